"""The plan of one claim's prepare: what it will do, computed from the claim, the node's devices
and the claims already prepared, with no side effect (so that it can be computed again).

The claim's config is decoded once here (cdigen.plugin.dra.config.claim_configs); the plan carries
its devices and their views, the capabilities each request asks for, the MPS settings and the MIG
placements it will make; cdigen.plugin.dra.prepare applies it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdigen.cdi.names import qualified_name
from cdigen.cdi.types import MountDoc
from cdigen.errors import InputError
from cdigen.plugin.dra.checkpoint import ClaimDoc, PlacementDoc, PreparedDeviceDoc
from cdigen.plugin.dra.claim_spec import (
    ClaimSpecs,
    claim_capability_name,
    claim_device_name,
    claim_kind,
)
from cdigen.plugin.dra.claims import AllocatedDevice, ClaimRef, allocated_devices, quoted
from cdigen.plugin.dra.config import claim_configs, claim_sharing
from cdigen.plugin.dra.mps import MpsSettings, claim_limits
from cdigen.policies.device_view import DeviceView


@dataclass(frozen=True)
class ClaimPlan:
    """What preparing one claim does: its devices and their views, the capabilities beyond the
    node-wide ones each request asks for (and those asked by name), the MPS settings, and the
    MIG placements it makes."""

    allocated: tuple[AllocatedDevice, ...]
    views: tuple[DeviceView, ...]
    extra: Mapping[str, tuple[str, ...]]
    explicit: frozenset[str]
    env: tuple[str, ...]
    mounts: tuple[MountDoc, ...]
    placements: tuple[PlacementDoc, ...]


def plan_claim(
    ref: ClaimRef,
    claim: Mapping[str, Any],
    *,
    driver: str,
    pool: str,
    views: Mapping[str, DeviceView],
    specs: ClaimSpecs,
    mps: MpsSettings,
    held: Mapping[str, ClaimDoc],
    can_make_migs: bool,
) -> ClaimPlan:
    """The plan of claim ``ref`` (``claim``: the API object); InputError (one line) when it
    cannot be prepared on this node: a device not offered, held by another claim without
    sharing, a bad config, a placement without NVML to make it."""
    allocated = allocated_devices(claim, ref, driver=driver, pool=pool)
    where = f"ResourceClaim {ref.namespace}/{ref.name}"
    configs = claim_configs(claim, ref, driver=driver)
    extra, explicit = specs.capabilities_asked(ref, configs, allocated)
    found = _offered_views(ref, allocated, views, pool=pool, held=held, where=where)
    env: Sequence[str] = ()
    mounts: Sequence[MountDoc] = ()
    if found:
        sharing = claim_sharing(configs, [r.request for r in allocated], where)
        env, mounts = claim_limits(allocated, views, mps, sharing, where=where)
    placements = _placements(found, can_make_migs=can_make_migs, where=where)
    return ClaimPlan(
        allocated=tuple(allocated),
        views=tuple(found),
        extra=extra,
        explicit=explicit,
        env=tuple(env),
        mounts=tuple(mounts),
        placements=placements,
    )


def _offered_views(
    ref: ClaimRef,
    allocated: Sequence[AllocatedDevice],
    views: Mapping[str, DeviceView],
    *,
    pool: str,
    held: Mapping[str, ClaimDoc],
    where: str,
) -> list[DeviceView]:
    """The view of each allocated device; InputError for one this node does not offer, or that
    another claim holds without sharing."""
    found: list[DeviceView] = []
    for result in allocated:
        view = views.get(result.device)
        if view is None:
            raise InputError(
                f"device {quoted(result.device)} of pool {pool!r} is not offered by this node",
                where=where,
                hint="the node's devices changed since the claim was allocated",
            )
        _refuse_if_held(ref, result, held)
        found.append(view)
    return found


def _placements(
    found: Sequence[DeviceView], *, can_make_migs: bool, where: str
) -> tuple[PlacementDoc, ...]:
    """The MIG placements the claim's devices will make (``--mig-strategy dynamic``);
    InputError when there are some and this plugin cannot make MIG devices."""
    placements = tuple(
        PlacementDoc(
            device=v.name,
            gpuUUID=v.gpu.uuid,
            start=v.placement.start,
            size=v.placement.profile.memory_slices,
        )
        for v in found
        if v.placement is not None
    )
    if placements and not can_make_migs:
        raise InputError(
            f"device {placements[0]['device']!r} is a MIG placement, and this plugin cannot "
            "make MIG devices (no NVML)",
            where=where,
            hint="serve --mig-strategy dynamic with NVML (--node nvml)",
        )
    return placements


def _refuse_if_held(ref: ClaimRef, result: AllocatedDevice, held: Mapping[str, ClaimDoc]) -> None:
    for uid, other in held.items():
        if uid == ref.uid or result.device not in other["shareable"]:
            continue
        if result.shareable and other["shareable"][result.device]:
            continue
        raise InputError(
            f"device {result.device!r} is already prepared for claim "
            f"{other['namespace']}/{other['name']} ({uid})",
            where=f"ResourceClaim {ref.namespace}/{ref.name}",
            hint="a device is shared only when both claims were allocated it for sharing",
        )


def device_doc(
    driver: str, pool: str, uid: str, result: AllocatedDevice, capabilities: Sequence[str]
) -> PreparedDeviceDoc:
    """What the kubelet is told of one prepared device: its CDI IDs in the claim's spec."""
    kind = claim_kind(driver)
    doc: PreparedDeviceDoc = {
        "requestNames": [result.request] if result.request else [],
        "poolName": pool,
        "deviceName": result.device,
        "cdiDeviceIds": [
            qualified_name(kind, claim_device_name(uid, result)),
            *(qualified_name(kind, claim_capability_name(uid, c)) for c in capabilities),
        ],
        "shareId": result.share_id,
    }
    if result.consumed:  # what the claim was given of a shared device (attribution)
        doc["consumedCapacity"] = dict(result.consumed)
    return doc
