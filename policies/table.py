"""Subset tables of the exact search: every subset of up to ``EXACT_LIMIT`` GPUs scored once.

A table holds, per bit mask over its universe of GPU positions: the link score, the NUMA nodes,
the best ``NEXT_SET_SIZE``-GPU set and the best pairing within it (the fragmentation terms of
the objective), and the subsets of each size sorted by the static part of the objective.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import repeat
from math import comb
from operator import add, rshift, sub

from cdigen.policies.graph import Topology
from cdigen.policies.terms import NEXT_SET_SIZE, StaticTerms, static_terms

EXACT_LIMIT = 16
# Up to this many GPUs a table also holds its walk per available set and size (Walks)
WITHIN_LIMIT = 8


def bits(mask: int) -> list[int]:
    """The set bits of ``mask``, lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


@dataclass(frozen=True)
class Universe:
    """The GPUs of a table, by bit: their positions, pair scores, NUMA nodes (as bits of this
    universe's own numbering) and which fail the selector."""

    positions: tuple[int, ...]
    bit_of: Mapping[int, int]
    weights: list[list[int]]
    numa_bit: list[int]
    numa_ids: Mapping[int | None, int]
    fail_mask: int

    @classmethod
    def of(
        cls, topology: Topology, universe: Sequence[int], fail_positions: AbstractSet[int]
    ) -> Universe:
        """The universe of GPU positions ``universe`` of ``topology``."""
        positions = tuple(universe)
        bit_of = {p: b for b, p in enumerate(positions)}
        numa_ids: dict[int | None, int] = {}
        numa_bit: list[int] = []
        for p in positions:
            numa = topology.numa[p]
            numa_bit.append(0 if numa is None else 1 << numa_ids.setdefault(numa, len(numa_ids)))
        return cls(
            positions=positions,
            bit_of=bit_of,
            weights=[[topology.scores[p][q] for q in positions] for p in positions],
            numa_bit=numa_bit,
            numa_ids=numa_ids,
            fail_mask=sum(1 << bit_of[p] for p in fail_positions if p in bit_of),
        )

    def positions_of(self, mask: int) -> tuple[int, ...]:
        """The GPU positions of a mask, ascending."""
        return tuple(sorted(self.positions[b] for b in bits(mask)))


class Table:
    """Every subset of ``universe`` (GPU positions) scored, and sorted per size by static key."""

    def __init__(
        self, topology: Topology, universe: Sequence[int], fail_positions: AbstractSet[int]
    ) -> None:
        parts = Universe.of(topology, universe, fail_positions)
        self.universe = parts.positions
        self.bit_of = parts.bit_of
        count = len(self.universe)
        weights, numa_bit, numa_ids = parts.weights, parts.numa_bit, parts.numa_ids
        fail_mask = self.fail_mask = parts.fail_mask
        score, numa_bits, sizes = _per_mask(weights, numa_bit)
        self.score = score
        self.numa_bits = numa_bits
        # this table's NUMA bit -> the node's NUMA node, and NUMA bit sets -> sorted nodes
        self._numa_of_bit = {1 << b: n for n, b in numa_ids.items() if n is not None}
        self._numa_nodes: dict[int, tuple[int, ...]] = {}
        self._nvlinks = [[topology.nvlinks[p][q] for q in self.universe] for p in self.universe]
        self._min_pair: list[int] | None = None
        self._popcounts = sizes
        # constraint results by this table's raw fact arrays (see Objective.mask_ok)
        self.ok_cache: dict[tuple[int, ...], bool] = {}
        self.numa_span = list(map(int.bit_count, numa_bits))
        key, shift = _sort_keys(score, numa_bits, len(numa_ids), fail_mask, count)
        # the static rank (above it the size, equal within an order list): ties are equal
        self.static_rank = list(map(rshift, key, repeat(shift)))
        key.sort()
        ordered = list(map(((1 << count) - 1).__and__, key))
        self.order: list[list[int]] = []
        start = 0
        for k in range(count + 1):
            self.order.append(ordered[start : start + comb(count, k)])
            start += comb(count, k)
        self.full_mask = (1 << count) - 1
        self.within: Walks | None = None  # see walks_within
        self.weights = weights
        self.left_best_set = _best_set_within(score, sizes, count, NEXT_SET_SIZE)
        self.left_pairs = _best_pairing_within(weights, count)
        self._rest_bounds = [
            (
                max(map(self.left_best_set.__getitem__, masks)),
                max(map(self.left_pairs.__getitem__, masks)),
                max(map(score.__getitem__, masks)),
            )
            for masks in self.order
        ]

    def rest_bounds(self, size: int) -> tuple[int, int, int]:
        """The highest best set, best pairing and link score of any ``size``-mask: a set that
        leaves all three free cannot be beaten on terms 6-8."""
        return self._rest_bounds[size]

    def walks_within(self) -> Walks | None:
        """Per available mask, per size ``k``: the ``k``-masks within it in the order of
        :attr:`order` (the walk without the sets that use a busy GPU); None above
        ``WITHIN_LIMIT`` GPUs."""
        if self.within is None and len(self.universe) <= WITHIN_LIMIT:
            self.within = Walks(self.order, self.full_mask)
        return self.within

    def static_terms(self, mask: int) -> StaticTerms:
        """Terms 1, 3 and 4 of the objective for a mask (what :attr:`static_rank` orders)."""
        return static_terms(
            (mask & self.fail_mask).bit_count(), self.score[mask], self.numa_span[mask]
        )

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
                out.append(self._popcounts)
            elif name == "linkScore":
                out.append(self.score)
            else:
                self.min_pair_nvlinks(0)
                assert self._min_pair is not None
                out.append(self._min_pair)
        return out


class Walks(dict[int, "SizeWalks"]):
    """Per available mask, per size ``k``: the ``k``-masks within it in the order of the
    table's walk (``order``), each made when first asked for (a few µs on 8 GPUs: all 2,304
    at engine build were most of its cost) and kept."""

    def __init__(self, order: list[list[int]], full_mask: int) -> None:
        super().__init__()
        self._order, self._full_mask = order, full_mask

    def __missing__(self, avail: int) -> SizeWalks:
        walks = self[avail] = SizeWalks(self._order, self._full_mask & ~avail)
        return walks


class SizeWalks(dict[int, list[int]]):
    """One available mask's walks by size ``k``, each made when first asked for."""

    def __init__(self, order: list[list[int]], busy: int) -> None:
        super().__init__()
        self._order, self._busy = order, busy

    def __missing__(self, k: int) -> list[int]:
        busy = self._busy
        walk = self[k] = [mask for mask in self._order[k] if not mask & busy]
        return walk


def _max_into(target: list[int], values: list[int]) -> list[int]:
    """The elementwise maximum of ``target`` and ``values``."""
    return [t if t >= v else v for t, v in zip(target, values, strict=False)]  # same lengths


def _subsets_with_bit(count: int, bit: int) -> list[tuple[slice, slice]]:
    """The masks below ``1 << count`` holding ``bit``, as slices, each with the slice of the
    same masks without it: strided when that takes fewer slices, else contiguous blocks."""
    half, step = 1 << bit, 2 << bit
    if half <= (1 << count) // step:
        return [(slice(j + half, None, step), slice(j, None, step)) for j in range(half)]
    return [
        (slice(start + half, start + step), slice(start, start + half))
        for start in range(0, 1 << count, step)
    ]


def _best_set_within(score: list[int], sizes: list[int], count: int, k: int) -> list[int]:
    """For every mask: the highest link score of a ``k``-subset of it (0 if it has fewer, and
    at least 0 if it has more)."""
    floor = min(score) - 1  # below every set's score: "no k-subset here yet"
    best = [s if n == k else floor for s, n in zip(score, sizes, strict=True)]
    for bit in range(count):  # the maximum over subsets, one bit at a time
        for with_bit, without in _subsets_with_bit(count, bit):
            best[with_bit] = _max_into(best[with_bit], best[without])
    return [
        v if n == k else (v if v > 0 else 0) if n > k else 0
        for v, n in zip(best, sizes, strict=True)
    ]


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
    """For every mask: the highest total link score of disjoint pairs in it (a best matching).

    By the highest bit h of a mask: h stays unpaired, or pairs with a bit j of the rest r,
    best[h + r] = max(best[r], weights[h][j] + best[r - j]); per (h, j) one slice operation.
    """
    best = [0]
    for h in range(count):
        row = weights[h]
        top = best[:]  # h unpaired
        for j in range(h):
            w = row[j]
            for with_j, without in _subsets_with_bit(h, j):
                top[with_j] = [
                    t if t >= (v := x + w) else v
                    for t, x in zip(top[with_j], best[without], strict=False)  # same lengths
                ]
        best += top
    return best


def _per_mask(
    weights: list[list[int]], numa_bit: list[int]
) -> tuple[list[int], list[int], list[int]]:
    """Per mask over ``len(weights)`` bits: the link score, the NUMA bits and the size.

    Every list is built by doubling over the highest bit: the masks with bit b set are those
    below 1 << b with b added, so each step is one list operation in C."""
    score, numa_bits, sizes = [0], [0], [0]
    for b in range(len(weights)):
        row = weights[b]
        gain = [0]  # the link score of bit b to each subset of the bits below it
        for j in range(b):
            gain += list(map(row[j].__add__, gain))
        score += list(map(add, score, gain))
        numa_bits += list(map(numa_bit[b].__or__, numa_bits))
        sizes += list(map((1).__add__, sizes))
    return score, numa_bits, sizes


def _sort_keys(
    score: list[int], numa_bits: list[int], numa_count: int, fail_mask: int, count: int
) -> tuple[list[int], int]:
    """One sort key per mask (unsorted), and the shift below its static rank.

    A key is a packed int, high bits first: the mask's size; its static rank, terms 1, 3 and 4
    (static_terms) as one int, (fails * R + high - score) * S + span; term 9, positions
    ascending (the bit-reversed mask descending); the mask itself. All but the score and the
    span add up over the mask's bits: built by doubling too."""
    low, high = min(score), max(score)
    spread, spans = high - low + 1, numa_count + 1
    shift = 2 * count
    rank_bits = ((fail_mask.bit_count() + 1) * spread * spans).bit_length()
    full = (1 << count) - 1
    key = [((high * spans) << shift) + (full << count)]
    for b in range(count):
        step = (1 << (rank_bits + shift)) + (((fail_mask >> b & 1) * spread * spans) << shift)
        step += (1 << b) - (1 << (count - 1 - b) << count)
        key += list(map(step.__add__, key))
    span_key = [nodes.bit_count() << shift for nodes in range(1 << numa_count)]
    key = list(
        map(
            sub,
            map(add, key, map(span_key.__getitem__, numa_bits)),
            map((spans << shift).__mul__, score),
        )
    )
    return key, shift


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
