"""ResourceSlices (resource.k8s.io/v1) from the DRA device view, as plain dicts.

One pool per node, named after the node; at most 128 devices per slice (64 when a device has a
taint, as resource.k8s.io/v1 requires of a slice with taints or counters); devices in the order
the allocation engine prefers (:mod:`cdigen.policies.dra.order`), because the scheduler's first fit
walks them in slice order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from cdigen.memory_shares import MemoryShares
from cdigen.policies.device_view import DeviceView
from cdigen.sizes import quantity_text

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128
# resource.k8s.io/v1: a slice in which any device has taints or consumes counters holds at most
# 64 devices (the API server refuses more)
MAX_DEVICES_WITH_TAINTS = 64


class TaintDoc(TypedDict):
    """A device taint as a v1 ResourceSlice carries it (DeviceTaints, beta in 1.36)."""

    key: str
    value: str
    effect: str


def device_doc(
    view: DeviceView,
    *,
    shares: MemoryShares | None = None,
    taints: Sequence[TaintDoc] = (),
    consumes: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """One device entry of a v1 ResourceSlice; ``shares`` makes a whole GPU consumable by
    several claims (MIG devices stay exclusive); ``taints`` are its device taints; ``consumes``
    its ``consumesCounters`` (cdigen.plugin.dra.counters)."""
    shared = (
        shares is not None and view.mig is None and shares.shares(view.capacity.get("memory", 0))
    )
    capacity: dict[str, Any] = {}
    for name, v in sorted(view.capacity.items()):
        entry: dict[str, Any] = {"value": quantity_text(v)}
        if shared and name == "memory":
            assert shares is not None
            entry["requestPolicy"] = shares.policy(v)
        capacity[name] = entry
    doc: dict[str, Any] = {
        "name": view.name,
        "attributes": {
            name: {a.kind: list(a.value) if isinstance(a.value, tuple) else a.value}
            for name, a in sorted(view.attributes.items())
        },
        "capacity": capacity,
    }
    if shared:
        doc["allowMultipleAllocations"] = True
    if taints:
        doc["taints"] = [dict(t) for t in taints]
    if consumes:
        doc["consumesCounters"] = [dict(c) for c in consumes]
    return doc


def slice_name(node_name: str, driver: str, n: int) -> str:
    """A stable object name for slice ``n`` of this node's pool (a DNS subdomain)."""
    base = re.sub(r"[^a-z0-9.-]+", "-", f"{node_name}-{driver}".lower()).strip("-.")
    return f"{base[:240]}-{n}"


def build_slices(
    views: Sequence[DeviceView],
    *,
    driver: str,
    node_name: str,
    generation: int,
    owner: dict[str, str] | None = None,
    max_devices: int = MAX_DEVICES_PER_SLICE,
    shares: MemoryShares | None = None,
    taints: Mapping[str, Sequence[TaintDoc]] | None = None,
) -> list[dict[str, Any]]:
    """The ResourceSlices of one node's pool: ``views`` in order, ``max_devices`` per slice
    (at most 64 while any device is tainted).

    ``owner`` (``{"name": ..., "uid": ...}`` of the Node object) makes the slices go away with
    the node. A node without devices still publishes one empty slice, so the pool exists.
    ``shares`` and ``taints`` (by device name) as in :func:`device_doc`.
    """
    taints = taints or {}
    if any(taints.get(v.name) for v in views):
        max_devices = min(max_devices, MAX_DEVICES_WITH_TAINTS)
    chunks = [list(views[i : i + max_devices]) for i in range(0, len(views), max_devices)] or [[]]
    contents = [
        {"devices": [device_doc(v, shares=shares, taints=taints.get(v.name, ())) for v in chunk]}
        for chunk in chunks
    ]
    return pool_slices(
        contents, driver=driver, node_name=node_name, generation=generation, owner=owner
    )


def pool_slices(
    contents: Sequence[Mapping[str, Any]],
    *,
    driver: str,
    node_name: str,
    generation: int,
    owner: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """One ResourceSlice per entry of ``contents`` (each its ``devices`` and/or
    ``sharedCounters``), numbered in order, all of one pool generation."""
    slices: list[dict[str, Any]] = []
    for n, content in enumerate(contents):
        metadata: dict[str, Any] = {"name": slice_name(node_name, driver, n)}
        if owner:
            metadata["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": owner["name"], "uid": owner["uid"]}
            ]
        pool = {"name": node_name, "generation": generation, "resourceSliceCount": len(contents)}
        slices.append(
            {
                "apiVersion": API_VERSION,
                "kind": "ResourceSlice",
                "metadata": metadata,
                "spec": {"driver": driver, "nodeName": node_name, "pool": pool, **content},
            }
        )
    return slices
