"""Allocator rules for shared devices: MIG devices under ``pack`` keep whole GPUs free."""

from __future__ import annotations

import pytest

from cdigen.discover import load_node
from cdigen.model import Node
from cdigen.policies.allocator import AllocationRequest, Allocator
from cdigen.policies.policy import builtin_policy


@pytest.fixture(scope="module")
def mig_node() -> Node:
    return load_node("builtin:dgx-a100-mig-mixed")


def _mig_ids(node: Node, profile: str) -> dict[int, list[str]]:
    return {
        g.index: [m.uuid for m in g.mig_devices if m.profile == profile]
        for g in node.gpus
        if any(m.profile == profile for m in g.mig_devices)
    }


def test_pack_puts_a_mig_request_on_the_gpu_with_fewest_free_that_fits(mig_node: Node) -> None:
    by_gpu = _mig_ids(mig_node, "1g.10gb")  # GPU 0 has 2, GPU 1 has 7
    available = tuple(by_gpu[0] + by_gpu[1])
    pack = Allocator(mig_node, builtin_policy("pack"))
    one = pack.prefer(AllocationRequest(available, (), 1))
    assert set(one.devices) <= set(by_gpu[0])
    two = pack.prefer(AllocationRequest(available, (), 2))
    assert set(two.devices) == set(by_gpu[0])
    three = pack.prefer(AllocationRequest(available, (), 3))
    assert set(three.devices) <= set(by_gpu[1])  # GPU 0 cannot hold 3: the next best fit


def test_pack_moves_on_when_the_fullest_gpu_is_used_up(mig_node: Node) -> None:
    by_gpu = _mig_ids(mig_node, "1g.10gb")
    free = list(by_gpu[0] + by_gpu[1])
    pack = Allocator(mig_node, builtin_policy("pack"))
    placed = []
    for _ in range(9):
        answer = pack.prefer(AllocationRequest(tuple(free), (), 1))
        placed.append(answer.devices[0])
        free.remove(answer.devices[0])
    assert set(placed[:2]) == set(by_gpu[0]) and set(placed[2:]) == set(by_gpu[1])


def test_spread_keeps_multi_device_requests_on_distinct_gpus(mig_node: Node) -> None:
    by_gpu = _mig_ids(mig_node, "1g.10gb")
    available = tuple(by_gpu[0] + by_gpu[1])
    answer = Allocator(mig_node).prefer(AllocationRequest(available, (), 2))
    assert len(set(answer.devices) & set(by_gpu[0])) == 1


def test_spread_sends_a_single_replica_to_the_least_loaded_gpu() -> None:
    node = load_node("builtin:pcie-8x4090")
    free = [f"{g.uuid}::{k}" for g in node.gpus for k in range(4)]
    allocator = Allocator(node)
    placed = []
    for _ in range(8):
        answer = allocator.prefer(AllocationRequest(tuple(free), (), 1))
        placed.append(answer.devices[0].split("::")[0])
        free.remove(answer.devices[0])
    assert len(set(placed)) == 8  # one pod per GPU before any GPU gets a second
