"""The exact search for whole GPUs by counts, on nodes whose GPUs fall into few classes of
interchangeable GPUs: :class:`ClassSearch` (used by :class:`cdigen.policies.search.ExactSearch` for
whole-GPU requests under a policy without constraints; it needs no subset table)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product

from cdigen.policies.table import Universe
from cdigen.policies.terms import NEXT_SET_SIZE

# From this many GPUs a node's interchangeable GPUs are searched by counts (ClassSearch) when
# that takes at most CLASS_STATES count vectors.
CLASS_MIN_GPUS = 9
CLASS_STATES = 4096


class ClassSearch:
    """The exact search for whole GPUs by counts: GPUs that are interchangeable (the same
    selector result and NUMA node, and the same link score to every other GPU) form classes,
    and every objective term but the last depends only on how many a set takes from each.

    So the best set is found among count vectors, each standing for its earliest set (term 9:
    in each class, its must-include GPUs and then its lowest available ones). Masks are over
    the table's universe (bit b: ``universe[b]``); answers equal :meth:`ExactSearch.best_plain`.
    """

    def __init__(self, universe: Universe) -> None:
        count = len(universe.positions)
        members: list[list[int]] = []  # bits per class
        for b in range(count):
            for group in members:
                if _twins(universe, group[0], b):
                    group.append(b)
                    break
            else:
                members.append([b])
        self.masks = tuple(sum(1 << b for b in group) for group in members)
        self.bits = tuple(tuple(1 << b for b in group) for group in members)
        first = [group[0] for group in members]
        self.weight = tuple(
            tuple(
                universe.weights[a][group[1]]
                if a == group[0] and len(group) > 1
                else universe.weights[a][group[0]]
                if a != group[0]
                else 0
                for group in members
            )
            for a in first
        )
        self.fails = tuple(universe.fail_mask >> a & 1 for a in first)
        self.numa = tuple(universe.numa_bit[a] for a in first)
        # per count vector, filled on first use: static terms, what is left free, pairings
        self._static: dict[tuple[int, ...], tuple[int, int, int]] = {}
        self._left: dict[tuple[int, ...], tuple[int, int, int]] = {}
        self._pairs: dict[tuple[int, ...], int] = {}
        self._sets: dict[tuple[int, ...], int] = {}
        self._scores: dict[tuple[int, ...], int] = {}

    def prepare(self) -> None:
        """Compute what every count vector leaves free now, not on a kubelet call."""
        for counts in product(*[range(len(bits) + 1) for bits in self.bits]):
            self.left(counts)

    def states(self) -> int:
        """How many count vectors a request may have to look at, at most."""
        total = 1
        for bits in self.bits:
            total *= len(bits) + 1
        return total

    def score(self, counts: tuple[int, ...]) -> int:
        """The link score of a set taking ``counts`` GPUs of each class (cached)."""
        found = self._scores.get(counts)
        if found is None:
            found = self._scores[counts] = self._score(counts)
        return found

    def _score(self, counts: tuple[int, ...]) -> int:
        weight = self.weight
        total = 0
        for c, x in enumerate(counts):
            if x:
                row = weight[c]
                total += x * (x - 1) // 2 * row[c]
                for d in range(c + 1, len(counts)):
                    total += x * counts[d] * row[d]
        return total

    def left(self, counts: tuple[int, ...]) -> tuple[int, int, int]:
        """What ``counts`` GPUs left free offer: the best NEXT_SET_SIZE-set, the best pairing,
        the link score (cached)."""
        found = self._left.get(counts)
        if found is None:
            size = sum(counts)
            best_set = 0
            if size == NEXT_SET_SIZE:
                best_set = self.score(counts)
            elif size > NEXT_SET_SIZE:
                best_set = max(0, self._best_set(counts))
            found = (best_set, self._pairing(counts), self.score(counts))
            self._left[counts] = found
        return found

    def _best_set(self, counts: tuple[int, ...]) -> int:
        """The highest link score of NEXT_SET_SIZE of ``counts`` GPUs (at least that many):
        the best over the vectors one GPU smaller."""
        if sum(counts) == NEXT_SET_SIZE:
            return self.score(counts)
        found = self._sets.get(counts)
        if found is None:
            rest = list(counts)
            for c, x in enumerate(counts):
                if x:
                    rest[c] -= 1
                    value = self._best_set(tuple(rest))
                    rest[c] += 1
                    if found is None or value > found:
                        found = value
            assert found is not None
            self._sets[counts] = found
        return found

    def _pairing(self, counts: tuple[int, ...]) -> int:
        """The best total link score of disjoint pairs among ``counts`` GPUs (a best matching):
        a GPU of the first class present stays unpaired or pairs with one of some class."""
        if sum(counts) < 2:
            return 0
        found = self._pairs.get(counts)
        if found is None:
            c = next(n for n, x in enumerate(counts) if x)
            rest = list(counts)
            rest[c] -= 1
            found = self._pairing(tuple(rest))
            for d, x in enumerate(rest):
                if x:
                    rest[d] -= 1
                    found = max(found, self.weight[c][d] + self._pairing(tuple(rest)))
                    rest[d] += 1
            self._pairs[counts] = found
        return found

    def best(self, k: int, avail: int, must: int) -> int:
        """The mask of the best ``k``-set within ``avail`` holding ``must``, or -1."""
        have = tuple([(avail & m).bit_count() for m in self.masks])
        need = [(must & m).bit_count() for m in self.masks]
        all_left = self.score(have)
        best_key: tuple[int, int, int, int, int, int] | None = None
        best: tuple[int, ...] = ()
        tied: list[tuple[int, ...]] = []
        for counts in _vectors(have, need, k):
            static = self._static.get(counts)
            if static is None:
                static = self._static[counts] = self._static_terms(counts)
            left_set, left_pairs, left_score = self.left(
                tuple([h - x for h, x in zip(have, counts, strict=True)])
            )
            key = (*static, -left_set, -left_pairs, all_left + static[1] - left_score)
            if best_key is None or key < best_key:
                best_key, best, tied = key, counts, []
            elif key == best_key:
                tied.append(counts)
        if best_key is None:
            return -1
        # term 9 among count vectors equal on the rest: the earliest of their earliest sets
        return min(
            (self._earliest(counts, avail, must, need) for counts in [best, *tied]),
            key=_ascending_bits,
        )

    def _static_terms(self, counts: tuple[int, ...]) -> tuple[int, int, int]:
        """Terms 1, 3 and 4 (static_terms) of a set taking ``counts`` of each class."""
        numa = 0
        for c, x in enumerate(counts):
            if x:
                numa |= self.numa[c]
        fails = sum(f * x for f, x in zip(self.fails, counts, strict=True))
        return (fails, -self.score(counts), numa.bit_count())

    def _earliest(self, counts: tuple[int, ...], avail: int, must: int, need: list[int]) -> int:
        """The earliest set (term 9) taking ``counts``: in each class its must-include GPUs,
        then its lowest available others."""
        mask = must
        for c, x in enumerate(counts):
            extra = x - need[c]
            for bit in self.bits[c]:
                if not extra:
                    break
                if bit & avail and not bit & must:
                    mask |= bit
                    extra -= 1
        return mask


def _twins(universe: Universe, a: int, b: int) -> bool:
    """Whether bits ``a`` and ``b`` are interchangeable for the objective."""
    if (universe.fail_mask >> a & 1) != (universe.fail_mask >> b & 1):
        return False
    if universe.numa_bit[a] != universe.numa_bit[b]:
        return False
    row_a, row_b = universe.weights[a], universe.weights[b]
    return all(row_a[x] == row_b[x] for x in range(len(row_a)) if x not in (a, b))


def _vectors(have: Sequence[int], need: Sequence[int], k: int) -> list[tuple[int, ...]]:
    """The count vectors x with need <= x <= have, elementwise, summing to ``k``."""
    if not have:
        return [()] if k == 0 else []
    ranges = [range(n, h + 1) for n, h in zip(need[:-1], have[:-1], strict=True)]
    low, high = need[-1], have[-1]
    out = []
    for first in product(*ranges):
        last = k - sum(first)
        if low <= last <= high:
            out.append((*first, last))
    return out


def _ascending_bits(mask: int) -> tuple[int, ...]:
    """The bit numbers of ``mask``, ascending (term 9 compares these)."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return tuple(out)
