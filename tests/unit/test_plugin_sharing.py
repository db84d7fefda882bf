"""Sharing in the plugin: config, resource planning, and Allocate under every strategy.

The plugin runs in-process on real unix sockets, seen through the kubelet simulator.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cdigen.cli import main
from cdigen.discover import load_node
from cdigen.errors import InputError
from cdigen.model import Node
from cdigen.plugin.deviceplugin.config import PluginConfig, ResourceConfig, load_config
from cdigen.plugin.deviceplugin.gpu_selector import GpuSelector
from cdigen.plugin.deviceplugin.runner import Plugin
from cdigen.plugin.deviceplugin.sharing import ShareRefused, Sharing, allocate_shares
from tests.kubelet_sim import KubeletSimulator

SLICES = "nvidia.com/gpu-memory"
REPLICAS = "nvidia.com/gpu.shared"
RTX = "builtin:rtx4090"
EIGHT = "builtin:pcie-8x4090"  # a GPU for each resource of SHARING_YAML
SHM = "/dev/shm"

SHARING_YAML = f"""\
resources:
  - name: nvidia.com/gpu
    gpus: [0]
  - name: {REPLICAS}
    gpus: [1]
    policy: pack
    sharing: {{replicas: 4, failRequestsGreaterThanOne: true}}
  - name: {SLICES}
    gpus: [2]
    sharing:
      memorySliceMiB: 1024
      mps: {{pipeDirectory: /run/nvidia/mps, shmDirectory: /run/nvidia/mps-shm}}
"""


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plugin.yaml"
    path.write_text(text)
    return path


# --- config -----------------------------------------------------------------------------------


def test_whole_gpus_replicas_and_slices_may_be_served_together_on_gpus_of_their_own(
    tmp_path: Path,
) -> None:
    config = load_config(config_file(tmp_path, SHARING_YAML), env={})
    assert config.resources == (
        ResourceConfig("nvidia.com/gpu", gpus=GpuSelector((0,))),
        ResourceConfig(
            REPLICAS,
            "pack",
            Sharing(replicas=4, fail_requests_greater_than_one=True),
            gpus=GpuSelector((1,)),
        ),
        ResourceConfig(
            SLICES,
            None,
            Sharing(
                memory_slice_mib=1024,
                mps_pipe_directory="/run/nvidia/mps",
                mps_shm_directory="/run/nvidia/mps-shm",
            ),
            gpus=GpuSelector((2,)),
        ),
    )
    assert config.gpu_resource == "nvidia.com/gpu" and config.advertises_whole_gpus
    assert [r.name for r in config.sharing_resources] == [REPLICAS, SLICES]


def test_resource_flag_keeps_a_single_resource_sharing(tmp_path: Path) -> None:
    path = config_file(tmp_path, f"resources:\n  - name: {SLICES}\n    sharing: {{replicas: 2}}\n")
    config = load_config(path, env={}, flags={"resource": "example.com/gpu.shared"})
    assert config.resources == (ResourceConfig("example.com/gpu.shared", None, Sharing(2)),)
    assert not config.advertises_whole_gpus


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "resources:\n  - name: a.com/gpu\n  - name: b.com/gpu\n",
            "resources a.com/gpu and b.com/gpu would both advertise every GPU",
        ),
        (
            "resources:\n  - {name: a.com/x, sharing: {replicas: 2}}\n"
            "  - {name: a.com/x, sharing: {memorySliceMiB: 512}}\n",
            "resource a.com/x is listed more than once",
        ),
        (
            "migStrategy: mixed\nresources:\n  - {name: nvidia.com/mig-1g.10gb, "
            "sharing: {replicas: 2}}\n",
            "per-profile MIG resource and cannot be shared",
        ),
        (
            "resources:\n  - {name: a.com/x, sharing: {}}\n",
            "resources[0].sharing: sharing needs exactly one of replicas and memorySliceMiB",
        ),
        (
            "resources:\n  - {name: a.com/y}\n  - {name: a.com/x, sharing: {replicas: 2000}}\n",
            "resources[1].sharing.replicas",
        ),
        ("resources:\n  - {name: a.com/x, sharing: {slices: 3}}\n", "slices"),
        (
            "resources:\n  - {name: a.com/x, sharing: {replicas: 2, mps: {pipeDirectory: r}}}\n",
            "pipeDirectory",
        ),
        (
            "resources:\n  - {name: a.com/x, sharing: {replicas: 2, mps: {pipeDirectory: /p, "
            "shmDirectory: shm}}}\n",
            "resources[0].sharing.mps.shmDirectory: 'shm' does not match '^/'",
        ),
        (
            "resources:\n  - {name: a.com/x, sharing: {replicas: 2, mps: {pipeDirectory: /p, "
            "shmDirectory: /dev//shm/}}}\n",
            "resources[0].sharing: mps.shmDirectory must not be the node's own /dev/shm",
        ),
        (
            "resources:\n  - {name: a.com/x, sharing: {replicas: 2, mps: {shmDirectory: /s}}}\n",
            "resources[0].sharing.mps: 'pipeDirectory' is a dependency of 'shmDirectory'",
        ),
        (
            "resources:\n  - {name: a.com/x, sharing: {replicas: 2, mps: {pipeDirectory: /p, "
            "shmDirectory: /p/}}}\n",
            "mps.shmDirectory must not be the pipe directory '/p'",
        ),
        (
            "resources:\n  - {name: a.com/x, sharing: {replicas: 2, mps: {shm: /s}}}\n",
            "'shm' was unexpected",
        ),
    ],
)
def test_bad_sharing_configs_are_one_line_input_errors(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(InputError, match=re.escape(message)) as caught:
        load_config(config_file(tmp_path, text), env={})
    assert "\n" not in str(caught.value)


# --- resource planning ------------------------------------------------------------------------


def plan(node: Node, *resources: ResourceConfig, **kw: object) -> dict[str, list[str]]:
    config = dataclasses.replace(PluginConfig(), resources=resources, **kw)  # type: ignore[arg-type]
    plugin = Plugin(config, node=node)
    return {r.name: [d.id for d in r.devices] for r in plugin.resources}


def test_sharing_only_configs_do_not_advertise_whole_gpus_as_well() -> None:
    node = load_node(RTX)
    uuid = node.gpus[0].uuid
    shared = ResourceConfig(REPLICAS, sharing=Sharing(replicas=2))
    assert plan(node, shared) == {REPLICAS: [f"{uuid}::0", f"{uuid}::1"]}
    eight = load_node(EIGHT)
    first, second = (g.uuid for g in eight.gpus[:2])
    whole = ResourceConfig(gpus=GpuSelector((0,)))
    assert plan(eight, whole, dataclasses.replace(shared, gpus=GpuSelector((1,)))) == {
        "nvidia.com/gpu": [first],
        REPLICAS: [f"{second}::0", f"{second}::1"],
    }


def test_mig_enabled_gpus_are_not_shared() -> None:
    node = load_node("builtin:dgx-a100-mig-mixed")
    plain = [g.uuid for g in node.gpus if not g.mig_enabled]
    assert plain and len(plain) < len(node.gpus)
    planned = plan(node, ResourceConfig(REPLICAS, sharing=Sharing(replicas=2)))
    assert sorted({i.split("::")[0] for i in planned[REPLICAS]}) == sorted(plain)


# --- Allocate, in-process ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def spec_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cdi")
    assert main(["generate", "--node", EIGHT, "--output-dir", str(out)]) == 0
    return out


def serve(tmp_path: Path, spec_dir: Path, strategy: str) -> Iterator[KubeletSimulator]:
    config = load_config(
        config_file(tmp_path, SHARING_YAML),
        env={},
        flags={
            "plugin_dir": tmp_path / "plugins",
            "spec_dirs": [str(spec_dir)],
            "device_list_strategy": strategy,
        },
    )
    plugin = Plugin(config, node=load_node(EIGHT))
    with KubeletSimulator(config.plugin_dir) as kubelet:
        plugin.start()
        try:
            for name in ("nvidia.com/gpu", REPLICAS, SLICES):
                kubelet.wait_registered(name)
            yield kubelet
        finally:
            plugin.stop()


@pytest.fixture
def cdi_cri(tmp_path: Path, spec_dir: Path) -> Iterator[KubeletSimulator]:
    yield from serve(tmp_path, spec_dir, "cdi-cri")


def ids(kubelet: KubeletSimulator, resource: str) -> list[str]:
    return [d.ID for d in kubelet.wait_devices(resource)]


def test_pods_on_each_resource_get_the_card_of_that_resource(cdi_cri: KubeletSimulator) -> None:
    uuids = [g.uuid for g in load_node(EIGHT).gpus]
    whole = cdi_cri.allocate("nvidia.com/gpu", [ids(cdi_cri, "nvidia.com/gpu")])
    replica = cdi_cri.allocate(REPLICAS, [ids(cdi_cri, REPLICAS)[:1]])
    sliced = cdi_cri.allocate(SLICES, [ids(cdi_cri, SLICES)[:4], ids(cdi_cri, SLICES)[4:5]])
    names = [
        [d.name for d in c.cdi_devices]
        for r in (whole, replica, sliced)
        for c in r.container_responses
    ]
    assert names == [[f"nvidia.com/gpu={uuids[p]}"] for p in (0, 1, 2, 2)]
    limits = [c.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] for c in sliced.container_responses]
    assert limits == ["0=4096M", "0=1024M"]
    assert not whole.container_responses[0].envs and not whole.container_responses[0].mounts
    # MPS clients (the slices) get the daemon's shared memory at /dev/shm, writable; the plain
    # time-sliced replica (no MPS) and the whole GPU get no mounts at all
    for container in sliced.container_responses:
        shm = [(m.host_path, m.read_only) for m in container.mounts if m.container_path == SHM]
        assert shm == [("/run/nvidia/mps-shm", False)]
    assert not replica.container_responses[0].mounts


def test_a_refused_container_names_its_index(cdi_cri: KubeletSimulator) -> None:
    replicas = ids(cdi_cri, REPLICAS)
    with pytest.raises(grpc.RpcError) as caught:
        cdi_cri.allocate(REPLICAS, [replicas[:1], replicas[1:3]])
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (caught.value.details() or "").startswith("container request 1: ")


def test_a_whole_gpu_id_is_not_a_share(cdi_cri: KubeletSimulator) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        cdi_cri.allocate(SLICES, [ids(cdi_cri, "nvidia.com/gpu")])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("strategy", ["envvar", "native", "cdi-annotations"])
def test_shares_under_other_strategies(tmp_path: Path, spec_dir: Path, strategy: str) -> None:
    uuid = load_node(EIGHT).gpus[2].uuid  # SLICES' GPU
    for kubelet in serve(tmp_path, spec_dir, strategy):
        response = kubelet.allocate(SLICES, [ids(kubelet, SLICES)[:3]]).container_responses[0]
        assert response.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=3072M"
        assert response.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia/mps"
        mounts = [(m.host_path, m.container_path) for m in response.mounts]
        assert ("/run/nvidia/mps", "/run/nvidia/mps") in mounts
        if strategy == "envvar":
            assert response.envs["NVIDIA_VISIBLE_DEVICES"] == uuid  # the GPU, not the slices
        elif strategy == "native":
            assert [d.container_path for d in response.devices] == ["/dev/nvidia2"]
        else:
            assert list(response.annotations.values()) == [f"nvidia.com/gpu={uuid}"]


def test_the_shm_directory_is_checked_like_the_pipe_directory(tmp_path: Path) -> None:
    """A missing directory is mounted (the runtime makes it, as for the pipe directory), a real
    one (world-writable, as /dev/shm is) too; a symlink or a file is refused, saying why."""
    node = load_node(RTX)
    share = [f"{node.gpus[0].uuid}::slice-0"]
    shm = tmp_path / "node" / "mps-shm"
    sharing = Sharing(
        memory_slice_mib=1024, mps_pipe_directory=str(tmp_path / "pipe"), mps_shm_directory=str(shm)
    )

    def mounts() -> list[tuple[str, str, bool]]:
        got = allocate_shares(share, node, sharing, cdi_kind="nvidia.com/gpu", resource=SLICES)
        return [(m.host_path, m.container_path, m.read_only) for m in got.mounts]

    pipe_mount = (str(tmp_path / "pipe"), str(tmp_path / "pipe"), True)
    assert mounts() == [pipe_mount, (str(shm), SHM, False)]  # not there yet
    shm.parent.mkdir(mode=0o755)
    shm.mkdir()
    shm.chmod(0o1777)
    assert mounts() == [pipe_mount, (str(shm), SHM, False)]
    shm.rmdir()
    shm.symlink_to("/dev/shm")
    with pytest.raises(ShareRefused, match=re.escape(f"{shm} is a symlink")) as refused:
        mounts()
    assert "sharing.mps.shmDirectory" in str(refused.value) and "\n" not in str(refused.value)
    shm.unlink()
    shm.write_text("")
    with pytest.raises(ShareRefused, match="is not a directory"):
        mounts()


def test_an_empty_spec_dir_is_one_error_and_one_warning_per_gpu(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 35 e: the 23 slices of a 4090 lack one CDI name, said once; they turn Unhealthy
    in one line, not 23."""
    import logging

    (tmp_path / "cdi").mkdir()
    path = config_file(
        tmp_path, f"resources:\n  - {{name: {SLICES}, sharing: {{memorySliceMiB: 1024}}}}\n"
    )
    config = load_config(
        path,
        env={},
        flags={"plugin_dir": tmp_path / "plugins", "spec_dirs": [str(tmp_path / "cdi")]},
    )
    node = load_node(RTX)
    plugin = Plugin(config, node=node)
    with caplog.at_level(logging.INFO), KubeletSimulator(config.plugin_dir) as kubelet:
        plugin.start()
        try:
            kubelet.wait_registered(SLICES)
            kubelet.wait_devices(SLICES, lambda ds: all(d.health == "Unhealthy" for d in ds))
        finally:
            plugin.stop()
    name = f"nvidia.com/gpu={node.gpus[0].uuid}"
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].count(name) == 1, errors
    assert "23 device(s) advertised Unhealthy" in errors[0]
    unhealthy = [r.getMessage() for r in caplog.records if "Unhealthy:" in r.getMessage()]
    assert unhealthy == [
        f"23 devices ({node.gpus[0].uuid}::slice-0 … {node.gpus[0].uuid}::slice-22) are "
        f"Unhealthy: CDI name {name} missing from the spec dirs"
    ]


@pytest.mark.parametrize("bad", ["pipe", "shm"])
def test_both_wings_mount_the_mps_directories_alike_and_refuse_the_same_one(
    tmp_path: Path, bad: str
) -> None:
    """Issue 36 point 1: one MPS module. A device-plugin share and a DRA claim limited on the
    same node get the same mounts (the pipe directory read-only at its path, the shm directory
    writable at /dev/shm) and refuse the same symlinked directory for the same reason."""
    from cdigen.plugin.dra.claims import AllocatedDevice
    from cdigen.plugin.dra.mps import MpsSettings, claim_limits
    from cdigen.policies.device_view import device_views

    node = load_node(RTX)
    pipe, shm = tmp_path / "pipe", tmp_path / "shm"
    sharing = Sharing(
        memory_slice_mib=1024, mps_pipe_directory=str(pipe), mps_shm_directory=str(shm)
    )
    settings = MpsSettings(pipe_dir=str(pipe), shm_dir=str(shm))
    views = {v.name: v for v in device_views(node)}
    claim = [AllocatedDevice(request="r", device="gpu-0", consumed={"memory": "3Gi"})]

    def plugin_mounts() -> list[tuple[str, str, bool]]:
        share = [f"{node.gpus[0].uuid}::slice-0"]
        got = allocate_shares(share, node, sharing, cdi_kind="nvidia.com/gpu", resource=SLICES)
        return [(m.host_path, m.container_path, m.read_only) for m in got.mounts]

    def dra_mounts() -> list[tuple[str, str, bool]]:
        _, mounts = claim_limits(claim, views, settings)
        return [(m["hostPath"], m["containerPath"], "ro" in m["options"]) for m in mounts]

    expected = [(str(pipe), str(pipe), True), (str(shm), SHM, False)]
    assert plugin_mounts() == dra_mounts() == expected
    (tmp_path / "elsewhere").mkdir()
    (pipe if bad == "pipe" else shm).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ShareRefused) as plugin_refused:
        plugin_mounts()
    with pytest.raises(InputError) as dra_refused:
        dra_mounts()
    reason = f"{tmp_path / bad} is a symlink"
    assert reason in str(plugin_refused.value) and reason in str(dra_refused.value)
