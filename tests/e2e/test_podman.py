"""podman as a real CDI consumer of ``cdigen generate`` (recipe: shared/reference/podman-cdi.md).

A fake driver root, dev root (char devices made with mknod) and sysfs; ``cdigen generate`` writes
into a temporary CDI directory (the same spec, byte for byte, as ``--host-root`` writes from a copy
of that host mounted elsewhere) that is bind-mounted over /etc/cdi in a private mount namespace;
podman 4.3 + runc run a busybox rootfs with ``--device nvidia.com/gpu=...``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdigen.nodefile import dump_node
from tests.cdihost import DRIVER_VERSION, LIB_DIR, NVIDIA_MAJOR, FakeHost, build_host, make_node
from tests.helpers.podman import Podman
from tests.helpers.podman import missing_tools as podman_missing_tools


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Podman, FakeHost]]:
    reason = podman_missing_tools()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("podman")
    store = Path(tempfile.mkdtemp(prefix="cdigen-podman-", dir="/tmp"))
    try:
        yield from _prepare(base, store)
    finally:
        shutil.rmtree(store, ignore_errors=True)


def _prepare(base: Path, store: Path) -> Iterator[tuple[Podman, FakeHost]]:
    podman = Podman(base / "work", store)
    smoke = podman.run("true")
    if smoke.returncode != 0:
        pytest.skip(f"this machine cannot run containers at all: {smoke.stderr.strip()[-300:]}")
    host = build_host(base / "host", make_node(3, mig_gpu=2))  # GPU 2: two MIG devices
    if not host.real_nodes:
        pytest.skip("mknod is not permitted here, so no real device nodes for podman to use")
    node_file = base / "node.yaml"
    node_file.write_text(dump_node(host.node, "yaml"))
    result = subprocess.run(
        [
            sys.executable, "-m", "cdigen.cli", "generate",
            "--node", str(node_file),
            "--driver-root", str(host.driver_root),
            "--dev-root", str(host.dev_root),
            "--sysfs-root", str(host.sysfs_root),
            "--output-dir", str(podman.cdi),
            "--capabilities", "all",  # libnvidia-fbc (graphics) is the ld.so.cache-only one
        ],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (podman.cdi / "nvidia.com-gpu.yaml").exists()
    assert (
        _generate_with_host_root(base, host, node_file)
        == (podman.cdi / "nvidia.com-gpu.yaml").read_bytes()
    ), "--host-root wrote a different spec than the run podman uses below"
    yield podman, host


def _generate_with_host_root(base: Path, host: FakeHost, node_file: Path) -> bytes:
    """The spec from a copy of the same host mounted elsewhere, as in the host-driver DaemonSet:
    the host's / at ``base/hostroot``, the fake host inside it at its own path."""
    host_root = base / "hostroot"
    copy = host_root / str(host.base).lstrip("/")
    copy.parent.mkdir(parents=True)
    subprocess.run(["cp", "-a", str(host.base), str(copy)], check=True)  # keeps nodes and links
    out = base / "hostroot-spec" / "nvidia.com-gpu.yaml"
    result = subprocess.run(
        [
            sys.executable, "-m", "cdigen.cli", "generate",
            "--node", str(node_file),
            "--host-root", str(host_root),
            "--driver-root", str(host.driver_root),
            "--dev-root", str(host.dev_root),
            "--sysfs-root", str(host.sysfs_root),
            "--output", str(out),
            "--capabilities", "all",
        ],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out.read_bytes()


CHECK = (
    'stat -c "%n %F %t %T" /dev/nvidia{minor} /dev/nvidiactl; '
    f"cat {LIB_DIR}/libcuda.so.{DRIVER_VERSION} {LIB_DIR}/libcuda.so.1 "
    f"{LIB_DIR}/libnvidia-ml.so.1 /opt/nvidia/lib64/libnvidia-fbc.so.1; "
    "nvidia-smi; ls /dev/dri"
)


@pytest.mark.parametrize("by", ["index", "uuid"])
def test_gpu_zero_appears_with_devices_and_libraries(
    setup: tuple[Podman, FakeHost], by: str
) -> None:
    podman, host = setup
    gpu = host.node.gpus[0]
    assert gpu.minor != gpu.index  # the device node must follow the minor, not the index
    name = "0" if by == "index" else gpu.uuid
    result = podman.run(CHECK.format(minor=gpu.minor), f"nvidia.com/gpu={name}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # busybox stat prints major/minor in hex
    assert f"/dev/nvidia{gpu.minor} character special file {NVIDIA_MAJOR:x} {gpu.minor:x}" in lines
    assert f"/dev/nvidiactl character special file {NVIDIA_MAJOR:x} ff" in lines
    # the versioned file, its SONAME path (no ldconfig needed), and a library from ld.so.cache
    assert lines.count(f"fake libcuda.so.{DRIVER_VERSION}") == 2
    assert f"fake libnvidia-ml.so.{DRIVER_VERSION}" in lines
    assert f"fake libnvidia-fbc.so.{DRIVER_VERSION}" in lines
    assert "fake nvidia-smi" in lines
    assert "card1" in lines and "renderD128" in lines and "card2" not in lines


def test_other_gpu_is_not_visible(setup: tuple[Podman, FakeHost]) -> None:
    podman, host = setup
    other = host.node.gpus[1]
    result = podman.run(f"test ! -e /dev/nvidia{other.minor}", "nvidia.com/gpu=0")
    assert result.returncode == 0, result.stderr + result.stdout


def test_all_gives_every_gpu(setup: tuple[Podman, FakeHost]) -> None:
    podman, host = setup
    paths = " ".join(f"/dev/nvidia{g.minor}" for g in host.node.gpus)
    result = podman.run(f"ls {paths}", "nvidia.com/gpu=all")
    assert result.returncode == 0, result.stderr


def test_mig_device_gets_its_parent_and_capability_nodes(setup: tuple[Podman, FakeHost]) -> None:
    podman, host = setup
    gpu = host.node.gpus[2]
    mig = gpu.mig_devices[1]
    caps = " ".join(f"/dev/nvidia-caps/nvidia-cap{c}" for c in mig.cap_minors)
    other = gpu.mig_devices[0].cap_minors[0]
    script = f"ls /dev/nvidia{gpu.minor} {caps} && test ! -e /dev/nvidia-caps/nvidia-cap{other}"
    for name in (f"{gpu.index}:1", mig.uuid):
        result = podman.run(script, f"nvidia.com/gpu={name}")
        assert result.returncode == 0, result.stderr + result.stdout
    whole = podman.run("true", f"nvidia.com/gpu={gpu.index}")  # MIG on: no whole-GPU device
    assert f"unresolvable CDI devices nvidia.com/gpu={gpu.index}" in whole.stderr


def test_unknown_device_fails(setup: tuple[Podman, FakeHost]) -> None:
    podman, _ = setup
    result = podman.run("true", "nvidia.com/gpu=7")
    assert result.returncode != 0
    assert "unresolvable CDI devices nvidia.com/gpu=7" in result.stderr
