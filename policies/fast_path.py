"""The engine's fast path: whole GPUs, every one usable and known, a full table (or the class
search) and a policy without constraints. It answers on bit masks, with
:meth:`~policies.search.ExactSearch.best_plain`, what the general path would; the
:class:`~policies.allocator.Allocator` builds it and falls back to the general path on None.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from itertools import compress

from cdigen.shares import share_kind
from policies.answers import AllocationAnswer, AllocationRequest, PositionAnswer
from policies.search import ExactSearch

log = logging.getLogger("cdigen.allocator")


class FastPath:
    """Whole-GPU IDs and positions -> their table bit, and the answers read off them."""

    def __init__(
        self,
        exact: ExactSearch,
        good: Sequence[int],
        ids: Sequence[str],
        position_of: Callable[[str], int | None],
    ) -> None:
        """The fast path over ``exact``'s universe for the usable positions ``good``;
        ``ids``: the whole-GPU IDs (UUIDs and indexes), read off ``position_of`` so that both
        paths agree on what an ID names."""
        universe = exact.universe
        assert universe is not None
        self.exact = exact
        self.universe = universe
        self.position_bits = {p: 1 << universe.bit_of[p] for p in good}
        self.id_bits: dict[str, int] = {}
        for name in ids:
            named = position_of(name)
            if named in self.position_bits and share_kind(name) == "gpu":
                self.id_bits[name] = self.position_bits[named]

    def ids(self, request: AllocationRequest) -> AllocationAnswer | None:
        """The answer for distinct whole-GPU IDs of usable GPUs with the must-include IDs
        among them (at most ``size``), else None: the general path answers the rest."""
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
        must = 0
        must_ids = request.must_include
        if must_ids:
            if len(must_ids) > size:
                return None
            for m in must_ids:
                if m not in available:
                    return None
                must += bit_of[m]
            if must.bit_count() != len(must_ids):
                return None
        best = self.exact.best_plain(size, avail, must)
        if best < 0:
            return None
        score, numa_nodes, fails = self.exact.facts(best)
        return AllocationAnswer(
            tuple(compress(available, map(best.__and__, bits))),
            score,
            numa_nodes,
            _selector_note(fails),
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
            _selector_note(fails),
        )


def _selector_note(fails: int) -> str | None:
    """The fast path's fallback reason: ``fails`` chosen GPUs fail the selector, if any."""
    if not fails:
        return None
    reason = f"{fails} chosen device(s) fail the policy selector"
    log.info("preferred allocation fallback: %s", reason)
    return reason
