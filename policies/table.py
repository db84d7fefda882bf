"""Subset tables of the exact search: every subset of up to ``EXACT_LIMIT`` GPUs scored once.

A table holds, per bit mask over its universe of GPU positions: the link score, the NUMA nodes,
the best ``NEXT_SET_SIZE``-GPU set and the best pairing within it (the fragmentation terms of
the objective), and the subsets of each size sorted by the static part of the objective.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from policies.graph import Topology
from policies.objective import NEXT_SET_SIZE, StaticTerms, static_terms

EXACT_LIMIT = 16


def popcount(mask: int) -> int:
    """How many bits ``mask`` has set."""
    return mask.bit_count()


def bits(mask: int) -> list[int]:
    """The set bits of ``mask``, lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class Table:
    """Every subset of ``universe`` (GPU positions) scored, and sorted per size by static key."""

    def __init__(
        self, topology: Topology, universe: Sequence[int], fail_positions: AbstractSet[int]
    ) -> None:
        self.universe = tuple(universe)
        self.bit_of = {p: b for b, p in enumerate(self.universe)}
        count = len(self.universe)
        weights = [[topology.scores[p][q] for q in self.universe] for p in self.universe]
        numa_ids: dict[int | None, int] = {}
        numa_bit: list[int] = []
        for p in self.universe:
            numa = topology.numa[p]
            numa_bit.append(0 if numa is None else 1 << numa_ids.setdefault(numa, len(numa_ids)))
        fail_mask = sum(1 << self.bit_of[p] for p in fail_positions if p in self.bit_of)
        self.fail_mask = fail_mask
        size = 1 << count
        score = [0] * size
        numa_bits = [0] * size
        reverse = [0] * size
        for mask in range(1, size):
            low = mask & -mask
            bit = low.bit_length() - 1
            rest = mask ^ low
            row = weights[bit]
            gain = 0
            r = rest
            while r:
                lb = r & -r
                gain += row[lb.bit_length() - 1]
                r ^= lb
            score[mask] = score[rest] + gain
            numa_bits[mask] = numa_bits[rest] | numa_bit[bit]
            reverse[mask] = reverse[rest] | (1 << (count - 1 - bit))
        self.score = score
        self.numa_bits = numa_bits
        # this table's NUMA bit -> the node's NUMA node, and NUMA bit sets -> sorted nodes
        self._numa_of_bit = {1 << b: n for n, b in numa_ids.items() if n is not None}
        self._numa_nodes: dict[int, tuple[int, ...]] = {}
        self._nvlinks = [[topology.nvlinks[p][q] for q in self.universe] for p in self.universe]
        self._min_pair: list[int] | None = None
        self._popcounts: list[int] | None = None
        # constraint results by this table's raw fact arrays (see Objective.mask_ok)
        self.ok_cache: dict[tuple[int, ...], bool] = {}
        self.numa_span = [popcount(b) for b in numa_bits]
        by_size: list[list[int]] = [[] for _ in range(count + 1)]
        for mask in range(size):
            by_size[popcount(mask)].append(mask)
        # the terms of the objective a set has whatever the request, then term 9 (positions)
        static_of = [
            static_terms(popcount(m & fail_mask), score[m], self.numa_span[m]) for m in range(size)
        ]
        self.order: list[list[int]] = []
        self.static: list[list[StaticTerms]] = []
        for masks in by_size:
            masks.sort(key=reverse.__getitem__, reverse=True)  # term 9 (no two equal) ...
            masks.sort(key=static_of.__getitem__)  # ... then, stable, terms 1, 3 and 4 first
            self.order.append(masks)
            self.static.append([static_of[m] for m in masks])
        # the static terms as one int per mask, in the same order: equal iff the terms are
        low, high = min(score), max(score)
        spans = max(self.numa_span) + 1
        self.static_rank = [
            ((f * (high - low + 1)) + (high - s)) * spans + n
            for f, s, n in zip(
                (popcount(m & fail_mask) for m in range(size)), score, self.numa_span, strict=True
            )
        ]
        self.weights = weights
        self.left_best_set = _best_set_within(score, count, NEXT_SET_SIZE)
        self.left_pairs = _best_pairing_within(weights, count)

    def left_free(self, free: int) -> tuple[int, int]:
        """What the free devices ``free`` offer the next request: best set, best pairing."""
        return self.left_best_set[free], self.left_pairs[free]

    def numa_nodes(self, mask: int) -> tuple[int, ...]:
        """The known NUMA nodes of a mask's GPUs, sorted (as ``Topology.numa_nodes``)."""
        numa = self.numa_bits[mask]
        nodes = self._numa_nodes.get(numa)
        if nodes is None:
            nodes = tuple(sorted(n for b, n in self._numa_of_bit.items() if b & numa))
            self._numa_nodes[numa] = nodes
        return nodes

    def mask_of(self, positions: Sequence[int]) -> int:
        """The table mask of GPU positions (all must be in the universe)."""
        return sum(1 << self.bit_of[p] for p in positions)

    def positions(self, mask: int) -> tuple[int, ...]:
        """The GPU positions of a table mask, ascending."""
        return tuple(sorted(self.universe[b] for b in bits(mask)))

    def min_pair_nvlinks(self, mask: int) -> int:
        """The fewest NVLinks between two GPUs of a mask (0 below two); a table built once."""
        table = self._min_pair
        if table is None:
            table = self._min_pair = _min_pair_within(self._nvlinks, len(self.universe))
        return table[mask]

    def fact_arrays(self, fields: Sequence[str]) -> list[list[int]]:
        """Per-mask arrays of the named ``allocation`` facts, in ``fields`` order; within this
        table equal entries mean equal facts (NUMA nodes as this table's bit set)."""
        out = []
        for name in fields:
            if name == "numaNodes":
                out.append(self.numa_bits)
            elif name == "size":
                if self._popcounts is None:
                    self._popcounts = [popcount(m) for m in range(len(self.score))]
                out.append(self._popcounts)
            elif name == "linkScore":
                out.append(self.score)
            else:
                self.min_pair_nvlinks(0)
                assert self._min_pair is not None
                out.append(self._min_pair)
        return out


def _best_set_within(score: list[int], count: int, k: int) -> list[int]:
    """For every mask: the highest link score of a ``k``-subset of it (0 if it has fewer)."""
    best = [0] * (1 << count)
    for mask in range(1, 1 << count):
        bits = mask.bit_count()
        if bits == k:
            best[mask] = score[mask]
        elif bits > k:  # a k-subset misses at least one bit of the mask
            top, rest = 0, mask
            while rest:
                low = rest & -rest
                rest ^= low
                if best[mask ^ low] > top:
                    top = best[mask ^ low]
            best[mask] = top
    return best


def _min_pair_within(nvlinks: list[list[int]], count: int) -> list[int]:
    """For every mask: the fewest NVLinks between two of its bits (0 below two bits).

    A pair of a set either misses its lowest bit a, or misses its second-lowest b, or is
    {a, b}: so the minimum is min(best[mask - a], best[mask - b], nvlinks[a][b]).
    """
    big = 1 << 30
    best = [big] * (1 << count)
    for mask in range(1, 1 << count):
        low = mask & -mask
        rest = mask ^ low
        if not rest:
            continue
        second = rest & -rest
        pair = nvlinks[low.bit_length() - 1][second.bit_length() - 1]
        best[mask] = min(best[rest], best[mask ^ second], pair)
    return [0 if v == big else v for v in best]


def _best_pairing_within(weights: list[list[int]], count: int) -> list[int]:
    """For every mask: the highest total link score of disjoint pairs in it (a best matching)."""
    best = [0] * (1 << count)
    for mask in range(3, 1 << count):
        low = mask & -mask
        rest = mask ^ low
        row = weights[low.bit_length() - 1]
        top = best[rest]  # the lowest device stays unpaired
        others = rest
        while others:
            partner = others & -others
            others ^= partner
            value = row[partner.bit_length() - 1] + best[rest ^ partner]
            if value > top:
                top = value
        best[mask] = top
    return best


class BitSums:
    """``sums(mask)``: the sum of ``values[b]`` over the bits of ``mask``.

    Above 8 values, by byte lookup tables (worth building when a request compares thousands
    of tied sets); up to 8, directly.
    """

    def __init__(self, values: Sequence[int]) -> None:
        self.values = list(values)
        self.tables: list[list[int]] = []
        if len(values) <= 8:
            return
        for start in range(0, max(len(values), 1), 8):
            chunk = list(values[start : start + 8])
            table = [0] * 256
            for byte in range(1, 256):
                low = byte & -byte
                bit = low.bit_length() - 1
                table[byte] = table[byte ^ low] + (chunk[bit] if bit < len(chunk) else 0)
            self.tables.append(table)

    def __call__(self, mask: int) -> int:
        if not self.tables:
            return sum(self.values[b] for b in bits(mask))
        total = 0
        for table in self.tables:
            total += table[mask & 255]
            mask >>= 8
        return total


def degrees(weights: list[list[int]], avail: int) -> list[int]:
    """For each table bit, the sum of its pair scores to the available devices."""
    present = bits(avail)
    return [sum(row[b] for b in present) for row in weights]
