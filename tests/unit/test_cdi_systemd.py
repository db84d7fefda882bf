"""deploy/systemd: the units parse, and their command lines are ones this cdigen accepts."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from cdigen.cli import build_parser

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
SERVICE = UNITS / "cdigen-generate.service"
PATH_UNIT = UNITS / "cdigen-generate.path"


def directives(unit: Path, key: str) -> list[str]:
    """Every value of ``key=`` in a unit file (systemd allows repeats)."""
    return [
        line.partition("=")[2].strip()
        for line in unit.read_text().splitlines()
        if line.partition("=")[0].strip() == key
    ]


def test_service_commands_parse_with_this_cdigen() -> None:
    commands = directives(SERVICE, "ExecStart")
    assert [shlex.split(c)[1] for c in commands] == ["discover", "generate"]
    parser = build_parser()
    for command in commands:
        argv = shlex.split(command)
        assert argv[0].endswith("/cdigen")
        args = parser.parse_args(argv[1:])
        assert callable(args.func)
    generate = parser.parse_args(shlex.split(commands[1])[1:])
    assert generate.output_dir == "/etc/cdi" and generate.node == "/run/cdigen/node.yaml"


def test_service_runs_before_the_runtimes_and_can_run_again() -> None:
    before = " ".join(directives(SERVICE, "Before")).split()
    assert {"containerd.service", "crio.service", "kubelet.service"} <= set(before)
    assert directives(SERVICE, "Type") == ["oneshot"]
    assert directives(SERVICE, "RemainAfterExit") == []  # else the .path unit could not restart it


def test_path_unit_watches_the_module_tree_and_the_loader_cache() -> None:
    assert directives(PATH_UNIT, "Unit") == [SERVICE.name]
    assert directives(PATH_UNIT, "PathChanged") == [
        "/lib/modules/%v/modules.dep",
        "/etc/ld.so.cache",
    ]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    # verify insists that ExecStart binaries exist: point them at /bin/true
    text = SERVICE.read_text().replace("/opt/cdigen/bin/cdigen", "/bin/true")
    (tmp_path / SERVICE.name).write_text(text)
    shutil.copy(PATH_UNIT, tmp_path / PATH_UNIT.name)
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *(str(p) for p in sorted(tmp_path.iterdir()))],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    # unknown keys and bad values are only warnings (exit 0), naming the file
    warnings = [line for line in result.stderr.splitlines() if str(tmp_path) in line]
    assert warnings == []
