"""THE COMPARISON BASELINE, not cdigen's engine: the best-effort policy NVIDIA's device plugin uses.

Written from what that policy (go-gpuallocator v0.6.0, ``GetPreferredAllocation``) is documented
and observed to do, for side-by-side figures only (``cdigen policy simulate``, ``benchmarks/``).
It lives here rather than in ``benchmarks/`` so ``policy simulate`` needs no benchmark import.
``tests/unit/test_baseline_reference.py`` holds it to the answers the real policy gave for every
request on five built-in nodes (``../shared/reference/go-gpuallocator``).

What it does, weaknesses kept on purpose:

- it scores a set of GPUs as the sum of its pair scores: 100 per NVLink plus the PCIe level
  (SYS 10, NODE 20, PHB 30, PXB 40, PIX 50); no NUMA term. On NVSwitch systems it sees no
  NVLink (go-nvml matches an NVLink's remote bus id against the peer GPU's, which through a
  switch never matches), so those pairs score PCIe only. A node counts as NVSwitch here when
  every GPU pair has the same non-zero NVLink count and there are at least 8 GPUs;
- it does not pick the best set for the request: it fills the free GPUs up with empty slots
  to a multiple of the request size, cuts them every possible way into groups of that size
  (the empty slots all in one group), and keeps the highest-scoring cut that has an
  empty-slot-free group holding every must-include GPU; among equals the first in canonical
  order wins (the group of the lowest slot first, its companions in lexicographic order);
- its answer is the highest-scoring group of that cut holding the must-include GPUs (the first
  of equals), which may be the group with the empty slots: then the answer holds ``None``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from itertools import combinations
from math import factorial
from operator import itemgetter

from cdigen.model import Node
from cdigen.policies.search import bit_values

PCIE_SCORE = {"SYS": 10, "NODE": 20, "PHB": 30, "PXB": 40, "PIX": 50}
NVLINK_SCORE = 100


def is_nvswitch(node: Node) -> bool:
    """Whether the baseline would miss this node's NVLinks (uniform all-pairs NVLink, >= 8 GPUs)."""
    if len(node.gpus) < 8:
        return False
    counts = {
        (link.nvlinks if (link := node.link(a.index, b.index)) else 0)
        for i, a in enumerate(node.gpus)
        for b in node.gpus[i + 1 :]
    }
    return len(counts) == 1 and min(counts) > 0


def pair_scores(node: Node) -> dict[tuple[int, int], int]:
    """The baseline's score of each ordered pair of GPU indexes (0 for a GPU with itself, or
    where there is no link)."""
    nvlink_seen = not is_nvswitch(node)
    scores: dict[tuple[int, int], int] = {}
    for a in node.gpus:
        for b in node.gpus:
            link = node.link(a.index, b.index) if a.index != b.index else None
            score = 0
            if link is not None:
                score = PCIE_SCORE.get(link.pcie or "", 0)
                score += NVLINK_SCORE * link.nvlinks if nvlink_seen else 0
            scores[(a.index, b.index)] = score
    return scores


def partition_count(available: int, size: int) -> int:
    """How many cuts the baseline scores for ``available`` free GPUs and a ``size`` request."""
    slots = available + (-available) % size
    groups = slots // size
    count: int = factorial(slots) // (factorial(size) ** groups * factorial(groups))
    return count


def _positions(mask: int) -> list[int]:
    """The positions of the bits set in ``mask``, lowest first."""
    return [bit.bit_length() - 1 for bit in bit_values(mask)]


def _cuts(
    slots: int, size: int, empty: int, score: Callable[[int], int]
) -> Iterator[tuple[int, tuple[int, ...]]]:
    """Every cut of the slot mask ``slots`` into group masks of ``size`` slots, with its score
    (the sum of ``score`` over its groups), in canonical order; a group holds all of the
    ``empty`` slots or none of them."""
    groups: list[int] = []

    def grow(left: int, total: int) -> Iterator[tuple[int, tuple[int, ...]]]:
        if not left:
            yield total, tuple(groups)
            return
        lowest = left & -left
        for companions in combinations(bit_values(left ^ lowest), size - 1):
            group = lowest | sum(companions)
            if group & empty in (0, empty):
                groups.append(group)
                yield from grow(left ^ group, total + score(group))
                groups.pop()

    return grow(slots, 0)


class BestEffortBaseline:
    """The baseline's answers over GPU indexes for one node (``None`` in one: an empty slot)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.pair = pair_scores(node)

    def set_score(self, group: Sequence[int | None]) -> int:
        """Sum of the pair scores of the GPUs in ``group``; empty slots add nothing."""
        gpus = [g for g in group if g is not None]
        return sum(self.pair[(a, b)] for i, a in enumerate(gpus) for b in gpus[i + 1 :])

    def allocate(
        self, available: Sequence[int], required: Sequence[int], size: int
    ) -> list[int | None]:
        """The baseline's answer, in ``available``'s order; ``[]`` where it has none."""
        if size <= 0 or len(available) < size or len(required) > size:
            return []
        must = set(required)
        if not must <= set(available):
            return []
        if size == 1:  # one cut, every group scores 0: the first group that fits wins
            return [required[0] if required else available[0]]
        slots: list[int | None] = [*available, *[None] * ((-len(available)) % size)]
        need = empty = 0
        for position, gpu in enumerate(slots):
            if gpu is None:
                empty |= 1 << position
            elif gpu in must:
                need |= 1 << position
        scores: dict[int, int] = {}  # a group recurs in many cuts

        def group_score(group: int) -> int:
            if (score := scores.get(group)) is None:
                score = scores[group] = self.set_score([slots[i] for i in _positions(group)])
            return score

        cuts = _cuts((1 << len(slots)) - 1, size, empty, group_score)
        eligible = (c for c in cuts if any(g & need == need and not g & empty for g in c[1]))
        best = max(eligible, key=itemgetter(0), default=None)
        if best is None:
            return []
        answer = max((g for g in best[1] if g & need == need), key=group_score)
        return [slots[i] for i in _positions(answer)]
