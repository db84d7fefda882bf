"""The preferred-allocation engine: one entry point, ``Allocator(node, policy).prefer(request)``.

The objective is lexicographic (see docs/policies.md): a valid answer always; fewest devices
failing the selector; every constraint satisfied; the highest link score; the fewest NUMA nodes;
the least fragmentation of what is left (the free devices stay best connected); the
lexicographically smallest set of GPU indexes.

Exact method (up to ``EXACT_LIMIT`` healthy GPUs): at construction, every subset of the GPUs is
scored once (link score, NUMA span, selector failures) and the subsets of each size are sorted
by that static key. A request walks the sorted list of its size, skips subsets that use busy
devices or miss a must-include device, and stops as soon as no later subset can win; only ties
are compared on fragmentation: what the free devices left behind still offer (the link score
of the best ``NEXT_SET_SIZE``-GPU set, then of the best pairing into disjoint pairs; both
precomputed for every subset, so a lookup), then the links cut from them. Answers are memoized
per (available, must_include, size).

Shared devices (``policies.shares``): replicas ``<gpu>::<k>``, memory slices
``<gpu>::slice-<k>`` and MIG devices count as shares of their GPU. Memory slices, and every
share under the ``pack`` policy, go on one GPU when one has room: the best fit (the fewest free
shares left on it), then the GPU least linked to the other free GPUs. Slices that must span
GPUs come back with a fallback reason (the plugin's Allocate refuses such a set). Under
``spread`` (the default) a request for several replicas gets distinct GPUs, by topology.

Above the limit: when at most ``EXACT_LIMIT`` GPUs are available the same exact table is built
for them (cached); otherwise a greedy construction followed by 1-swap local search runs in
O(k·n²) per pass, at most ``MAX_SWAP_PASSES`` passes: always valid, not guaranteed optimal;
there fragmentation is the links cut alone (no subset tables).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cdigen.errors import AllocationError
from cdigen.model import Node
from policies.cel import allocation_value, device_value
from policies.graph import Topology, build_topology
from policies.policy import Policy, builtin_policy
from policies.shares import gpu_part, share_kind

log = logging.getLogger("cdigen.allocator")

EXACT_LIMIT = 16
MAX_SWAP_PASSES = 4
MEMO_LIMIT = 65536
# Fragmentation looks at what stays free for the next request: the best set of this size (the
# commonest multi-GPU job after a pair), then the best split into pairs.
NEXT_SET_SIZE = 4
# CPU time one request may spend evaluating policy constraints; past it the sets not yet
# evaluated count as failing them (a fallback reason says so), so that a slow policy cannot
# hold a kubelet call (each evaluation is bounded too: policies.cel.EVAL_TIME_LIMIT_S).
CONSTRAINT_BUDGET_S = 0.08


@dataclass(frozen=True)
class AllocationRequest:
    """What the kubelet asks: choose ``size`` of ``available`` (IDs: UUIDs, indexes, replicas)."""

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


@dataclass(frozen=True)
class AllocationAnswer:
    """The chosen IDs (in the form asked), their link score, NUMA nodes, and any fallback."""

    devices: tuple[str, ...]
    link_score: int
    numa_nodes: tuple[int, ...]
    fallback_reason: str | None = None


@dataclass(frozen=True)
class Candidate:
    """One candidate set of physical GPUs with its objective key, for ``explain``."""

    positions: tuple[int, ...]
    selector_failures: int
    constraints_ok: bool
    constraint_reason: str | None
    link_score: int
    numa_span: int
    left_best_set: int  # link score of the best NEXT_SET_SIZE-GPU set left free
    left_pairs: int  # total link score of the best split of the free devices left into pairs
    fragmentation: int  # link score cut between the set and the devices left free

    def key(self) -> tuple[int, bool, int, int, int, int, int, tuple[int, ...]]:
        """The lexicographic objective: smaller is better."""
        return (
            self.selector_failures,
            not self.constraints_ok,
            -self.link_score,
            self.numa_span,
            -self.left_best_set,
            -self.left_pairs,
            self.fragmentation,
            self.positions,
        )


def _popcount(mask: int) -> int:
    return mask.bit_count()


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class _Table:
    """Every subset of ``universe`` (GPU positions) scored, and sorted per size by static key."""

    def __init__(self, topology: Topology, universe: Sequence[int], fail_positions: set[int]):
        self.universe = tuple(universe)
        self.bit_of = {p: b for b, p in enumerate(self.universe)}
        count = len(self.universe)
        weights = [[topology.scores[p][q] for q in self.universe] for p in self.universe]
        numa_ids: dict[int | None, int] = {}
        numa_bit = []
        for p in self.universe:
            numa = topology.numa[p]
            numa_bit.append(0 if numa is None else 1 << numa_ids.setdefault(numa, len(numa_ids)))
        fail_mask = sum(1 << self.bit_of[p] for p in fail_positions if p in self.bit_of)
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
        self._nvlinks = [[topology.nvlinks[p][q] for q in self.universe] for p in self.universe]
        self._min_pair: list[int] | None = None
        self._popcounts: list[int] | None = None
        # constraint results by this table's raw fact arrays (see Allocator._mask_ok)
        self.ok_cache: dict[tuple[int, ...], bool] = {}
        self.numa_span = [_popcount(b) for b in numa_bits]
        by_size: list[list[int]] = [[] for _ in range(count + 1)]
        for mask in range(size):
            by_size[_popcount(mask)].append(mask)
        self.order: list[list[int]] = []
        self.static: list[list[tuple[int, int, int]]] = []
        for masks in by_size:
            masks.sort(
                key=lambda m: (_popcount(m & fail_mask), -score[m], self.numa_span[m], -reverse[m])
            )
            self.order.append(masks)
            self.static.append(
                [(_popcount(m & fail_mask), -score[m], self.numa_span[m]) for m in masks]
            )
        self.weights = weights
        self.left_best_set = _best_set_within(score, count, NEXT_SET_SIZE)
        self.left_pairs = _best_pairing_within(weights, count)

    def left_free(self, free: int) -> tuple[int, int]:
        """What the free devices ``free`` offer the next request: best set, best pairing."""
        return self.left_best_set[free], self.left_pairs[free]

    def mask_of(self, positions: Sequence[int]) -> int:
        """The table mask of GPU positions (all must be in the universe)."""
        return sum(1 << self.bit_of[p] for p in positions)

    def positions(self, mask: int) -> tuple[int, ...]:
        """The GPU positions of a table mask, ascending."""
        return tuple(sorted(self.universe[b] for b in _bits(mask)))

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
                    self._popcounts = [_popcount(m) for m in range(len(self.score))]
                out.append(self._popcounts)
            elif name == "linkScore":
                out.append(self.score)
            else:
                self.min_pair_nvlinks(0)
                assert self._min_pair is not None
                out.append(self._min_pair)
        return out


def _position_fact(topology: Topology, positions: tuple[int, ...], name: str) -> Any:
    """One ``allocation`` fact of a set of GPU positions."""
    if name == "numaNodes":
        return topology.numa_nodes(positions)
    if name == "size":
        return len(positions)
    if name == "linkScore":
        return topology.set_score(positions)
    return topology.min_pair_nvlinks(positions)


@dataclass
class _Parsed:
    groups: dict[int, list[str]]  # GPU position -> its available IDs, in request order
    bad: list[str]  # unknown IDs, or IDs of GPUs with an error: chosen last
    must_groups: dict[int, list[str]]
    must_bad: list[str]
    notes: list[str]


class Allocator:
    """The engine for one (node, policy): built once, then ``prefer`` is cheap and memoized."""

    def __init__(self, node: Node, policy: Policy | None = None) -> None:
        self.node = node
        self.policy = policy if policy is not None else builtin_policy("default")
        self.topology = build_topology(node, self.policy.link_weights)
        topo = self.topology
        self._index_ids = {str(g.index): p for p, g in enumerate(topo.gpus)}
        # MIG devices (by UUID, or CDI-style "<gpu index>:<n>") count as shares of their GPU
        self._index_ids.update({m.uuid: p for p, g in enumerate(topo.gpus) for m in g.mig_devices})
        self.unusable: dict[int, str] = {}
        for p, gpu in enumerate(topo.gpus):
            if gpu.error:
                self.unusable[p] = f"discovery error: {gpu.error}"
            elif not gpu.healthy:
                self.unusable[p] = "unhealthy"
        self.selector_failures: dict[int, str] = {}
        for p, gpu in enumerate(topo.gpus):
            if p in self.unusable:
                continue
            passed, reason = self.policy.selector_result(gpu, node)
            if not passed:
                self.selector_failures[p] = reason or "selector is false"
        self.good = tuple(p for p in range(topo.size) if p not in self.unusable)
        self._fail_positions = set(self.selector_failures)
        self._table = (
            _Table(topo, self.good, self._fail_positions) if len(self.good) <= EXACT_LIMIT else None
        )
        self._tables: OrderedDict[tuple[int, ...], _Table] = OrderedDict()
        self._tables_lock = threading.Lock()
        self._constraint_cache: dict[tuple[Any, ...], tuple[bool, str | None]] = {}
        # constraints that read only set facts (allocation.size, ...) are evaluated once per
        # distinct facts, not once per set; None: one evaluation per set of GPUs
        self._fact_fields = self.policy.constraint_facts()
        self._request = threading.local()  # the constraint-evaluation deadline of a request
        if self._table is not None and self._fact_fields and "minPairNVLinks" in self._fact_fields:
            self._table.min_pair_nvlinks(0)  # build its table now, not on a kubelet call
        self._devices = (
            [device_value(g, node) for g in topo.gpus] if self.policy.constraints else []
        )
        self._memo: dict[tuple[tuple[str, ...], tuple[str, ...], int], AllocationAnswer] = {}

    # ------------------------------------------------------------------ the entry point

    def prefer(self, request: AllocationRequest) -> AllocationAnswer:
        """The preferred ``request.size`` IDs. AllocationError only if size > available."""
        key = (request.available, request.must_include, request.size)
        answer = self._memo.get(key)
        if answer is None:
            self._request.deadline = time.thread_time() + CONSTRAINT_BUDGET_S
            self._request.exhausted = False
            try:
                answer = self._solve(request)
            finally:
                self._request.deadline = None
            if len(self._memo) >= MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = answer
        return answer

    # ------------------------------------------------------------------ parsing IDs

    def position_of(self, device_id: str) -> int | None:
        """The GPU position of an ID, else None.

        IDs: a GPU UUID or index, either with a replica suffix ``::n``, a MIG UUID, or a
        CDI-style MIG name ``<gpu index>:<n>``; replicas and MIG devices map to their GPU.
        """
        base = gpu_part(device_id)
        position = self.topology.position_by_uuid.get(base)
        if position is None:
            position = self._index_ids.get(base)
        if position is None and ":" in base:
            position = self._index_ids.get(base.split(":", 1)[0])
        return position

    def _parse(self, available: Sequence[str], must: Sequence[str]) -> _Parsed:
        parsed = _Parsed({}, [], {}, [], [])
        unknown = []
        for device_id in available:
            position = self.position_of(device_id)
            if position is None or position in self.unusable:
                parsed.bad.append(device_id)
                if position is None:
                    unknown.append(device_id)
            else:
                parsed.groups.setdefault(position, []).append(device_id)
        for device_id in must:
            position = self.position_of(device_id)
            if position is None or position in self.unusable:
                parsed.must_bad.append(device_id)
            else:
                parsed.must_groups.setdefault(position, []).append(device_id)
        if unknown:
            parsed.notes.append(f"unknown device IDs {unknown[:3]} (chosen last)")
        busy_bad = [self.topology.gpus[p].index for p in self.unusable]
        if busy_bad and any(self.position_of(i) in self.unusable for i in available):
            parsed.notes.append(f"GPUs {busy_bad} have errors (chosen last)")
        return parsed

    # ------------------------------------------------------------------ solving

    def _solve(self, request: AllocationRequest) -> AllocationAnswer:
        available = tuple(dict.fromkeys(request.available))
        size = request.size
        if size > len(available):
            raise AllocationError(
                f"request for {size} devices but only {len(available)} are available",
                hint="ask for at most as many devices as are available",
            )
        if size <= 0:
            return AllocationAnswer((), 0, ())
        notes: list[str] = []
        in_available = set(available)
        must = tuple(dict.fromkeys(request.must_include))
        outside = [m for m in must if m not in in_available]
        if outside:
            notes.append(f"must-include IDs {outside[:3]} are not available (ignored)")
            must = tuple(m for m in must if m in in_available)
        if len(must) > size:
            notes.append(f"{len(must)} must-include IDs for a request of {size} (kept the first)")
            return self._answer(must[:size], notes)
        parsed = self._parse(available, must)
        notes.extend(parsed.notes)
        slots = size - len(parsed.must_bad)
        capacity = sum(len(ids) for ids in parsed.groups.values())
        if slots > capacity:
            notes.append(f"only {capacity} healthy known devices for {slots} places")
            chosen = [i for ids in parsed.groups.values() for i in ids] + parsed.must_bad
            chosen += [b for b in parsed.bad if b not in set(parsed.must_bad)][: size - len(chosen)]
            return self._answer(tuple(chosen), notes, order=available)
        if slots == 0:
            return self._answer(tuple(parsed.must_bad), notes, order=available)
        pack = self._packs(parsed)
        positions = self._choose_positions(parsed, slots, notes, pack)
        chosen_ids = self._assign(parsed, positions, slots, pack) + parsed.must_bad
        return self._answer(tuple(chosen_ids), notes, order=available)

    @staticmethod
    def _is_slices(parsed: _Parsed) -> bool:
        return any(share_kind(i) == "slice" for ids in parsed.groups.values() for i in ids)

    def _packs(self, parsed: _Parsed) -> bool:
        """Whether shares go on as few GPUs as possible: memory slices always, else the policy."""
        return self._is_slices(parsed) or self.policy.replicas == "pack"

    def _choose_positions(
        self, parsed: _Parsed, slots: int, notes: list[str], pack: bool
    ) -> tuple[int, ...]:
        avail_positions = sorted(parsed.groups)
        must_positions = sorted(parsed.must_groups)
        replicas = any(len(ids) > 1 for ids in parsed.groups.values())
        counts = {p: len(ids) for p, ids in parsed.groups.items()}
        found: tuple[int, ...] | None = None
        slices = self._is_slices(parsed)
        if pack and (replicas or slices):
            fit = self._best_fit(counts, must_positions, slots, avail_positions)
            if fit is not None:
                return (fit,)
            if slices:
                notes.append(
                    f"no single GPU has {slots} free slices (at most {max(counts.values())} "
                    "on one GPU); the answer spans GPUs and Allocate will refuse it"
                )
        if not replicas:
            found = self._best(avail_positions, must_positions, slots, None, notes)
        elif pack:
            for k in range(max(1, len(must_positions)), len(avail_positions) + 1):
                if sum(sorted(counts.values(), reverse=True)[:k]) < slots:
                    continue
                found = self._best(avail_positions, must_positions, k, (counts, slots), notes)
                if found is not None:
                    break
        else:
            k = max(len(must_positions), min(slots, len(avail_positions)))
            found = self._best(
                avail_positions, must_positions, k, (counts, slots), notes, balance=counts
            )
        if found is None:  # not expected for a valid request; stay valid anyway
            notes.append("no candidate set found; used every available GPU")
            found = tuple(avail_positions)
        return found

    def _best_fit(
        self,
        counts: dict[int, int],
        must_positions: Sequence[int],
        slots: int,
        avail_positions: Sequence[int],
    ) -> int | None:
        """The one GPU for ``slots`` shares: best fit (fewest free shares left), else None.

        GPUs passing the selector and the constraints come first; ties after the best fit go to
        the GPU least linked to the other free GPUs (keeping the well-connected ones for
        multi-GPU requests), then to the lowest index.
        """
        if len(must_positions) > 1:
            return None
        fits = [
            p
            for p, free in counts.items()
            if free >= slots and (not must_positions or must_positions[0] == p)
        ]
        if not fits:
            return None
        scores = self.topology.scores

        constraints = bool(self.policy.constraints)

        def key(p: int) -> tuple[bool, bool, int, int, int]:
            failed = constraints and not self._constraints_ok((p,))[0]
            degree = sum(scores[p][q] for q in avail_positions if q != p)
            return (p in self._fail_positions, failed, counts[p] - slots, degree, p)

        return min(fits, key=key)

    def _table_for(self, avail_positions: Sequence[int]) -> _Table | None:
        if self._table is not None:
            return self._table
        if len(avail_positions) > EXACT_LIMIT:
            return None
        key = tuple(avail_positions)
        with self._tables_lock:  # the plugin calls prefer() from several gRPC threads
            table = self._tables.get(key)
            if table is None:
                table = _Table(self.topology, key, self._fail_positions)
                self._tables[key] = table
                if len(self._tables) > 8:
                    self._tables.popitem(last=False)
        return table

    def _best(
        self,
        avail_positions: Sequence[int],
        must_positions: Sequence[int],
        k: int,
        capacity: tuple[dict[int, int], int] | None,
        notes: list[str],
        balance: dict[int, int] | None = None,
    ) -> tuple[int, ...] | None:
        """The best ``k`` GPU positions, or None if no set fits (must-include, capacity).

        ``balance`` (free shares per GPU, for ``spread``): among sets equal on the topology,
        prefer the one with the most free shares, so that pods spread over the GPUs.
        """
        table = self._table_for(avail_positions)
        if table is None:
            return self._greedy(avail_positions, must_positions, k, capacity)
        avail = table.mask_of(avail_positions)
        must = table.mask_of(must_positions)
        busy = ((1 << len(table.universe)) - 1) & ~avail
        order, static = table.order[k], table.static[k]
        capacity_of: _BitSums | None = None
        needed = 0
        if capacity is not None:
            counts, needed = capacity
            if min(counts.values()) * k < needed:  # otherwise every set of k GPUs has room
                capacity_of = _BitSums([counts.get(p, 0) for p in table.universe])
        # the links a set cuts from the rest (+ 2 x its score): the last step, computed on ties
        degree: _BitSums | None = None
        free_of = _BitSums([balance.get(p, 0) for p in table.universe]) if balance else None
        best_key: tuple[int, bool, int, int, int, int, int] | None = None
        best_mask = -1
        best_ok = False
        best_cut: int | None = None
        left_sets, left_pairs = table.left_best_set, table.left_pairs
        constraints = bool(self.policy.constraints)
        fields = self._fact_fields
        arrays = table.fact_arrays(fields) if constraints and fields is not None else None
        for idx, mask in enumerate(order):
            if mask & busy or mask & must != must:
                continue
            if capacity_of is not None and capacity_of(mask) < needed:
                continue
            fails, neg_score, span = static[idx]
            if best_key is not None:
                if fails > best_key[0]:
                    break
                if best_ok and (fails, neg_score, span) > (best_key[0], *best_key[2:4]):
                    break
            ok = self._mask_ok(table, mask, arrays) if constraints else True
            if best_key is not None and (fails, not ok, neg_score, span) > best_key[:4]:
                continue
            load = -free_of(mask) if free_of is not None else 0
            rest = avail & ~mask
            candidate = (fails, not ok, neg_score, span, load, -left_sets[rest], -left_pairs[rest])
            if best_key is None or candidate < best_key:
                best_key, best_mask, best_ok, best_cut = candidate, mask, ok, None
            elif candidate == best_key:
                if degree is None:
                    degree = _BitSums(_degrees(table.weights, avail))
                if best_cut is None:
                    best_cut = degree(best_mask) + 2 * neg_score
                cut = degree(mask) + 2 * neg_score
                if cut < best_cut:  # on equal cuts the earlier set (lower indexes) stays
                    best_mask, best_ok, best_cut = mask, ok, cut
        if best_key is None:
            return None
        if getattr(self._request, "exhausted", False):
            notes.append(
                f"constraint evaluation ran past {CONSTRAINT_BUDGET_S * 1000:.0f} ms; "
                "sets not evaluated count as failing"
            )
        elif self.policy.constraints and not best_ok:
            notes.append("no available set satisfies the policy constraints")
        if best_key[0]:
            notes.append(f"{best_key[0]} chosen device(s) fail the policy selector")
        return table.positions(best_mask)

    def _mask_ok(self, table: _Table, mask: int, arrays: list[list[int]] | None) -> bool:
        """Whether the set of a table mask satisfies the constraints; with ``arrays`` (the
        table's fact arrays), looked up by its facts first."""
        if arrays is None:
            return self._constraints_ok(table.positions(mask))[0]
        key = tuple([array[mask] for array in arrays])
        ok = table.ok_cache.get(key)
        if ok is None:
            positions = table.positions(mask)
            ok = self._constraints_ok(positions)[0]
            if self._constraint_key(positions) in self._constraint_cache:  # not over a limit
                table.ok_cache[key] = ok
        return ok

    def _constraint_key(self, positions: tuple[int, ...]) -> tuple[Any, ...]:
        fields = self._fact_fields
        if fields is None:
            return positions
        return tuple(_position_fact(self.topology, positions, f) for f in fields)

    def _constraints_ok(self, positions: tuple[int, ...]) -> tuple[bool, str | None]:
        topo = self.topology
        key = self._constraint_key(positions)
        cached = self._constraint_cache.get(key)
        if cached is None:
            deadline = getattr(self._request, "deadline", None)
            if deadline is not None and time.thread_time() > deadline:
                self._request.exhausted = True
                return False, "the constraint evaluation budget of this request ran out"
            allocation = allocation_value(
                [self._devices[p] for p in positions],
                topo.numa_nodes(positions),
                topo.set_score(positions),
                topo.min_pair_nvlinks(positions),
            )
            ok, reason, cacheable = self.policy.constraints_outcome(allocation, deadline)
            if not cacheable:
                if deadline is not None and time.thread_time() > deadline:
                    self._request.exhausted = True
                return ok, reason
            cached = (ok, reason)
            self._constraint_cache[key] = cached
        return cached

    def _full_key(
        self,
        positions: tuple[int, ...],
        avail_positions: Sequence[int],
        table: _Table | None = None,
    ) -> Candidate:
        """``positions`` scored on every objective step (what is left free only with a table)."""
        topo = self.topology
        ok, reason = self._constraints_ok(positions) if self.policy.constraints else (True, None)
        chosen = set(positions)
        frag = sum(topo.scores[p][q] for p in positions for q in avail_positions if q != p)
        left_set = left_pairs = 0
        if table is not None:
            left = table.mask_of(avail_positions) & ~table.mask_of(positions)
            left_set, left_pairs = table.left_free(left)
        return Candidate(
            positions=positions,
            selector_failures=sum(1 for p in positions if p in self._fail_positions),
            constraints_ok=ok,
            constraint_reason=reason,
            link_score=topo.set_score(positions),
            numa_span=len(topo.numa_nodes(positions)),
            left_best_set=left_set,
            left_pairs=left_pairs,
            fragmentation=frag - sum(topo.scores[p][q] for p in chosen for q in chosen),
        )

    def _greedy(
        self,
        avail_positions: Sequence[int],
        must_positions: Sequence[int],
        k: int,
        capacity: tuple[dict[int, int], int] | None,
    ) -> tuple[int, ...] | None:
        """Greedy build, then 1-swap local search on the full key; valid, not always optimal."""
        chosen = list(must_positions)
        pool = [p for p in avail_positions if p not in chosen]

        def key(ps: Sequence[int]) -> tuple[Any, ...]:
            return self._full_key(tuple(sorted(ps)), avail_positions).key()

        while len(chosen) < k:
            best = min(pool, key=lambda p: key([*chosen, p]))
            chosen.append(best)
            pool.remove(best)
        fixed = set(must_positions)
        for _ in range(MAX_SWAP_PASSES):
            improved = False
            current = key(chosen)
            for i, p in enumerate(chosen):
                if p in fixed:
                    continue
                for q in pool:
                    trial = [*chosen[:i], q, *chosen[i + 1 :]]
                    if capacity is not None and sum(capacity[0][x] for x in trial) < capacity[1]:
                        continue
                    trial_key = key(trial)
                    if trial_key < current:
                        pool[pool.index(q)] = p
                        chosen, current, improved = trial, trial_key, True
                        break
            if not improved:
                break
        if capacity is not None and sum(capacity[0][p] for p in chosen) < capacity[1]:
            return None
        return tuple(sorted(chosen))

    def _assign(
        self, parsed: _Parsed, positions: Sequence[int], slots: int, pack: bool
    ) -> list[str]:
        """Pick ``slots`` IDs on the chosen GPUs: must-include first, then spread or pack."""
        picked: dict[int, list[str]] = {p: list(parsed.must_groups.get(p, [])) for p in positions}
        left = slots - sum(len(v) for v in picked.values())
        spare = {p: [i for i in parsed.groups[p] if i not in set(picked[p])] for p in positions}
        if pack:
            for p in sorted(positions, key=lambda p: -len(parsed.groups[p])):
                take = spare[p][:left]
                picked[p].extend(take)
                left -= len(take)
        else:
            while left > 0:
                open_ = [p for p in positions if spare[p]]
                if not open_:
                    break
                p = min(open_, key=lambda p: (len(picked[p]), p))
                picked[p].append(spare[p].pop(0))
                left -= 1
        chosen = [i for p in positions for i in picked[p]]
        if left > 0:  # only after a fallback: top up from the other GPUs, keep the answer valid
            taken = set(chosen)
            extra = [i for ids in parsed.groups.values() for i in ids if i not in taken]
            chosen += extra[:left]
        return chosen

    def _answer(
        self, ids: tuple[str, ...], notes: list[str], order: Sequence[str] | None = None
    ) -> AllocationAnswer:
        if order is not None:
            rank = {i: n for n, i in enumerate(order)}
            ids = tuple(sorted(ids, key=lambda i: rank.get(i, len(rank))))
        positions = tuple(sorted({p for i in ids if (p := self.position_of(i)) is not None}))
        reason = "; ".join(notes) if notes else None
        if reason:
            log.info("preferred allocation fallback: %s", reason)
        return AllocationAnswer(
            devices=ids,
            link_score=self.topology.set_score(positions),
            numa_nodes=self.topology.numa_nodes(positions),
            fallback_reason=reason,
        )

    # ------------------------------------------------------------------ explain

    def candidates(self, request: AllocationRequest) -> list[Candidate]:
        """Every valid set of physical GPUs for a replica-free request, best first (for explain)."""
        from itertools import combinations

        parsed = self._parse(request.available, request.must_include)
        avail = sorted(parsed.groups)
        must = sorted(parsed.must_groups)
        k = request.size - len(parsed.must_bad)
        if k < len(must) or k > len(avail):
            return []
        rest = [p for p in avail if p not in must]
        table = self._table_for(avail)
        found = [
            self._full_key(tuple(sorted([*must, *extra])), avail, table)
            for extra in combinations(rest, k - len(must))
        ]
        found.sort(key=Candidate.key)
        return found


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


class _BitSums:
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
            return sum(self.values[b] for b in _bits(mask))
        total = 0
        for table in self.tables:
            total += table[mask & 255]
            mask >>= 8
        return total


def _degrees(weights: list[list[int]], avail: int) -> list[int]:
    """For each table bit, the sum of its pair scores to the available devices."""
    bits = _bits(avail)
    return [sum(row[b] for b in bits) for row in weights]


def why_lost(winner: Candidate, loser: Candidate) -> str:
    """The first objective step on which ``loser`` is worse than ``winner``."""
    if loser.selector_failures != winner.selector_failures:
        return f"{loser.selector_failures} device(s) fail the selector"
    if loser.constraints_ok != winner.constraints_ok:
        return loser.constraint_reason or "fails a constraint"
    if loser.link_score != winner.link_score:
        return f"lower link score ({loser.link_score} < {winner.link_score})"
    if loser.numa_span != winner.numa_span:
        return f"spans more NUMA nodes ({loser.numa_span} > {winner.numa_span})"
    if loser.left_best_set != winner.left_best_set:
        return (
            f"leaves a worse {NEXT_SET_SIZE}-GPU set free (link score "
            f"{loser.left_best_set} < {winner.left_best_set})"
        )
    if loser.left_pairs != winner.left_pairs:
        return (
            "leaves worse pairs free (best pairing of what is left scores "
            f"{loser.left_pairs} < {winner.left_pairs})"
        )
    if loser.fragmentation != winner.fragmentation:
        return (
            "fragments the free devices more (cuts link score "
            f"{loser.fragmentation} > {winner.fragmentation} from what is left)"
        )
    return "tie-break: higher GPU indexes"
