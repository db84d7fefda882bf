"""The order of devices in a DRA ResourceSlice: the scheduler's first fit walks devices in slice
order, so the order is where the engine's link score reaches DRA.

The order is built from nested best sets: the best-linked pair first, grown to the best-linked
4-set containing it, then 8, ... up to half the node; the rest is ordered the same way. A first
fit over it lands on the best pair for a 2-GPU claim and on the best 4-set for a 4-GPU claim on
a free node (checked by brute force on the builtin topologies, tests/unit/test_dra_topology.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from cdigen.model import Node
from cdigen.policies.device_view import DeviceView
from cdigen.policies.graph import Topology, build_topology

# The most candidate sets one growth step may score before falling back to greedy growth.
MAX_CANDIDATES = 5000


def _key(topology: Topology, positions: tuple[int, ...]) -> tuple[int, int, tuple[int, ...]]:
    """Best link score, then fewest NUMA nodes, then the lowest indexes."""
    return (
        topology.set_score(positions),
        -len(topology.numa_nodes(positions)),
        tuple(-topology.gpus[p].index for p in sorted(positions)),
    )


def _grow(topology: Topology, chosen: list[int], pool: list[int], size: int) -> list[int]:
    """The members to add to ``chosen`` (from ``pool``) so that it has ``size`` GPUs, in the
    order a first fit should meet them."""
    need = size - len(chosen)
    if need <= 0:
        return []
    if len(pool) >= need and _combinations(len(pool), need) <= MAX_CANDIDATES:
        best = max(
            itertools.combinations(pool, need),
            key=lambda extra: _key(topology, (*chosen, *extra)),
        )
        new = list(best)
    else:
        new = []
        while len(new) < need:
            placed = chosen + new
            new.append(
                max(
                    (p for p in pool if p not in new),
                    key=lambda p: _key(topology, (*placed, p)),
                )
            )
    # inside one growth step: the GPU best linked to those already placed first
    ordered: list[int] = []
    while new:
        placed = chosen + ordered
        nxt = max(new, key=lambda p: (sum(topology.scores[p][q] for q in placed), -p))
        ordered.append(nxt)
        new.remove(nxt)
    return ordered


def _combinations(n: int, k: int) -> int:
    import math

    return math.comb(n, k)


def _nested(topology: Topology, pool: list[int]) -> list[int]:
    order: list[int] = []
    left = list(pool)
    while left:
        if len(left) == 1:
            order.append(left.pop())
            break
        block: list[int] = []
        size = 2
        limit = max(2, len(left) // 2) if len(left) > 2 else len(left)
        while True:
            block += _grow(topology, block, [p for p in left if p not in block], size)
            if size >= limit:
                break
            size = min(size * 2, limit)
        order += block
        left = [p for p in left if p not in block]
    return order


def engine_order(node: Node, exclude: frozenset[int] = frozenset()) -> tuple[int, ...]:
    """GPU indexes in the order a first fit should meet them (see the module doc). Unhealthy
    GPUs and those in ``exclude`` (tainted ones) come last, by index."""
    topology = build_topology(node)
    usable = [p for p, g in enumerate(topology.gpus) if g.usable and g.index not in exclude]
    order = _nested(topology, usable)
    rest = [p for p in range(topology.size) if p not in order]
    return tuple(topology.gpus[p].index for p in order + rest)


def ordered_views(
    views: Sequence[DeviceView], node: Node, exclude: frozenset[int] = frozenset()
) -> list[DeviceView]:
    """``views`` sorted by their GPU's place in :func:`engine_order` (a GPU's MIG devices stay
    together, in their own order)."""
    rank = {index: n for n, index in enumerate(engine_order(node, exclude))}
    return sorted(views, key=lambda v: rank.get(v.gpu.index, len(rank)))
