"""Policy reloads (SIGHUP) racing a layout change (the poller thread)."""

from __future__ import annotations

import threading

import pytest

from cdigen.discover import load_node
from cdigen.model import Node
from plugin.config import ResourceConfig
from plugin.serve import Preferences
from policies import allocator as allocator_module
from policies.allocator import Allocator
from policies.policy import Policy


def test_a_reload_racing_a_layout_change_leaves_the_new_layout_in_force(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = load_node("builtin:rtx4090")
    preferences = Preferences(node, [ResourceConfig("nvidia.com/gpu")])
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
    sighup = threading.Thread(target=preferences.load, args=(None,))
    sighup.start()
    assert reload_started.wait(5)

    def new_layout() -> None:
        resources = [ResourceConfig("nvidia.com/gpu"), ResourceConfig("nvidia.com/mig-1g.10gb")]
        preferences.update(node, resources, {"nvidia.com/mig-1g.10gb": "pack"})
        preferences.load(None)

    layout = threading.Thread(target=new_layout)
    layout.start()
    layout.join(0.5)  # lets an unserialised layout load finish before the reload does
    reload_may_finish.set()
    sighup.join(5)
    layout.join(5)
    assert preferences.policy_for("nvidia.com/mig-1g.10gb") == "pack"
    prefer = preferences.preferrer("nvidia.com/mig-1g.10gb")()
    assert prefer(("0",), (), 1).devices == ("0",)
