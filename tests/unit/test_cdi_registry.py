"""Spec directories as runtimes resolve them, and ``cdigen list``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdigen.cdi.cache import load_state
from cdigen.cli import main
from cdigen.fileio import dump_document


def spec(*names: str, kind: str = "nvidia.com/gpu") -> dict[str, Any]:
    return {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [
            {"name": n, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}
            for n in names
        ],
    }


def put(directory: Path, name: str, doc: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(dump_document(doc, "json" if name.endswith(".json") else "yaml"))
    return path


def test_later_directory_wins(tmp_path: Path) -> None:
    etc = put(tmp_path / "etc", "a.yaml", spec("0", "1"))
    run = put(tmp_path / "run", "b.json", spec("1"))
    reg = load_state([tmp_path / "etc", tmp_path / "run"])
    assert {n: d.spec_path for n, d in reg.devices.items()} == {
        "nvidia.com/gpu=0": etc,
        "nvidia.com/gpu=1": run,
    }
    assert reg.conflicts == {} and reg.errors == {}


def test_same_directory_conflict_drops_the_device_everywhere(tmp_path: Path) -> None:
    a = put(tmp_path / "etc", "a.yaml", spec("0", "1"))
    b = put(tmp_path / "etc", "b.yaml", spec("0"))
    put(tmp_path / "run", "c.yaml", spec("0"))  # a higher priority does not rescue it
    reg = load_state([tmp_path / "etc", tmp_path / "run"])
    assert sorted(reg.devices) == ["nvidia.com/gpu=1"]
    assert reg.conflicts == {"nvidia.com/gpu=0": (a, b)}


def test_broken_files_and_ignored_names(tmp_path: Path) -> None:
    d = tmp_path / "etc"
    bad = put(d, "bad.yaml", {**spec("0"), "cdiVersion": "0.9.0"})
    (d / "junk.yaml").write_text("kind: [\n")
    put(d, "ignored.yml", spec("9"))  # not *.yaml/*.json: runtimes never read it
    (d / "sub").mkdir()
    put(d / "sub", "deep.yaml", spec("8"))  # not recursive
    reg = load_state([d, tmp_path / "missing"])
    assert reg.devices == {}
    assert set(reg.errors) == {bad, d / "junk.yaml"}
    assert "unknown cdiVersion '0.9.0'" in reg.errors[bad]


def test_list_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    a = put(etc, "a.yaml", spec("0", "all"))
    put(etc, "b.yaml", spec("0"))
    bad = put(run, "bad.yaml", {**spec("1"), "containerEdits": {"env": ["NOEQUALS"]}})
    assert main(["list", "--spec-dir", str(etc), "--spec-dir", str(run)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"nvidia.com/gpu=all\t{a}"
    assert lines[1].startswith("nvidia.com/gpu=0\tCONFLICT: defined in ")
    assert lines[2].startswith(f"{bad}\tFAILED TO LOAD: containerEdits.env[0]: invalid environment")
    assert len(lines) == 3


def test_list_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = put(tmp_path, "a.yaml", spec("0"))
    assert main(["list", "--spec-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"nvidia.com/gpu=0\t{a}\n"


def test_list_says_when_there_is_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "none").mkdir()  # an empty dir; a missing one: tests/unit/test_cli_names.py
    assert main(["list", "--spec-dir", str(tmp_path / "none")]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"cdigen: no CDI spec files (*.yaml, *.json) in {tmp_path / 'none'}\n"


def test_list_counts_further_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = put(tmp_path, "bad.yaml", {**spec("0"), "cdiVersion": "0.9.0", "x": 1})
    assert main(["list", "--spec-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{bad}\tFAILED TO LOAD: ")
    assert out.endswith(f"(and 1 more: cdigen validate {bad})\n")
