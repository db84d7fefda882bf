"""Scanning a driver root, a dev root and sysfs (a fake host built in a temp directory)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cdigen.cdi import devnodes, driverfiles, libdirs
from tests.cdihost import (
    DRIVER_VERSION,
    EXTRA_LIB_DIR,
    LIB_DIR,
    FakeHost,
    build_host,
    make_node,
    write_ld_cache,
)


@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path, make_node(2, mig_gpu=1), hook=True)


def test_libraries_with_sonames_from_standard_and_cached_dirs(fake: FakeHost) -> None:
    files = driverfiles.scan_driver(fake.driver_root, DRIVER_VERSION)
    found = {lib.path: lib.sonames for lib in files.libraries}
    expected = {p: ((s,) if s else ()) for p, s in fake.libraries}
    assert found == expected
    assert files.library_dirs == (LIB_DIR, EXTRA_LIB_DIR)
    lib = next(lib for lib in files.libraries if lib.path.endswith(f"libcuda.so.{DRIVER_VERSION}"))
    assert Path(lib.host_path).read_text() == f"fake libcuda.so.{DRIVER_VERSION}\n"


def test_merged_usr_is_not_scanned_twice_and_other_libraries_are_ignored(fake: FakeHost) -> None:
    paths = [
        lib.path for lib in driverfiles.scan_driver(fake.driver_root, DRIVER_VERSION).libraries
    ]
    assert not any(p.startswith("/lib/") for p in paths)  # /lib -> usr/lib in the fake root
    assert not any("libz" in p for p in paths)
    assert len(paths) == len(set(paths))


def test_driver_version_is_detected_from_libcuda(fake: FakeHost) -> None:
    files = driverfiles.scan_driver(fake.driver_root, "")
    assert files.driver_version == DRIVER_VERSION
    assert len(files.libraries) == len(fake.libraries)


def test_other_driver_version_finds_no_libraries(fake: FakeHost) -> None:
    assert driverfiles.scan_driver(fake.driver_root, "535.104.05").libraries == ()


def test_binaries_firmware_and_ipc(fake: FakeHost) -> None:
    files = driverfiles.scan_driver(fake.driver_root, DRIVER_VERSION)
    assert [b.path for b in files.binaries] == [
        "/usr/bin/nvidia-smi",
        "/usr/bin/nvidia-debugdump",
        "/usr/bin/nvidia-persistenced",
        "/usr/bin/nvidia-cuda-mps-control",
    ]
    assert [f.path for f in files.firmware] == [
        f"/lib/firmware/nvidia/{DRIVER_VERSION}/gsp_ga10x.bin",
        f"/lib/firmware/nvidia/{DRIVER_VERSION}/gsp_tu10x.bin",
    ]
    assert [f.path for f in files.ipc] == ["/run/nvidia-persistenced/socket"]
    assert files.ipc[0].host_path == str(fake.driver_root / "run/nvidia-persistenced/socket")


def test_empty_driver_root_finds_nothing(tmp_path: Path) -> None:
    files = driverfiles.scan_driver(tmp_path, "550.54.15")
    assert files.libraries == files.binaries == files.firmware == files.ipc == ()


def test_find_hook(fake: FakeHost, tmp_path: Path) -> None:
    assert driverfiles.find_hook(fake.driver_root) == str(
        fake.driver_root / "usr/bin/nvidia-cdi-hook"
    )
    assert driverfiles.find_hook(tmp_path / "nothing") is None


def test_device_node_reads_type_numbers_and_mode(fake: FakeHost) -> None:
    if not fake.real_nodes:
        pytest.skip("mknod is not permitted here")
    info = devnodes.device_node(fake.dev_root, "/dev/nvidia1")
    assert info == devnodes.DeviceNodeInfo(
        path="/dev/nvidia1",
        host_path=str(fake.dev_root / "dev/nvidia1"),
        type="c",
        major=195,
        minor=1,
        file_mode=0o666,
        permissions="rw",
    )
    cap = devnodes.device_node(fake.dev_root, "/dev/nvidia-caps/nvidia-cap66")
    assert (cap.major, cap.minor, cap.file_mode, cap.permissions) == (511, 66, 0o444, "r")


def test_missing_node_keeps_only_its_path(tmp_path: Path) -> None:
    info = devnodes.device_node(tmp_path, "/dev/nvidia0")
    assert info == devnodes.DeviceNodeInfo(
        path="/dev/nvidia0", host_path=str(tmp_path / "dev/nvidia0")
    )
    assert devnodes.device_node("/", "/dev/nvidia0").host_path == "/dev/nvidia0"


def test_control_nodes_only_those_present(fake: FakeHost) -> None:
    os.unlink(fake.dev_root / "dev/nvidia-modeset")
    assert [n.path for n in devnodes.control_nodes(fake.dev_root)] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]


@pytest.mark.parametrize("bus_id", ["00000000:07:00.0", "0000:07:00.0", "07:00.0"])
def test_drm_nodes_from_sysfs(fake: FakeHost, bus_id: str) -> None:
    assert devnodes.drm_nodes(fake.sysfs_root, bus_id) == ("/dev/dri/card1", "/dev/dri/renderD128")
    assert devnodes.drm_nodes(fake.sysfs_root, "0000:99:00.0") == ()


def test_ld_cache_round_trip(tmp_path: Path) -> None:
    entries = [("libcuda.so.1", "/usr/lib64/libcuda.so.1"), ("libx.so.2", "/opt/x/libx.so.2")]
    write_ld_cache(tmp_path / "ld.so.cache", entries)
    assert libdirs.read_ld_cache(tmp_path / "ld.so.cache") == entries
    (tmp_path / "junk").write_bytes(b"not a cache at all")
    assert libdirs.read_ld_cache(tmp_path / "junk") == []
    assert libdirs.read_ld_cache(tmp_path / "missing") == []


def test_ld_cache_truncated_is_unreadable_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "ld.so.cache"
    write_ld_cache(path, [("libcuda.so.1", "/usr/lib64/libcuda.so.1")])
    path.write_bytes(path.read_bytes()[:-1])  # the last string loses its terminating NUL
    assert libdirs.read_ld_cache(path) == []
    path.write_bytes(b"ld.so-1.7.0")  # an old-format magic and nothing after it
    assert libdirs.read_ld_cache(path) == []


@pytest.mark.skipif(
    not (os.path.exists("/etc/ld.so.cache") and shutil.which("ldconfig")),
    reason="needs this host's /etc/ld.so.cache and ldconfig to compare with",
)
def test_ld_cache_reader_agrees_with_ldconfig() -> None:
    listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True)
    expected = {
        (line.split()[0], line.split(" => ")[1])
        for line in listing.stdout.splitlines()[1:]
        if " => " in line and ("x86-64" in line or "AArch64" in line)
    }
    assert set(libdirs.read_ld_cache("/etc/ld.so.cache")) == expected
