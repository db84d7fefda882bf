"""The plugin's layout: one value per node state, rebuilt on every change, health included."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from cdigen.discover import load_node
from cdigen.model import Node
from cdigen.nodefile import dump_node
from plugin.config import HealthConfig, PluginConfig
from plugin.serve import Plugin
from policies.allocator import AllocationRequest, Allocator
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
