"""The searches for the best set of GPUs, behind one small protocol: :class:`Search`.

- :class:`ExactSearch` (up to ``EXACT_LIMIT`` GPUs): walks the subsets of the request's size in
  the order of a :class:`~cdigen.policies.table.Table` (sorted by the static terms of the
  objective), skips sets that use busy GPUs or miss a must-include GPU, and stops as soon as no
  later set can win; ties are compared on the rest of the objective. Tables are built once per node
  (or, above the limit, once per set of at most ``EXACT_LIMIT`` available GPUs, cached). Whole-GPU
  requests under a policy without constraints take :meth:`ExactSearch.best_plain`: the same
  walk on ints, or, on a node whose GPUs fall into few classes of interchangeable GPUs (any
  size), :class:`~cdigen.policies.class_search.ClassSearch`, which ranks how many GPUs a set takes
  from each class and needs no table (the table is then built on first need).
- :class:`GreedySearch` (above): a greedy construction followed by 1-swap local search on the
  objective key, O(k·n²) per pass, at most ``MAX_SWAP_PASSES`` passes: always valid, not
  guaranteed optimal; there fragmentation is the links cut alone (no subset tables).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import combinations
from math import comb
from typing import Any, Protocol

from cdigen.policies.class_search import CLASS_MIN_GPUS, CLASS_STATES, ClassSearch
from cdigen.policies.graph import Topology
from cdigen.policies.objective import Head, Objective, head
from cdigen.policies.table import EXACT_LIMIT, BitSums, Table, Universe, degrees

MAX_SWAP_PASSES = 4
TABLE_CACHE = 8  # tables kept for sets of available GPUs on nodes above the limit


@dataclass(frozen=True)
class SetQuery:
    """Find the best ``k`` GPU positions of ``available`` holding every one of ``must``.

    ``shares``: free shares per GPU, when the request is over shares; then the set must hold
    ``needed`` of them, and with ``balance`` (``spread``) more free shares rank better.
    """

    available: tuple[int, ...]
    must: tuple[int, ...]
    k: int
    shares: Mapping[int, int] | None = None
    needed: int = 0
    balance: bool = False


class Search(Protocol):
    """A search for the best set: ``best(query, notes)`` -> sorted GPU positions, or None if no
    set fits; it may add fallback notes."""

    def best(self, query: SetQuery, notes: list[str]) -> tuple[int, ...] | None:
        """The best set for ``query`` by the objective, or None."""
        ...


class ExactSearch:
    """The exact search over subset tables (see the module docstring)."""

    def __init__(
        self, objective: Objective, good: Sequence[int], tables_of: ExactSearch | None = None
    ) -> None:
        """The search over ``good`` (the usable GPU positions). Its tables hold every GPU
        without a discovery error when they fit in one, so that they serve every health state
        (a search walks only available GPUs: a larger universe gives the same answers);
        ``tables_of``: a search of the same node and policy in another health state, whose
        tables are reused instead of built."""
        self.objective = objective
        topo = objective.topology
        universe = objective.error_free if len(objective.error_free) <= EXACT_LIMIT else good
        shared = tables_of._full if tables_of is not None else None
        self._full: _FullTable | None
        if shared is not None and set(good) <= set(shared.universe.positions):
            self._full = shared
        elif len(universe) <= EXACT_LIMIT:
            self._full = _FullTable(topo, universe, objective.table_fails)
        else:
            self._full = None
        self._tables: OrderedDict[tuple[int, ...], Table]
        self._tables_lock: threading.Lock
        if tables_of is not None:  # by available GPUs, health-blind too: shared, with its lock
            self._tables, self._tables_lock = tables_of._tables, tables_of._tables_lock
        else:
            self._tables, self._tables_lock = OrderedDict(), threading.Lock()
        # Whole-GPU requests under a policy without constraints search by counts when the
        # node's GPUs fall into few classes; the table is then built on first need (the
        # general path: shares, explain), else now, not on a kubelet call.
        self.classes: ClassSearch | None = None
        self._universe = self._full.universe if self._full is not None else None
        if (
            tables_of is not None
            and tables_of.classes is not None
            and tables_of._universe is self._universe
            and not objective.constrained
        ):  # another health state over the same table: the same classes
            self.classes = tables_of.classes
        elif not objective.constrained and len(good) >= CLASS_MIN_GPUS:
            # above EXACT_LIMIT GPUs there is no table: the classes of the usable GPUs
            parts = self._universe or Universe.of(topo, good, objective.table_fails)
            classes = ClassSearch(parts)
            if classes.states() <= CLASS_STATES:
                classes.prepare()
                self.classes, self._universe = classes, parts
        if self._full is not None and self.classes is None:
            table = self._full.get()
            if not objective.constrained:
                table.walks_within()  # best_plain's walks: each is made on first use, and kept
        fields = objective.fact_fields
        if self._full is not None and fields and "minPairNVLinks" in fields:
            self._full.get().min_pair_nvlinks(0)  # build its table now, not on a kubelet call

    @property
    def full_table(self) -> Table | None:
        """The table of every GPU without a discovery error (None above EXACT_LIMIT GPUs),
        built on first use where the class search makes that later."""
        return self._full.get() if self._full is not None else None

    @property
    def universe(self) -> Universe | None:
        """The GPUs of the full table by bit (without building it), or above EXACT_LIMIT
        GPUs those of the class search; None when neither exists."""
        return self._universe

    def facts(self, mask: int) -> tuple[int, tuple[int, ...], int]:
        """A mask's link score, NUMA nodes and selector failures (masks over
        :attr:`universe`)."""
        table = self._full.built if self._full is not None else None
        if table is not None:
            return table.score[mask], table.numa_nodes(mask), (mask & table.fail_mask).bit_count()
        parts = self._universe
        assert parts is not None
        positions = parts.positions_of(mask)
        topo = self.objective.topology
        return (
            topo.set_score(positions),
            topo.numa_nodes(positions),
            (mask & parts.fail_mask).bit_count(),
        )

    def table_for(self, available: Sequence[int]) -> Table | None:
        """The table covering ``available``, or None when it is too large for one."""
        if self.full_table is not None:
            return self.full_table
        if len(available) > EXACT_LIMIT:
            return None
        key = tuple(available)
        with self._tables_lock:  # the plugin calls prefer() from several gRPC threads
            table = self._tables.get(key)
            if table is None:
                table = Table(self.objective.topology, key, self.objective.table_fails)
                self._tables[key] = table
                if len(self._tables) > TABLE_CACHE:
                    self._tables.popitem(last=False)
        return table

    def best_plain(self, k: int, avail: int, must: int) -> int:
        """The mask of the best ``k``-set within ``avail`` holding ``must`` (table masks), or
        -1, for whole GPUs under a policy without constraints: :meth:`best` with its terms as
        ints. Sets of one static rank tie on terms 1-4 (5 is 0 here), then rank on what they
        leave free (6, 7), then on the links they cut (8): score(avail) - score(set) -
        score(rest); the earliest in the walk wins equal ones (9)."""
        if self.classes is not None:
            return self.classes.best(k, avail, must)
        assert self._full is not None
        table = self._full.built or self._full.get()
        rank = table.static_rank
        left_sets, left_pairs, score = table.left_best_set, table.left_pairs, table.score
        # no set leaving avail.bit_count() - k free can beat one that reaches all three
        bound = table.rest_bounds(avail.bit_count() - k)
        best = best_rank = best_set = best_pairs = -1
        best_cut: int | None = None
        if table.within is not None:  # the walk of the sets within avail: none uses a busy GPU
            walk, guard = table.within[avail][k], must
        else:
            walk, guard = table.order[k], (table.full_mask & ~avail) | must
            free, more = avail & ~must, k - must.bit_count()
            fits = comb(free.bit_count(), more)
            if 8 * fits * fits < len(walk):
                # Few sets fit (the walk would skip about len(walk) / fits before the first):
                # list them instead. Combinations of ascending bits come in term-9 order; a
                # stable sort by rank makes it the walk's.
                walk = list(map(must.__add__, map(sum, combinations(bit_values(free), more))))
                walk.sort(key=rank.__getitem__)
        for mask in walk:
            if mask & guard != must:  # a busy GPU, or a must-include one missing
                continue
            rest = avail ^ mask
            if best < 0:
                best, best_rank = mask, rank[mask]
                best_set, best_pairs = left_sets[rest], left_pairs[rest]
            elif rank[mask] != best_rank:
                break
            else:
                left_set = left_sets[rest]
                if left_set < best_set:
                    continue
                pairs = left_pairs[rest]
                if left_set == best_set:
                    if pairs < best_pairs:
                        continue
                    if pairs == best_pairs:
                        if best_cut is None:
                            best_cut = score[avail] - score[best] - score[avail ^ best]
                        cut = score[avail] - score[mask] - score[rest]
                        if cut >= best_cut:
                            continue
                best, best_set, best_pairs, best_cut = mask, left_set, pairs, None
            if best_set == bound[0] and best_pairs == bound[1] and score[rest] == bound[2]:
                break
        return best

    def best(self, query: SetQuery, notes: list[str]) -> tuple[int, ...] | None:
        """The best set by the objective; the table must cover ``query.available``."""
        table = self.table_for(query.available)
        assert table is not None, "ExactSearch.best on more GPUs than a table holds"
        objective = self.objective
        k = query.k
        avail = table.mask_of(query.available)
        must = table.mask_of(query.must)
        busy = ((1 << len(table.universe)) - 1) & ~avail
        order = table.order[k]
        needed = query.needed
        capacity_of, free_of = _share_sums(table, query)
        # the links a set cuts from the rest (+ 2 x its score): the last step, computed on ties
        degree: BitSums | None = None
        best_key: Head | None = None
        best_mask = -1
        best_ok = False
        best_cut: int | None = None
        left_sets, left_pairs = table.left_best_set, table.left_pairs
        constraints = objective.constrained
        fields = objective.fact_fields
        arrays = table.fact_arrays(fields) if constraints and fields is not None else None
        for mask in order:
            if mask & busy or mask & must != must:
                continue
            if capacity_of is not None and capacity_of(mask) < needed:
                continue
            fails, neg_score, span = table.static_terms(mask)
            if best_key is not None:
                if fails > best_key[0]:
                    break
                if best_ok and (fails, neg_score, span) > (best_key[0], *best_key[2:4]):
                    break
            ok = objective.mask_ok(table, mask, arrays) if constraints else True
            if best_key is not None and (fails, not ok, neg_score, span) > best_key[:4]:
                continue
            rest = avail & ~mask
            candidate = head(
                fails,
                ok,
                -neg_score,
                span,
                free_of(mask) if free_of is not None else 0,
                left_sets[rest],
                left_pairs[rest],
            )
            if best_key is None or candidate < best_key:
                best_key, best_mask, best_ok, best_cut = candidate, mask, ok, None
            elif candidate == best_key:  # term 8, fragmentation: the links cut
                if degree is None:
                    degree = BitSums(degrees(table.weights, avail))
                if best_cut is None:
                    best_cut = degree(best_mask) + 2 * neg_score
                cut = degree(mask) + 2 * neg_score
                if cut < best_cut:  # term 9: on equal cuts the earlier set (lower positions)
                    best_mask, best_ok, best_cut = mask, ok, cut
        if best_key is None:
            return None
        notes.extend(self._notes(best_key[0], best_ok))
        return table.positions(best_mask)

    def _notes(self, fails: int, ok: bool) -> list[str]:
        """What the caller is told about the chosen set: ``fails`` of its devices fail the
        selector; ``ok``: it satisfies the constraints."""
        objective = self.objective
        notes = []
        if objective.budget_exhausted:
            notes.append(
                f"constraint evaluation ran past {objective.budget_s * 1000:.0f} ms; "
                "sets not evaluated count as failing"
            )
        elif objective.constrained and not ok:
            notes.append("no available set satisfies the policy constraints")
        if fails:
            notes.append(f"{fails} chosen device(s) fail the policy selector")
        return notes


def _share_sums(table: Table, query: SetQuery) -> tuple[BitSums | None, BitSums | None]:
    """The free shares of a mask's GPUs, as a capacity check (None when every set of
    ``query.k`` GPUs has room) and as the ``spread`` balance term (None unless asked)."""
    shares = query.shares
    if shares is None:
        return None, None
    sums = BitSums([shares.get(p, 0) for p in table.universe])
    capacity_of = sums if min(shares.values()) * query.k < query.needed else None
    return capacity_of, sums if query.balance and shares else None


def bit_values(mask: int) -> list[int]:
    """The set bits of ``mask`` as values (1 << b), lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low)
        mask ^= low
    return out


class _FullTable:
    """The table of a node's GPUs, built once on first use, shared by health states."""

    def __init__(
        self, topology: Topology, universe: Sequence[int], fails: AbstractSet[int]
    ) -> None:
        self.universe = Universe.of(topology, universe, fails)
        self._args = (topology, universe, fails)
        self.built: Table | None = None
        self._lock = threading.Lock()

    def get(self) -> Table:
        """The table, built now if not yet."""
        table = self.built
        if table is None:
            with self._lock:  # the plugin calls prefer() from several gRPC threads
                if self.built is None:
                    self.built = Table(*self._args)
                table = self.built
        return table


class GreedySearch:
    """Greedy build, then 1-swap local search on the objective key: valid, not always optimal.

    It ranks by the whole key without the subset-table terms (6, 7) and, as before the engine
    was split, without the free-shares term (5): ``spread`` balance is the exact search's.
    """

    def __init__(self, objective: Objective) -> None:
        self.objective = objective

    def best(self, query: SetQuery, notes: list[str]) -> tuple[int, ...] | None:
        """A good set for ``query``, or None if the one found lacks the shares needed."""
        avail_positions = query.available
        chosen = list(query.must)
        pool = [p for p in avail_positions if p not in chosen]
        shares = query.shares
        needed = query.needed

        def key(ps: Sequence[int]) -> tuple[Any, ...]:
            return self.objective.candidate(tuple(sorted(ps)), avail_positions).key()

        while len(chosen) < query.k:
            best = min(pool, key=lambda p: key([*chosen, p]))
            chosen.append(best)
            pool.remove(best)
        fixed = set(query.must)
        for _ in range(MAX_SWAP_PASSES):
            improved = False
            current = key(chosen)
            for i, p in enumerate(chosen):
                if p in fixed:
                    continue
                for q in pool:
                    trial = [*chosen[:i], q, *chosen[i + 1 :]]
                    if shares is not None and sum(shares[x] for x in trial) < needed:
                        continue
                    trial_key = key(trial)
                    if trial_key < current:
                        pool[pool.index(q)] = p
                        chosen, current, improved = trial, trial_key, True
                        break
            if not improved:
                break
        if shares is not None and sum(shares[p] for p in chosen) < needed:
            return None
        return tuple(sorted(chosen))
