"""The allocation objective: one key, and the explanation of why a set lost, read off that key.

The objective is lexicographic (docs/policies.md), smaller key is better:

1. the devices failing the selector; 2. whether a constraint fails; 3. the link score (higher
wins); 4. the NUMA nodes spanned; 5. the free shares on the set's GPUs (higher wins; ``spread``
requests over replicas only, 0 elsewhere); 6. the link score of the best ``NEXT_SET_SIZE``-GPU
set left free and 7. the best pairing of what is left (higher wins; with subset tables only, 0
in the greedy search); 8. the links cut from the free devices (fragmentation); 9. the GPU
positions, ascending.

:func:`head` builds terms 1-7, :meth:`Candidate.key` all nine,
:func:`cdigen.policies.terms.static_terms` terms 1, 3 and 4; the exact and greedy searches,
``explain`` and :func:`why_lost` all rank by them.
The exact search reads terms 1, 3 and 4 from its sorted tables, computes term 8 only for sets
tied on 1-7, and gets term 9 from its walk order (the tables' last sort key).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdigen.model import Node
from cdigen.policies.graph import Topology
from cdigen.policies.policy import Policy
from cdigen.policies.terms import NEXT_SET_SIZE

if TYPE_CHECKING:
    from cdigen.policies.table import Table


# CPU time one request may spend evaluating policy constraints; past it the sets not yet
# evaluated count as failing them (a fallback reason says so), so that a slow policy cannot
# hold a kubelet call (each evaluation is bounded too: cdigen.policies.cel.EVAL_TIME_LIMIT_S).
CONSTRAINT_BUDGET_S = 0.08

Head = tuple[int, bool, int, int, int, int, int]
Key = tuple[int, bool, int, int, int, int, int, int, tuple[int, ...]]


def head(
    selector_failures: int,
    constraints_ok: bool,
    link_score: int,
    numa_span: int,
    free_shares: int,
    left_best_set: int,
    left_pairs: int,
) -> Head:
    """Terms 1-7 of the objective key (smaller is better)."""
    return (
        selector_failures,
        not constraints_ok,
        -link_score,
        numa_span,
        -free_shares,
        -left_best_set,
        -left_pairs,
    )


@dataclass(frozen=True)
class Candidate:
    """One candidate set of physical GPUs with its objective terms, for ``explain``."""

    positions: tuple[int, ...]
    selector_failures: int
    constraints_ok: bool
    constraint_reason: str | None
    link_score: int
    numa_span: int
    left_best_set: int  # link score of the best NEXT_SET_SIZE-GPU set left free
    left_pairs: int  # total link score of the best split of the free devices left into pairs
    fragmentation: int  # link score cut between the set and the devices left free
    free_shares: int = 0  # free shares on the set's GPUs (spread over replicas only)

    def key(self) -> Key:
        """The lexicographic objective: smaller is better."""
        return (
            *head(
                self.selector_failures,
                self.constraints_ok,
                self.link_score,
                self.numa_span,
                self.free_shares,
                self.left_best_set,
                self.left_pairs,
            ),
            self.fragmentation,
            self.positions,
        )


# why a set lost on each term of the key, in key order: (winner, loser) -> text
_LOST_BECAUSE: tuple[Callable[[Candidate, Candidate], str], ...] = (
    lambda w, lo: f"{lo.selector_failures} device(s) fail the selector",
    lambda w, lo: lo.constraint_reason or "fails a constraint",
    lambda w, lo: f"lower link score ({lo.link_score} < {w.link_score})",
    lambda w, lo: f"spans more NUMA nodes ({lo.numa_span} > {w.numa_span})",
    lambda w, lo: f"its GPUs have fewer free shares ({lo.free_shares} < {w.free_shares})",
    lambda w, lo: (
        f"leaves a worse {NEXT_SET_SIZE}-GPU set free (link score "
        f"{lo.left_best_set} < {w.left_best_set})"
    ),
    lambda w, lo: (
        "leaves worse pairs free (best pairing of what is left scores "
        f"{lo.left_pairs} < {w.left_pairs})"
    ),
    lambda w, lo: (
        "fragments the free devices more (cuts link score "
        f"{lo.fragmentation} > {w.fragmentation} from what is left)"
    ),
    lambda w, lo: "tie-break: higher GPU indexes",
)


def why_lost(winner: Candidate, loser: Candidate) -> str:
    """The first objective term on which ``loser`` differs from ``winner``, in words (two sets
    of distinct GPUs differ at the last term, their positions, if nowhere else)."""
    for term, (won, lost) in enumerate(zip(winner.key(), loser.key(), strict=True)):
        if won != lost:
            return _LOST_BECAUSE[term](winner, loser)
    raise ValueError(f"why_lost: both candidates are the set {winner.positions}")


def position_fact(topology: Topology, positions: tuple[int, ...], name: str) -> Any:
    """One ``allocation`` fact of a set of GPU positions."""
    if name == "numaNodes":
        return topology.numa_nodes(positions)
    if name == "size":
        return len(positions)
    if name == "linkScore":
        return topology.set_score(positions)
    return topology.min_pair_nvlinks(positions)


class Objective:
    """The objective evaluated on one (node, policy): selector failures, constraint results
    (cached, within a CPU budget per request) and whole candidates."""

    def __init__(self, node: Node, policy: Policy, topology: Topology) -> None:
        self.policy = policy
        self.topology = topology
        self.unusable: dict[int, str] = {}
        for p, gpu in enumerate(topology.gpus):
            if gpu.error:
                self.unusable[p] = f"discovery error: {gpu.error}"
            elif not gpu.healthy:
                self.unusable[p] = "unhealthy"
        # Health does not reach the selector, so it is asked of every GPU without a discovery
        # error: the subset tables sort by its results (table_fails) and so serve every health
        # state of the node (see Allocator.for_health).
        self.error_free = tuple(p for p, gpu in enumerate(topology.gpus) if not gpu.error)
        failures: dict[int, str] = {}
        for p in self.error_free:
            passed, reason = policy.selector_result(topology.gpus[p], node)
            if not passed:
                failures[p] = reason or "selector is false"
        self.table_fails = frozenset(failures)
        self.selector_failures = {p: r for p, r in failures.items() if p not in self.unusable}
        self.fail_positions = set(self.selector_failures)
        self.constrained = bool(policy.constraints)
        self._constraint_cache: dict[tuple[Any, ...], tuple[bool, str | None]] = {}
        # constraints that read only set facts (allocation.size, ...) are evaluated once per
        # distinct facts, not once per set; None: one evaluation per set of GPUs
        self.fact_fields = policy.constraint_facts()
        self._request = threading.local()  # the constraint-evaluation deadline of a request
        self._devices: list[Any] = []
        if self.constrained:  # the CEL engine is imported for constraints only (start-up time)
            from cdigen.policies.cel import device_value

            self._devices = [device_value(g, node) for g in topology.gpus]

    # ------------------------------------------------------------------ per request

    def start_request(self, budget_s: float = CONSTRAINT_BUDGET_S) -> None:
        """Start the constraint-evaluation budget of one request (this thread): ``budget_s``
        seconds of CPU time."""
        self._request.budget_s = budget_s
        self._request.deadline = time.thread_time() + budget_s
        self._request.exhausted = False

    def end_request(self) -> None:
        """End the budget of this thread's request."""
        self._request.deadline = None

    @property
    def budget_s(self) -> float:
        """The constraint-evaluation budget of this thread's request, in seconds."""
        return float(getattr(self._request, "budget_s", CONSTRAINT_BUDGET_S))

    @property
    def budget_exhausted(self) -> bool:
        """Whether this thread's request ran out of constraint-evaluation time."""
        return bool(getattr(self._request, "exhausted", False))

    # ------------------------------------------------------------------ constraints

    def mask_ok(self, table: Table, mask: int, arrays: list[list[int]] | None) -> bool:
        """Whether the set of a table mask satisfies the constraints; with ``arrays`` (the
        table's fact arrays), looked up by its facts first."""
        if arrays is None:
            return self.constraints_ok(table.positions(mask))[0]
        key = tuple([array[mask] for array in arrays])
        ok = table.ok_cache.get(key)
        if ok is None:
            positions = table.positions(mask)
            ok = self.constraints_ok(positions)[0]
            if self._constraint_key(positions) in self._constraint_cache:  # not over a limit
                table.ok_cache[key] = ok
        return ok

    def _constraint_key(self, positions: tuple[int, ...]) -> tuple[Any, ...]:
        fields = self.fact_fields
        if fields is None:
            return positions
        return tuple(position_fact(self.topology, positions, f) for f in fields)

    def constraints_ok(self, positions: tuple[int, ...]) -> tuple[bool, str | None]:
        """Whether a set of GPU positions satisfies every constraint, and if not why."""
        topo = self.topology
        key = self._constraint_key(positions)
        cached = self._constraint_cache.get(key)
        if cached is None:
            deadline = getattr(self._request, "deadline", None)
            if deadline is not None and time.thread_time() > deadline:
                self._request.exhausted = True
                return False, "the constraint evaluation budget of this request ran out"
            from cdigen.policies.cel import allocation_value

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

    # ------------------------------------------------------------------ candidates

    def candidate(
        self,
        positions: tuple[int, ...],
        avail_positions: Sequence[int],
        table: Table | None = None,
    ) -> Candidate:
        """``positions`` scored on every objective term (what is left free only with a table;
        free shares are the exact search's, for ``spread`` over replicas, and 0 here)."""
        topo = self.topology
        ok, reason = self.constraints_ok(positions) if self.constrained else (True, None)
        chosen = set(positions)
        frag = sum(topo.scores[p][q] for p in positions for q in avail_positions if q != p)
        left_set = left_pairs = 0
        if table is not None:
            left = table.mask_of(avail_positions) & ~table.mask_of(positions)
            left_set, left_pairs = table.left_free(left)
        return Candidate(
            positions=positions,
            selector_failures=sum(1 for p in positions if p in self.fail_positions),
            constraints_ok=ok,
            constraint_reason=reason,
            link_score=topo.set_score(positions),
            numa_span=len(topo.numa_nodes(positions)),
            left_best_set=left_set,
            left_pairs=left_pairs,
            fragmentation=frag - sum(topo.scores[p][q] for p in chosen for q in chosen),
        )
