"""ResourceSlices for ``--mig-strategy dynamic`` (KEP-4815, partitionable devices): each
MIG-enabled GPU's memory and compute slices as a counter set, every MIG placement as a device
that consumes from it. The scheduler then never allocates two placements that overlap.

The layout depends on the API server (resource.k8s.io/v1 validation):

* Kubernetes 1.34: a device may only consume from a counter set of its own slice, and a slice
  holds at most 32 counters in all its sets; so one slice per MIG GPU (its set and its
  placements), the whole GPUs in slices of their own.
* Kubernetes 1.35 and later: a slice holds either ``sharedCounters`` or ``devices``, never both;
  at most 8 counter sets per slice, counter set names unique in the pool, and at most 64 devices
  in a slice where any device consumes counters. So counter slices first, then device slices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cdigen.memory_shares import MemoryShares
from cdigen.model import Gpu
from cdigen.plugin.dra.slices import (
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_WITH_TAINTS,
    TaintDoc,
    device_doc,
    pool_slices,
)
from cdigen.policies.device_view import DeviceView
from cdigen.sizes import quantity_text

SEPARATE_COUNTERS_MINOR = 35  # from Kubernetes 1.35 counters live in slices of their own
MAX_COUNTER_SETS_PER_SLICE = 8  # 1.35+
MEMORY = "memory"
COMPUTE = "compute-slices"


def memory_slice_counter(n: int) -> str:
    """The counter of memory slice ``n`` (a DNS label)."""
    return f"memory-slice-{n}"


def counter_set_name(gpu: Gpu) -> str:
    """The counter set of one GPU: ``gpu-<index>-mig``."""
    return f"gpu-{gpu.index}-mig"


def counter_set(placements: Sequence[DeviceView]) -> dict[str, Any]:
    """One MIG-enabled GPU's counter set, from its ``placements``: its memory in bytes, its
    compute slices (the largest profile's), and each memory slice (1: a placement takes it
    whole)."""
    gpu = placements[0].gpu
    made = [v.placement for v in placements if v.placement is not None]
    counters = {
        MEMORY: {"value": quantity_text(gpu.memory_bytes)},
        COMPUTE: {"value": str(max(p.profile.compute_slices for p in made))},
    }
    for n in range(max(p.memory_slices.stop for p in made)):
        counters[memory_slice_counter(n)] = {"value": "1"}
    return {"name": counter_set_name(gpu), "counters": counters}


def _by_gpu(views: Sequence[DeviceView]) -> tuple[list[list[DeviceView]], list[DeviceView]]:
    """The placement views grouped by GPU (in view order), and the other views."""
    groups: dict[int, list[DeviceView]] = {}
    others: list[DeviceView] = []
    for view in views:
        if view.placement is None:
            others.append(view)
        else:
            groups.setdefault(view.gpu.index, []).append(view)
    return list(groups.values()), others


def consumption(view: DeviceView) -> list[dict[str, Any]]:
    """The ``consumesCounters`` of a placement device (none for any other device)."""
    placement = view.placement
    if placement is None:
        return []
    counters = {
        MEMORY: {"value": quantity_text(placement.profile.memory_bytes)},
        COMPUTE: {"value": str(placement.profile.compute_slices)},
    }
    for n in placement.memory_slices:
        counters[memory_slice_counter(n)] = {"value": "1"}
    return [{"counterSet": counter_set_name(view.gpu), "counters": counters}]


def _docs(
    views: Sequence[DeviceView],
    shares: MemoryShares | None,
    taints: Mapping[str, Sequence[TaintDoc]],
) -> list[dict[str, Any]]:
    return [
        device_doc(v, shares=shares, taints=taints.get(v.name, ()), consumes=consumption(v))
        for v in views
    ]


def _chunks(items: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def _contents_1_34(
    views: Sequence[DeviceView],
    shares: MemoryShares | None,
    taints: Mapping[str, Sequence[TaintDoc]],
) -> list[dict[str, Any]]:
    """One slice per MIG GPU (its counter set and placements, in view order), then the other
    devices."""
    groups, others = _by_gpu(views)
    contents: list[dict[str, Any]] = [
        {"sharedCounters": [counter_set(group)], "devices": _docs(group, shares, taints)}
        for group in groups
    ]
    limit = MAX_DEVICES_WITH_TAINTS if any(taints.get(v.name) for v in others) else None
    for chunk in _chunks(others, limit or MAX_DEVICES_PER_SLICE):
        contents.append({"devices": _docs(chunk, shares, taints)})
    return contents


def _contents_1_35(
    views: Sequence[DeviceView],
    shares: MemoryShares | None,
    taints: Mapping[str, Sequence[TaintDoc]],
) -> list[dict[str, Any]]:
    """Counter slices (8 sets each), then device slices of at most 64 devices, in view order."""
    sets = [counter_set(group) for group in _by_gpu(views)[0]]
    contents: list[dict[str, Any]] = [
        {"sharedCounters": chunk} for chunk in _chunks(sets, MAX_COUNTER_SETS_PER_SLICE)
    ]
    for chunk in _chunks(views, MAX_DEVICES_WITH_TAINTS):
        contents.append({"devices": _docs(chunk, shares, taints)})
    return contents


def build_counter_slices(
    views: Sequence[DeviceView],
    *,
    driver: str,
    node_name: str,
    generation: int,
    server_minor: int,
    owner: dict[str, str] | None = None,
    shares: MemoryShares | None = None,
    taints: Mapping[str, Sequence[TaintDoc]] | None = None,
) -> list[dict[str, Any]]:
    """The pool's slices with counters, in the layout Kubernetes 1.``server_minor`` takes
    (as :func:`cdigen.plugin.dra.slices.build_slices` otherwise)."""
    build = _contents_1_35 if server_minor >= SEPARATE_COUNTERS_MINOR else _contents_1_34
    contents = build(views, shares, taints or {}) or [{"devices": []}]
    return pool_slices(
        contents, driver=driver, node_name=node_name, generation=generation, owner=owner
    )
