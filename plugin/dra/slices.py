"""ResourceSlices (resource.k8s.io/v1) from the DRA device view, as plain dicts.

One pool per node, named after the node; at most 128 devices per slice (64 when a device has a
taint, as resource.k8s.io/v1 requires of a slice with taints or counters); devices in the order
the allocation engine prefers (:mod:`policies.dra.order`), because the scheduler's first fit
walks them in slice order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from policies.device_view import DeviceView

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128
# resource.k8s.io/v1: a slice in which any device has taints or consumes counters holds at most
# 64 devices (the API server refuses more)
MAX_DEVICES_WITH_TAINTS = 64
_BINARY_SUFFIXES = (
    ("Ei", 1 << 60),
    ("Pi", 1 << 50),
    ("Ti", 1 << 40),
    ("Gi", 1 << 30),
    ("Mi", 1 << 20),
    ("Ki", 1 << 10),
)


def quantity_text(count: int) -> str:
    """``85899345920`` -> ``"80Gi"``: the canonical Kubernetes quantity of a byte count."""
    for suffix, size in _BINARY_SUFFIXES:
        if count >= size and count % size == 0:
            return f"{count // size}{suffix}"
    return str(count)


class TaintDoc(TypedDict):
    """A device taint as a v1 ResourceSlice carries it (DeviceTaints, beta in 1.36)."""

    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class MemoryShares:
    """Whole GPUs published for consumable capacity (KEP-5075, beta in 1.36): the device allows
    multiple allocations and its ``memory`` is consumed in ``step`` bytes.

    What a request that names no memory takes (the capacity's ``requestPolicy.default``) is the
    operator's: ``default`` bytes, or with ``per_gpu`` N the GPU's memory / N rounded down to the
    step, or, with neither, the whole GPU (all the steps it has), so that such a claim never
    shares its GPU.
    """

    step: int = 1 << 30
    default: int | None = None
    per_gpu: int | None = None

    def top(self, total: int) -> int:
        """The most a claim may take of a GPU with ``total`` bytes: whole steps."""
        return total - total % self.step

    def shares(self, total: int) -> bool:
        """Whether a GPU of ``total`` bytes is published as shares: the API server refuses a
        range whose ``min + step`` is above the capacity."""
        return total >= 2 * self.step

    def default_for(self, total: int) -> int:
        """What a request naming no memory takes of a GPU with ``total`` bytes."""
        if self.default is not None:
            return self.default
        if self.per_gpu:
            return total // self.per_gpu // self.step * self.step
        return self.top(total)

    def described(self) -> str:
        """The setting, for a log line or a note: ``6Gi``, ``1/4 of the GPU``, ``the whole
        GPU``."""
        if self.default is not None:
            return quantity_text(self.default)
        if self.per_gpu:
            return f"1/{self.per_gpu} of the GPU's memory, in whole steps"
        return "the whole GPU"

    def refusal(self, views: Sequence[DeviceView]) -> str:
        """Why the default cannot be published for one of the whole GPUs among ``views``, as
        the API server would refuse it (a default within min..max, on a step), or ""."""
        for view in views:
            name, total = view.name, view.capacity.get("memory", 0)
            if view.mig is not None or not self.shares(total):
                continue
            amount, top = self.default_for(total), self.top(total)
            if amount < self.step or amount > top:
                return (
                    f"a claim naming no memory would take {quantity_text(amount)} of "
                    f"{name}, which offers {quantity_text(self.step)} to {quantity_text(top)} "
                    f"in steps of {quantity_text(self.step)}"
                )
        return ""

    def policy(self, total: int) -> dict[str, Any]:
        """The ``requestPolicy`` of a GPU with ``total`` bytes of memory."""
        return {
            "default": quantity_text(self.default_for(total)),
            "validRange": {
                "min": quantity_text(self.step),
                "max": quantity_text(self.top(total)),
                "step": quantity_text(self.step),
            },
        }


def device_doc(
    view: DeviceView,
    *,
    shares: MemoryShares | None = None,
    taints: Sequence[TaintDoc] = (),
    consumes: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """One device entry of a v1 ResourceSlice; ``shares`` makes a whole GPU consumable by
    several claims (MIG devices stay exclusive); ``taints`` are its device taints; ``consumes``
    its ``consumesCounters`` (plugin.dra.counters)."""
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
        "attributes": {name: {a.kind: a.value} for name, a in sorted(view.attributes.items())},
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
