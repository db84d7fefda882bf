"""What the plugin's layout hands the engine: the GPUs it sees down after a health change, the
devices a request may name, the built-in policy per resource, and the engines it keeps."""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest

from cdigen.discover import load_node
from cdigen.model import Node
from cdigen.plugin.agent.health import with_board_health
from cdigen.plugin.deviceplugin.config import PluginConfig, ResourceConfig
from cdigen.plugin.deviceplugin.gpu_selector import GpuSelector
from cdigen.plugin.deviceplugin.kubelet_requests import (
    PreferenceRequest,
    RequestInvalid,
    check_preference,
)
from cdigen.plugin.deviceplugin.layout import (
    AllocatorCache,
    Layout,
    gpus_down,
    plan_layout,
    plan_resources_for,
)
from cdigen.plugin.deviceplugin.sharing import Sharing
from cdigen.policies.policy_set import PolicySet

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
SLICED = "nvidia.com/gpu.sliced"


@cache
def _node() -> Node:
    return load_node("builtin:dgx1-v100")


def _uuid(index: int) -> str:
    return next(g.uuid for g in _node().gpus if g.index == index)


def _config(*resources: ResourceConfig, mig_strategy: str = "none") -> PluginConfig:
    return PluginConfig(node="unused", resources=resources, mig_strategy=mig_strategy)


def _ask(
    layout: Layout, resource: str, available: tuple[str, ...], must: tuple[str, ...], size: int
) -> PreferenceRequest:
    """The request as the gRPC edge checks it against ``resource``'s devices in ``layout``."""
    devices = {d.id: d for d in layout.resource(resource).devices}
    return check_preference(available, must, size, devices, resource)


def _sick(node: Node, *indexes: int) -> Node:
    gpus = tuple(dataclasses.replace(g, healthy=g.index not in indexes) for g in node.gpus)
    return dataclasses.replace(node, gpus=gpus)


def test_a_gpu_is_down_only_when_every_device_on_it_holds_a_reason() -> None:
    """Two replicas per GPU: one sick replica of GPU 1 leaves the GPU up; both put it down, and
    the engine then treats GPU 1, and only GPU 1, as unusable."""
    node = _node()
    config = _config(ResourceConfig(SHARED, None, Sharing(replicas=2)))
    devices = [d for r in plan_resources_for(node, config) for d in r.devices]
    one = {f"{_uuid(1)}::0": ("Xid 79",)}
    assert gpus_down(one, devices) == frozenset()
    both = {**one, f"{_uuid(1)}::1": ("Xid 79",), f"{_uuid(2)}::0": ()}  # () holds no reason
    down = gpus_down(both, devices)
    assert down == {_uuid(1)}
    layout = plan_layout(with_board_health(node, down), config, PolicySet())
    assert layout.engine(SHARED).allocator.unusable == {1: "unhealthy"}
    assert [g.index for g in layout.node.gpus if not g.healthy] == [1]


def test_the_board_marks_gpus_down_and_never_back_up() -> None:
    """The board owns health: the GPUs it holds down are marked unhealthy, the others keep the
    health the node source gave them (a GPU the source calls sick stays sick)."""
    node = _sick(_node(), 5)
    marked = with_board_health(node, frozenset({_uuid(2)}))
    assert {g.index: g.healthy for g in marked.gpus} == {i: i not in (2, 5) for i in range(8)}
    assert dataclasses.replace(marked, gpus=node.gpus) == node  # nothing else changed


def test_a_board_with_nothing_new_down_keeps_the_node_as_it_is() -> None:
    """Nothing down, or only GPUs already unhealthy: the same node, not a copy (its layout
    and engines stay)."""
    node = _sick(_node(), 5)
    assert with_board_health(node, frozenset()) is node
    assert with_board_health(node, frozenset({_uuid(5)})) is node


def test_the_engine_takes_the_devices_of_its_layout_and_ignores_others() -> None:
    """The kubelet may list devices of an older layout: the request checked against the layout
    leaves available IDs it does not advertise out (the engine never sees them), and refuses a
    must-include one; the engine answers from the devices the request holds."""
    layout = plan_layout(_node(), _config(ResourceConfig(GPU)), PolicySet())
    engine = layout.engine(GPU)
    uuids = [_uuid(i) for i in range(8)]
    stale = "GPU-00000000-dead-beef-0000-000000000000"
    with_stale = _ask(layout, GPU, (stale, *uuids), (), 2)
    assert with_stale.ignored == (stale,) and with_stale.ids == tuple(uuids)
    answer = engine.prefer(with_stale)
    assert answer == engine.prefer(_ask(layout, GPU, tuple(uuids), (), 2))
    assert answer.devices == (uuids[2], uuids[3]) and not answer.fallback
    must = engine.prefer(_ask(layout, GPU, (stale, *uuids), (uuids[4],), 2))
    assert must.devices == (uuids[4], uuids[7]) and must.link_score == 230  # 4's best partner
    with pytest.raises(RequestInvalid, match=f"must-include device {stale} is not advertised"):
        _ask(layout, GPU, (stale, *uuids), (stale, uuids[4]), 2)


def test_replicas_spread_and_memory_slices_pack() -> None:
    """Two replicas of a shared resource go to two GPUs (``spread``, its built-in policy); two
    memory slices go to one GPU, whatever the policy, and the slice resource keeps the
    ``default`` policy."""
    config = _config(
        ResourceConfig(SHARED, None, Sharing(replicas=2), gpus=GpuSelector((0, 1, 2, 3))),
        ResourceConfig(
            SLICED, None, Sharing(memory_slice_mib=4096), gpus=GpuSelector((4, 5, 6, 7))
        ),
    )
    layout = plan_layout(_node(), config, PolicySet())
    assert layout.policy_names() == {SHARED: "spread", SLICED: "default"}
    replicas = [d.id for d in layout.resource(SHARED).devices]
    two = layout.engine(SHARED).prefer(_ask(layout, SHARED, tuple(replicas), (), 2))
    assert len({i.split("::")[0] for i in two.devices}) == 2
    slices = [d.id for d in layout.resource(SLICED).devices if d.gpu_position in (4, 7)]
    packed = layout.engine(SLICED).prefer(_ask(layout, SLICED, tuple(slices), (), 2))
    assert len({i.split("::")[0] for i in packed.devices}) == 1


def test_mig_resources_pack_and_whole_gpus_stay_off_when_only_shares_are_listed() -> None:
    node = load_node("builtin:dgx-a100-mig-mixed")
    only_shares = _config(ResourceConfig(SHARED, None, Sharing(replicas=2)), mig_strategy="mixed")
    resources = plan_resources_for(node, only_shares)
    names = [r.name for r in resources]
    assert GPU not in names and SHARED in names
    assert all(r.mig_profile is not None for r in resources if r.name != SHARED)
    layout = plan_layout(node, only_shares, PolicySet())
    policies = layout.policy_names()
    assert {policies[n] for n in names if n != SHARED} == {"pack"} and policies[SHARED] == "spread"
    with_gpus = plan_resources_for(node, _config(ResourceConfig(GPU), mig_strategy="mixed"))
    assert GPU in [r.name for r in with_gpus]


def test_a_resource_the_layout_lacks_is_a_key_error() -> None:
    config = _config(
        ResourceConfig(GPU, gpus=GpuSelector((0,))),
        ResourceConfig(SHARED, None, Sharing(replicas=2), gpus=GpuSelector((1,))),
    )
    layout = plan_layout(_node(), config, PolicySet())
    assert layout.resource(SHARED).name == SHARED and layout.resource(GPU).name == GPU
    with pytest.raises(KeyError):
        layout.resource("nvidia.com/none")


def test_resources_of_one_policy_share_one_engine() -> None:
    config = _config(
        ResourceConfig(GPU, gpus=GpuSelector((0, 1, 2, 3))),
        ResourceConfig(SLICED, None, Sharing(memory_slice_mib=4096), gpus=GpuSelector((4, 5))),
    )
    layout = plan_layout(_node(), config, PolicySet())
    assert layout.engine(GPU).allocator is layout.engine(SLICED).allocator


def test_the_cache_keeps_the_engines_of_the_last_eight_health_states() -> None:
    """Nine health states in turn: the first one's engine was dropped (bounded), the other
    eight come back as they were."""
    cache_ = AllocatorCache()
    policy = PolicySet().for_resource(ResourceConfig(GPU), "default")
    states = [_sick(_node(), i) for i in range(8)] + [_sick(_node(), 0, 1)]
    built = [cache_.get(state, policy) for state in states]
    again = [cache_.get(state, policy) for state in states[1:]]
    assert all(a is b for a, b in zip(again, built[1:], strict=True))
    first = cache_.get(states[0], policy)
    assert first is not built[0] and first.unusable == {0: "unhealthy"}
