"""podman runs a container with a device of a claim that ``cdigen dra serve`` prepared.

The DRA plugin in-process (the same wiring as tests/e2e/test_dra.py: the kubelet simulator, the
fake API server) prepares a claim on a fake host with real device nodes; its transient spec
directory is bind-mounted over /var/run/cdi in a private mount namespace (podman 4.3 reads only
/etc/cdi and /var/run/cdi; recipe: shared/reference/podman-cdi.md), and podman + runc run a busybox
rootfs with ``--device k8s.gpu.cdigen.dev/claim=<uid>-gpu-0``. After unprepare the name is gone.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugin.dra.prepare import claim_spec_path
from tests.cdihost import DRIVER_VERSION, LIB_DIR, NVIDIA_MAJOR, build_host, make_node
from tests.fake_apiserver import FakeApiServer
from tests.helpers.dra import DRIVER, NODE_NAME, Harness
from tests.helpers.podman import Podman
from tests.helpers.podman import missing_tools as podman_missing_tools

UID = "3f2c9a4e-5b1d-4c6e-8f00-0123456789ab"  # a real claim UID starts with a digit or a letter


class ClaimPodman(Podman):
    """podman with the plugin's spec dir at /var/run/cdi and nothing at /etc/cdi."""

    def __init__(self, work: Path, store: Path, run_cdi: Path) -> None:
        super().__init__(work, store)
        self.run_cdi = run_cdi
        self.etc_cdi = work / "empty"
        self.var_run_cdi = run_cdi


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[ClaimPodman, Harness]]:
    reason = podman_missing_tools()
    if reason:
        pytest.skip(reason)
    store = Path(tempfile.mkdtemp(prefix="cdigen-podman-", dir="/tmp"))
    kubelet_dir = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))
    api = FakeApiServer().start()
    api.nodes[NODE_NAME] = {"metadata": {"name": NODE_NAME, "uid": "node-uid-1"}}
    harness: Harness | None = None
    try:
        host = build_host(tmp_path / "host", make_node(3, mig_gpu=2))
        if not host.real_nodes:
            pytest.skip("mknod is not permitted here, so no real device nodes for podman to use")
        harness = Harness(api, host, kubelet_dir, tmp_path)
        harness.cdi_dir.mkdir()
        podman = ClaimPodman(tmp_path / "work", store, harness.cdi_dir)
        smoke = podman.run("true")
        if smoke.returncode != 0:
            pytest.skip(f"this machine cannot run containers at all: {smoke.stderr.strip()[-300:]}")
        yield podman, harness
    finally:
        if harness is not None:
            harness.stop()
        api.stop()
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(kubelet_dir, ignore_errors=True)


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
