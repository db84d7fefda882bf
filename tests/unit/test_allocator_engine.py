"""The engine's two paths and its edges, as a caller sees them.

Whole usable GPUs with no constraints are answered on the fast path, never by the general search
(the first test takes the general search away); every other request, the odd ones included
(an ID twice, a must-include device not offered, more must-include devices than places, size 0,
unknown IDs and positions, sick GPUs), gets the general path's answer, the same whichever way
it is asked.
"""

from __future__ import annotations

import dataclasses
import itertools
from functools import cache

import pytest

from cdigen.discover import load_node
from cdigen.errors import AllocationError
from cdigen.model import Node
from cdigen.policies import allocator as allocator_module
from cdigen.policies.allocator import AllocationAnswer, AllocationRequest, Allocator, PositionAnswer
from cdigen.policies.cel import compile_expression
from cdigen.policies.expression import Expression
from cdigen.policies.policy import Policy, builtin_policy

ALLOCATION = frozenset({"allocation"})


def _policy(name: str, constraint: str | None = None, selector: str | None = None) -> Policy:
    return Policy(
        name=name,
        source="test",
        selector=Expression("spec.selector", compile_expression(selector)) if selector else None,
        constraints=(
            (Expression("spec.constraints[0]", compile_expression(constraint, ALLOCATION)),)
            if constraint
            else ()
        ),
    )


PASSING = "allocation.size >= 1"


@cache
def _node(name: str = "dgx1-v100") -> Node:
    return load_node(f"builtin:{name}")


def _sick(node: Node, *indexes: int) -> Node:
    gpus = tuple(dataclasses.replace(g, healthy=g.index not in indexes) for g in node.gpus)
    return dataclasses.replace(node, gpus=gpus)


def _ids(*indexes: int) -> tuple[str, ...]:
    return tuple(map(str, indexes))


def _no_general_search(*_: object) -> list[int]:
    raise AssertionError("answered by the general search")


def test_whole_gpus_are_answered_on_the_fast_path_as_the_general_path_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every set of free GPUs of dgx1-v100, every size, with no, one or two must-include GPUs,
    asked by index, by UUID and by position."""
    node = _node()
    general = Allocator(node, _policy("general", PASSING))
    requests = [
        (free, must, size)
        for n in range(1, 9)
        for free in itertools.combinations(range(8), n)
        for size in range(1, n + 1)
        for must in ((), free[-1:], free[:2] if size >= 2 else ())
    ]
    expected = {
        r: general.prefer(AllocationRequest(_ids(*r[0]), _ids(*r[1]), r[2])) for r in requests
    }
    uuid = [g.uuid for g in node.gpus]
    fast = Allocator(node)
    monkeypatch.setattr(fast, "_solve", _no_general_search)
    for (free, must, size), answer in expected.items():
        assert fast.prefer(AllocationRequest(_ids(*free), _ids(*must), size)) == answer
        by_uuid = fast.prefer(
            AllocationRequest(tuple(uuid[p] for p in free), tuple(uuid[p] for p in must), size)
        )
        assert by_uuid.devices == tuple(uuid[int(i)] for i in answer.devices)
        placed = fast.prefer_positions(free, [free.index(m) for m in must], size)
        assert tuple(free[n] for n in placed.devices) == tuple(map(int, answer.devices))
        assert placed.positions == tuple(map(int, answer.devices))
        assert (placed.link_score, placed.numa_nodes) == (answer.link_score, answer.numa_nodes)


# requests off the fast path: (available, must, size) -> the answer's devices and reason
ODD_REQUESTS = {
    "an ID twice": ((_ids(0, 0, 3), (), 2), _ids(0, 3), None),
    "must not offered": (
        (_ids(0, 1, 2, 3), _ids(5), 2),
        _ids(2, 3),
        "must-include IDs ['5'] are not available (ignored)",
    ),
    "must twice": ((_ids(0, 1, 2, 3), _ids(1, 1), 2), _ids(1, 2), None),
    "more must than size": (
        (_ids(0, 1, 2, 3), _ids(2, 1, 0), 2),
        _ids(2, 1),
        "3 must-include IDs for a request of 2 (kept the first)",
    ),
    "must as many as size": ((_ids(0, 1, 2, 3), _ids(2, 1), 2), _ids(1, 2), None),
    "size 0": ((_ids(0, 1), _ids(1), 0), (), None),
    "unknown ID": (
        (("0", "nope", "1"), (), 3),
        ("0", "nope", "1"),
        "unknown device IDs ['nope'] (chosen last); only 2 healthy known devices for 3 places",
    ),
    "unknown ID not needed": (
        (("nope", "0", "3"), (), 2),
        _ids(0, 3),
        ("unknown device IDs ['nope'] (chosen last)"),
    ),
}


@pytest.mark.parametrize("case", ODD_REQUESTS)
def test_odd_requests_get_the_general_paths_answer(case: str) -> None:
    (available, must, size), devices, reason = ODD_REQUESTS[case]
    request = AllocationRequest(available, must, size)
    for allocator in (Allocator(_node()), Allocator(_node(), _policy("general", PASSING))):
        answer = allocator.prefer(request)
        assert (answer.devices, answer.fallback_reason) == (devices, reason)
        if not devices:
            assert answer == AllocationAnswer((), 0, ())


# positions off the fast path: (available, must, size) -> the answer's devices and reason
ODD_POSITIONS = {
    "a GPU twice": (((0, 0, 3), (), 2), (0, 2), None),
    "must past the end": (
        ((0, 1, 2, 3), (4,), 2),
        (2, 3),
        "must-include indexes [4] are not in available (ignored)",
    ),
    "must before the start": (
        ((0, 1, 2, 3), (-1,), 2),
        (2, 3),
        "must-include indexes [-1] are not in available (ignored)",
    ),
    "must index 0": (((5, 1, 2, 3), (0,), 2), (0, 1), None),
    "more must than size": (
        ((0, 1, 2, 3), (2, 1, 0), 2),
        (2, 1),
        "3 must-include devices for a request of 2 (kept the first)",
    ),
    "must as many as size": (((0, 1, 2, 3), (2, 0), 2), (0, 2), None),
    "size 0": (((0, 1), (1,), 0), (), None),
    "position past the node": (
        ((8, 1, 2), (), 3),
        (0, 1, 2),
        "unknown GPU positions [8] (chosen last); only 2 healthy known devices for 3 places",
    ),
    "negative position": (
        ((-1, 1, 2), (), 2),
        (1, 2),
        "unknown GPU positions [-1] (chosen last)",
    ),
    "unknown position, GPU 0 not offered": (
        ((99, 5, 6), (), 2),
        (1, 2),
        "unknown GPU positions [99] (chosen last)",
    ),
}


@pytest.mark.parametrize("case", ODD_POSITIONS)
def test_odd_positions_get_the_general_paths_answer(case: str) -> None:
    (available, must, size), devices, reason = ODD_POSITIONS[case]
    for allocator in (Allocator(_node()), Allocator(_node(), _policy("general", PASSING))):
        answer = allocator.prefer_positions(available, must, size)
        assert (answer.devices, answer.fallback_reason) == (devices, reason)
        if not devices:
            assert answer == PositionAnswer((), (), 0, ())


def test_a_request_larger_than_what_is_offered_is_the_one_error() -> None:
    allocator = Allocator(_node())
    assert len(allocator.prefer(AllocationRequest(_ids(0, 1, 2), (), 3)).devices) == 3
    with pytest.raises(AllocationError, match="request for 4 devices but only 3"):
        allocator.prefer(AllocationRequest(_ids(0, 1, 2), (), 4))
    with pytest.raises(AllocationError, match="request for 9 devices but only 8"):
        allocator.prefer(AllocationRequest(_ids(*range(8)), (), 9))  # more than any table size
    with pytest.raises(AllocationError, match="request for 2 devices but only 1"):
        allocator.prefer_positions([0], [], 2)


def test_the_id_grammar() -> None:
    """GPU UUIDs and indexes, with or without a replica suffix, MIG UUIDs and CDI-style MIG
    names (``<gpu index>:<n>``) name their GPU's position; anything else names none."""
    node = _node("dgx-a100-mig-mixed")
    allocator = Allocator(node)
    mig_gpu = next(p for p, g in enumerate(node.gpus) if g.mig_devices and p > 0)
    index = node.gpus[mig_gpu].index
    assert allocator.position_of(node.gpus[mig_gpu].mig_devices[0].uuid) == mig_gpu
    assert allocator.position_of(f"{index}:1") == mig_gpu
    assert allocator.position_of(f"{index}:0") == mig_gpu
    assert allocator.position_of(f"{node.gpus[2].uuid}::3") == 2
    assert allocator.position_of("2::1") == 2
    assert allocator.position_of(node.gpus[2].uuid) == 2
    for nothing in ("nope", "99", "99:1", ":1", "GPU-nope::1"):
        assert allocator.position_of(nothing) is None


def test_sick_gpus_come_last_and_the_answer_says_so_only_when_offered() -> None:
    allocator = Allocator(_sick(_node(), 3))
    assert allocator.prefer(AllocationRequest(_ids(0, 1, 2), (), 2)).fallback_reason is None
    offered = allocator.prefer(AllocationRequest(_ids(0, 1, 2, 3), (), 2))
    assert offered.devices == _ids(1, 2)  # 1-3 and 0-3 would be the best linked
    assert offered.fallback_reason == "GPUs [3] have errors (chosen last)"
    full = allocator.prefer(AllocationRequest(_ids(0, 1, 3), (), 2))
    assert (
        full.devices == _ids(0, 1) and full.fallback_reason == "GPUs [3] have errors (chosen last)"
    )
    short = allocator.prefer(AllocationRequest(_ids(0, 3, 1, 5), (), 4))
    assert short.devices == _ids(0, 3, 1, 5)
    assert short.fallback_reason == (
        "GPUs [3] have errors (chosen last); only 3 healthy known devices for 4 places"
    )


def test_a_must_include_sick_gpu_is_kept_and_the_rest_chosen_around_it() -> None:
    allocator = Allocator(_sick(_node(), 3))
    answer = allocator.prefer(AllocationRequest(_ids(0, 1, 2, 3, 4), _ids(3), 2))
    assert answer.devices == _ids(3, 4)
    both = allocator.prefer(AllocationRequest(_ids(0, 1, 2, 3, 4), _ids(3, 0), 2))
    assert both.devices == _ids(0, 3)
    bad_only = allocator.prefer(AllocationRequest(("nope", "3", "0"), ("3",), 2))
    assert bad_only.devices == ("3", "0")
    few = allocator.prefer(AllocationRequest(("nope", "3", "0", "ghost"), ("3",), 3))
    assert sorted(few.devices) == sorted(("nope", "3", "0"))
    assert "only 1 healthy known devices for 2 places" in (few.fallback_reason or "")


def test_the_fast_path_reports_chosen_devices_failing_the_selector() -> None:
    not_3 = Allocator(
        _node(), _policy("not-3", selector='device.attributes["cdigen.dev"].index != 3')
    )
    assert not_3.prefer(AllocationRequest(_ids(0, 3), (), 1)).fallback_reason is None
    forced = not_3.prefer(AllocationRequest(_ids(3), (), 1))
    assert forced.fallback_reason == "1 chosen device(s) fail the policy selector"
    placed = not_3.prefer_positions([3], [], 1)
    assert placed.fallback_reason == "1 chosen device(s) fail the policy selector"


def test_a_constrained_policy_holds_by_positions_too() -> None:
    """Positions never skip the constraints: GPU 0's best partners (3 and 4) fail
    ``linkScore < 200``."""
    allocator = Allocator(_node(), _policy("modest", "allocation.linkScore < 200"))
    assert allocator.prefer_positions(list(range(8)), [0], 2).positions == (0, 1)
    ids = allocator.prefer(AllocationRequest(_ids(*range(8)), _ids(0), 2))
    assert ids.devices == _ids(0, 1)


def test_shares_by_position_spread_unless_they_are_memory_slices() -> None:
    allocator = Allocator(_node())
    two_each = [p for p in (0, 3) for _ in range(2)]
    assert allocator.prefer_positions(two_each, [], 2).positions == (0, 3)
    assert allocator.prefer_positions(two_each, [], 2, slices=True).positions == (0,)
    pack = Allocator(_node(), builtin_policy("pack"))
    assert pack.prefer_positions(two_each, [], 2).positions == (0,)


def test_answers_are_remembered_up_to_a_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator_module, "MEMO_LIMIT", 3)
    allocator = Allocator(_node())
    for size in range(1, 8):
        allocator.prefer(AllocationRequest(_ids(*range(8)), (), size))
        allocator.prefer_positions(list(range(8)), [], size)
        assert len(allocator._memo) <= 3 and len(allocator._position_memo) <= 3
    assert len(allocator._memo) == len(allocator._position_memo) == 1  # cleared at 3, then 1


def test_explain_lists_sets_around_sick_must_include_gpus() -> None:
    allocator = Allocator(_sick(_node(), 3))
    ranked = allocator.candidates(AllocationRequest(("0", "1", "2", "3", "nope"), _ids(3, 1), 3))
    assert [c.positions for c in ranked] == [(1, 2), (0, 1)]
    assert allocator.candidates(AllocationRequest(_ids(0, 1), _ids(0, 1), 1)) == []
    assert allocator.candidates(AllocationRequest(_ids(0, 1, 3), (), 3)) == []
    whole = allocator.candidates(AllocationRequest(_ids(0, 1, 2), (), 3))
    assert [c.positions for c in whole] == [(0, 1, 2)]
