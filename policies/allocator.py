"""The preferred-allocation engine: ``Allocator(node, policy)``, built once per node and policy.

Two entry points, one engine:

- ``prefer_positions(available, must, size)``: devices as handles. ``available`` holds, per
  device offered, the position of its GPU in ``node.gpus`` (a GPU with several shares appears
  once per share); ``must`` holds indexes into ``available``; the answer names the chosen
  devices by their indexes into ``available``. Callers that know their devices (the plugin's
  layout) use it and never build or parse ID strings.
- ``prefer(AllocationRequest)``: devices as the kubelet's ID strings. A thin wrapper: it
  parses the IDs once (:meth:`Allocator.position_of`, the one place of the ID grammar) and
  runs the same engine, answering in the IDs asked.

The engine's parts: :mod:`cdigen.policies.objective` (the lexicographic objective, its key and the
explanation of why a set lost), :mod:`cdigen.policies.fast_path` (whole GPUs on bit masks),
:mod:`cdigen.policies.search` (the exact search over the subset tables of
:mod:`cdigen.policies.table`, and the greedy search above ``EXACT_LIMIT`` GPUs, behind one
protocol), :mod:`cdigen.policies.placement` (replicas, memory slices and MIG devices: pack, spread,
best fit). Answers are memoized per request. The request and answer types are
:mod:`cdigen.policies.answers`'s, exported here with the engine (``__all__``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from cdigen.catalogue import gpu_entries, mig_entries
from cdigen.errors import AllocationError
from cdigen.model import Node
from cdigen.policies.answers import AllocationAnswer, AllocationRequest, PositionAnswer
from cdigen.policies.fast_path import FastPath
from cdigen.policies.graph import build_topology
from cdigen.policies.objective import CONSTRAINT_BUDGET_S, Candidate, Objective, why_lost
from cdigen.policies.placement import DeviceGroups, assign, choose_gpus
from cdigen.policies.policy import Policy, builtin_policy
from cdigen.policies.search import ExactSearch, GreedySearch, Search
from cdigen.policies.table import EXACT_LIMIT
from cdigen.policies.terms import NEXT_SET_SIZE
from cdigen.shares import gpu_part, share_kind

__all__ = [
    "CONSTRAINT_BUDGET_S",
    "EXACT_LIMIT",
    "MEMO_LIMIT",
    "NEXT_SET_SIZE",
    "AllocationAnswer",
    "AllocationRequest",
    "Allocator",
    "Candidate",
    "PositionAnswer",
    "why_lost",
    "without_health",
]

log = logging.getLogger("cdigen.allocator")

MEMO_LIMIT = 65536
INDEX_NAMES = "index"  # the CDI naming strategy whose names are ``0`` and ``0:1``
_T = TypeVar("_T")


def _other_names(node: Node) -> dict[str, int]:
    """GPU position by the names other than a GPU's UUID that a request may use: the GPU's
    index, and each MIG device's UUID and CDI name ``<gpu index>:<n>`` (MIG devices count as
    shares of their GPU). Made from the node's catalogue entries, which hold each device's GPU
    place and MIG place as values: a name is looked up whole, never split into parts."""
    out: dict[str, int] = {}
    for whole in gpu_entries(node):
        out[whole.cdi_name(INDEX_NAMES)] = whole.position
        for entry in mig_entries(whole):
            out[entry.uuid] = entry.position
            out[entry.cdi_name(INDEX_NAMES)] = entry.position
    return out


class Allocator:
    """The engine for one (node, policy): built once, then ``prefer`` is cheap and memoized."""

    def __init__(
        self, node: Node, policy: Policy | None = None, *, tables_of: Allocator | None = None
    ) -> None:
        """The engine of ``node`` under ``policy`` (default: the built-in ``default``).
        ``tables_of``: reuse that engine's subset tables; only :meth:`for_health` passes it."""
        self.node = node
        self.policy = policy if policy is not None else builtin_policy("default")
        self.topology = build_topology(node, self.policy.link_weights)
        topo = self.topology
        self._index_ids = _other_names(node)
        self.objective = Objective(node, self.policy, topo)
        self.unusable = self.objective.unusable
        self.selector_failures = self.objective.selector_failures
        self.good = tuple(p for p in range(topo.size) if p not in self.unusable)
        self.exact: ExactSearch = ExactSearch(
            self.objective, self.good, tables_of.exact if tables_of is not None else None
        )
        self.greedy = GreedySearch(self.objective)
        # The fast path (whole GPUs, every one usable and known, a full table, no constraints)
        self._plain = (
            FastPath(
                self.exact,
                self.good,
                ([gpu.uuid for gpu in topo.gpus], [str(gpu.index) for gpu in topo.gpus]),
                self.position_of,
            )
            if self.exact.universe is not None and not self.objective.constrained
            else None
        )
        self._memo: dict[tuple[tuple[str, ...], tuple[str, ...], int], AllocationAnswer] = {}
        self._position_memo: dict[
            tuple[tuple[int, ...], tuple[int, ...], int, bool], PositionAnswer
        ] = {}

    def for_health(self, node: Node) -> Allocator:
        """The engine of ``node`` under this policy, where ``node`` is this engine's node with
        other GPUs marked healthy or unhealthy (ValueError if anything else differs). It
        answers as ``Allocator(node, policy)`` does, but takes this engine's subset tables
        instead of building them (up to hundreds of ms on 16 GPUs): health does not enter them."""
        if without_health(node) != without_health(self.node):
            raise ValueError("Allocator.for_health: the nodes differ in more than GPU health")
        return Allocator(node, self.policy, tables_of=self)

    # ------------------------------------------------------------------ the entry points

    def prefer_positions(
        self, available: Sequence[int], must: Sequence[int], size: int, *, slices: bool = False
    ) -> PositionAnswer:
        """The preferred ``size`` devices of ``available`` (GPU positions, one per device).

        ``must``: indexes into ``available`` that must be chosen; ``slices``: the devices are
        memory slices (always packed onto one GPU). Positions outside the node, or of GPUs
        with errors, are chosen last. AllocationError only if size > len(available).
        """
        key = (tuple(available), tuple(must), size, slices)
        answer = self._position_memo.get(key)
        if answer is None:
            answer = self._plain.positions(*key[:3]) if self._plain and not slices else None
            if answer is None:
                answer = self._budgeted(lambda: self._solve_positions(*key))
            if len(self._position_memo) >= MEMO_LIMIT:
                self._position_memo.clear()
            self._position_memo[key] = answer
        return answer

    def prefer(self, request: AllocationRequest) -> AllocationAnswer:
        """The preferred ``request.size`` IDs. AllocationError only if size > available."""
        key = (request.available, request.must_include, request.size)
        answer = self._memo.get(key)
        if answer is None:
            answer = self._plain.ids(request) if self._plain else None
            if answer is None:
                answer = self._budgeted(lambda: self._solve_ids(request))
            if len(self._memo) >= MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = answer
        return answer

    def _budgeted(self, solve: Callable[[], _T]) -> _T:
        self.objective.start_request(CONSTRAINT_BUDGET_S)  # read here: tests may patch it
        try:
            return solve()
        finally:
            self.objective.end_request()

    # ------------------------------------------------------------------ IDs (the string path)

    def position_of(self, device_id: str) -> int | None:
        """The GPU position of an ID, else None.

        IDs: a GPU UUID or index, either with a replica suffix ``::n``, a MIG UUID, or a
        CDI-style MIG name ``<gpu index>:<n>`` of a MIG device the node has; replicas and MIG
        devices map to their GPU.
        """
        base = gpu_part(device_id)
        position = self.topology.position_by_uuid.get(base)
        if position is None:
            position = self._index_ids.get(base)
        return position

    def _solve_ids(self, request: AllocationRequest) -> AllocationAnswer:
        available = tuple(dict.fromkeys(request.available))
        size = request.size
        _check_size(size, len(available))
        if size <= 0:
            return AllocationAnswer((), 0, ())
        notes: list[str] = []
        in_available = set(available)
        must = tuple(dict.fromkeys(request.must_include))
        outside = [m for m in must if m not in in_available]
        if outside:
            notes.append(f"must-include IDs {outside[:3]} are not available (ignored)")
            must = tuple(m for m in must if m not in set(outside))
        positions = [self.position_of(i) for i in available]
        index = {device_id: n for n, device_id in enumerate(available)} if must else {}
        if len(must) > size:
            notes.append(f"{len(must)} must-include IDs for a request of {size} (kept the first)")
            chosen = [index[m] for m in must[:size]]
        else:
            chosen = self._solve(
                positions,
                [index[m] for m in must],
                size,
                lambda n: share_kind(available[n]) == "slice",
                notes,
                lambda ns: f"unknown device IDs {[available[n] for n in ns]}",
            )
        at = _answer_facts(self, positions, chosen, notes)
        return AllocationAnswer(tuple(available[n] for n in chosen), *at)

    # ------------------------------------------------------------------ positions (handles)

    def _solve_positions(
        self, available: tuple[int, ...], must: tuple[int, ...], size: int, slices: bool
    ) -> PositionAnswer:
        _check_size(size, len(available))
        if size <= 0:
            return PositionAnswer((), (), 0, ())
        notes: list[str] = []
        must = tuple(dict.fromkeys(must))
        outside = [m for m in must if not 0 <= m < len(available)]
        if outside:
            notes.append(f"must-include indexes {outside[:3]} are not in available (ignored)")
            must = tuple(m for m in must if m not in set(outside))
        count = self.topology.size
        positions = [p if 0 <= p < count else None for p in available]
        if len(must) > size:
            notes.append(
                f"{len(must)} must-include devices for a request of {size} (kept the first)"
            )
            chosen = list(must[:size])
        else:
            chosen = self._solve(
                positions,
                list(must),
                size,
                lambda n: slices,
                notes,
                lambda ns: f"unknown GPU positions {[available[n] for n in ns]}",
            )
        link_score, numa_nodes, reason = _answer_facts(self, positions, chosen, notes)
        used = tuple(sorted({p for n in chosen if (p := positions[n]) is not None}))
        return PositionAnswer(tuple(chosen), used, link_score, numa_nodes, reason)

    # ------------------------------------------------------------------ the engine

    def _solve(
        self,
        positions: Sequence[int | None],
        must: Sequence[int],
        size: int,
        is_slice: Callable[[int], bool],
        notes: list[str],
        unknown_note: Callable[[list[int]], str],
    ) -> list[int]:
        """The chosen devices (indexes into ``positions``, ascending but for must-include
        devices whose GPU is unusable), for at most ``size`` must-include devices."""
        devices = self._group(positions, must)
        unknown = [n for n, p in enumerate(positions) if p is None]
        if unknown:
            notes.append(f"{unknown_note(unknown[:3])} (chosen last)")
        busy_bad = [self.topology.gpus[p].index for p in self.unusable]
        if busy_bad and any(p in self.unusable for p in positions):
            notes.append(f"GPUs {busy_bad} have errors (chosen last)")
        slots = size - len(devices.must_bad)
        capacity = sum(len(ids) for ids in devices.groups.values())
        if slots > capacity:
            notes.append(f"only {capacity} healthy known devices for {slots} places")
            chosen = [n for ids in devices.groups.values() for n in ids] + devices.must_bad
            must_bad = set(devices.must_bad)
            chosen += [b for b in devices.bad if b not in must_bad][: size - len(chosen)]
            return sorted(chosen)
        if slots == 0:
            return sorted(devices.must_bad)
        slices = any(is_slice(n) for ids in devices.groups.values() for n in ids)
        pack = slices or self.policy.replicas == "pack"
        search = self._search_for(sorted(devices.groups))
        gpus = choose_gpus(self.objective, search, devices, slots, notes, pack=pack, slices=slices)
        return sorted(assign(devices, gpus, slots, pack) + devices.must_bad)

    def _group(self, positions: Sequence[int | None], must: Sequence[int]) -> DeviceGroups:
        devices = DeviceGroups()
        for n, p in enumerate(positions):
            if p is None or p in self.unusable:
                devices.bad.append(n)
            else:
                devices.groups.setdefault(p, []).append(n)
        for n in must:
            p = positions[n]
            if p is None or p in self.unusable:
                devices.must_bad.append(n)
            else:
                devices.must_groups.setdefault(p, []).append(n)
        return devices

    def _usable(self, device_id: str) -> int | None:
        """The GPU position of an ID when that GPU is usable, else None."""
        p = self.position_of(device_id)
        return None if p is None or p in self.unusable else p

    def _search_for(self, avail_positions: Sequence[int]) -> Search:
        """The exact search when a subset table covers the available GPUs, else the greedy."""
        if self.exact.table_for(avail_positions) is not None:
            return self.exact
        return self.greedy

    # ------------------------------------------------------------------ explain

    def candidates(self, request: AllocationRequest) -> list[Candidate]:
        """Every valid set of physical GPUs for a replica-free request, best first (for explain)."""
        from itertools import combinations

        usable = [p for i in request.available if (p := self._usable(i)) is not None]
        avail = sorted(set(usable))
        must_all = [self._usable(i) for i in request.must_include]
        must = sorted({p for p in must_all if p is not None})
        k = request.size - sum(1 for p in must_all if p is None)
        if k < len(must) or k > len(avail):
            return []
        rest = [p for p in avail if p not in must]
        table = self.exact.table_for(avail)
        found = [
            self.objective.candidate(tuple(sorted([*must, *extra])), avail, table)
            for extra in combinations(rest, k - len(must))
        ]
        found.sort(key=Candidate.key)
        return found


def without_health(node: Node) -> Node:
    """``node`` with every GPU marked healthy: what stays when only health changes."""
    if all(g.healthy for g in node.gpus):
        return node
    return dataclasses.replace(
        node, gpus=tuple(dataclasses.replace(g, healthy=True) for g in node.gpus)
    )


def _check_size(size: int, available: int) -> None:
    if size > available:
        raise AllocationError(
            f"request for {size} devices but only {available} are available",
            hint="ask for at most as many devices as are available",
        )


def _answer_facts(
    allocator: Allocator, positions: Sequence[int | None], chosen: Sequence[int], notes: list[str]
) -> tuple[int, tuple[int, ...], str | None]:
    """Link score and NUMA nodes of the chosen devices' GPUs, and the fallback reason."""
    used = tuple(sorted({p for n in chosen if (p := positions[n]) is not None}))
    reason = "; ".join(notes) if notes else None
    if reason:
        log.info("preferred allocation fallback: %s", reason)
    topo = allocator.topology
    return topo.set_score(used), topo.numa_nodes(used), reason
