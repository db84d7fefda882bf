"""THE COMPARISON BASELINE, not cdigen's engine: go-gpuallocator's best-effort policy, ported.

A port of NVIDIA/go-gpuallocator's ``bestEffortPolicy.Allocate`` from its public description,
used only for side-by-side figures (``cdigen policy simulate``, ``benchmarks/``). It lives here
rather than in ``benchmarks/`` so that ``policy simulate`` can use it without importing
benchmarks. Its known weaknesses are kept on purpose:

- pad ``available`` with empty slots (None) to a multiple of ``size``, enumerate every
  partition into groups of ``size`` (a group holds no padding or all of it), keep the first
  best-scoring partition that has a padding-free group holding every required device, and
  return that partition's first best-scoring group holding them, which may be the padded one;
- pair scores: 100 per NVLink plus the PCIe level (SYS 10, NODE 20, PHB 30, PXB 40, PIX 50);
  no NUMA term; on NVSwitch systems NVLinks are not seen (go-nvml compares the NVLink's remote
  bus id with the peer GPU's; through a switch it never matches), so they score PCIe only.
  Here a node counts as NVSwitch when every GPU pair has the same non-zero NVLink count and
  there are at least 8 GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import combinations
from math import factorial

from cdigen.model import Node

_PCIE = {"SYS": 10, "NODE": 20, "PHB": 30, "PXB": 40, "PIX": 50}


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


class BestEffortBaseline:
    """go-gpuallocator's best-effort allocation over GPU indexes (None: a padded empty slot)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        blind = is_nvswitch(node)
        indexes = [g.index for g in node.gpus]
        self.pair: dict[tuple[int, int], int] = {}
        for a in indexes:
            for b in indexes:
                link = node.link(a, b) if a != b else None
                score = 0
                if link is not None:
                    score = _PCIE.get(link.pcie or "", 0) + (0 if blind else 100 * link.nvlinks)
                self.pair[(a, b)] = score

    def set_score(self, group: Sequence[int | None]) -> int:
        """Sum of pair scores; pairs with an empty slot score 0."""
        real = [g for g in group if g is not None]
        return sum(self.pair[(a, b)] for i, a in enumerate(real) for b in real[i + 1 :])

    def allocate(
        self, available: Sequence[int], required: Sequence[int], size: int
    ) -> list[int | None]:
        """The baseline's answer: may hold None (a padded slot), as the Go code may."""
        if size <= 0 or len(available) < size or len(required) > size:
            return []
        need = set(required)
        best: list[list[int | None]] | None = None
        best_score = 0
        for partition in _partitions(list(available), size):
            # a set holding every required device and no padding must exist
            if not any(need <= set(g) and None not in g for g in partition):
                continue
            score = sum(self.set_score(group) for group in partition)
            if best is None or score > best_score:
                best, best_score = partition, score
        if best is None:
            return []
        # every set holding the required devices, padding or not (the empty-slot bug)
        candidates = [g for g in best if need <= set(g)]
        if not candidates:
            return []
        chosen = candidates[0]
        chosen_score = self.set_score(chosen)
        for group in candidates[1:]:
            score = self.set_score(group)
            if score > chosen_score:
                chosen, chosen_score = group, score
        return chosen


def partition_count(available: int, size: int) -> int:
    """How many partitions the baseline enumerates for ``available`` devices and ``size``."""
    padded = available + (-available) % size
    groups = padded // size
    count: int = factorial(padded) // (factorial(size) ** groups * factorial(groups))
    return count


def _partitions(devices: list[int], size: int) -> Iterator[list[list[int | None]]]:
    """Partitions in the Go code's order: sets with no padding or all of it, first device fixed."""
    if size == 1:
        for device in devices:
            yield [[device]]
        return
    padded: list[int | None] = [*devices, *([None] * ((-len(devices)) % size))]
    padding = padded.count(None)

    def iterate(items: list[int | None]) -> Iterator[list[list[int | None]]]:
        if len(items) == size:
            yield [items]
            return
        first, rest = items[0], items[1:]
        for companions in combinations(range(len(rest)), size - 1):
            group = [first, *(rest[i] for i in companions)]
            nones = group.count(None)
            if nones not in (0, padding):
                continue
            # Go drops every nil from the remainder once a set holds one (nil == nil)
            remaining = [
                x for i, x in enumerate(rest) if i not in companions and not (nones and x is None)
            ]
            for tail in iterate(remaining):
                yield [group, *tail]

    yield from iterate(padded)
