"""The strict schema plus semantic checks, via the library and ``cdigen validate``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdigen.cdi import names
from cdigen.cdi.validate import check_spec, spec_problems
from cdigen.cli import main
from cdigen.errors import SchemaError
from cdigen.fileio import dump_document

GOOD: dict[str, Any] = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "devices": [
        {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
        {"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
    ],
    "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "mounts": [{"hostPath": "/usr/bin/nvidia-smi", "containerPath": "/usr/bin/nvidia-smi"}],
        "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook"}],
    },
}


def with_change(path: str, value: Any) -> dict[str, Any]:
    """A copy of GOOD with the field at dotted ``path`` set (``devices.0.name``)."""
    doc = copy.deepcopy(GOOD)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    target: Any = doc
    for p in parents:
        target = target[p]
    target[last] = value
    return doc


def test_good_spec_has_no_problems() -> None:
    assert spec_problems(GOOD) == []


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("devices.0.containerEdits.x", 1, "device '0': containerEdits: unknown field(s) 'x'"),
        ("containerEdits.env.0", "NOEQUALS", "invalid environment variable 'NOEQUALS'"),
        ("containerEdits.mounts.0.containerPath", "usr/bin/x", "path 'usr/bin/x' is not absolute"),
        ("containerEdits.hooks.0.hookName", "preStart", "unknown hook name 'preStart'"),
        ("devices.0.name", "-0", "invalid device name '-0'"),
        ("kind", "nvidia.com", "invalid kind 'nvidia.com'"),
        ("cdiVersion", "0.9.0", "cdiVersion: unknown cdiVersion '0.9.0'"),
        ("cdiVersion", "0.4.0", "cdiVersion 0.4.0 is too low: a device name starts with a digit"),
        ("devices.1.name", "0", "device '0': defined more than once"),
        ("devices.1.containerEdits", {}, "device 'all': containerEdits: empty"),
        (
            "devices.0.containerEdits.deviceNodes.0.type",
            "x",
            "device '0': containerEdits.deviceNodes[0].type",
        ),
        ("devices.0.containerEdits.deviceNodes.0.permissions", "rwx", "invalid permissions 'rwx'"),
        ("devices", [], "devices: [] should be non-empty"),
    ],
)
def test_each_problem_is_found_and_located(path: str, value: Any, expected: str) -> None:
    problems = spec_problems(with_change(path, value))
    assert any(expected in p for p in problems), problems


def test_check_spec_raises_one_line() -> None:
    with pytest.raises(SchemaError) as info:
        check_spec(with_change("containerEdits.env.0", "X"), where="generated spec")
    assert "\n" not in str(info.value) and str(info.value).startswith("generated spec: ")


def test_validate_command_reports_every_problem_in_every_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(dump_document(GOOD, "yaml"))
    bad = tmp_path / "bad.json"
    doc = with_change("containerEdits.env.0", "NOEQUALS")
    doc["devices"][1]["name"] = "0"
    bad.write_text(dump_document(doc, "json"))
    broken = tmp_path / "broken.yaml"
    broken.write_text("cdiVersion: [unclosed\n")
    assert main(["validate", str(good)]) == 0
    assert f"{good}: ok" in capsys.readouterr().out
    # every file's problems, and exit 2: one file is not YAML at all (bad input, not a spec that
    # fails a check)
    assert main(["validate", str(good), str(bad), str(broken)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert (
        f"{bad}: containerEdits.env[0]: invalid environment variable 'NOEQUALS': expected KEY=VALUE"
        in err
    )
    assert f"{bad}: device '0': defined more than once; runtimes reject the whole file" in err
    assert any(line.startswith(f"{broken}: line 2, column 1: invalid YAML") for line in err)
    assert err[-1] == "cdigen: 3 file(s) checked: 3 problem(s)"


def test_validate_flags_names_runtimes_ignore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "nvidia.yml"
    spec.write_text(dump_document(GOOD, "yaml"))
    assert main(["validate", str(spec)]) == 1
    assert "only read *.yaml and *.json" in capsys.readouterr().err


def test_validate_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 2  # bad input
    assert "CDI spec not found" in capsys.readouterr().err


@pytest.mark.parametrize("path", ["devices.0.name", "kind", "cdiVersion"])
def test_a_trailing_newline_is_caught(path: str) -> None:
    doc = copy.deepcopy(GOOD)
    target: Any = doc
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    for p in parents:
        target = target[p]
    target[last] += "\n"
    assert any("ends with a newline" in p for p in spec_problems(doc))


def test_version_with_a_leading_v_is_accepted() -> None:
    assert spec_problems(with_change("cdiVersion", "v0.5.0")) == []


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="aZ09_.:-/= \n", max_size=8))
def test_schema_and_name_rules_agree_on_device_names(name: str) -> None:
    schema_ok = not any(
        p.startswith("device ") and "name" in p
        for p in spec_problems(with_change("devices.0.name", name))
    )
    assert schema_ok == (names.device_name_problem(name) is None)
