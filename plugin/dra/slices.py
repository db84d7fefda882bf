"""ResourceSlices (resource.k8s.io/v1) from the DRA device view, as plain dicts.

One pool per node, named after the node; at most 128 devices per slice; devices in the order
the allocation engine prefers, because the scheduler's first fit walks them in slice order.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from cdigen.model import Node
from policies.device_view import DeviceView
from policies.graph import build_topology

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128
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


def engine_order(node: Node) -> tuple[int, ...]:
    """GPU indexes in the order the engine's link score prefers, built greedily: start from the
    best-connected GPU, then always add the GPU with the highest score to those already placed
    (ties: the same NUMA node as the first, then the lowest index). A scheduler's first fit over
    this order lands on well-connected sets. Unhealthy GPUs come last, by index."""
    topology = build_topology(node)
    usable = [p for p, g in enumerate(topology.gpus) if g.healthy and not g.error]
    order: list[int] = []
    while len(order) < len(usable):
        home = topology.numa[order[0]] if order else None

        def gain(p: int, home: int | None = home) -> tuple[int, bool, int]:
            row = topology.scores[p]
            score = sum(row[q] for q in order) if order else sum(row[q] for q in usable)
            return (score, topology.numa[p] == home, -topology.gpus[p].index)

        order.append(max((p for p in usable if p not in order), key=gain))
    rest = [p for p in range(topology.size) if p not in order]
    return tuple(topology.gpus[p].index for p in order + rest)


def ordered_views(views: Sequence[DeviceView], node: Node) -> list[DeviceView]:
    """``views`` sorted by their GPU's place in :func:`engine_order` (a GPU's MIG devices stay
    together, in their own order)."""
    rank = {index: n for n, index in enumerate(engine_order(node))}
    return sorted(views, key=lambda v: rank.get(v.gpu.index, len(rank)))


def device_doc(view: DeviceView) -> dict[str, Any]:
    """One device entry of a v1 ResourceSlice."""
    return {
        "name": view.name,
        "attributes": {name: {a.kind: a.value} for name, a in sorted(view.attributes.items())},
        "capacity": {
            name: {"value": quantity_text(v)} for name, v in sorted(view.capacity.items())
        },
    }


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
) -> list[dict[str, Any]]:
    """The ResourceSlices of one node's pool: ``views`` in order, ``max_devices`` per slice.

    ``owner`` (``{"name": ..., "uid": ...}`` of the Node object) makes the slices go away with
    the node. A node without devices still publishes one empty slice, so the pool exists.
    """
    chunks = [list(views[i : i + max_devices]) for i in range(0, len(views), max_devices)] or [[]]
    slices: list[dict[str, Any]] = []
    for n, chunk in enumerate(chunks):
        metadata: dict[str, Any] = {"name": slice_name(node_name, driver, n)}
        if owner:
            metadata["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": owner["name"], "uid": owner["uid"]}
            ]
        slices.append(
            {
                "apiVersion": API_VERSION,
                "kind": "ResourceSlice",
                "metadata": metadata,
                "spec": {
                    "driver": driver,
                    "nodeName": node_name,
                    "pool": {
                        "name": node_name,
                        "generation": generation,
                        "resourceSliceCount": len(chunks),
                    },
                    "devices": [device_doc(v) for v in chunk],
                },
            }
        )
    return slices
