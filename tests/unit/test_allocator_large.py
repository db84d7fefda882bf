"""Nodes above the exact limit, MIG devices as shares, and explain's candidate list."""

from __future__ import annotations

import random
from itertools import combinations

from cdigen.model import Gpu, Link, MigDevice, Node
from cdigen.policies.allocator import EXACT_LIMIT, AllocationRequest, Allocator, why_lost
from tests.helpers.nodes import dgx1_v100


def big_node(count: int = 24) -> Node:
    """Pairs (2i, 2i+1) joined by NV4, NUMA per group of 8, SYS across groups, NODE within."""
    gpus = tuple(
        Gpu(i, i, f"GPU-big-{i}", "X", "Hopper", "9.0", 1, f"0000:{i:02x}:00.0", numa_node=i // 8)
        for i in range(count)
    )
    links = []
    for a in range(count):
        for b in range(a + 1, count):
            nvlinks = 4 if b == a + 1 and a % 2 == 0 else 0
            pcie = "NODE" if a // 8 == b // 8 else "SYS"
            links.append(Link(a, b, pcie=pcie, nvlinks=nvlinks))  # type: ignore[arg-type]
    return Node(gpus=gpus, links=tuple(links), name="big")


def test_above_the_limit_answers_are_valid_and_take_nvlink_pairs() -> None:
    allocator = Allocator(big_node())
    assert allocator.exact.full_table is None  # no full table above EXACT_LIMIT GPUs
    ids = tuple(str(i) for i in range(24))
    answer = allocator.prefer(AllocationRequest(ids, ("9",), 2))
    assert set(answer.devices) == {"8", "9"}
    four = allocator.prefer(AllocationRequest(ids, (), 4))
    assert len(four.devices) == 4 and len(four.numa_nodes) == 1
    assert four.link_score == 2 * 400 + 6 * 20


def test_above_the_limit_with_few_available_is_exact() -> None:
    allocator = Allocator(big_node())
    rng = random.Random(5)
    topo = allocator.topology
    for _ in range(20):
        free = sorted(rng.sample(range(24), rng.randint(2, EXACT_LIMIT)))
        size = rng.randint(1, min(5, len(free)))
        answer = allocator.prefer(AllocationRequest(tuple(map(str, free)), (), size))
        got = tuple(sorted(int(d) for d in answer.devices))
        best = max((topo.set_score(s), -len(topo.numa_nodes(s))) for s in combinations(free, size))
        assert (topo.set_score(got), -len(topo.numa_nodes(got))) == best


def test_greedy_answers_are_always_valid() -> None:
    allocator = Allocator(big_node(20))
    rng = random.Random(9)
    for _ in range(30):
        free = rng.sample(range(20), rng.randint(EXACT_LIMIT + 1, 20))
        size = rng.randint(1, len(free))
        must = rng.sample(free, rng.randint(0, min(3, size)))
        request = AllocationRequest(tuple(map(str, free)), tuple(map(str, must)), size)
        answer = allocator.prefer(request)
        assert len(set(answer.devices)) == size
        assert set(must) <= {int(d) for d in answer.devices} <= set(free)


def test_mig_devices_count_as_shares_of_their_gpu() -> None:
    base = dgx1_v100()
    migs = tuple(
        MigDevice(f"MIG-{g.index}-{n}", "1g.10gb", n, 0, 10) for g in base.gpus for n in (1, 2)
    )
    gpus = tuple(
        g.__class__(
            **{
                **g.__dict__,
                "mig_enabled": True,
                "mig_devices": migs[2 * g.index : 2 * g.index + 2],
            }
        )
        for g in base.gpus
    )
    allocator = Allocator(Node(gpus=gpus, links=base.links, name="mig"))
    ids = tuple(m.uuid for m in migs)
    answer = allocator.prefer(AllocationRequest(ids, ("MIG-0-1",), 2))
    assert answer.devices == ("MIG-0-1", "MIG-3-1")  # spread: the NV2 partner of GPU 0
    assert answer.link_score == 200 and answer.fallback_reason is None
    assert allocator.position_of("3:1") == 3
    # a CDI-style MIG name is a MIG device the node has, looked up whole: GPU 3 has no third
    assert allocator.position_of("3:2") is None and allocator.position_of("3:") is None
    assert allocator.position_of("3") == 3 and allocator.position_of("MIG-3-1") == 3


def test_explain_candidates_are_ordered_and_explained() -> None:
    allocator = Allocator(dgx1_v100())
    request = AllocationRequest(("0", "2", "3", "5"), ("0",), 2)
    candidates = allocator.candidates(request)
    assert [c.positions for c in candidates] == [(0, 3), (0, 2), (0, 5)]
    assert why_lost(candidates[0], candidates[2]) == "lower link score (10 < 200)"
