"""Hostile inputs (issue 13, points 5-9 and 12): each one gets one clear line and exit 2, never a
traceback, a hang, a huge allocation or a wrong answer."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cdigen import model
from cdigen.cdi.validate import spec_problems, validate_files
from cdigen.cli import main
from cdigen.discover.builtin import sample_text
from cdigen.discover.topo_import import import_topo_text
from cdigen.discover.topo_matrix import parse_topo
from cdigen.errors import CdigenError, InputError, SchemaError
from cdigen.fileio import MAX_INPUT_BYTES_ENV, dump_document, parse_document, read_document
from cdigen.nodefile import load_node_file
from cdigen.plugin.deviceplugin.config import load_config
from cdigen.policies.policy import check_policy_file
from cdigen.schemas import _whole_value, load_schema
from tests.fixtures.reference import TOPOLOGIES

HUGE = "9" * 5000  # past Python's 4,300-digit limit for int("...")
GOOD_SPEC = (
    "cdiVersion: 0.6.0\nkind: example.com/gpu\ndevices:\n"
    "- name: x\n  containerEdits:\n    deviceNodes: [{path: /dev/x, permissions: rw}]\n"
)
GOOD_POLICY = (
    "apiVersion: cdigen/v1alpha1\nkind: AllocationPolicy\nmetadata: {name: p}\n"
    "spec:\n  resource: nvidia.com/gpu\n"
    "  linkWeights: {NVLINK: 100, PIX: 50, PXB: 40, PHB: 30, NODE: 20, SYS: 10}\n"
)


def node_text() -> str:
    return sample_text("dgx-a100")


def node_with(tmp_path: Path, old: str, new: str, *, count: int = 1) -> Path:
    """The dgx-a100 sample with the first ``count`` occurrences of ``old`` replaced."""
    text = node_text()
    assert old in text
    path = tmp_path / "node.yaml"
    path.write_text(text.replace(old, new, count), encoding="utf-8")
    return path


def node_doc_with(tmp_path: Path, field: str, value: Any, *, sample: str = "dgx-a100") -> Path:
    """The sample with the dotted ``field`` (``gpus.0.uuid``) set to ``value``, as YAML."""
    doc = parse_document(sample_text(sample), where=sample)
    *parents, last = [int(p) if p.isdigit() else p for p in field.split(".")]
    target = doc
    for p in parents:
        target = target[p]
    target[last] = value
    path = tmp_path / "node.yaml"
    path.write_text(dump_document(doc, "yaml"), encoding="utf-8")
    return path


def dotted(field: str) -> str:
    """``gpus.0.uuid`` as error messages write it: ``gpus[0].uuid``."""
    return re.sub(r"\.(\d+)", r"[\1]", field)


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and len(text) < 400, text
    return text


def bomb(levels: int = 6) -> str:
    """A billion-laughs document: 9**levels leaves from a few hundred bytes."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


# --- 5: YAML and input size ----------------------------------------------------------------


def test_alias_bomb_in_a_node_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(
        bomb() + "apiVersion: cdigen/v1alpha1\nkind: Node\ngpus: *a5\n", encoding="utf-8"
    )
    with pytest.raises(InputError, match=r"node\.yaml: line \d+, column \d+: aliases expand") as e:
        load_node_file(path)
    one_line(e.value)


def test_alias_bomb_in_a_spec_policy_and_plugin_config_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(bomb() + GOOD_SPEC.replace("devices:", "annotations: *a5\ndevices:"))
    [problem] = validate_files([spec])
    assert "aliases expand" in problem and problem.startswith(str(spec))
    policy = tmp_path / "policy.yaml"
    policy.write_text(bomb() + GOOD_POLICY)
    assert any("aliases expand" in p for p in check_policy_file(policy))
    config = tmp_path / "config.yaml"
    config.write_text(bomb() + "node: builtin:dgx-a100\n")
    with pytest.raises(InputError, match="aliases expand"):
        load_config(config, env={})


def test_small_alias_use_still_loads() -> None:
    doc = parse_document("base: &b {x: 1}\nc: [*b, *b]\n", where="t")
    assert doc == {"base": {"x": 1}, "c": [{"x": 1}, {"x": 1}]}


def test_self_referring_alias_and_deep_nesting_are_refused() -> None:
    with pytest.raises(InputError, match="alias refers to a node that contains it"):
        parse_document("a: &a [1, *a]\n", where="t")
    with pytest.raises(InputError, match="nested more than 200 levels"):
        parse_document("[" * 300 + "]" * 300, where="t")


def test_a_file_over_the_size_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(node_text())
    load_node_file(path)  # under the default limit
    monkeypatch.setenv(MAX_INPUT_BYTES_ENV, "1000")
    with pytest.raises(InputError, match=r"node\.yaml: node file is larger than 1000 bytes") as e:
        load_node_file(path)
    assert MAX_INPUT_BYTES_ENV in one_line(e.value)
    monkeypatch.setenv(MAX_INPUT_BYTES_ENV, "lots")
    with pytest.raises(InputError, match=f"{MAX_INPUT_BYTES_ENV}='lots' is not"):
        load_node_file(path)


def test_character_devices_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["discover", "--node", "/dev/null"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "cdigen: error: /dev/null: expected a node file, found a character device; "
        "give the path of a regular file\n"
    )


def _limited() -> None:  # in the child: 1 GiB of address space, so a runaway read dies fast
    resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))


@pytest.mark.parametrize("what", ["/dev/zero", "fifo"])
def test_endless_and_blocking_files_are_refused(tmp_path: Path, what: str) -> None:
    path = what
    if what == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)  # nobody writes: opening it for reading must not wait
    done = subprocess.run(
        [sys.executable, "-c", "from cdigen.cli import run; run()", "validate", path],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limited,
    )
    kind = "a character device" if what == "/dev/zero" else "a pipe"
    assert (done.returncode, done.stdout) == (2, "")  # a file that cannot be read: bad input
    assert f"{path}: expected a CDI spec, found {kind}" in done.stderr
    assert "Traceback" not in done.stderr


# --- 6: numbers ------------------------------------------------------------------------------


def test_a_huge_integer_in_a_node_file_is_one_line(tmp_path: Path) -> None:
    path = node_with(tmp_path, "numaNode: 3", f"numaNode: {HUGE}")
    with pytest.raises(InputError, match="integer of 5000 characters is too large") as e:
        load_node_file(path)
    assert one_line(e.value).startswith(f"{path}: line ")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpus.0.numaNode", 2**63),
        ("gpus.0.numaNode", 1024),
        ("gpus.0.memoryBytes", 1e29),
        ("gpus.0.minor", 2**20),
        ("gpus.0.index", 2**63),
        ("links.0.nvlinks", 19),
        ("links.0.a", 2**64),
    ],
)
def test_node_values_out_of_range_are_refused_at_load(
    tmp_path: Path, field: str, value: float
) -> None:
    path = node_doc_with(tmp_path, field, value)
    with pytest.raises(SchemaError, match="is greater than the maximum of") as e:
        load_node_file(path)
    assert f": {dotted(field)}: " in one_line(e.value)


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("gpus.0.name", "x" * 100_000, "is too long: 100,000 characters, at most 256"),
        ("gpus.0.uuid", "GPU-" + "é" * 100_000, "does not match"),
        ("gpus.0.migDevices.0.capMinors", list(range(100_000)), "100,000 items, at most 2"),
    ],
    ids=["maxLength", "pattern", "maxItems"],
)
def test_a_huge_value_is_quoted_short(tmp_path: Path, field: str, value: Any, why: str) -> None:
    path = node_doc_with(tmp_path, field, value, sample="dgx-a100-mig-mixed")
    with pytest.raises(SchemaError, match=why) as e:
        load_node_file(path)
    assert f": {dotted(field)}: " in one_line(e.value)


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "1.0e+400"])
def test_nan_and_infinity_are_refused_at_load(value: str) -> None:
    with pytest.raises(InputError, match=r"t: line 1, column 4: .* is not a finite number"):
        parse_document(f"x: {value}\n", where="t")


def test_whole_floats_load_as_integers(tmp_path: Path) -> None:
    node = load_node_file(node_with(tmp_path, "memoryBytes: 85899345920", "memoryBytes: 8.0e+10"))
    assert node.gpus[0].memory_bytes == 80_000_000_000
    assert isinstance(node.gpus[0].memory_bytes, int)


def test_schema_maxima_are_the_model_limits() -> None:
    defs = load_schema("node")["$defs"]
    gpu, mig, link = defs["gpu"]["properties"], defs["migDevice"]["properties"], defs["link"]
    assert gpu["numaNode"]["maximum"] == model.MAX_NUMA_NODE == 1023
    assert gpu["minor"]["maximum"] == model.MAX_MINOR == 2**20 - 1
    assert gpu["index"]["maximum"] == link["properties"]["a"]["maximum"] == model.MAX_GPU_INDEX
    assert link["properties"]["nvlinks"]["maximum"] == model.MAX_NVLINKS == 18
    assert defs["memoryBytes"]["maximum"] == model.MAX_MEMORY_BYTES
    assert mig["giId"]["maximum"] == mig["ciId"]["maximum"] == model.MAX_MIG_ID


def test_huge_integers_in_specs_policies_and_plugin_config(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(GOOD_SPEC.replace("permissions: rw", f"permissions: rw, major: {HUGE}"))
    [problem] = validate_files([spec])
    assert "integer of 5000 characters is too large" in problem
    spec.write_text(GOOD_SPEC.replace("permissions: rw", f"permissions: rw, major: {2**63}"))
    [problem] = validate_files([spec])
    assert "containerEdits.deviceNodes[0].major" in problem
    policy = tmp_path / "policy.yaml"
    policy.write_text(GOOD_POLICY.replace("NVLINK: 100", f"NVLINK: {HUGE}"))
    [problem] = check_policy_file(policy)
    assert "integer of 5000 characters is too large" in problem
    config = tmp_path / "config.yaml"
    config.write_text(f"health: {{ignoredXids: [{HUGE}]}}\n")
    with pytest.raises(InputError, match="integer of 5000 characters"):
        load_config(config, env={})
    config.write_text("resources: [{name: nvidia.com/gpu, sharing: {memorySliceMiB: 99999999}}]\n")
    with pytest.raises(SchemaError, match="memorySliceMiB"):
        load_config(config, env={})


def topo(rows: list[list[str]], header: str = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity") -> str:
    return "\n".join([header, *("\t".join(row) for row in rows)]) + "\n"


@pytest.mark.parametrize(
    ("cell", "column", "expected"),
    [
        ("NV" + HUGE, 2, "NV9999.* is more NVLinks than two GPUs can share"),
        ("NV19", 2, "NV19 is more NVLinks"),
        ("²", 4, "NUMA Affinity '²' is not a NUMA node number"),
        (HUGE, 4, "NUMA Affinity '9999.*' is not a NUMA node number"),
        ("1024", 4, "NUMA Affinity '1024' is not a NUMA node number .0 to 1023"),
        (HUGE, 3, "CPU Affinity '9999.*' is not a CPU list"),
    ],
)
def test_bad_numbers_in_topo_cells(cell: str, column: int, expected: str) -> None:
    row0 = ["GPU0", " X ", "NV2", "0-7", "0"]
    row1 = ["GPU1", "NV2", " X ", "8-15", "1"]
    row0[column] = cell
    if column == 2:
        row1[1] = cell
    with pytest.raises(InputError, match=expected) as e:
        parse_topo(topo([row0, row1]), where="t.txt")
    assert one_line(e.value).startswith("t.txt: line 2")


def test_huge_cpu_cell_without_numa_column_is_one_line() -> None:
    header = "\tGPU0\tGPU1\tCPU Affinity"
    text = topo([["GPU0", " X ", "SYS", HUGE], ["GPU1", "SYS", " X ", "8"]], header)
    with pytest.raises(InputError, match="is not a CPU list"):
        parse_topo(text, where="t.txt")


def test_topo_import_memory_of_hundreds_of_digits(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["topo", "import", str(TOPOLOGIES / "dgx-a100.txt"), "--memory", "9" * 400])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("cdigen: error: --memory: '9999")
    assert len(err.splitlines()) == 1
    code = main(["topo", "import", str(TOPOLOGIES / "dgx-a100.txt"), "--memory", "99999GiB"])
    err = capsys.readouterr().err
    assert code == 2 and "--memory: '9999" in err and "more than 16 TiB" in err


# --- 7: dates, sets and binary values --------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "described"),
    [
        ("2001-01-01", "a date (2001-01-01)"),
        ("2001-01-01 10:00:00", "a timestamp (2001-01-01T10:00:00)"),
        ("!!set {a, b}", 'a set ["a", "b"]'),
        ("!!binary aGVsbG8=", "binary data (5 bytes)"),
    ],
)
def test_yaml_only_types_name_the_field_and_the_expected_type(
    tmp_path: Path, value: str, described: str
) -> None:
    path = node_with(tmp_path, "architecture: Ampere", f"architecture: {value}")
    with pytest.raises(SchemaError) as e:
        load_node_file(path)
    assert f"gpus[0].architecture: expected string, got {described}" in one_line(e.value)
    spec = tmp_path / "spec.yaml"
    spec.write_text(GOOD_SPEC.replace("permissions: rw", f"permissions: {value}"))
    [problem] = validate_files([spec])
    assert f"containerEdits.deviceNodes[0].permissions: expected string, got {described}" in (
        problem
    )
    policy = tmp_path / "policy.yaml"
    policy.write_text(GOOD_POLICY.replace("resource: nvidia.com/gpu", f"resource: {value}"))
    [problem] = check_policy_file(policy)
    assert f"spec.resource: expected string, got {described}" in problem


def test_a_date_in_an_enum_field(tmp_path: Path) -> None:
    path = node_with(tmp_path, "pcie: null", "pcie: 2001-01-01")
    with pytest.raises(
        SchemaError, match=r"links\[0\]\.pcie: expected one of PIX, .*, null, got a"
    ):
        load_node_file(path)


def test_an_impossible_date_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="day is out of range"):
        load_node_file(node_with(tmp_path, "architecture: Ampere", "architecture: 2001-02-30"))


# --- 8: patterns match the whole value -------------------------------------------------------


@pytest.mark.parametrize(
    ("sample", "field", "value"),
    [
        ("dgx-a100", "gpus.0.uuid", "GPU-6841bfd8-ffee-57b1-be60-84531269b471\n"),
        ("dgx-a100", "gpus.0.cudaComputeCapability", "8.0\n"),
        ("dgx-a100", "gpus.0.pciBusId", "0000:07:00.0\n"),
        ("dgx-a100", "cudaDriverVersion", "12.4\n"),
        ("h100-mig-single", "gpus.0.migDevices.0.uuid", "MIG-abc\n"),
        ("h100-mig-single", "gpus.0.migDevices.0.profile", "1g.10gb\n"),
    ],
)
def test_node_patterns_refuse_a_trailing_newline(
    tmp_path: Path, sample: str, field: str, value: str
) -> None:
    path = node_doc_with(tmp_path, field, value, sample=sample)
    with pytest.raises(SchemaError, match="does not match") as e:
        load_node_file(path)
    assert f": {dotted(field)}: " in one_line(e.value)


def test_spec_permissions_and_plugin_resource_names_refuse_a_trailing_newline(
    tmp_path: Path,
) -> None:
    doc: Any = parse_document(GOOD_SPEC, where="t")
    doc["devices"][0]["containerEdits"]["deviceNodes"][0]["permissions"] = "rw\n"
    assert any("invalid permissions 'rw\\n'" in p for p in spec_problems(doc))
    config = tmp_path / "config.yaml"
    config.write_text('resources: [{name: "nvidia.com/gpu\\n"}]\n')
    with pytest.raises(SchemaError, match=r"resources\[0\]\.name"):
        load_config(config, env={})


def test_dollar_means_the_end_of_the_value_as_in_ecma_and_go() -> None:
    assert _whole_value("^[rwm]*$") == "^[rwm]*\\Z"
    assert _whole_value("^a[$]b\\$c$") == "^a[$]b\\$c\\Z"  # a $ in a class or escaped stays
    assert _whole_value("^(a|b$)") == "^(a|b\\Z)"


# --- 9: --node '' and a relative --dev-root --------------------------------------------------


def test_an_empty_node_source_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["discover", "--node", ""]) == 2
    assert capsys.readouterr().err == (
        "cdigen: error: the node source '' names no file; "
        "give nvml, builtin:NAME or the path of a node file\n"
    )


@pytest.mark.parametrize("flag", ["--dev-root", "--driver-root"])
def test_a_relative_root_blames_the_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str
) -> None:
    code = main(["generate", "--node", "builtin:dgx-a100", flag, "rel", "--output-dir",
                 str(tmp_path)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"cdigen: error: {flag}: 'rel' is not an absolute path")
    assert list(tmp_path.iterdir()) == []


# --- 12: topo import reads cells by position ----------------------------------------------------


def blank_cpu_cells(text: str) -> str:
    """``text`` with every GPU row's CPU Affinity cell emptied, as nvidia-smi prints it under a
    Slurm or cgroup CPU limit (the tabs stay)."""
    lines = text.splitlines()
    header = next(line for line in lines if "CPU Affinity" in line).split("\t")
    at = header.index("CPU Affinity")
    out = []
    for line in lines:
        cells = line.split("\t")
        if cells[0].startswith("GPU") and len(cells) > at:
            cells[at] = ""
        out.append("\t".join(cells))
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("expand", [False, True], ids=["tabs", "pasted-from-a-terminal"])
def test_blank_cpu_affinity_keeps_the_numa_column(expand: bool) -> None:
    text = blank_cpu_cells((TOPOLOGIES / "dgx-a100.txt").read_text())
    assert "\tSYS\t\t3" in text
    if expand:
        text = text.expandtabs(8)
    node = import_topo_text(text, where="dgx-a100-slurm.txt")
    assert [g.numa_node for g in node.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    matrix = parse_topo(text, where="t")
    assert matrix.cpu_affinity == (None,) * 8 and not matrix.numa_inferred


def test_text_separated_by_single_spaces_still_reads() -> None:
    text = "GPU0 GPU1 CPU Affinity NUMA Affinity\nGPU0 X NV2 0-7 0\nGPU1 NV2 X 8-15 1\n"
    matrix = parse_topo(text, where="t")
    assert matrix.labels == (("X", "NV2"), ("NV2", "X"))
    assert matrix.cpu_affinity == ("0-7", "8-15") and matrix.numa_nodes == (0, 1)


def test_every_reference_topology_reads_the_same_pasted_from_a_terminal() -> None:
    for path in sorted(TOPOLOGIES.glob("*.txt")):
        text = path.read_text()
        if "\t" not in text or path.name.startswith("truncated"):
            continue
        assert parse_topo(text.expandtabs(8), where="p") == parse_topo(text, where="t"), path


def test_no_input_error_escapes_as_anything_else(tmp_path: Path) -> None:
    """Every error above is a CdigenError: the CLI prints it as one line, exit 2."""
    path = node_with(tmp_path, "numaNode: 3", f"numaNode: {HUGE}")
    with pytest.raises(CdigenError):
        read_document(path)
