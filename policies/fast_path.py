"""The engine's fast path: whole GPUs, every one usable and known, a full table (or the class
search) and a policy without constraints. It answers on bit masks, with
:meth:`~cdigen.policies.search.ExactSearch.best_plain`, what the general path would; the
:class:`~cdigen.policies.allocator.Allocator` builds it and falls back to the general path on None.

On a node of at most ``NAMED_LIMIT`` GPUs, requests naming the available GPUs all by UUID or
all by index, in the node's order (ascending index), skip the per-ID work: their mask is
looked up by the whole tuple, and the answer of each chosen set is made once, when first chosen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from itertools import compress

from cdigen.policies.answers import AllocationAnswer, AllocationRequest, PositionAnswer
from cdigen.policies.search import ExactSearch
from cdigen.shares import share_kind

log = logging.getLogger("cdigen.allocator")

# Up to this many usable GPUs the fast path holds every answer by chosen set, per naming
NAMED_LIMIT = 8


class FastPath:
    """Whole-GPU IDs and positions -> their table bit, and the answers read off them."""

    def __init__(
        self,
        exact: ExactSearch,
        good: Sequence[int],
        namings: Sequence[Sequence[str]],
        position_of: Callable[[str], int | None],
    ) -> None:
        """The fast path over ``exact``'s universe for the usable positions ``good``;
        ``namings``: the whole-GPU IDs, per naming (UUIDs, indexes) in the node's order, read
        off ``position_of`` so that both paths agree on what an ID names."""
        universe = exact.universe
        assert universe is not None
        self.exact = exact
        self.universe = universe
        self.position_bits = {p: 1 << universe.bit_of[p] for p in good}
        self.id_bits: dict[str, int] = {}
        namings_kept: list[Naming] = []
        for ids in namings:
            bit_of = {}
            for name in ids:
                named = position_of(name)
                if named in self.position_bits and share_kind(name) == "gpu":
                    bit_of[name] = self.position_bits[named]
            self.id_bits.update(bit_of)
            if len(good) <= NAMED_LIMIT:
                namings_kept.append(Naming(bit_of, exact))
        # the available tuples of a naming in the node's order -> (mask, naming)
        self.named = NodeOrder(namings_kept)

    def ids(self, request: AllocationRequest) -> AllocationAnswer | None:
        """The answer for distinct whole-GPU IDs of usable GPUs with the must-include IDs
        among them (at most ``size``), else None: the general path answers the rest."""
        named = self.named[request.available]
        if named is None:
            return self._any_ids(request)
        avail, naming = named
        size, must_ids = request.size, request.must_include
        must = _must_mask(must_ids, naming.bit_of, request.available, size) if must_ids else 0
        if must < 0 or not 0 < size <= len(request.available):
            return None
        best = self.exact.best_plain(size, avail, must)
        if best < 0:
            return None
        answer = naming.answers[best]
        if answer.fallback_reason is not None:
            log.info("preferred allocation fallback: %s", answer.fallback_reason)
        return answer

    def _any_ids(self, request: AllocationRequest) -> AllocationAnswer | None:
        """:meth:`ids` for IDs in any order and naming (each ID read off :attr:`id_bits`)."""
        available, size = request.available, request.size
        bit_of = self.id_bits
        try:
            bits = list(map(bit_of.__getitem__, available))
        except KeyError:  # not a whole usable GPU
            return None
        avail = sum(bits)
        # n distinct bits sum to n set bits; a GPU named twice gives fewer
        if avail.bit_count() != len(bits) or not 0 < size <= len(bits):
            return None
        must_ids = request.must_include
        must = _must_mask(must_ids, bit_of, available, size) if must_ids else 0
        if must < 0:
            return None
        best = self.exact.best_plain(size, avail, must)
        if best < 0:
            return None
        score, numa_nodes, fails = self.exact.facts(best)
        return AllocationAnswer(
            tuple(compress(available, map(best.__and__, bits))),
            score,
            numa_nodes,
            _logged(_selector_note(fails)),
        )

    def positions(
        self, available: tuple[int, ...], must: tuple[int, ...], size: int
    ) -> PositionAnswer | None:
        """:meth:`ids` for devices as GPU positions (one device per GPU)."""
        get = self.position_bits.get
        bits = [get(p, 0) for p in available]
        avail = sum(bits)
        if avail.bit_count() != len(bits) or not 0 < size <= len(bits) or len(must) > size:
            return None
        must_mask = 0
        for m in must:
            if not 0 <= m < len(bits):
                return None
            must_mask |= bits[m]
        if must_mask.bit_count() != len(must):
            return None
        best = self.exact.best_plain(size, avail, must_mask)
        if best < 0:
            return None
        score, numa_nodes, fails = self.exact.facts(best)
        return PositionAnswer(
            tuple(compress(range(len(bits)), map(best.__and__, bits))),
            self.universe.positions_of(best),
            score,
            numa_nodes,
            _logged(_selector_note(fails)),
        )


class Naming:
    """One naming of the usable GPUs (all UUIDs or all indexes): each ID's bit, and every
    chosen mask's answer (:attr:`answers`, by mask) with its IDs in the node's order, made when
    the mask is first chosen and kept."""

    def __init__(self, bit_of: Mapping[str, int], exact: ExactSearch) -> None:
        self.bit_of = bit_of
        self.by_bit = sorted(bit_of.items(), key=lambda item: item[1])
        self.answers = _Answers(self, exact)

    def mask_of(self, ids: tuple[str, ...]) -> int | None:
        """The mask of ``ids`` when they are IDs of this naming in the node's order (each bit
        above the one before), else None."""
        mask = last = 0
        for name in ids:
            bit = self.bit_of.get(name, 0)
            if bit <= last:  # not of this naming, out of order, or named twice
                return None
            mask, last = mask | bit, bit
        return mask


class NodeOrder(dict[tuple[str, ...], "tuple[int, Naming] | None"]):
    """Tuples of available IDs in the node's order -> (their mask, their naming), each found
    when first asked for and kept (at most 2^8 per naming); None, not kept, for any other."""

    def __init__(self, namings: Sequence[Naming]) -> None:
        super().__init__()
        self._namings = namings

    def __missing__(self, ids: tuple[str, ...]) -> tuple[int, Naming] | None:
        for naming in self._namings:
            mask = naming.mask_of(ids)
            if mask is not None:
                self[ids] = found = (mask, naming)
                return found
        return None


class _Answers(dict[int, AllocationAnswer]):
    """A naming's answers by chosen mask, each made on first use: making all 2 x 256 with the
    engine tripled an 8-GPU engine build."""

    def __init__(self, naming: Naming, exact: ExactSearch) -> None:
        super().__init__()
        self._naming, self._exact = naming, exact

    def __missing__(self, mask: int) -> AllocationAnswer:
        score, numa_nodes, fails = self._exact.facts(mask)
        ids = tuple(name for name, bit in self._naming.by_bit if mask & bit)
        answer = AllocationAnswer(ids, score, numa_nodes, _selector_note(fails))
        self[mask] = answer
        return answer


def _must_mask(
    must_ids: Sequence[str], bit_of: Mapping[str, int], available: Sequence[str], size: int
) -> int:
    """The mask of the must-include IDs when they are at most ``size`` distinct IDs of
    ``available``, else -1 (the general path answers, with its note)."""
    if len(must_ids) > size:
        return -1
    must = 0
    for m in must_ids:
        if m not in available:
            return -1
        must |= bit_of[m]
    return must if must.bit_count() == len(must_ids) else -1


def _selector_note(fails: int) -> str | None:
    """The fast path's fallback reason: ``fails`` chosen GPUs fail the selector, if any."""
    if not fails:
        return None
    return f"{fails} chosen device(s) fail the policy selector"


def _logged(reason: str | None) -> str | None:
    """``reason``, logged as the general path logs its fallback reasons."""
    if reason is not None:
        log.info("preferred allocation fallback: %s", reason)
    return reason
