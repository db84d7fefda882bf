"""Policy reloads (SIGHUP) racing a layout change (the poller thread)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from cdigen.discover import load_node
from cdigen.model import Node
from cdigen.plugin.deviceplugin.config import PluginConfig
from cdigen.plugin.deviceplugin.kubelet_requests import PreferenceRequest
from cdigen.plugin.deviceplugin.runner import Plugin
from cdigen.policies import allocator as allocator_module
from cdigen.policies.allocator import Allocator
from cdigen.policies.policy import Policy

MIG = "nvidia.com/mig-1g.10gb"


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
