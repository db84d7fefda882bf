"""What ``dra why`` reads of the whole cluster for every node: the DeviceClasses, each node's
devices from its newest ResourceSlices, and what the allocated claims hold, indexed by pool and
read once. Malformed objects are left out and named in ``skipped``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdigen.plugin.dra.api_objects import (
    SHAPE_ERRORS,
    Malformed,
    described,
    integer,
    name_of,
    obj,
    objs,
)
from cdigen.policies.dra.claim_docs import Claim, DeviceClass, device_class, refuse_unchecked
from cdigen.policies.dra.claims import FirstFit, NodeState, Pick
from cdigen.policies.dra.slice_devices import DeviceKey, SliceDevice, qualify, slice_devices


def classes_of(docs: Iterable[Mapping[str, Any]], skipped: list[str]) -> list[DeviceClass]:
    out = []
    for doc in docs:
        source = f"deviceclass {name_of(doc)[1]}"
        try:
            refuse_unchecked({"kind": "DeviceClass", **doc}, source)
            obj(doc.get("spec"), "spec")
            out.append(device_class(doc, source))
        except SHAPE_ERRORS as exc:
            skipped.append(f"{source} ({described(exc)})")
    return out


def node_slices(
    slices: Iterable[Mapping[str, Any]], skipped: list[str]
) -> dict[str, list[Mapping[str, Any]]]:
    """Each node's ResourceSlices of the newest generation of each (driver, pool) published
    for it (the scheduler ignores older generations); malformed slices are left out."""
    read: list[tuple[str, tuple[str, str], int, Mapping[str, Any]]] = []
    newest: dict[tuple[str, str], int] = {}
    for body in slices:
        try:
            spec = obj(body.get("spec"), "spec")
            pool = obj(spec.get("pool"), "spec.pool")
            generation = integer(pool.get("generation"), "spec.pool.generation")
            objs(spec.get("devices"), "spec.devices")
        except Malformed as exc:
            skipped.append(f"resourceslice {name_of(body)[1]} ({exc})")
            continue
        key = (str(spec.get("driver")), str(pool.get("name")))
        newest[key] = max(newest.get(key, 0), generation)
        if spec.get("nodeName"):
            read.append((str(spec["nodeName"]), key, generation, body))
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for node, key, generation, body in read:
        if generation == newest[key]:
            by_node.setdefault(node, []).append(body)
    return by_node


def node_devices(
    node: str, bodies: Iterable[Mapping[str, Any]], skipped: list[str]
) -> list[SliceDevice] | None:
    """The devices of ``node``'s slices ``bodies`` (made one node at a time, so that a
    cluster's devices are never all in memory at once), or None when they are malformed."""
    try:
        return slice_devices(bodies)
    except SHAPE_ERRORS as exc:
        skipped.append(f"the resourceslices of node {node} ({described(exc)})")
        return None


@dataclass(frozen=True)
class InvalidPools:
    """The pools of one node the scheduler will not allocate from, by (driver, pool), each
    with its reason, and one line per pool telling it for ``dra why``'s story of the node."""

    reasons: Mapping[tuple[str, str], str]
    lines: tuple[str, ...]

    @classmethod
    def of(cls, devices: Sequence[SliceDevice]) -> InvalidPools:
        """Those among one node's ``devices`` (newest generation of each pool, all its
        slices): a name two devices of a pool share makes the pool invalid, "duplicate device
        name NAME", the first such name in slice order (k8s.io/dynamic-resource-allocation,
        structured/internal/stable/pools_stable.go: poolIsInvalid, from 1.35
        validateDeviceNames). One name in two pools or drivers is no duplicate: a device is
        its driver, pool and name."""
        seen: set[DeviceKey] = set()
        reasons: dict[tuple[str, str], str] = {}
        for device in devices:
            pool = (device.driver, device.pool)
            if device.key in seen and pool not in reasons:
                reasons[pool] = f"duplicate device name {device.name}"
            seen.add(device.key)
        counts = Counter((d.driver, d.pool) for d in devices)
        # From 1.35 the allocator skips an invalid pool and, when nothing else fits, fails the
        # node with "invalid resource pools were encountered" (allocator_stable.go, Allocate);
        # 1.33 and 1.34 failed the node with "pool P is invalid: REASON" as soon as the
        # search came to the pool (allocateOne), in the random order of a Go map.
        lines = tuple(
            f"  pool {driver}/{pool} is invalid: {reason}; the scheduler allocates none of "
            f"its {counts[driver, pool]} device(s)"
            for (driver, pool), reason in sorted(reasons.items())
        )
        return cls(reasons, lines)

    def valid(self, devices: Iterable[SliceDevice]) -> list[SliceDevice]:
        """``devices`` but those of the invalid pools."""
        return [d for d in devices if (d.driver, d.pool) not in self.reasons]

    def refusal(self, claim: Claim) -> str:
        """Why the scheduler refuses ``claim`` on the node whatever its other devices hold,
        or "": a request for all devices when any pool of the node is invalid
        (allocator_stable.go, 1.32 on: "asks for all devices, but resource pool D/P is
        currently invalid")."""
        if not self.reasons:
            return ""
        (driver, pool), reason = min(self.reasons.items())
        for request in claim.requests:
            for r in request.alternatives or (request,):
                if r.mode == "All":
                    return (
                        f"request {r.name!r} asks for all devices, but resource pool "
                        f"{driver}/{pool} is invalid: {reason}"
                    )
        return ""


# An allocated claim's results in one (driver, pool): the claim's name, the (driver, pool) and
# (request, device, consumed capacity by qualified name) for each result there.
Held = tuple[str, tuple[str, str], list[tuple[str, str, dict[str, int]]]]


def held_by_pool(
    claims: Mapping[tuple[str, str], Mapping[str, Any]], skipped: list[str]
) -> dict[tuple[str, str], list[Held]]:
    """What each allocated claim holds, by (driver, pool), read once for every node; a
    malformed claim is left out and named in ``skipped``."""
    from cdigen.policies.dra.slice_devices import quantity

    out: dict[tuple[str, str], list[Held]] = {}
    for (namespace, name), doc in claims.items():
        try:
            status = obj(doc.get("status"), "status")
            allocation = obj(status.get("allocation"), "status.allocation")
            devices = obj(allocation.get("devices"), "status.allocation.devices")
            mine: dict[tuple[str, str], list[tuple[str, str, dict[str, int]]]] = {}
            field = "status.allocation.devices.results"
            for n, result in enumerate(objs(devices.get("results"), field)):
                driver = str(result.get("driver"))
                at = f"{field}[{n}].consumedCapacity"
                consumed = {
                    qualify(str(k), driver): quantity(v, f"{at}.{k}")
                    for k, v in obj(result.get("consumedCapacity"), at).items()
                }
                key = (driver, str(result.get("pool")))
                entry = (str(result.get("request", "")), str(result.get("device")), consumed)
                mine.setdefault(key, []).append(entry)
        except SHAPE_ERRORS as exc:
            skipped.append(f"resourceclaim {namespace}/{name} ({described(exc)})")
            continue
        for key, picks in mine.items():
            out.setdefault(key, []).append((f"{namespace}/{name}", key, picks))
    return out


def held_on(
    devices: Sequence[SliceDevice], fit: FirstFit, holders: Iterable[Held]
) -> tuple[NodeState, int]:
    """What the allocated claims ``holders`` hold of one node's ``devices``, and how many
    claims hold some (a claim holding devices of two pools of the node is one). A result
    names its device by driver, pool and name, the device's identity (a name alone is unique
    only in its pool). The state is told in ``fit``'s devices, which may be another node's
    of the same shape (``devices_key``): the n-th device of this node is the fit's n-th."""
    as_fit = {d.key: f.key for d, f in zip(devices, fit.devices, strict=True)}
    state = NodeState()
    held: set[str] = set()
    for claim, (driver, pool), results in holders:
        picks = []
        for request, name, consumed in results:
            key = as_fit.get(DeviceKey(driver, pool, name))
            if key is not None:
                picks.append(Pick(request, key, consumed))
        if picks:
            held.add(claim)
            state.add(picks, fit.by_key)
    return state, len(held)
