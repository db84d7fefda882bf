"""The allocator on the reference topologies: named cases and brute-force optimality."""

from __future__ import annotations

import random
from itertools import combinations

import pytest

from cdigen.errors import AllocationError
from cdigen.policies.allocator import AllocationAnswer, AllocationRequest, Allocator
from tests.helpers.nodes import (
    EIGHT_GPU_NODES,
    dgx1_v100,
    dgx2_v100,
    dgx_a100,
    dgx_a100_nvlink_only,
    pcie_8x4090,
    pcie_node_phb,
    ws_4xv100,
)


def ask(allocator: Allocator, available: str, size: int, must: str = "") -> AllocationAnswer:
    request = AllocationRequest(
        tuple(available.split(",")), tuple(m for m in must.split(",") if m), size
    )
    return allocator.prefer(request)


def chosen(answer: AllocationAnswer) -> set[int]:
    return {int(d) for d in answer.devices}


# (case name, node factory, available, must, size, expected set)
CASES = [
    ("dgx1_v100_pair_prefers_nv2", dgx1_v100, "0,2,3,5", "0", 2, {0, 3}),
    ("dgx1_v100_pair_without_must_takes_nv2", dgx1_v100, "0,1,2,3,4,5,6,7", "", 2, {0, 3}),
    ("dgx1_v100_quad_is_one_socket", dgx1_v100, "0,1,2,3,4,5,6,7", "", 4, {0, 1, 2, 3}),
    ("dgx1_v100_single_keeps_nv2_pair_free", dgx1_v100, "0,3,5", "", 1, {5}),
    ("dgx_a100_pair_is_same_numa", dgx_a100, "0,1,2,3,4,5,6,7", "", 2, {0, 1}),
    (
        "dgx_a100_hidden_pcie_pair_is_same_numa",
        dgx_a100_nvlink_only,
        "1,2,3,4,5,6,7",
        "",
        2,
        {2, 3},
    ),
    ("dgx_a100_single_takes_orphan_over_pair", dgx_a100, "1,2,3", "", 1, {1}),
    ("dgx_a100_quad_spans_two_numa", dgx_a100, "0,1,2,3,4,5,6,7", "", 4, {0, 1, 2, 3}),
    ("pcie_4090_pair_same_socket", pcie_8x4090, "3,4,5", "", 2, {4, 5}),
    ("pcie_4090_must_pulls_its_socket", pcie_8x4090, "0,1,4,5", "4", 2, {4, 5}),
    ("pcie_phb_pair_prefers_phb", pcie_node_phb, "0,1,2,5", "", 2, {1, 2}),
    ("pcie_phb_single_takes_gpu_without_phb_partner", pcie_node_phb, "0,1,2", "", 1, {0}),
    ("ws_4xv100_pair_takes_nv2", ws_4xv100, "0,1,2,3", "1", 2, {1, 2}),
    ("dgx2_triple_same_numa", dgx2_v100, ",".join(map(str, range(16))), "", 3, {0, 1, 2}),
    ("dgx2_eight_one_numa", dgx2_v100, "0,1,2,3,8,9,10,11,12,13,14,15", "", 8, set(range(8, 16))),
]


@pytest.mark.parametrize(
    ("factory", "available", "must", "size", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_named_case(factory, available, must, size, expected) -> None:  # type: ignore[no-untyped-def]
    assert chosen(ask(Allocator(factory()), available, size, must)) == expected


def test_answers_use_uuids_when_asked_with_uuids() -> None:
    node = dgx1_v100()
    allocator = Allocator(node)
    uuids = tuple(node.gpus[i].uuid for i in (0, 2, 3, 5))
    answer = allocator.prefer(AllocationRequest(uuids, (uuids[0],), 2))
    assert set(answer.devices) == {node.gpus[0].uuid, node.gpus[3].uuid}
    assert answer.link_score == ask(allocator, "0,2,3,5", 2, "0").link_score


def test_size_larger_than_available_is_the_only_error() -> None:
    with pytest.raises(AllocationError, match="3 devices but only 2"):
        ask(Allocator(dgx1_v100()), "0,1", 3)


def test_gpu_with_error_is_chosen_last_and_never_fails_the_call() -> None:
    import dataclasses

    node = dgx1_v100()
    broken = dataclasses.replace(node.gpus[3], error="NVML: GPU is lost")
    node = dataclasses.replace(node, gpus=(*node.gpus[:3], broken, *node.gpus[4:]))
    allocator = Allocator(node)
    answer = ask(allocator, "0,2,3,5", 2, "0")
    assert chosen(answer) == {0, 2}
    full = ask(allocator, "0,3", 2)
    assert chosen(full) == {0, 3} and full.fallback_reason is not None


def test_unknown_ids_pad_only_when_needed() -> None:
    allocator = Allocator(dgx1_v100())
    assert chosen(ask(allocator, "0,3,GPU-nope", 2)) == {0, 3}
    answer = ask(allocator, "0,GPU-nope", 2)
    assert set(answer.devices) == {"0", "GPU-nope"} and "unknown" in (answer.fallback_reason or "")


def test_must_outside_available_falls_back_gracefully() -> None:
    answer = ask(Allocator(dgx1_v100()), "0,3,5", 2, "7")
    assert len(answer.devices) == 2 and "not available" in (answer.fallback_reason or "")


def test_answers_are_memoized() -> None:
    allocator = Allocator(dgx1_v100())
    assert ask(allocator, "0,2,3,5", 2, "0") is ask(allocator, "0,2,3,5", 2, "0")


def brute_force_best(allocator: Allocator, available: list[int], must: list[int], size: int):  # type: ignore[no-untyped-def]
    topo = allocator.topology
    rest = [p for p in available if p not in must]
    keys = []
    for extra in combinations(rest, size - len(must)):
        s = tuple(sorted([*must, *extra]))
        keys.append((-topo.set_score(s), len(topo.numa_nodes(s))))
    return min(keys)


def _check_optimal(allocator: Allocator, available: list[int], must: list[int], size: int) -> None:
    ids = tuple(str(allocator.topology.gpus[p].index) for p in available)
    must_ids = tuple(str(allocator.topology.gpus[p].index) for p in must)
    answer = allocator.prefer(AllocationRequest(ids, must_ids, size))
    positions = tuple(sorted(allocator.position_of(d) for d in answer.devices))  # type: ignore[type-var]
    assert len(set(positions)) == size and set(must) <= set(positions) <= set(available)
    got = (-allocator.topology.set_score(positions), len(allocator.topology.numa_nodes(positions)))
    assert got == brute_force_best(allocator, available, must, size), (available, must, size)


@pytest.mark.parametrize("name", sorted(EIGHT_GPU_NODES))
def test_optimal_on_every_8gpu_topology(name: str) -> None:
    """Every availability pattern with >= 4 free GPUs, every size, no must and one must."""
    allocator = Allocator(EIGHT_GPU_NODES[name]())
    rng = random.Random(name)
    for mask in range(1, 256):
        available = [p for p in range(8) if mask >> p & 1]
        if len(available) < 4 and mask % 3:
            continue
        for size in range(1, len(available) + 1):
            _check_optimal(allocator, available, [], size)
            _check_optimal(allocator, available, [rng.choice(available)], size)


def test_optimal_sampled_on_16gpu_nvswitch() -> None:
    allocator = Allocator(dgx2_v100())
    rng = random.Random(16)
    for _ in range(40):
        available = sorted(rng.sample(range(16), rng.randint(2, 12)))
        size = rng.randint(1, min(6, len(available)))
        must = rng.sample(available, rng.randint(0, min(2, size)))
        _check_optimal(allocator, available, must, size)
