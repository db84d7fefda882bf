"""The engine's fast path (whole GPUs, no constraints) answers as its general path does.

A constraint that every set passes sends the same requests through the general path (the one
for replicas, slices and constrained policies): the answers, facts and fallback reasons must
be the same, on every request of a node, by IDs and by GPU positions.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from pathlib import Path

import pytest

from cdigen.discover import load_node
from cdigen.policies.allocator import AllocationRequest, Allocator
from cdigen.policies.policy import load_policy

PASSING_CONSTRAINT = "  constraints:\n    - allocation.size >= 1\n"
NOT_GPU_3 = '  selector: device.attributes["cdigen.dev"].index != 3\n'


def _policy(tmp_path: Path, name: str, spec: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"apiVersion: cdigen/v1alpha1\nkind: AllocationPolicy\nmetadata: {{name: {name}}}\n"
        f"spec:\n{spec}",
        encoding="utf-8",
    )
    return path


def _every_request(count: int) -> list[tuple[tuple[int, ...], tuple[int, ...], int]]:
    out = []
    for mask in range(1, 1 << count):
        free = tuple(i for i in range(count) if mask >> i & 1)
        for size in range(1, len(free) + 1):
            for must in [(), *((p,) for p in free)]:
                out.append((free, must, size))
    return out


@pytest.mark.parametrize(
    ("name", "selector"),
    [("dgx1-v100", ""), ("dgx-a100", ""), ("pcie-8x4090", ""), ("dgx1-v100", NOT_GPU_3)],
)
def test_the_fast_path_answers_as_the_general_path(
    tmp_path: Path, name: str, selector: str
) -> None:
    node = load_node(f"builtin:{name}")
    fast = Allocator(node, load_policy(_policy(tmp_path, "fast", selector or "  {}\n")))
    general = Allocator(
        node, load_policy(_policy(tmp_path, "general", selector + PASSING_CONSTRAINT))
    )
    assert fast._plain and not general._plain  # the paths under test
    uuid = {g.index: g.uuid for g in node.gpus}
    for free, must, size in _every_request(len(node.gpus)):
        by_index = AllocationRequest(tuple(map(str, free)), tuple(map(str, must)), size)
        expected = general.prefer(by_index)
        assert fast.prefer(by_index) == expected, (free, must, size)
        by_uuid = AllocationRequest(
            tuple(uuid[i] for i in free), tuple(uuid[i] for i in must), size
        )
        answer = fast.prefer(by_uuid)
        assert answer.devices == tuple(uuid[int(i)] for i in expected.devices)
        placed = fast.prefer_positions(free, [free.index(m) for m in must], size)
        assert tuple(free[n] for n in placed.devices) == tuple(map(int, expected.devices))
        assert (placed.link_score, placed.numa_nodes, placed.fallback_reason) == (
            expected.link_score,
            expected.numa_nodes,
            expected.fallback_reason,
        )
    if selector:  # the selector's fallback reason comes out of the fast path too
        assert fast.prefer(AllocationRequest(("3",), (), 1)).fallback_reason == (
            "1 chosen device(s) fail the policy selector"
        )


def test_the_fast_path_answers_as_the_general_path_on_16_gpus(tmp_path: Path) -> None:
    """Random requests on a 16-GPU node, where ties run to thousands of sets and the fast
    path lists the few sets that fit instead of walking its table."""
    node = load_node("builtin:dgx2-v100")
    fast = Allocator(node)
    policy = load_policy(_policy(tmp_path, "general", PASSING_CONSTRAINT))
    general = Allocator(node, policy, tables_of=fast)  # one table build (no selector in either)
    rng = random.Random(16)
    for _ in range(150):
        free = sorted(rng.sample(range(16), rng.randint(1, 16)))
        size = rng.randint(1, len(free))
        must = sorted(rng.sample(free, rng.randint(0, min(2, size))))
        request = AllocationRequest(tuple(map(str, free)), tuple(map(str, must)), size)
        assert fast.prefer(request) == general.prefer(request), (free, must, size)
    for size in range(1, 17):  # the free node: every set ties on the links
        request = AllocationRequest(tuple(map(str, range(16))), (), size)
        assert fast.prefer(request) == general.prefer(request), size


def test_requests_off_the_fast_path_still_answer(tmp_path: Path) -> None:
    """Repeated, unknown and unusable IDs, a repeated GPU, must-include IDs outside the
    available ones or more of them than the size: the general path answers, with its reason."""
    node = load_node("builtin:dgx1-v100")
    allocator = Allocator(node)
    uuid0 = node.gpus[0].uuid
    cases = [
        (("0", "1", "2"), ("5",), 2, "are not available"),
        (("0", "1", "2"), ("0", "1", "2"), 2, "must-include IDs for a request of 2"),
        (("0", "1", "bogus"), (), 2, None),
        (("0", uuid0, "1"), (), 2, None),
    ]
    for available, must, size, reason in cases:
        answer = allocator.prefer(AllocationRequest(available, must, size))
        assert len(answer.devices) == size
        if reason is not None:
            assert answer.fallback_reason is not None and reason in answer.fallback_reason


def test_a_16_gpu_nvswitch_node_answers_whole_gpus_without_its_subset_table() -> None:
    """dgx2-v100's GPUs fall into two classes (one per NUMA node, every pair on NVSwitch):
    whole-GPU requests are searched by counts, and the 2^16-set table waits for a request
    over shares."""
    node = load_node("builtin:dgx2-v100")
    allocator = Allocator(node)
    assert allocator.exact.classes is not None
    answer = allocator.prefer(AllocationRequest(tuple(map(str, range(16))), ("9",), 8))
    assert answer.devices == tuple(map(str, range(8, 16)))  # one NUMA node, with GPU 9
    assert answer.numa_nodes == (1,) and answer.fallback_reason is None
    free = tuple(map(str, range(15, -1, -1)))  # any order, any size, with or without must
    for size, must in ((1, ()), (16, ()), (3, ("4",)), (16, ("0",))):
        answer = allocator.prefer(AllocationRequest(free, must, size))
        assert len(answer.devices) == size and set(must) <= set(answer.devices)
    assert allocator.exact._full is not None and allocator.exact._full.built is None
    uuid = node.gpus[0].uuid
    replicas = AllocationRequest((f"{uuid}::0", f"{uuid}::1", "3"), (), 2)
    assert len(allocator.prefer(replicas).devices) == 2
    assert allocator.exact._full.built is not None


def test_a_health_change_keeps_the_classes_and_answers_as_a_fresh_engine() -> None:
    node = load_node("builtin:dgx2-v100")
    engine = Allocator(node)
    sick = dataclasses.replace(
        node,
        gpus=tuple(dataclasses.replace(g, healthy=g.index not in (8, 9)) for g in node.gpus),
    )
    derived, fresh = engine.for_health(sick), Allocator(sick)
    assert derived.exact.classes is engine.exact.classes  # not recomputed
    rng = random.Random(8)
    healthy = [i for i in range(16) if i not in (8, 9)]  # the kubelet offers only these
    for _ in range(100):
        free = sorted(rng.sample(healthy, rng.randint(1, len(healthy))))
        size = rng.randint(1, len(free))
        must = sorted(rng.sample(free, rng.randint(0, min(1, size))))
        request = AllocationRequest(tuple(map(str, free)), tuple(map(str, must)), size)
        assert derived.prefer(request) == fresh.prefer(request), (free, must, size)
    assert engine.exact._full is not None and engine.exact._full.built is None


def test_any_order_or_naming_of_the_ids_gets_the_same_answer() -> None:
    """The node's order (ascending index, all UUIDs or all indexes) is looked up whole; any
    other order, or UUIDs mixed with indexes, is read ID by ID: the same sets either way, named
    as asked and in the order offered."""
    node = load_node("builtin:dgx1-v100")
    allocator = Allocator(node)
    uuid = {str(g.index): g.uuid for g in node.gpus}
    index_of = {u: i for i, u in uuid.items()}
    for free, must, size in random.Random(27).sample(_every_request(len(node.gpus)), 400):
        ids, must_ids = tuple(map(str, free)), tuple(map(str, must))
        expected = allocator.prefer(AllocationRequest(ids, must_ids, size))
        mixed = tuple(uuid[i] if int(i) % 2 else i for i in reversed(ids))
        mixed_must = tuple(m for m in mixed if index_of.get(m, m) in must_ids)
        answer = allocator.prefer(AllocationRequest(mixed, mixed_must, size))
        assert answer.devices == tuple(d for d in mixed if index_of.get(d, d) in expected.devices)
        assert (answer.link_score, answer.numa_nodes, answer.fallback_reason) == (
            expected.link_score,
            expected.numa_nodes,
            expected.fallback_reason,
        )


def test_requests_in_the_nodes_order_share_one_answer_per_chosen_set() -> None:
    """Asked in the node's order, the answer of a chosen set is built once, when first chosen:
    requests that choose the same set get that one object (and the memo holds no copies)."""
    node = load_node("builtin:dgx-a100")
    allocator = Allocator(node)
    free = tuple(map(str, range(8)))
    first = allocator.prefer(AllocationRequest(free, (), 2))
    again = allocator.prefer(AllocationRequest(free, first.devices[:1], 2))
    assert again is first
    uuids = tuple(g.uuid for g in sorted(node.gpus, key=lambda g: g.index))
    by_uuid = allocator.prefer(AllocationRequest(uuids, (), 2))
    assert by_uuid is allocator.prefer(AllocationRequest(uuids, by_uuid.devices[1:], 2))
    assert by_uuid.devices == tuple(uuids[int(i)] for i in first.devices)
    reversed_ids = allocator.prefer(AllocationRequest(free[::-1], (), 2))
    assert reversed_ids == dataclasses.replace(first, devices=first.devices[::-1])


def test_the_walk_within_each_available_set_is_the_tables_walk_filtered(tmp_path: Path) -> None:
    """On up to 8 GPUs the table holds, per available set and size, its walk without the sets
    that use a busy GPU; built with the engine of a policy without constraints only."""
    node = load_node("builtin:dgx1-v100")
    table = Allocator(node).exact.full_table
    assert table is not None and table.within is not None
    for avail in range(1 << 8):
        for k, masks in enumerate(table.order):
            assert table.within[avail][k] == [m for m in masks if m & avail == m], (avail, k)
    constrained = Allocator(node, load_policy(_policy(tmp_path, "c", PASSING_CONSTRAINT)))
    full = constrained.exact.full_table
    assert full is not None and full.within is None  # only the fast path walks them
    sixteen = Allocator(load_node("builtin:dgx2-v100")).exact
    assert sixteen.full_table is not None and sixteen.full_table.walks_within() is None


def test_the_selector_reason_is_logged_on_either_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """GPU 3 fails the selector: an answer holding it says so and logs it, in the node's
    order (looked up whole) and in another (read ID by ID); one without it does neither."""
    node = load_node("builtin:dgx1-v100")
    allocator = Allocator(node, load_policy(_policy(tmp_path, "sel", NOT_GPU_3)))
    caplog.set_level(logging.INFO, logger="cdigen.allocator")
    note = "1 chosen device(s) fail the policy selector"
    cases = [
        (("3",), 1, note),
        ((node.gpus[3].uuid,), 1, note),
        (("3", "2"), 2, note),
        (("2", "3"), 1, None),
        (("3", "2"), 1, None),
    ]
    for available, size, reason in cases:
        caplog.clear()
        answer = allocator.prefer(AllocationRequest(available, (), size))
        assert answer.fallback_reason == reason, available
        logged = [r.getMessage() for r in caplog.records]
        assert logged == ([f"preferred allocation fallback: {reason}"] if reason else [])
