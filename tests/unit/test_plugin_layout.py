"""The plugin's layout: one value per node state, rebuilt on every change, health included."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cdigen.discover import load_node
from cdigen.model import Node
from cdigen.nodefile import dump_node
from cdigen.plugin.deviceplugin.config import HealthConfig, PluginConfig, ResourceConfig
from cdigen.plugin.deviceplugin.runner import Plugin
from cdigen.policies.allocator import AllocationRequest, Allocator
from tests.kubelet_sim import KubeletSimulator

RESOURCE = "nvidia.com/gpu"


def _with_health(node: Node, index: int, healthy: bool) -> Node:
    gpus = tuple(
        dataclasses.replace(g, healthy=healthy) if g.index == index else g for g in node.gpus
    )
    return dataclasses.replace(node, gpus=gpus)


def test_a_gpu_that_recovers_is_preferred_again_without_a_reload(tmp_path: Path) -> None:
    """dgx1-v100: GPU 3 starts unhealthy, then recovers. The next preferred answer for must=0,
    size 2 is a fresh engine's ([0, 3], two NVLinks), with no SIGHUP."""
    node = load_node("builtin:dgx1-v100")
    uuids = [g.uuid for g in sorted(node.gpus, key=lambda g: g.index)]
    fresh = Allocator(node).prefer(AllocationRequest(tuple(uuids), (uuids[0],), 2))
    assert list(fresh.devices) == [uuids[0], uuids[3]] and not fresh.fallback_reason
    path = tmp_path / "node.yaml"
    sick = _with_health(node, 3, healthy=False)
    healthy = [u for i, u in enumerate(uuids) if i != 3]
    while_sick = Allocator(sick).prefer(AllocationRequest(tuple(healthy), (uuids[0],), 2))
    path.write_text(dump_node(sick))
    config = PluginConfig(
        node=str(path),
        plugin_dir=tmp_path / "plugins",
        device_list_strategy="envvar",
        health=HealthConfig(poll_interval_s=0.05),
    )
    plugin = Plugin(config)
    with KubeletSimulator(config.plugin_dir) as kubelet:
        plugin.start()
        try:
            kubelet.wait_registered(RESOURCE)
            kubelet.wait_devices(RESOURCE, lambda d: d[3].health == "Unhealthy")
            assert kubelet.preferred(RESOURCE, healthy, 2, [uuids[0]]) == list(while_sick.devices)
            path.write_text(dump_node(node))
            kubelet.wait_devices(RESOURCE, lambda d: all(x.health == "Healthy" for x in d))
            answer = kubelet.preferred(RESOURCE, uuids, 2, [uuids[0]])
        finally:
            plugin.stop()
    assert answer == list(fresh.devices)


def test_the_layout_names_devices_as_the_generated_spec_does(tmp_path: Path) -> None:
    """Every CDI name a layout hands out is one the generated spec defines; each device knows
    its kind and its GPU's position, and each resource has its engine."""
    from cdigen.cdi.cache import load_state
    from cdigen.plugin.deviceplugin.config import ResourceConfig
    from cdigen.plugin.deviceplugin.generate_specs import write_specs
    from cdigen.plugin.deviceplugin.gpu_selector import GpuSelector
    from cdigen.plugin.deviceplugin.layout import plan_layout
    from cdigen.plugin.deviceplugin.sharing import Sharing
    from cdigen.policies.policy_set import PolicySet
    from tests.cdihost import build_host, make_node

    node = make_node(3, mig_gpu=1)
    host = build_host(tmp_path / "host", node, merged=True)
    shared = "nvidia.com/gpu.shared"
    config = PluginConfig(
        node="unused",
        plugin_dir=tmp_path / "plugins",
        mig_strategy="mixed",
        spec_dirs=(tmp_path / "cdi",),
        host_root=str(host.base),
        resources=(
            ResourceConfig(RESOURCE, gpus=GpuSelector(indexes=(0,))),
            ResourceConfig(shared, None, Sharing(2), gpus=GpuSelector(indexes=(2,))),
        ),
    )
    write_specs(node, config)
    defined = set(load_state([tmp_path / "cdi"]).devices)
    layout = plan_layout(node, config, PolicySet())
    assert plan_layout(node, config, PolicySet()).resources == layout.resources  # pure
    names = {n for d in layout.devices for n in d.cdi_names}
    assert names and names <= defined
    kinds = {(r.name, d.id): (d.kind, d.gpu_position) for r in layout.resources for d in r.devices}
    gpus = [g.uuid for g in node.gpus]
    migs = [m.uuid for m in node.gpus[1].mig_devices]
    assert kinds == {
        (RESOURCE, gpus[0]): ("gpu", 0),
        ("nvidia.com/mig-1g.10gb", migs[0]): ("mig", 1),
        ("nvidia.com/mig-1g.10gb", migs[1]): ("mig", 1),
        **{(shared, f"{gpus[2]}::{k}"): ("replica", 2) for k in range(2)},
    }
    assert set(layout.engines) == {r.name for r in layout.resources}
    assert [name for name, e in layout.engines.items() if e.share is not None] == [shared]
    assert layout.policy_names()[shared] == "spread"
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.node = node  # type: ignore[misc]


def test_a_health_state_seen_before_gets_its_engine_back_without_a_rebuild() -> None:
    """Allocators are a pure function of (node, policy): a GPU that flaps back to a state seen
    before reuses the engine built for it, a new health state derives its engine from the last
    one (the subset tables shared); a new policy set starts afresh."""
    import dataclasses

    from cdigen.discover import load_node
    from cdigen.plugin.deviceplugin.layout import AllocatorCache, plan_layout
    from cdigen.policies.policy_set import PolicySet

    node = load_node("builtin:dgx1-v100")
    config = PluginConfig(node="builtin:dgx1-v100", resources=(ResourceConfig(RESOURCE),))
    sick = dataclasses.replace(
        node, gpus=tuple(dataclasses.replace(g, healthy=g.index != 3) for g in node.gpus)
    )
    cache = AllocatorCache(size=2)
    healthy = plan_layout(node, config, PolicySet(), cache).engine(RESOURCE).allocator
    unhealthy = plan_layout(sick, config, PolicySet(), cache).engine(RESOURCE).allocator
    assert unhealthy is not healthy and 3 in {g.index for g in unhealthy.node.gpus if not g.healthy}
    assert unhealthy.exact.full_table is healthy.exact.full_table  # derived, not rebuilt
    again = plan_layout(node, config, PolicySet(), cache).engine(RESOURCE).allocator
    assert again is healthy
    fresh = plan_layout(node, config, PolicySet(), AllocatorCache()).engine(RESOURCE).allocator
    assert fresh is not healthy and fresh.exact.full_table is not healthy.exact.full_table
