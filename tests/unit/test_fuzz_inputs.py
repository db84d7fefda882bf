"""Fuzzing the readers of hostile input (issue 13, acceptance): node files, ``nvidia-smi topo -m``
text and CDI specs. Whatever the input, the answer is a value or a one-line CdigenError: never
another exception, never a case over 5 s (hypothesis' deadline), never a peak over 1 GB."""

from __future__ import annotations

import datetime
import resource
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdigen.cdi.validate import validate_files
from cdigen.cli import main
from cdigen.discover.builtin import sample_text
from cdigen.discover.topo_import import import_topo_text
from cdigen.errors import CdigenError
from cdigen.fileio import dump_document, parse_document
from cdigen.nodefile import load_node_file
from tests.fixtures.reference import TOPOLOGIES

PEAK_LIMIT = 2**30
FUZZ = settings(
    max_examples=120,
    deadline=5000,  # milliseconds per case
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)

# Values that broke a reader once, or that a careless one would choke on.
HOSTILE_SCALARS = [
    "9" * 5000,
    "-" + "9" * 50,
    str(2**63),
    "1.0e+400",
    ".nan",
    ".inf",
    "0x" + "f" * 60,
    ":".join(["59"] * 2000),  # a YAML 1.1 sexagesimal integer
    "2001-01-01",
    "2001-02-30",
    "2001-01-01 10:00:00",
    "!!set {a, b}",
    "!!binary aGVsbG8=",
    "!!python/object:os.system x",
    '"GPU-1\\n"',
    '"rw\\n"',
    "[" * 150 + "]" * 150,
    "{a: 1, 2: b, [x]: c}",
    "null",
    "~",
    "''",
    "²",
    "*undefined",
    "&a [*a]",
    '"\\0"',
]
YAML_BOMB = "".join(
    f"b{i}: &b{i} [{','.join([f'*b{i - 1}'] * 9) if i else ','.join(['lol'] * 9)}]\n"
    for i in range(8)
)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def bounded(check: Callable[[], Any]) -> Any:
    """Run ``check``; only a CdigenError may escape, and the process may not grow past 1 GB over
    its peak so far (the peak RSS: cheap, and it counts libyaml's C heap too)."""
    before = _peak_rss()
    try:
        return check()
    except CdigenError as exc:
        assert "\n" not in str(exc), str(exc)
        return exc
    finally:
        assert _peak_rss() - before < PEAK_LIMIT, f"peak RSS grew by {_peak_rss() - before} bytes"


def mutate_lines(text: str, data: st.DataObject) -> str:
    """``text`` with a few lines changed: a value swapped for a hostile one, a line dropped or
    doubled, or characters inserted."""
    lines = text.splitlines()
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(lines) - 1))
        action = data.draw(st.sampled_from(["value", "drop", "double", "insert", "bomb"]))
        line = lines[at]
        if action == "value" and ":" in line:
            key = line.split(":", 1)[0]
            lines[at] = f"{key}: {data.draw(st.sampled_from(HOSTILE_SCALARS))}"
        elif action == "drop":
            del lines[at]
        elif action == "double":
            lines.insert(at, line)
        elif action == "insert":
            col = data.draw(st.integers(0, len(line)))
            junk = data.draw(st.text(st.sampled_from("\t []{}:,-&*!#'\"\n9²x"), max_size=6))
            lines[at] = line[:col] + junk + line[col:]
        elif action == "bomb" and ":" in line:
            lines[at] = f"{line.split(':', 1)[0]}: *b7"
            lines.insert(0, YAML_BOMB)
        if not lines:
            lines = ["x: 1"]
    return "\n".join(lines) + "\n"


# Node files -------------------------------------------------------------------------------------


def _small_mig_node() -> str:
    """The first two GPUs of the h100-mig-single sample (MIG devices included), as YAML."""
    doc = parse_document(sample_text("h100-mig-single"), where="sample")
    doc["gpus"] = doc["gpus"][:2]
    doc["links"] = [k for k in doc["links"] if k["a"] < 2 and k["b"] < 2]
    return str(dump_document(doc, "yaml"))


NODE_TEXTS = [sample_text("ws-4xv100"), _small_mig_node()]

json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=20)
    | st.dates()
    | st.binary(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=8) | st.integers(0, 9), children, max_size=4)
    ),
    max_leaves=20,
)


@FUZZ
@given(data=st.data())
def test_fuzzed_node_files(tmp_path: Path, data: st.DataObject) -> None:
    text = mutate_lines(data.draw(st.sampled_from(NODE_TEXTS)), data)
    path = tmp_path / "node.yaml"
    path.write_text(text, encoding="utf-8")
    bounded(lambda: load_node_file(path))


@FUZZ
@given(value=json_like, field=st.sampled_from(["name", "index", "numaNode", "uuid", "pciBusId"]))
def test_node_files_with_any_value_in_a_field(tmp_path: Path, value: Any, field: str) -> None:
    doc = parse_document(NODE_TEXTS[0], where="sample")
    doc["gpus"][0][field] = value
    path = tmp_path / "node.yaml"
    path.write_text(dump_document(doc, "yaml"), encoding="utf-8")
    result = bounded(lambda: load_node_file(path))
    if not isinstance(result, CdigenError):  # it loaded: then it is what the schema allows
        gpu = result.gpus[0]
        assert isinstance(gpu.index, int) and 0 <= gpu.index <= 4095
        assert gpu.numa_node is None or 0 <= gpu.numa_node <= 1023


# topo -m text ---------------------------------------------------------------------------------

TOPO_CELLS = [" X ", "X", "NV1", "NV12", "NV18", "NV19", "NV" + "9" * 5000, "PIX", "PXB", "PHB",
              "NODE", "SYS", "SOC", "", "N/A", "0-15", "0-15,32-47", "9" * 5000, "²", "٣", "3",
              "1024", "-1", "CPU Affinity", "GPU0", "x y"]  # fmt: skip
REFERENCES = sorted(p for p in TOPOLOGIES.glob("*.txt"))


@st.composite
def topo_texts(draw: st.DrawFn) -> str:
    """A made-up ``topo -m`` text: a header of N GPUs and trailing columns, then rows of cells
    drawn from real and hostile labels, joined by tabs or spaces."""
    count = draw(st.integers(1, 4))
    trailing = draw(st.lists(st.sampled_from(["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]),
                             max_size=3, unique=True))  # fmt: skip
    sep = draw(st.sampled_from(["\t", "    ", " ", "\t\t"]))
    header = sep + sep.join([f"GPU{i}" for i in range(count)] + trailing)
    rows = []
    for i in range(draw(st.integers(0, count + 1))):
        cells = draw(st.lists(st.sampled_from(TOPO_CELLS), min_size=0, max_size=count + 4))
        rows.append(sep.join([f"GPU{i}", *cells]))
    return "\n".join([header, *rows]) + "\n"


@FUZZ
@given(text=topo_texts())
def test_fuzzed_topo_text(text: str) -> None:
    bounded(lambda: import_topo_text(text, where="fuzz.txt"))


@FUZZ
@given(data=st.data())
def test_mutated_reference_topologies(data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(REFERENCES))
    lines = path.read_text().splitlines()
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(lines) - 1))
        cells = lines[at].split("\t")
        col = data.draw(st.integers(0, len(cells) - 1))
        cells[col] = data.draw(st.sampled_from(TOPO_CELLS))
        lines[at] = "\t".join(cells)
    text = "\n".join(lines) + "\n"
    if data.draw(st.booleans()):
        text = text.expandtabs(8)
    bounded(lambda: import_topo_text(text, where=path.name))


# CDI specs ------------------------------------------------------------------------------------

SPEC = """\
cdiVersion: 0.7.0
kind: example.com/gpu
annotations:
  note: fuzz
devices:
- name: gpu0
  containerEdits:
    env:
    - A=1
    deviceNodes:
    - path: /dev/nvidia0
      major: 195
      minor: 0
      permissions: rw
    mounts:
    - hostPath: /usr/lib/libcuda.so
      containerPath: /usr/lib/libcuda.so
      options: [ro, nosuid]
    hooks:
    - hookName: createContainer
      path: /usr/bin/hook
      timeout: 5
containerEdits:
  additionalGids: [44]
"""


@FUZZ
@given(data=st.data())
def test_fuzzed_cdi_specs(tmp_path: Path, data: st.DataObject) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(mutate_lines(SPEC, data), encoding="utf-8")
    problems = bounded(lambda: validate_files([path]))
    assert isinstance(problems, list)
    assert all(isinstance(p, str) and "\n" not in p for p in problems), problems


@pytest.mark.parametrize("scalar", HOSTILE_SCALARS)
def test_every_hostile_scalar_through_validate_exits_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scalar: str
) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.replace("major: 195", f"major: {scalar}"), encoding="utf-8")
    assert bounded(lambda: main(["validate", str(path)])) in (0, 1, 2)  # 2: not YAML at all
    err = capsys.readouterr().err
    assert all(line.startswith((str(path), "cdigen: ")) for line in err.splitlines()), err


def test_the_hostile_scalars_are_known_values() -> None:
    """The list above holds what YAML really turns into non-JSON values."""
    doc = parse_document("d: 2001-01-01\nt: 2001-01-01 10:00:00\n", where="t")
    assert isinstance(doc["d"], datetime.date) and isinstance(doc["t"], datetime.datetime)


# policy replay request lines ------------------------------------------------------------------

REPLAY_IDS = ["0", "1", "2", "3", "7", "8", "-1", "GPU-x", "", "0::1", "1:0", "9" * 5000]
replay_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from(REPLAY_IDS)
    | st.floats(allow_nan=True),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=12,
)


@st.composite
def replay_lines(draw: st.DrawFn) -> str:
    """Request lines as `policy replay` reads them: mostly well-formed objects with drawn values,
    plus raw text, deep nesting and huge numbers."""
    import json

    lines = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["object", "object", "raw", "deep"]))
        if kind == "object":
            doc = {
                "available": draw(
                    st.lists(st.sampled_from(REPLAY_IDS), max_size=6) | replay_values
                ),
                "mustInclude": draw(
                    st.lists(st.sampled_from(REPLAY_IDS), max_size=2) | replay_values
                ),
                "size": draw(st.integers(-2, 10) | replay_values),
            }
            lines.append(json.dumps(doc))
        elif kind == "deep":
            depth = draw(st.integers(50, 20000))
            lines.append("[" * depth + "]" * depth)
        else:
            lines.append(draw(st.text(max_size=40)).replace("\n", " "))
    return "\n".join(lines) + "\n"


@FUZZ
@given(text=replay_lines())
def test_fuzzed_replay_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text(text, encoding="utf-8")
    code = bounded(
        lambda: main(["policy", "replay", "--node", "builtin:dgx1-v100", "--requests", str(path)])
    )
    _, err = capsys.readouterr()
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err
    if code == 2:  # one line per bad request line (and a count when there are several)
        lines = err.strip().splitlines()
        assert lines and all(line.startswith(f"cdigen: error: {path}:") for line in lines), err
