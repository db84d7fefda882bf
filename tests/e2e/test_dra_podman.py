"""podman runs a container with a device of a claim that ``cdigen dra serve`` prepared.

The DRA plugin in-process (the same wiring as tests/e2e/test_dra.py: the kubelet simulator, the
fake API server) prepares a claim on a fake host with real device nodes; its transient spec
directory is bind-mounted over /var/run/cdi in a private mount namespace (podman 4.3 reads only
/etc/cdi and /var/run/cdi; recipe: shared/reference/podman-cdi.md), and podman + runc run a busybox
rootfs with ``--device k8s.gpu.cdigen.dev/claim=<uid>-gpu-0``. After unprepare the name is gone.

Capabilities per claim (GpuConfig, ``--capability-devices graphics,video``): a container given a
claim's GPU and the capability devices prepare returned for it sees the Vulkan ICD and glvnd EGL
JSON, the GLX libraries and the video libraries, from inside; one of a claim without the config
sees none of them.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdigen.plugin.dra.checkpoint import claim_spec_path
from tests.cdihost import DRIVER_VERSION, LIB_DIR, NVIDIA_MAJOR, FakeHost, build_host, make_node
from tests.helpers.dra import DRIVER, Harness, add_claim, entry, gpu_config
from tests.helpers.podman import GRAPHICS_FILES, Podman, file_check
from tests.helpers.podman import missing_tools as podman_missing_tools

UID = "3f2c9a4e-5b1d-4c6e-8f00-0123456789ab"  # a real claim UID starts with a digit or a letter


class ClaimPodman(Podman):
    """podman with the plugin's spec dir at /var/run/cdi and nothing at /etc/cdi; the busybox
    root through an overlay, so each container starts from the same root."""

    def __init__(self, work: Path, store: Path, run_cdi: Path) -> None:
        super().__init__(work, store)
        self.run_cdi = run_cdi
        self.etc_cdi = work / "empty"
        self.var_run_cdi = run_cdi
        # through an overlay: runc leaves the mount points it makes in a plain root behind, and
        # the next container would see them (empty files where the last one had graphics)
        self.overlay = True


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    """Three GPUs (the third with MIG), graphics and video files in the driver root."""
    return build_host(tmp_path / "host", make_node(3, mig_gpu=2), graphics=True)


@pytest.fixture
def setup(harness: Harness, tmp_path: Path) -> Iterator[tuple[ClaimPodman, Harness]]:
    reason = podman_missing_tools()
    if reason:
        pytest.skip(reason)
    if not harness.host.real_nodes:
        pytest.skip("mknod is not permitted here, so no real device nodes for podman to use")
    store = Path(tempfile.mkdtemp(prefix="cdigen-podman-", dir="/tmp"))
    try:
        harness.cdi_dir.mkdir()
        podman = ClaimPodman(tmp_path / "work", store, harness.cdi_dir)
        smoke = podman.run("true")
        if smoke.returncode != 0:
            pytest.skip(f"this machine cannot run containers at all: {smoke.stderr.strip()[-300:]}")
        yield podman, harness
    finally:
        shutil.rmtree(store, ignore_errors=True)


def test_podman_runs_with_a_prepared_claims_device(setup: tuple[ClaimPodman, Harness]) -> None:
    podman, harness = setup
    harness.start()
    ref = harness.claim("train", UID, "gpu-0", "gpu-2-mig-8-0")
    answer = harness.kubelet.prepare([ref]).claims[UID]
    assert answer.error == ""
    gpu_id, mig_id = (d.cdi_device_ids[0] for d in answer.devices)
    assert gpu_id == f"k8s.{DRIVER}/claim={UID}-gpu-0"
    assert claim_spec_path(harness.cdi_dir, DRIVER, UID).exists()

    gpu0, gpu1 = harness.host.node.gpus[:2]
    script = (
        f'stat -c "%n %F %t %T" /dev/nvidia{gpu0.minor} /dev/nvidiactl; '
        f"cat {LIB_DIR}/libcuda.so.1; test ! -e /dev/nvidia{gpu1.minor} && echo no-other-gpu"
    )
    result = podman.run(script, gpu_id)
    assert result.returncode == 0, result.stderr + result.stdout
    lines = result.stdout.splitlines()
    # busybox stat prints major/minor in hex
    node = f"/dev/nvidia{gpu0.minor} character special file {NVIDIA_MAJOR:x} {gpu0.minor:x}"
    assert node in lines
    assert f"/dev/nvidiactl character special file {NVIDIA_MAJOR:x} ff" in lines
    assert f"fake libcuda.so.{DRIVER_VERSION}" in lines  # the SONAME path, without ldconfig
    assert "no-other-gpu" in lines

    mig_gpu = harness.host.node.gpus[2]
    mig = mig_gpu.mig_devices[1]
    caps = " ".join(f"/dev/nvidia-caps/nvidia-cap{c}" for c in mig.cap_minors)
    result = podman.run(f"ls /dev/nvidia{mig_gpu.minor} {caps}", mig_id)
    assert result.returncode == 0, result.stderr + result.stdout

    assert harness.kubelet.unprepare([ref]).claims[UID].error == ""
    gone = podman.run("true", gpu_id)
    assert gone.returncode != 0
    assert f"unresolvable CDI devices {gpu_id}" in gone.stderr


# What the video capability adds (cdigen.cdi.capabilities: vdpau, encode, cuvid), at SONAME paths
VIDEO_FILES = (
    f"{LIB_DIR}/vdpau/libvdpau_nvidia.so.1",
    f"{LIB_DIR}/libnvidia-encode.so.1",
    f"{LIB_DIR}/libnvcuvid.so.1",
)


def test_only_the_claim_asking_for_graphics_and_video_sees_their_files(
    setup: tuple[ClaimPodman, Harness],
) -> None:
    podman, harness = setup
    harness.start(capability_devices=("graphics", "video"))
    config = [entry("FromClaim", gpu_config("graphics", "video"))]
    render = add_claim(harness, "render", UID, {"gpu-0": "gpu"}, config)
    plain_uid = "7d1e0b2a-9c4f-4e3b-a1d2-fedcba987654"
    plain = add_claim(harness, "plain", plain_uid, {"gpu-1": "gpu"}, [])
    response = harness.kubelet.prepare([render, plain])
    names: dict[str, list[str]] = {}
    for uid in (UID, plain_uid):
        answer = response.claims[uid]
        assert answer.error == ""
        (device,) = answer.devices
        names[uid] = list(device.cdi_device_ids)
        spec = json.loads(claim_spec_path(harness.cdi_dir, DRIVER, uid).read_text())
        in_spec = {f"{spec['kind']}={d['name']}" for d in spec["devices"]}
        assert set(names[uid]) == in_spec  # podman resolves exactly what prepare returned
    assert names[UID][0] == f"k8s.{DRIVER}/claim={UID}-gpu-0"
    # after the GPU, one device per capability asked, named <claim UID>-capability-<name>
    asked = sorted(n.split(f"={UID}-capability-")[1] for n in names[UID][1:])
    assert asked == ["graphics", "video"], names
    assert len(names[plain_uid]) == 1, names

    script = file_check(GRAPHICS_FILES + VIDEO_FILES)
    given = podman.run(f"cat {LIB_DIR}/libcuda.so.1; {script}", *names[UID])
    assert given.returncode == 0, given.stderr + given.stdout
    assert f"fake libcuda.so.{DRIVER_VERSION}" in given.stdout  # the GPU's own edits still apply
    for path in GRAPHICS_FILES + VIDEO_FILES:
        assert f"HAVE {path}" in given.stdout, given.stdout
    # the host's files, not empty mount points
    assert '{"file": "/usr/share/vulkan/icd.d/nvidia_icd.json"}' in given.stdout
    assert '{"file": "/usr/share/glvnd/egl_vendor.d/10_nvidia.json"}' in given.stdout
    assert f"fake libvdpau_nvidia.so.{DRIVER_VERSION}" in given.stdout

    alone = podman.run(script, *names[plain_uid])
    assert alone.returncode == 0, alone.stderr + alone.stdout
    assert "HAVE" not in alone.stdout and "LINK" not in alone.stdout, alone.stdout
