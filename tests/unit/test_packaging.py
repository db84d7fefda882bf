"""The wheel carries what cdigen needs at run time, and the CLI finds every part."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cdigen.cli import build_parser
from tests.helpers.packaging import wheel_path

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)],
        check=True,
        capture_output=True,
    )
    (path,) = out.glob("cdigen-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_ships_every_schema(wheel: zipfile.ZipFile) -> None:
    shipped = {Path(n).name for n in wheel.namelist() if n.startswith("cdigen/schema_files/")}
    in_repo = {p.name for p in (REPO / "schemas").glob("*.schema.json")}
    assert in_repo, "schemas/ is empty"
    assert in_repo <= shipped


def test_wheel_ships_builtin_nodes_and_policies(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    for folder, pattern in (("cdigen/discover/data", "*.yaml"), ("policies/builtin", "*.yaml")):
        in_repo = {p.name for p in (REPO / folder).glob(pattern)}
        assert in_repo, f"{folder} is empty"
        assert {f"{wheel_path(folder)}/{n}" for n in in_repo} <= set(names)


def test_wheel_ships_the_deviceclasses_dra_explain_reads(wheel: zipfile.ZipFile) -> None:
    shipped = wheel.read(f"{wheel_path('deploy/dra')}/deviceclasses.yaml")
    assert shipped == (REPO / "deploy" / "dra" / "deviceclasses.yaml").read_bytes()


def test_wheel_ships_the_proto_and_its_stubs(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for folder in ("plugin/deviceplugin/api", "plugin/agent/api", "plugin/dra/api"):
        files = [p for p in (REPO / folder).glob("*") if p.suffix in {".proto", ".py", ".pyi"}]
        assert files
        for path in files:
            assert f"{wheel_path(folder)}/{path.name}" in names


def test_every_part_registers_its_commands() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    commands = set(sub.choices)  # type: ignore[arg-type]
    expected = {"discover", "topo", "generate", "validate", "list", "policy", "plugin"}
    assert expected <= commands
