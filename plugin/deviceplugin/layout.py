"""The plugin's layout: one immutable value per (node, config, policies), swapped whole.

:func:`plan_layout` is the one pure function that makes it. For each advertised resource the
layout holds its devices (ID, GPU position and UUID, kind, CDI name; see
:class:`~cdigen.plugin.deviceplugin.resources.AdvertisedDevice`) and its :class:`Engine` (the
allocation policy's allocator, plus Allocate's share hand-out for a sharing resource). Health
reaches the engine through the node: :func:`cdigen.plugin.agent.health.with_board_health` marks the
GPUs the health board holds down, so a health change makes a new node, hence a new layout.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cdigen.model import Node
from cdigen.plugin.deviceplugin.cdi_names import capability_cdi_names
from cdigen.plugin.deviceplugin.config import PluginConfig, ResourceConfig
from cdigen.plugin.deviceplugin.kubelet_requests import PreferenceRequest
from cdigen.plugin.deviceplugin.resources import (
    AdvertisedDevice,
    Resource,
    cdi_names,
    plan_resources,
    shared_resource,
)
from cdigen.plugin.deviceplugin.servicer import Preference
from cdigen.plugin.deviceplugin.sharing import ShareAllocation, hand_out_shares

if TYPE_CHECKING:
    from cdigen.policies.allocator import Allocator
    from cdigen.policies.policy import Policy
    from cdigen.policies.policy_set import PolicySet

log = logging.getLogger("cdigen.plugin")


def engine_request(allocator: Allocator, request: PreferenceRequest) -> Preference:
    """Ask ``allocator`` for ``request.size`` of the request's candidates, its must-include
    devices among them.

    The one place the plugin talks to the engine. The request was checked at the gRPC edge
    (:func:`cdigen.plugin.deviceplugin.kubelet_requests.check_preference`) and holds the advertised
    devices: the engine gets their handles (each device's GPU position, from its catalogue entry),
    never ID strings to parse or look up again. Memory slices are always packed.
    """
    candidates = request.candidates
    # a resource's devices are all memory slices or none (and a checked request holds one)
    slices = candidates[0].kind == "slice"
    positions = [d.entry.position for d in candidates]  # the GPU's place, from the catalogue
    placed = allocator.prefer_positions(positions, request.must, request.size, slices=slices)
    chosen = tuple(request.ids[k] for k in placed.devices)
    score, fallback = int(placed.link_score), placed.fallback_reason
    if fallback:
        log.info("preferred allocation fell back: %s", fallback)
    return Preference(chosen, score, fallback=bool(fallback))


@dataclass(frozen=True)
class Engine:
    """What decides for one resource: its policy's allocator, and for a sharing resource what
    Allocate hands out for a set of shares. The devices are the layout's resource's, reaching
    the engine inside each checked request: it keeps no list of its own."""

    policy: Policy
    allocator: Allocator
    share: Callable[[Sequence[AdvertisedDevice]], ShareAllocation] | None = None

    def prefer(self, request: PreferenceRequest) -> Preference:
        """The policy's preferred devices (see :func:`engine_request`)."""
        return engine_request(self.allocator, request)


@dataclass(frozen=True)
class Layout:
    """What the plugin advertises and how it decides, for one node state. Never changed: a new
    node (health included) or a policy reload makes a new one."""

    node: Node  # health as the board holds it (see with_board_health)
    resources: tuple[Resource, ...]
    engines: Mapping[str, Engine] = field(default_factory=dict)  # empty: no policies loaded yet

    @property
    def devices(self) -> tuple[AdvertisedDevice, ...]:
        """Every advertised device, over all resources."""
        return tuple(d for r in self.resources for d in r.devices)

    def resource(self, name: str) -> Resource:
        """The resource ``name`` (KeyError if the layout has none)."""
        for resource in self.resources:
            if resource.name == name:
                return resource
        raise KeyError(name)

    def engine(self, name: str) -> Engine:
        """The engine of resource ``name`` (KeyError before policies load, or no such one)."""
        return self.engines[name]

    def parents(self) -> dict[str, tuple[str, ...]]:
        """Per device ID: the GPU UUIDs whose health it shares."""
        return {d.id: d.parents for d in self.devices}

    def cdi_names(self) -> dict[str, list[str]]:
        """Per device ID: the CDI names Allocate may return for it (capability devices too)."""
        return cdi_names(self.resources)

    def policy_names(self) -> dict[str, str]:
        """Per resource: the name of the policy in force."""
        return {name: engine.policy.name for name, engine in self.engines.items()}


def plan_resources_for(node: Node, config: PluginConfig) -> tuple[Resource, ...]:
    """The resources ``node`` advertises under ``config`` (InputError when the MIG strategy
    cannot hold), each with the capability devices its config entry asks for; no engines,
    so cheap."""
    from cdigen.plugin.deviceplugin.gpu_selector import owners

    # one owner per GPU (InputError naming both resources when the node shows two)
    owner = owners(node.gpus, config.gpu_claimants)
    claimants = {c.name for c in config.gpu_claimants}
    planned = plan_resources(
        node, config.mig_strategy, gpu_resource=config.gpu_resource, cdi_kind=config.cdi_kind
    )
    if not config.advertises_whole_gpus:  # only shares of the whole GPUs go out
        planned = tuple(r for r in planned if r.mig_profile is not None)
    shared = tuple(
        shared_resource(node, r.name, r.sharing, config.cdi_kind)
        for r in config.sharing_resources
        if r.sharing is not None
    )
    out = []
    for resource in planned + shared:
        if resource.mig_profile is None and resource.name in claimants:
            # whole GPUs and shares: only those of the GPUs this resource owns
            mine = tuple(d for d in resource.devices if owner.get(d.gpu_uuid) == resource.name)
            resource = dataclasses.replace(resource, devices=mine)
        names = capability_cdi_names(config.cdi_kind, config.extra_capabilities(resource.name))
        out.append(dataclasses.replace(resource, capability_names=names) if names else resource)
    return tuple(out)


def default_policies(resources: Sequence[Resource]) -> dict[str, str]:
    """The built-in policy per resource when the config names none."""
    # MIG devices are shares of their GPU: packing them keeps whole GPUs free. Replicas
    # spread: a pod gets the GPU with the most free replicas (slices are packed anyway).
    defaults = {r.name: "pack" for r in resources if r.mig_profile is not None}
    defaults.update({r.name: "spread" for r in resources if r.sharing and r.sharing.replicas})
    return defaults


def resource_configs(
    resources: Sequence[Resource], config: PluginConfig
) -> tuple[ResourceConfig, ...]:
    """The config entry of each planned resource (a bare one where the config has none)."""
    configured = {r.name: r for r in config.resources}
    return tuple(configured.get(r.name, ResourceConfig(r.name)) for r in resources)


def _share(
    resource: Resource, cdi_kind: str
) -> Callable[[Sequence[AdvertisedDevice]], ShareAllocation] | None:
    sharing = resource.sharing
    if sharing is None:
        return None
    name = resource.name

    def share(devices: Sequence[AdvertisedDevice]) -> ShareAllocation:
        shares = [d.entry for d in devices]
        return hand_out_shares(shares, sharing, cdi_kind=cdi_kind, resource=name)

    return share


class AllocatorCache:
    """Engines already built, by (node, policy): an allocator is a pure function of the two, so
    a GPU whose health flaps back to a state seen before gets its engine back at once. A health
    state not seen before derives its engine from the last one of the same node and policy
    (:meth:`~cdigen.policies.allocator.Allocator.for_health`: the subset tables are reused, not
    rebuilt, which takes up to hundreds of ms on 16 GPUs). Policies are told apart by name and
    source, which is exact within one loaded policy set: a policy reload must start a new cache.
    Bounded."""

    def __init__(self, size: int = 8) -> None:
        self._size = size
        self._built: dict[tuple[Node, str, str], Allocator] = {}
        self._last: dict[tuple[Node, str, str], Allocator] = {}  # by node without health

    def get(self, node: Node, policy: Policy) -> Allocator:
        """The allocator of ``node`` under ``policy``, built (or derived) on first use."""
        from cdigen.policies.allocator import Allocator as AllocatorClass
        from cdigen.policies.allocator import without_health

        key = (node, policy.name, policy.source)
        allocator = self._built.pop(key, None)
        if allocator is None:
            shape = (without_health(node), policy.name, policy.source)
            last = self._last.pop(shape, None)
            allocator = last.for_health(node) if last is not None else AllocatorClass(node, policy)
            _put(self._last, shape, allocator, self._size)
        _put(self._built, key, allocator, self._size)
        return allocator


def _put(
    cache: dict[tuple[Node, str, str], Allocator],
    key: tuple[Node, str, str],
    value: Allocator,
    size: int,
) -> None:
    cache[key] = value  # most recent last
    while len(cache) > size:
        del cache[next(iter(cache))]


def plan_layout(
    node: Node,
    config: PluginConfig,
    policies: PolicySet | None,
    allocators: AllocatorCache | None = None,
    resources: tuple[Resource, ...] | None = None,
) -> Layout:
    """The layout of ``node`` under ``config`` with ``policies`` (None: advertise only, no
    engines yet), taking engines from ``allocators`` where given. ``resources``: what
    :func:`plan_resources_for` gives for ``node``, when the caller has it (health does not
    change it). Raises InputError for a layout the MIG strategy cannot hold or a resource
    naming an unknown policy."""
    if resources is None:
        resources = plan_resources_for(node, config)
    if policies is None:
        return Layout(node, resources)
    defaults = default_policies(resources)
    engines = {}
    cache = allocators if allocators is not None else AllocatorCache()  # one per policy at least
    taken: dict[tuple[str, str], Allocator] = {}  # resources of one policy share its engine
    for resource, wanted in zip(resources, resource_configs(resources, config), strict=True):
        policy = policies.for_resource(wanted, defaults.get(resource.name, "default"))
        allocator = taken.get((policy.name, policy.source))
        if allocator is None:
            allocator = taken[policy.name, policy.source] = cache.get(node, policy)
        engines[resource.name] = Engine(policy, allocator, _share(resource, config.cdi_kind))
    return Layout(node, resources, engines)


def gpus_down(
    reasons: Mapping[str, Sequence[str]], devices: Sequence[AdvertisedDevice]
) -> frozenset[str]:
    """The GPU UUIDs the health board holds down: those whose every advertised device holds a
    reason (``reasons`` as :meth:`cdigen.plugin.agent.health.HealthBoard.snapshot` gives them)."""
    devices_on: dict[str, list[str]] = {}
    for device in devices:
        for gpu in device.parents:
            devices_on.setdefault(gpu, []).append(device.id)
    return frozenset(gpu for gpu, ids in devices_on.items() if all(reasons.get(d) for d in ids))
