"""``cdigen generate`` never writes a silently empty spec (issue 11, point 3).

A root flag that points at nothing is refused. A driver root without the node's driver libraries
is refused for a node NVML reported (the pynvml double stands in for the hardware) and is one
warning line for a simulated node.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

from cdigen.cdi.driverfiles import detect_driver_version
from cdigen.cli import main
from cdigen.nodefile import dump_node
from tests.cdihost import DRIVER_VERSION, FakeHost, build_host, make_node
from tests.fakes.fake_pynvml import FakeNvml

OTHER_VERSION = "535.104.05"


def roots(host: FakeHost) -> list[str]:
    return [
        "--driver-root", str(host.driver_root),
        "--dev-root", str(host.dev_root),
        "--sysfs-root", str(host.sysfs_root),
    ]  # fmt: skip


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("flag", ["--driver-root", "--dev-root", "--sysfs-root", "--hook-path"])
def test_a_root_flag_that_points_at_nothing_is_refused(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cdi"
    argv = ["generate", "--node", "builtin:rtx4090", flag, "/nonexistent", "--output-dir", str(out)]
    assert main(argv) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"cdigen: error: {flag}: '/nonexistent' does not exist")
    assert not out.exists()


def test_driver_root_nonexistent_with_dry_run_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["generate", "--node", "builtin:rtx4090", "--driver-root", "/nonexistent", "--dry-run"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "--driver-root: '/nonexistent' does not exist" in one_line(captured.err)


def test_a_hook_path_that_is_not_executable_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hook = tmp_path / "nvidia-cdi-hook"
    hook.write_text("#!/bin/sh\n")
    argv = ["generate", "--node", "builtin:rtx4090", "--hook-path", str(hook), "--dry-run"]
    assert main(argv) == 2
    assert f"'{hook}' is not an executable file" in one_line(capsys.readouterr().err)


def test_a_root_under_host_root_is_looked_up_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "sys").mkdir()
    argv = ["generate", "--node", "builtin:rtx4090", "--host-root", str(tmp_path), "--dry-run"]
    assert main([*argv, "--driver-root", "/run/nvidia/driver"]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"'/run/nvidia/driver' does not exist under --host-root {tmp_path}" in line


def nvml_generate(host: FakeHost, reported: str, out: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """``generate --node nvml`` where NVML (the double) reports driver ``reported``."""
    node = make_node(2, driver_version=reported)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(node))
    return main(["generate", "--node", "nvml", *roots(host), "--output-dir", str(out)])


def test_nvml_node_with_another_versions_libraries_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    host = build_host(tmp_path / "host", make_node(2, driver_version=OTHER_VERSION))
    out = tmp_path / "cdi"
    assert nvml_generate(host, DRIVER_VERSION, out, monkeypatch) == 2
    line = one_line(capsys.readouterr().err)
    assert f"--driver-root {host.driver_root}:" in line
    assert f"driver {OTHER_VERSION}'s" in line and f"running driver is {DRIVER_VERSION}" in line
    assert not out.exists()


def test_nvml_node_with_a_driver_root_without_libraries_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    host = build_host(tmp_path / "host", make_node(2))
    empty = tmp_path / "empty"
    empty.mkdir()
    node = make_node(2)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(node))
    argv = ["generate", "--node", "nvml", *roots(host), "--driver-root", str(empty), "--dry-run"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    line = one_line(captured.err)
    assert f"--driver-root {empty}: no libraries of the running driver {DRIVER_VERSION}" in line
    assert "/run/nvidia/driver" in line and captured.out == ""


def test_nvml_node_with_its_drivers_libraries_writes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    host = build_host(tmp_path / "host", make_node(2))
    out = tmp_path / "cdi"
    assert nvml_generate(host, DRIVER_VERSION, out, monkeypatch) == 0
    assert capsys.readouterr().err == ""
    spec = yaml.safe_load((out / "nvidia.com-gpu.yaml").read_text())
    mounted = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
    assert f"/usr/lib/x86_64-linux-gnu/libcuda.so.{DRIVER_VERSION}" in mounted


def test_simulated_node_with_another_versions_libraries_is_one_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = build_host(tmp_path / "host", make_node(2, driver_version=OTHER_VERSION))
    node_file = tmp_path / "node.yaml"
    node_file.write_text(dump_node(make_node(2), "yaml"))  # says DRIVER_VERSION
    argv = ["generate", "--node", str(node_file), *roots(host), "--dry-run"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    line = one_line(captured.err)
    assert line.startswith("cdigen: warning: the spec lists device nodes only")
    assert f"{node_file} says driver {DRIVER_VERSION}" in line
    assert f"{host.driver_root} has driver {OTHER_VERSION}'s libraries" in line
    spec = yaml.safe_load(captured.out)
    mounted = [m["containerPath"] for m in spec["containerEdits"].get("mounts", [])]
    assert not [p for p in mounted if ".so" in p] and len(spec["devices"]) == 5


def test_quick_start_exits_0_and_says_why_the_spec_has_no_libraries(
    capsys: pytest.CaptureFixture[str],
) -> None:
    if detect_driver_version("/"):  # pragma: no cover - a machine with a driver installed
        pytest.skip("this machine has NVIDIA driver libraries")
    assert main(["generate", "--node", "builtin:rtx4090", "--dry-run"]) == 0
    captured = capsys.readouterr()
    line = one_line(captured.err)
    assert "device nodes only" in line and "no NVIDIA driver libraries" in line
    assert "--driver-root /" in line
    assert yaml.safe_load(captured.out)["kind"] == "nvidia.com/gpu"


def test_a_node_file_discover_wrote_from_nvml_counts_as_the_hardware(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The boot flow ``discover -o node.yaml`` then ``generate --node node.yaml``: the file is
    NVML's word, so a root with another driver's libraries is refused, not a warning."""
    host = build_host(tmp_path / "host", make_node(2, driver_version=OTHER_VERSION))
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(make_node(2)))  # runs DRIVER_VERSION
    node_file = tmp_path / "node.yaml"
    discover = ["discover", "--node", "nvml", "--sysfs-root", str(host.sysfs_root)]
    assert main([*discover, "-o", str(node_file)]) == 0
    assert yaml.safe_load(node_file.read_text())["discoveredBy"] == "nvml"
    capsys.readouterr()
    argv = ["generate", "--node", str(node_file), *roots(host), "--dry-run"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    line = one_line(captured.err)
    assert f"running driver is {DRIVER_VERSION} (NVML, as {node_file} records it)" in line
    assert captured.out == ""


def test_a_driver_upgrade_rewrites_the_spec_with_only_the_new_versions_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The boot flow after a driver upgrade on disk, over a spec an older cdigen wrote (another
    header line, another cdiVersion): the spec is taken over and replaced by a new file (a new
    inode: renamed into place, never rewritten in place), naming none of the old version's
    files."""
    out = tmp_path / "cdi"
    node_file = tmp_path / "node.yaml"
    node_file.write_text(dump_node(make_node(2, driver_version=OTHER_VERSION), "yaml"))
    host = build_host(tmp_path / "host", make_node(2, driver_version=OTHER_VERSION))
    argv = ["generate", "--node", str(node_file), *roots(host), "--output-dir", str(out)]
    assert main(argv) == 0
    target = out / "nvidia.com-gpu.yaml"
    old = target.read_text()
    assert OTHER_VERSION in old and DRIVER_VERSION not in old
    header, rest = old.split("\n", 1)
    target.write_text("# Generated by cdigen 0.0.1\n" + rest.replace("0.5.0", "0.3.0", 1))
    inode = target.stat().st_ino

    shutil.rmtree(tmp_path / "host")  # the package manager replaces the driver's files
    build_host(tmp_path / "host", make_node(2))
    node_file.write_text(dump_node(make_node(2), "yaml"))  # discover at boot: DRIVER_VERSION
    capsys.readouterr()
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith(f"wrote {target}")
    new = target.read_text()
    assert new.startswith(header + "\n") and "cdiVersion: 0.5.0" in new
    assert OTHER_VERSION not in new and f"libcuda.so.{DRIVER_VERSION}" in new
    assert target.stat().st_ino != inode
    assert sorted(p.name for p in out.iterdir()) == [".cdigen.lock", target.name]
