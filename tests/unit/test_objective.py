"""The allocation objective as a user sees it: which set wins, and why each other set lost.

Every case is answered three ways that must agree: the fast path (whole GPUs, no constraints),
the general path (a constraint every set passes sends the request there, where the exact search
ranks by :func:`cdigen.policies.objective.head`), and ``policy explain``'s ranking
(:meth:`Allocator.candidates`, by :meth:`Candidate.key`), whose runner-up's ``lostBecause``
names the term that decided, with its numbers.
"""

from __future__ import annotations

import itertools
from functools import cache

import pytest

from cdigen.discover import load_node
from cdigen.model import Node
from cdigen.policies import objective as objective_module
from cdigen.policies.allocator import AllocationRequest, Allocator, why_lost
from cdigen.policies.cel import compile_expression
from cdigen.policies.expression import Expression
from cdigen.policies.policy import Policy

ALLOCATION = frozenset({"allocation"})
INDEX = 'device.attributes["cdigen.dev"].index'


def _policy(name: str, *constraints: str, selector: str | None = None) -> Policy:
    return Policy(
        name=name,
        source="test",
        selector=Expression("spec.selector", compile_expression(selector)) if selector else None,
        constraints=tuple(
            Expression(f"spec.constraints[{n}]", compile_expression(text, ALLOCATION))
            for n, text in enumerate(constraints)
        ),
    )


@cache
def _node(name: str) -> Node:
    return load_node(f"builtin:{name}")


def _request(free: tuple[int, ...], size: int, must: tuple[int, ...] = ()) -> AllocationRequest:
    return AllocationRequest(tuple(map(str, free)), tuple(map(str, must)), size)


# (node, free GPUs, must, size) -> the winner, a loser, and why that loser lost
CASES = {
    "link score": (
        ("dgx1-v100", tuple(range(8)), (0,), 2),
        (0, 3),
        (0, 4),
        "lower link score (210 < 230)",
    ),
    "NUMA span": (("dgx-a100", (0, 4, 5), (), 2), (4, 5), (0, 4), "spans more NUMA nodes (2 > 1)"),
    "best set left": (
        ("dgx1-v100", tuple(range(1, 8)), (), 1),
        (1,),
        (4,),
        "leaves a worse 4-GPU set free (link score 840 < 1120)",
    ),
    "pairs left": (
        ("dgx1-v100", tuple(range(1, 8)), (), 1),
        (1,),
        (3,),
        "leaves worse pairs free (best pairing of what is left scores 690 < 710)",
    ),
    "fragmentation": (
        ("dgx1-v100", (0, 1, 2, 4), (), 1),
        (4,),
        (0,),
        "fragments the free devices more (cuts link score 490 > 230 from what is left)",
    ),
    "positions": (
        ("pcie-8x4090", (0, 1, 2, 4, 5, 6), (), 3),
        (0, 1, 2),
        (4, 5, 6),
        "tie-break: higher GPU indexes",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_each_term_of_the_objective_decides_in_its_direction(case: str) -> None:
    (name, free, must, size), winner, loser, because = CASES[case]
    node = _node(name)
    request = _request(free, size, must)
    passing = _policy("general", "allocation.size >= 1")
    for allocator in (Allocator(node), Allocator(node, passing)):
        answer = allocator.prefer(request)
        assert answer.devices == tuple(map(str, winner)) and answer.fallback_reason is None
    ranked = Allocator(node).candidates(request)
    assert ranked[0].positions == winner
    lost = next(c for c in ranked if c.positions == loser)
    assert why_lost(ranked[0], lost) == because


def test_fragmentation_counts_the_links_cut_from_what_stays_free() -> None:
    """dgx1-v100, GPUs 0, 1, 2 and 4 free: GPU 4 has one NVLink to the rest (to 0), GPU 0 two
    NVLinks to 1 and 2 and one to 4; its cut is the link weights from it to the other three."""
    node = _node("dgx1-v100")
    ranked = Allocator(node).candidates(_request((0, 1, 2, 4), 1))
    cut = {c.positions: c.fragmentation for c in ranked}
    scores = Allocator(node).topology.scores
    assert cut == {(p,): sum(scores[p][q] for q in (0, 1, 2, 4) if q != p) for p in (0, 1, 2, 4)}
    assert cut[(4,)] == 230 and cut[(0,)] == 490
    pair = Allocator(node).candidates(_request((0, 1, 2, 4), 2, (0,)))
    # a pair's cut leaves out the links inside it: 0-1 cuts 0-2, 0-4, 1-2 (1 and 4 share none)
    assert {c.positions: c.fragmentation for c in pair}[(0, 1)] == (
        scores[0][2] + scores[0][4] + scores[1][2] + scores[1][4]
    )


def test_a_constraint_passes_over_the_best_linked_set_and_explain_says_which() -> None:
    """``allocation.linkScore < 200``: GPU 0's NV2 and NV1-to-the-other-board partners (3 and
    4) fail it, so the best set that passes (0 and 1, one NVLink) wins with no fallback."""
    node = _node("dgx1-v100")
    policy = _policy("modest", "allocation.size == 2", "allocation.linkScore < 200")
    request = _request(tuple(range(8)), 2, (0,))
    allocator = Allocator(node, policy)
    answer = allocator.prefer(request)
    assert answer.devices == ("0", "1") and answer.fallback_reason is None
    ranked = allocator.candidates(request)
    assert ranked[0].positions == (0, 1)
    lost = {c.positions: why_lost(ranked[0], c) for c in ranked[1:]}
    assert lost[(0, 3)] == lost[(0, 4)] == "spec.constraints[1] is false"


def test_when_no_set_passes_the_answer_says_so() -> None:
    node = _node("dgx1-v100")
    allocator = Allocator(node, _policy("never", "allocation.size > 8"))
    answer = allocator.prefer(_request(tuple(range(8)), 2, (0,)))
    assert answer.devices == ("0", "3")  # the objective's best all the same
    assert answer.fallback_reason == "no available set satisfies the policy constraints"


def test_a_set_failing_the_selector_loses_and_explain_says_how_many_devices() -> None:
    node = _node("dgx1-v100")
    not_3 = _policy("not-3", "allocation.size >= 1", selector=f"{INDEX} != 3")
    allocator = Allocator(node, not_3)
    request = _request(tuple(range(8)), 2, (0,))
    assert allocator.prefer(request).devices == ("0", "4")
    ranked = allocator.candidates(request)
    assert ranked[0].positions == (0, 4)
    lost = next(c for c in ranked if c.positions == (0, 3))
    assert why_lost(ranked[0], lost) == "1 device(s) fail the selector"
    assert allocator.selector_failures == {3: "selector is false"}
    # only the selector fails GPU 3: alone on offer, it is chosen, and the answer says why
    alone = allocator.prefer(_request((3, 5), 1))
    assert alone.devices == ("5",)
    forced = allocator.prefer(_request((3,), 1))
    assert forced.devices == ("3",)
    assert forced.fallback_reason == "1 chosen device(s) fail the policy selector"


def test_an_unhealthy_gpu_is_unusable_not_a_selector_failure() -> None:
    """Health never reaches the selector: a sick GPU that also fails it is listed once, as
    unhealthy; explain's failures list shows the selector's reason only for usable GPUs."""
    import dataclasses

    node = _node("dgx1-v100")
    sick = dataclasses.replace(
        node, gpus=tuple(dataclasses.replace(g, healthy=g.index != 3) for g in node.gpus)
    )
    allocator = Allocator(sick, _policy("not-3-or-5", selector=f"{INDEX} != 3 && {INDEX} != 5"))
    assert allocator.unusable == {3: "unhealthy"}
    assert allocator.selector_failures == {5: "selector is false"}


# constraints that read one fact each: evaluated once per distinct value of that fact
FACT_CONSTRAINTS = {
    "size": "allocation.size != 2",
    "numaNodes": "allocation.numaNodes.size() == 1",
    "linkScore": "allocation.linkScore < 200",
    "minPairNVLinks": "allocation.minPairNVLinks == 0",
}


@pytest.mark.parametrize("fact", FACT_CONSTRAINTS)
def test_constraints_on_one_fact_answer_as_evaluated_per_set(fact: str) -> None:
    """The constraint cache is keyed by the facts the constraints read: one evaluation per
    distinct value gives every answer that one evaluation per set of GPUs gives."""
    node = _node("dgx1-v100")
    policy = _policy(fact, FACT_CONSTRAINTS[fact])
    cached = Allocator(node, policy)
    assert cached.objective.fact_fields == (fact,)
    per_set = Allocator(node, policy)
    per_set.objective.fact_fields = None
    checked = 0
    for free in itertools.combinations(range(8), 5):
        for size in (1, 2, 3):
            request = _request(free, size)
            assert cached.prefer(request) == per_set.prefer(request), (fact, free, size)
            checked += 1
    assert checked == 168


def test_the_constraint_cache_keeps_distinct_facts_apart() -> None:
    """What the cache key holds, per fact read: the set's size, NUMA nodes, link score or the
    fewest NVLinks between two of its GPUs (the positions themselves when a constraint reads
    more than facts)."""
    node = _node("dgx1-v100")
    keys = {}
    for fact, text in FACT_CONSTRAINTS.items():
        objective = Allocator(node, _policy(fact, text)).objective
        keys[fact] = objective._constraint_key((0, 3)), objective._constraint_key((0, 5))
    assert keys == {
        "size": ((2,), (2,)),
        "numaNodes": (((0,),), ((0, 1),)),
        "linkScore": ((230,), (10,)),
        "minPairNVLinks": ((2,), (0,)),
    }
    devices = _policy("devices", 'allocation.devices.all(d, d.attributes["cdigen.dev"].index < 6)')
    objective = Allocator(node, devices).objective
    assert objective.fact_fields is None and objective._constraint_key((0, 3)) == (0, 3)


def test_a_request_within_its_budget_evaluates_every_set() -> None:
    node = _node("dgx1-v100")
    allocator = Allocator(node, _policy("modest", "allocation.linkScore < 200"))
    answer = allocator.prefer(_request(tuple(range(8)), 2, (0,)))
    assert answer.devices == ("0", "1") and answer.fallback_reason is None
    assert not allocator.objective.budget_exhausted


@pytest.mark.parametrize(
    ("budget_s", "constraint", "devices"),
    [
        (2.5, "allocation.linkScore < 200", ("0", "3")),
        (3.0, "allocation.linkScore < 220", ("0", "4")),
    ],
)
def test_past_its_budget_a_request_counts_the_sets_not_evaluated_as_failing(
    monkeypatch: pytest.MonkeyPatch, budget_s: float, constraint: str, devices: tuple[str, ...]
) -> None:
    """The budget is CPU time of the request's thread. This clock moves 1 s per reading: the
    request reads it at its start (1000), then twice per set evaluated (before, and in the
    evaluation), best link score first: (0, 3) at 1001, (0, 4) at 1003, (0, 1) at 1005. A
    2.5 s budget evaluates (0, 3) only: it fails, and so do the sets not evaluated, (0, 1)
    included, which would pass: (0, 3) wins, the best linked, and the answer says why. A 3 s
    budget evaluates (0, 4) too, at its deadline: it passes, and no set left can beat it."""
    readings = itertools.count(1000)
    monkeypatch.setattr(objective_module.time, "thread_time", lambda: float(next(readings)))
    monkeypatch.setattr("cdigen.policies.allocator.CONSTRAINT_BUDGET_S", budget_s)
    allocator = Allocator(_node("dgx1-v100"), _policy("modest", constraint))
    answer = allocator.prefer(_request(tuple(range(8)), 2, (0,)))
    assert answer.devices == devices
    ran_past = "constraint evaluation ran past 2500 ms; sets not evaluated count as failing"
    assert answer.fallback_reason == (ran_past if budget_s == 2.5 else None)
    # what a request did not evaluate is not remembered as failing: the next one, with time
    # enough, evaluates it
    monkeypatch.setattr("cdigen.policies.allocator.CONSTRAINT_BUDGET_S", 1000.0)
    later = allocator.prefer(_request(tuple(range(7)), 2, (0,)))
    assert later.devices == ("0", "4" if budget_s == 3.0 else "1")
    assert later.fallback_reason is None
    assert allocator.objective.constraints_ok((0, 1)) == (True, None)  # no budget outside


def test_a_replica_goes_to_the_gpu_with_the_most_free_replicas() -> None:
    """``spread`` (the default): one free replica on GPU 0, three on GPU 5; a pod gets GPU 5's."""
    node = _node("dgx1-v100")
    uuid = {g.index: g.uuid for g in node.gpus}
    free = (f"{uuid[0]}::0", *(f"{uuid[5]}::{k}" for k in range(3)))
    for allocator in (Allocator(node), Allocator(node, _policy("general", "allocation.size >= 1"))):
        answer = allocator.prefer(AllocationRequest(free, (), 1))
        assert answer.devices[0].startswith(uuid[5])


def test_a_selector_error_is_reported_as_one() -> None:
    """A GPU on which the selector errs fails it, and explain says it erred, not that it was
    false."""
    node = _node("dgx1-v100")
    policy = _policy("odd", selector=f"100 / ({INDEX} - 5) != 1000")
    failures = Allocator(node, policy).selector_failures
    assert list(failures) == [5] and failures[5].startswith("selector error: ")


TEN = "[1,2,3,4,5,6,7,8,9,10]"


@pytest.mark.parametrize(
    ("budget_s", "eval_limit_s", "reason"),
    [
        (
            2.5,
            1000.0,
            "constraint evaluation ran past 2500 ms; sets not evaluated count as failing",
        ),
        (1000.0, 0.5, "no available set satisfies the policy constraints"),
        (4.0, 0.5, "no available set satisfies the policy constraints"),
    ],
)
def test_an_evaluation_cut_short_fails_its_set_and_says_which_limit_cut_it(
    monkeypatch: pytest.MonkeyPatch, budget_s: float, eval_limit_s: float, reason: str
) -> None:
    """One set on offer (GPUs 0 and 3), a constraint of many steps, and a clock that moves 1 s
    per reading. Cut short by the request's deadline, the request ran out of budget and says
    so; cut short by its own time limit, the set fails the constraint, with budget left (with a
    4 s budget, the request is at its deadline, 1004, when it checks: not past it)."""
    readings = itertools.count(1000)
    monkeypatch.setattr(objective_module.time, "thread_time", lambda: float(next(readings)))
    monkeypatch.setattr("cdigen.policies.allocator.CONSTRAINT_BUDGET_S", budget_s)
    monkeypatch.setattr("cdigen.policies.cel.limits.EVAL_TIME_LIMIT_S", eval_limit_s)
    slow = f"{TEN}.map(a, {TEN}.map(b, a + b)).size() > allocation.size"
    allocator = Allocator(_node("dgx1-v100"), _policy("slow", slow))
    answer = allocator.prefer(_request((0, 3), 2))
    assert answer.devices == ("0", "3") and answer.fallback_reason == reason
