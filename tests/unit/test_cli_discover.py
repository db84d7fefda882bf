"""``cdigen discover``, ``topo`` and ``topo import`` through the real CLI entry point."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cdigen.cli import main
from tests.fixtures.reference import TOPOLOGIES, reference_rows


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_discover_dgx_a100_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "discover", "--node", "builtin:dgx-a100", "--format", "json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert len(doc["gpus"]) == 8
    assert [g["numaNode"] for g in doc["gpus"]] == [3, 3, 1, 1, 7, 7, 5, 5]
    pairs = {(k["a"], k["b"]): k["nvlinks"] for k in doc["links"]}
    assert len(pairs) == 28 and set(pairs.values()) == {12}


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_discover_output_loads_as_a_node_file_unchanged(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str
) -> None:
    path = tmp_path / f"node.{fmt}"
    code, out, _ = run(capsys, "discover", "--node", "builtin:h100-mig-single", "--format", fmt,
                       "--output", str(path))  # fmt: skip
    assert code == 0 and out == ""
    code, again, _ = run(capsys, "discover", "--node", str(path), "--format", fmt)
    assert code == 0 and again == path.read_text()


def test_topo_import_then_topo_reproduces_the_reference(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    src = TOPOLOGIES / "dgx1-v100.txt"
    node_file = tmp_path / "imported.yaml"
    code, _, err = run(capsys, "topo", "import", str(src), "--gpu-name", "Tesla V100-SXM2-16GB",
                       "--memory", "16GiB", "-o", str(node_file))  # fmt: skip
    assert code == 0
    assert err.startswith("cdigen: note: no NUMA Affinity column: NUMA nodes inferred")
    code, out, _ = run(capsys, "topo", "--node", str(node_file))
    assert code == 0
    labels, _ = reference_rows(src)
    rows = [line.split("\t") for line in out.splitlines() if line.startswith("GPU")]
    assert [[c.strip() for c in row[1:9]] for row in rows] == labels
    assert [row[9] for row in rows] == ["0"] * 4 + ["1"] * 4
    code, out, _ = run(capsys, "discover", "--node", str(node_file), "--format", "json")
    assert json.loads(out)["gpus"][0]["memoryBytes"] == 16 * 2**30


def test_topo_import_reads_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO((TOPOLOGIES / "dgx-h100.txt").read_text()))
    code, out, _ = run(capsys, "topo", "import", "-", "--format", "json")
    assert code == 0 and len(json.loads(out)["gpus"]) == 8


def test_topo_import_stdin_not_text_is_one_line_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    binary = io.TextIOWrapper(io.BytesIO(b"\xff\xfeGPU0\n"), encoding="utf-8", errors="strict")
    monkeypatch.setattr(sys, "stdin", binary)
    code, out, err = run(capsys, "topo", "import", "-")
    assert (code, out) == (2, "")
    assert err.startswith("cdigen: error: <stdin>: cannot read topo -m text:")
    assert len(err.splitlines()) == 1


def test_topo_formats(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "topo", "--node", "builtin:dgx-h100", "--format", "json")
    assert code == 0 and json.loads(out)["matrix"][1][0] == "NV18"
    code, out, _ = run(capsys, "topo", "--node", "builtin:dgx-h100", "--format", "dot")
    assert code == 0 and out.startswith('graph "dgx-h100"')


def _bad_inputs(tmp_path: Path) -> list[tuple[list[str], str]]:
    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: cdigen/v1alpha1\ngpus: [\n")
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text(
        "apiVersion: cdigen/v1alpha1\nkind: Node\ngpus:\n- {index: 0, minor: 0, uuid: GPU-1, "
        "name: x, architecture: y, cudaComputeCapability: '8.0', memoryBytes: lots, "
        "pciBusId: '0000:01:00.0'}\n"
    )
    empty = tmp_path / "empty.txt"
    empty.write_text("nothing to see here\n")
    return [
        (["discover", "--node", str(tmp_path / "missing.yaml")], "node file not found"),
        (["discover", "--node", str(broken)], "invalid YAML"),
        (["discover", "--node", str(invalid)], "gpus[0].memoryBytes: expected integer"),
        (["topo", "import", str(empty)], "no GPU columns found"),
        (["topo", "import", str(TOPOLOGIES / "truncated-dgx2-paste.txt")], "rows missing"),
        (
            ["topo", "import", str(TOPOLOGIES / "dgx-a100.txt"), "--memory", "lots"],
            "--memory: 'lots' is not a positive whole quantity of bytes",
        ),
        # the "invented UUIDs" note came before the error of a write that then failed
        (["topo", "import", str(TOPOLOGIES / "dgx-a100.txt"), "-o", str(tmp_path)], "write failed"),
        (
            ["topo", "import", str(TOPOLOGIES / "dgx-a100.txt"), "-o", str(empty / "x.yaml")],
            "does not exist",
        ),
        (["discover", "--node", "builtin:nope"], "no built-in sample called 'nope'"),
        (["topo", "--node", "nvml"], "NVML"),
    ]


def test_bad_input_is_exit_2_and_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for argv, expected in _bad_inputs(tmp_path):
        code, out, err = run(capsys, *argv)
        assert code == 2, argv
        assert out == ""
        assert err.count("\n") == 1 and err.startswith("cdigen: error: "), err
        assert expected in err, (argv, err)
        assert "Traceback" not in err


def test_failing_write_leaves_the_old_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "node.yaml"
    target.write_text("old\n")
    code, _, _ = run(capsys, "discover", "--node", "builtin:nope", "-o", str(target))
    assert code == 2 and target.read_text() == "old\n"


def test_help_is_useful(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["discover", "--help"], ["topo", "--help"], ["topo", "import", "--help"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert "--output" in out and "example" in out


def test_the_installed_script(tmp_path: Path) -> None:
    script = shutil.which("cdigen") or str(Path(sys.executable).parent / "cdigen")
    ok = subprocess.run([script, "discover", "--node", "builtin:rtx4090"], capture_output=True,
                        text=True, timeout=60)  # fmt: skip
    assert ok.returncode == 0 and "NVIDIA GeForce RTX 4090" in ok.stdout
    bad = subprocess.run([script, "topo", "import", str(TOPOLOGIES / "truncated-dgx2-paste.txt")],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "rows missing" in bad.stderr


@pytest.mark.parametrize(
    ("argv", "node", "sysfs_root", "proc_root"),
    [
        (["discover"], "nvml", "/sys", "/proc"),
        (["topo"], "nvml", "/sys", "/proc"),
        (["policy", "simulate"], "nvml", "/sys", "/proc"),
        (["policy", "replay", "--requests", "r.jsonl"], "nvml", "/sys", "/proc"),
        # plugin serve: unset flags fall through to CDIGEN_* and the config file
        (["plugin", "serve"], None, None, None),
    ],
)
def test_node_source_flags_are_shared(
    argv: list[str], node: str | None, sysfs_root: str | None, proc_root: str | None
) -> None:
    from cdigen.cli import build_parser

    args = build_parser().parse_args(argv)
    assert (args.node, args.sysfs_root, args.proc_root) == (node, sysfs_root, proc_root)
    given = build_parser().parse_args(
        [*argv, "--node", "builtin:rtx4090", "--sysfs-root", "/h/sys", "--proc-root", "/h/proc"]
    )
    assert (given.node, given.sysfs_root, given.proc_root) == (
        "builtin:rtx4090",
        "/h/sys",
        "/h/proc",
    )


def test_output_into_a_missing_directory_is_refused_not_created(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "typo" / "node.yaml"
    code, out, err = run(capsys, "discover", "--node", "builtin:rtx4090", "-o", str(target))
    assert code == 2 and out == ""
    assert "does not exist" in err and str(tmp_path / "typo") in err
    assert not (tmp_path / "typo").exists()


def test_topo_import_marks_its_invented_identifiers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "node.yaml"
    reference = TOPOLOGIES / "dgx-a100.txt"
    code, _, err = run(capsys, "topo", "import", str(reference), "-o", str(target))
    assert code == 0
    text = target.read_text()
    assert (
        text.startswith("# Imported from nvidia-smi topo -m") and "INVENTED" in text.splitlines()[0]
    )
    assert "invented" in err and "cdigen discover" in err
    code, _, _ = run(capsys, "discover", "--node", str(target))
    assert code == 0, "the header does not stop the file from loading"
