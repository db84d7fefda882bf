"""Policy reloads (SIGHUP) racing a layout change (the poller thread), and a layout change
whose policies fail to load."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import grpc
import pytest

from cdigen.discover import load_node
from cdigen.model import Node
from cdigen.nodefile import dump_node
from cdigen.plugin.deviceplugin.config import PluginConfig, load_config
from cdigen.plugin.deviceplugin.kubelet_requests import PreferenceRequest
from cdigen.plugin.deviceplugin.runner import Plugin
from cdigen.policies import allocator as allocator_module
from cdigen.policies.allocator import Allocator
from cdigen.policies.policy import Policy
from tests.helpers.mig import repartition
from tests.kubelet_sim import KubeletSimulator

MIG = "nvidia.com/mig-1g.10gb"
SHARED = "nvidia.com/gpu.shared"


def test_a_reload_racing_a_layout_change_leaves_the_new_layout_in_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = Plugin(
        PluginConfig(node="builtin:dgx-a100", plugin_dir=tmp_path, mig_strategy="mixed")
    )
    assert plugin.reload_policies()
    reload_started = threading.Event()
    reload_may_finish = threading.Event()
    built: list[Node] = []

    class SlowFirstAllocator(Allocator):
        def __init__(self, node: Node, policy: Policy | None = None) -> None:
            built.append(node)
            if len(built) == 1:  # the SIGHUP reload, building for the old layout
                reload_started.set()
                reload_may_finish.wait(5)
            super().__init__(node, policy)

    monkeypatch.setattr(allocator_module, "Allocator", SlowFirstAllocator)
    sighup = threading.Thread(target=plugin.reload_policies)
    sighup.start()
    assert reload_started.wait(5)
    mig_node = load_node("builtin:dgx-a100-mig-mixed")
    layout = threading.Thread(target=plugin.apply_node, args=(mig_node,))
    layout.start()
    layout.join(0.5)  # lets an unserialised layout change finish before the reload does
    reload_may_finish.set()
    sighup.join(5)
    layout.join(5)
    try:
        assert plugin.layout.node == mig_node
        assert plugin.policy_for(MIG) == "pack"
        device = plugin.resource(MIG).devices[0]
        request = PreferenceRequest((device,), (device.id,), (), 1)
        assert plugin.layout.engine(MIG).prefer(request).devices == (device.id,)
    finally:
        plugin.stop()


def test_a_share_asked_while_the_new_layout_has_no_policy_is_a_failed_precondition(
    tmp_path: Path,
) -> None:
    """A repartition brings a MIG resource whose config names a policy that does not exist:
    the new layout goes out without policies (the plugin keeps serving), and Allocate on a
    sharing resource answers FAILED_PRECONDITION, naming the gap, until one loads."""
    node = load_node("builtin:dgx-a100-mig-mixed")  # GPUs 4-7 without MIG, no 4g.40gb yet
    node_file = tmp_path / "node.yaml"
    node_file.write_text(dump_node(node))
    config_file = tmp_path / "plugin.yaml"
    config_file.write_text(
        "migStrategy: mixed\n"
        "resources:\n"
        f"  - {{name: {SHARED}, gpus: [5], sharing: {{replicas: 2}}}}\n"
        "  - {name: nvidia.com/mig-4g.40gb, policy: no-such-policy}\n"
    )
    flags = {
        "node": str(node_file),
        "plugin_dir": tmp_path / "plugins",
        "device_list_strategy": "envvar",
        "health_poll_interval": "0.05",
    }
    plugin = Plugin(load_config(config_file, env={}, flags=flags))
    with KubeletSimulator(plugin.config.plugin_dir) as kubelet:
        plugin.start()
        try:
            kubelet.wait_registered(SHARED)
            replicas = [d.ID for d in kubelet.wait_devices(SHARED)]
            assert kubelet.allocate(SHARED, [replicas[:1]]).container_responses
            staged = tmp_path / "node.new"
            staged.write_text(dump_node(repartition(node)))  # GPU 4 gets MIG: a 4g.40gb
            os.replace(staged, node_file)
            kubelet.wait_registered("nvidia.com/mig-4g.40gb")
            with pytest.raises(grpc.RpcError) as caught:
                kubelet.allocate(SHARED, [replicas[1:]])
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"{SHARED} has no policy in force" in (caught.value.details() or "")
        finally:
            plugin.stop()
