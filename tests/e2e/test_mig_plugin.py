"""MIG end to end: the plugin serving MIG devices to the kubelet simulator, per strategy.

Real files in temp dirs, a real gRPC server per resource on real unix sockets, the CDI spec
written by the plugin's own generation and read back by ``cdigen list``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cdigen.cli import main
from cdigen.discover import load_node
from cdigen.model import Node
from cdigen.nodefile import dump_node
from cdigen.plugin.deviceplugin.config import HealthConfig, PluginConfig
from cdigen.plugin.deviceplugin.runner import Plugin
from tests.fakes.event_nvml import EventNvml
from tests.helpers.mig import repartition
from tests.kubelet_sim import KubeletSimulator

GPU = "nvidia.com/gpu"
MIXED = "builtin:dgx-a100-mig-mixed"


def mixed_config(tmp_path: Path, node: str = MIXED, **kw: object) -> PluginConfig:
    """A mixed-strategy plugin that writes its own CDI spec under tmp_path."""
    libs = tmp_path / "driver" / "usr" / "lib" / "x86_64-linux-gnu"
    libs.mkdir(parents=True, exist_ok=True)
    # the running driver's libcuda, as generate's guard wants it (the samples say 535.129.03)
    (libs / "libcuda.so.535.129.03").write_bytes(b"")
    (tmp_path / "dev").mkdir(parents=True, exist_ok=True)
    settings: dict[str, object] = {
        "node": node,
        "plugin_dir": tmp_path / "plugins",
        "spec_dirs": (tmp_path / "cdi",),
        "mig_strategy": "mixed",
        "generate_specs": True,
        "driver_root": str(tmp_path / "driver"),
        "dev_root": str(tmp_path / "dev"),
        "health": HealthConfig(poll_interval_s=0.05, recover_after_s=60),
    }
    settings.update(kw)
    return PluginConfig(**settings)  # type: ignore[arg-type]


def profiles(node: Node) -> dict[str, list[str]]:
    """MIG UUIDs per profile, as the node describes them."""
    out: dict[str, list[str]] = {}
    for gpu in node.gpus:
        for mig in gpu.mig_devices:
            out.setdefault(mig.profile, []).append(mig.uuid)
    return out


def listed_names(spec_dir: Path, capsys: pytest.CaptureFixture[str]) -> set[str]:
    """The names ``cdigen list`` shows for ``spec_dir``."""
    capsys.readouterr()
    assert main(["list", "--spec-dir", str(spec_dir)]) == 0
    return {line.split("\t")[0] for line in capsys.readouterr().out.splitlines() if line}


def test_mixed_registers_one_resource_per_profile_and_allocates_listed_mig_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = load_node(MIXED)
    by_profile = profiles(node)
    config = mixed_config(tmp_path)
    plugin = Plugin(config)
    with KubeletSimulator(config.plugin_dir) as kubelet:
        plugin.start()
        try:
            expected = {GPU} | {f"nvidia.com/mig-{p}" for p in by_profile}
            for resource in expected:
                kubelet.wait_registered(resource)
            assert sorted(r.resource for r in kubelet.registrations) == sorted(expected)
            for resource in expected:
                assert (config.plugin_dir / f"cdigen-{resource.replace('/', '-')}.sock").exists()

            small = kubelet.wait_devices("nvidia.com/mig-1g.10gb")
            assert sorted(d.ID for d in small) == sorted(by_profile["1g.10gb"])
            assert all(d.health == "Healthy" for d in small)
            numa = {g.uuid: g.numa_node for g in node.gpus for _ in g.mig_devices}
            parent = {m.uuid: g.uuid for g in node.gpus for m in g.mig_devices}
            for device in small:  # NUMA comes from the parent GPU
                assert [n.ID for n in device.topology.nodes] == [numa[parent[device.ID]]]
            whole = kubelet.wait_devices(GPU)
            assert sorted(d.ID for d in whole) == sorted(
                g.uuid for g in node.gpus if not g.mig_enabled
            )

            chosen = by_profile["3g.40gb"][:2]
            response = kubelet.allocate("nvidia.com/mig-3g.40gb", [chosen])
            names = [d.name for d in response.container_responses[0].cdi_devices]
            assert names == [f"nvidia.com/gpu={u}" for u in chosen]
            assert set(names) <= listed_names(tmp_path / "cdi", capsys)
        finally:
            plugin.stop()
    assert not list(config.plugin_dir.glob("cdigen-*.sock"))


def test_xid_on_a_parent_gpu_marks_all_its_mig_devices_unhealthy(tmp_path: Path) -> None:
    node = load_node(MIXED)
    gpu1 = node.gpus[1]  # seven 1g.10gb devices
    gpu0 = node.gpus[0]
    nvml = EventNvml([g.uuid for g in node.gpus])
    config = mixed_config(tmp_path, node="nvml")
    plugin = Plugin(config, node=node, nvml=nvml)
    with KubeletSimulator(config.plugin_dir) as kubelet:
        plugin.start()
        try:
            kubelet.wait_registered("nvidia.com/mig-1g.10gb")
            kubelet.wait_devices(
                "nvidia.com/mig-1g.10gb", lambda d: all(x.health == "Healthy" for x in d)
            )
            nvml.xid(gpu1.uuid, 79)
            sick = kubelet.wait_devices(
                "nvidia.com/mig-1g.10gb", lambda d: any(x.health == "Unhealthy" for x in d)
            )
            unhealthy = {x.ID for x in sick if x.health == "Unhealthy"}
            assert unhealthy == {m.uuid for m in gpu1.mig_devices}
            # GPU 0's 1g.10gb devices and its other profiles stay Healthy
            assert {m.uuid for m in gpu0.mig_devices if m.profile == "1g.10gb"} <= {
                x.ID for x in sick if x.health == "Healthy"
            }
            assert all(
                x.health == "Healthy" for x in kubelet.wait_devices("nvidia.com/mig-3g.40gb")
            )
        finally:
            plugin.stop()


def test_a_new_mig_layout_is_re_advertised_within_5_seconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = load_node(MIXED)
    node_file = tmp_path / "node.yaml"
    node_file.write_text(dump_node(node))
    config = mixed_config(tmp_path, node=str(node_file))
    plugin = Plugin(config)
    with KubeletSimulator(config.plugin_dir) as kubelet:
        plugin.start()
        try:
            kubelet.wait_registered("nvidia.com/mig-7g.80gb")
            kubelet.wait_devices("nvidia.com/mig-3g.40gb", lambda d: len(d) == 3)
            old_socket = config.plugin_dir / "cdigen-nvidia.com-mig-7g.80gb.sock"
            assert old_socket.exists()

            new = repartition(node)
            node_file.write_text(dump_node(new))
            started = time.monotonic()
            big = kubelet.wait_devices("nvidia.com/mig-3g.40gb", lambda d: len(d) == 5)
            kubelet.wait_registered("nvidia.com/mig-4g.40gb")
            gpus = kubelet.wait_devices(GPU, lambda d: len(d) == 3)
            elapsed = time.monotonic() - started
            assert elapsed < 5, f"re-advertised after {elapsed:.1f} s"

            assert {d.ID for d in big} == set(profiles(new)["3g.40gb"])
            assert all(d.health == "Healthy" for d in big)  # the regenerated spec has them
            assert node.gpus[4].uuid not in {d.ID for d in gpus}
            assert not old_socket.exists()  # the profile that disappeared is not served
            assert "nvidia.com/mig-7g.80gb" not in {r.name for r in plugin.resources}
            listed = listed_names(tmp_path / "cdi", capsys)
            assert "nvidia.com/gpu=MIG-00000000-0000-4000-8000-000000000401" in listed
            assert not any("MIG-17a415f4" in n for n in listed)  # the old 7g.80gb device
            response = kubelet.allocate(
                "nvidia.com/mig-4g.40gb", [["MIG-00000000-0000-4000-8000-000000000401"]]
            )
            assert [d.name for d in response.container_responses[0].cdi_devices] == [
                "nvidia.com/gpu=MIG-00000000-0000-4000-8000-000000000401"
            ]
        finally:
            plugin.stop()


def test_single_advertises_mig_devices_as_gpus_and_none_hides_mig_gpus(tmp_path: Path) -> None:
    single = load_node("builtin:h100-mig-single")
    config = mixed_config(tmp_path / "a", node="builtin:h100-mig-single", mig_strategy="single")
    plugin = Plugin(config)
    with KubeletSimulator(config.plugin_dir) as kubelet:
        plugin.start()
        try:
            devices = kubelet.wait_devices(GPU)
            assert sorted(d.ID for d in devices) == sorted(
                m.uuid for g in single.gpus for m in g.mig_devices
            )
            response = kubelet.allocate(GPU, [[devices[0].ID]])
            assert response.container_responses[0].cdi_devices[0].name == f"{GPU}={devices[0].ID}"
            assert [r.resource for r in kubelet.registrations] == [GPU]
        finally:
            plugin.stop()

    mixed = load_node(MIXED)
    config = mixed_config(tmp_path / "b", mig_strategy="none")
    plugin = Plugin(config)
    with KubeletSimulator(config.plugin_dir) as kubelet:
        plugin.start()
        try:
            devices = kubelet.wait_devices(GPU)
            assert sorted(d.ID for d in devices) == sorted(
                g.uuid for g in mixed.gpus if not g.mig_enabled
            )
            assert [r.resource for r in kubelet.registrations] == [GPU]
        finally:
            plugin.stop()


def test_mig_requests_pack_onto_the_gpu_with_the_fewest_free_slices(tmp_path: Path) -> None:
    node = load_node(MIXED)
    gpu0 = [m.uuid for m in node.gpus[0].mig_devices if m.profile == "1g.10gb"]
    gpu1 = [m.uuid for m in node.gpus[1].mig_devices]
    config = mixed_config(tmp_path)
    plugin = Plugin(config)
    with KubeletSimulator(config.plugin_dir) as kubelet:
        plugin.start()
        try:
            kubelet.wait_registered("nvidia.com/mig-1g.10gb")
            # GPU 1 listed first and with more free slices: the request still goes to GPU 0
            assert kubelet.preferred("nvidia.com/mig-1g.10gb", gpu1 + gpu0[:1], 1) == gpu0[:1]
            # two fit on GPU 0 only when both of its slices are free
            assert sorted(kubelet.preferred("nvidia.com/mig-1g.10gb", gpu1 + gpu0, 2)) == sorted(
                gpu0
            )
            # three do not fit on GPU 0: they go to one GPU that holds them all
            three = kubelet.preferred("nvidia.com/mig-1g.10gb", gpu1 + gpu0, 3)
            assert set(three) <= set(gpu1)
        finally:
            plugin.stop()


def test_an_nvml_rescan_picks_up_a_repartition(tmp_path: Path) -> None:
    from tests.fakes.fake_pynvml import FakeNvml

    node = load_node(MIXED)
    fake = FakeNvml(node)
    proc = tmp_path / "proc"
    fake.write_host_files(sysfs_root=tmp_path / "sys", proc_root=proc)

    def rediscover() -> Node:
        return load_node("nvml", sysfs_root=tmp_path / "sys", proc_root=proc, nvml_module=fake)

    first = rediscover()
    assert profiles(first) == profiles(node)
    config = mixed_config(tmp_path, node="nvml", rescan_interval_s=0.2)
    plugin = Plugin(config, node=first, rediscover=rediscover)
    with KubeletSimulator(config.plugin_dir) as kubelet:
        plugin.start()
        try:
            kubelet.wait_registered("nvidia.com/mig-7g.80gb")
            fake.node = repartition(node)  # the admin ran nvidia-smi mig ...
            fake.write_host_files(proc_root=proc)
            started = time.monotonic()
            kubelet.wait_registered("nvidia.com/mig-4g.40gb")
            kubelet.wait_devices("nvidia.com/mig-3g.40gb", lambda d: len(d) == 5)
            assert time.monotonic() - started < 5
            new_caps = {m.uuid: m.cap_minors for g in plugin.node.gpus for m in g.mig_devices}
            assert new_caps["MIG-00000000-0000-4000-8000-000000000401"] == (
                4 * 9 * 15,
                4 * 9 * 15 + 1,
            )
            assert not (config.plugin_dir / "cdigen-nvidia.com-mig-7g.80gb.sock").exists()
        finally:
            plugin.stop()
