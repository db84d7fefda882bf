"""``Allocator.prefer_positions``: the engine asked with device handles (GPU positions), no IDs."""

from __future__ import annotations

import dataclasses
import random

import pytest

from cdigen.discover import load_node
from cdigen.errors import AllocationError
from cdigen.policies.allocator import AllocationRequest, Allocator
from cdigen.policies.policy import builtin_policy
from cdigen.shares import replica_ids, slice_ids


@pytest.mark.parametrize("name", ["dgx1-v100", "dgx-a100", "pcie-8gpu-phb"])
@pytest.mark.parametrize("policy", ["default", "single-numa"])
def test_positions_and_ids_give_the_same_answer(name: str, policy: str) -> None:
    node = load_node(f"builtin:{name}")
    allocator = Allocator(node, builtin_policy(policy))
    rng = random.Random(f"{name}-{policy}")
    for _ in range(40):
        gpus = rng.sample(range(len(node.gpus)), rng.randint(1, len(node.gpus)))
        size = rng.randint(1, len(gpus))
        must = rng.sample(range(len(gpus)), rng.randint(0, min(2, size)))
        ids = tuple(node.gpus[p].uuid for p in gpus)
        by_id = allocator.prefer(AllocationRequest(ids, tuple(ids[m] for m in must), size))
        by_position = allocator.prefer_positions(gpus, must, size)
        assert tuple(ids[n] for n in by_position.devices) == by_id.devices
        assert by_position.positions == tuple(sorted(gpus[n] for n in by_position.devices))
        assert (by_position.link_score, by_position.numa_nodes) == (
            by_id.link_score,
            by_id.numa_nodes,
        )
        assert by_position.fallback_reason == by_id.fallback_reason


def test_shares_as_repeated_positions() -> None:
    node = load_node("builtin:pcie-8x4090")
    available = [p for p in range(8) for _ in range(4)]  # four shares of every GPU
    ids = tuple(i for p in range(8) for i in replica_ids(node.gpus[p].uuid, 4))
    spread = Allocator(node)
    answer = spread.prefer_positions(available, [], 3)
    assert len(answer.positions) == 3  # spread: three distinct GPUs
    assert (
        tuple(ids[n] for n in answer.devices)
        == spread.prefer(AllocationRequest(ids, (), 3)).devices
    )
    pack = Allocator(node, builtin_policy("pack"))
    assert len(pack.prefer_positions(available, [], 3).positions) == 1
    # memory slices always pack, whatever the policy; the ID path says so with ::slice-k
    sliced = spread.prefer_positions(available, [5], 3, slices=True)
    assert sliced.positions == (available[5],) and 5 in sliced.devices
    slice_names = tuple(i for p in range(8) for i in slice_ids(node.gpus[p].uuid, 4))
    by_id = spread.prefer(AllocationRequest(slice_names, (slice_names[5],), 3))
    assert tuple(slice_names[n] for n in sliced.devices) == by_id.devices


def test_mig_devices_are_shares_of_their_gpu() -> None:
    node = load_node("builtin:dgx-a100-mig-mixed")
    migs = [(p, m) for p, g in enumerate(node.gpus) for m in g.mig_devices]
    assert migs
    allocator = Allocator(node, builtin_policy("pack"))
    answer = allocator.prefer_positions([p for p, _ in migs], [], 2)
    ids = tuple(m.uuid for _, m in migs)
    assert (
        tuple(ids[n] for n in answer.devices)
        == allocator.prefer(AllocationRequest(ids, (), 2)).devices
    )


def test_unusable_and_unknown_positions_come_last_and_are_reported() -> None:
    node = load_node("builtin:dgx1-v100")
    gpus = list(node.gpus)
    gpus[2] = dataclasses.replace(gpus[2], healthy=False)
    allocator = Allocator(dataclasses.replace(node, gpus=tuple(gpus)))
    answer = allocator.prefer_positions([2, 99, 0, 1], [], 2)
    assert answer.devices == (2, 3) and answer.positions == (0, 1)
    full = allocator.prefer_positions([2, 99, 0], [], 3)
    assert full.devices == (0, 1, 2)
    assert full.fallback_reason is not None
    assert "unknown GPU positions [99]" in full.fallback_reason
    assert "GPUs [2] have errors" in full.fallback_reason


def test_must_indexes_out_of_range_are_ignored_with_a_reason() -> None:
    allocator = Allocator(load_node("builtin:dgx1-v100"))
    answer = allocator.prefer_positions([0, 2, 3, 5], [7], 2)
    by_id = allocator.prefer(AllocationRequest(("0", "2", "3", "5"), (), 2))
    assert answer.positions == tuple(sorted(int(i) for i in by_id.devices))
    assert answer.fallback_reason == "must-include indexes [7] are not in available (ignored)"


def test_too_large_a_request_is_the_only_error_and_answers_are_memoized() -> None:
    allocator = Allocator(load_node("builtin:dgx1-v100"))
    with pytest.raises(AllocationError, match="request for 3 devices but only 2"):
        allocator.prefer_positions([0, 1], [], 3)
    first = allocator.prefer_positions([0, 2, 3, 5], [0], 2)
    assert first.positions == (0, 3)  # the dgx1-v100 acceptance case: NV2 beats NV1
    assert allocator.prefer_positions((0, 2, 3, 5), (0,), 2) is first
