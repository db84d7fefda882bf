"""Many jobs on one node: the fragmentation rule against go-gpuallocator's best-effort policy."""

from __future__ import annotations

from functools import cache

import pytest

from cdigen.discover import load_node
from cdigen.policies.allocator import AllocationRequest, Allocator, why_lost
from cdigen.policies.simulate import Figures, simulate


@cache
def figures(name: str, seed: int) -> tuple[Figures, Figures]:
    node = load_node(f"builtin:{name}")
    return simulate(node, Allocator(node), seed=seed, steps=2000)


def test_both_engines_place_the_same_jobs() -> None:
    ours, theirs = figures("dgx1-v100", 1)
    assert (ours.jobs, ours.rejected, ours.jobs_by_size) == (
        theirs.jobs,
        theirs.rejected,
        theirs.jobs_by_size,
    )
    assert ours.invalid_answers == theirs.invalid_answers == 0


@pytest.mark.parametrize(
    ("name", "seed"),
    [("dgx1-v100", 2), ("dgx1-v100", 3), ("dgx1-v100", 4), ("dgx-a100", 1), ("dgx-a100", 2)],
)
def test_ours_at_least_the_baseline_on_every_figure(name: str, seed: int) -> None:
    ours, theirs = figures(name, seed)
    assert ours.share_best_link() >= theirs.share_best_link()
    assert ours.mean_link_score() >= theirs.mean_link_score()
    assert ours.numa_excess_jobs == 0 and ours.invalid_answers == 0


def test_ahead_over_seeds_one_to_five_on_dgx1_v100() -> None:
    # seed 1 alone is behind on the mean (docs/policies.md says why); the pool is ahead
    runs = [figures("dgx1-v100", seed) for seed in range(1, 6)]
    ours_total = sum(o.link_score_total for o, _ in runs)
    theirs_total = sum(t.link_score_total for _, t in runs)
    assert ours_total > theirs_total
    assert all(o.share_best_link() > t.share_best_link() + 0.25 for o, t in runs)


def test_one_gpu_goes_to_the_quad_already_broken() -> None:
    allocator = Allocator(load_node("builtin:dgx1-v100"))
    free = tuple(str(i) for i in range(1, 8))  # GPU 0 busy: quad 0-3 is broken, 4-7 whole
    answer = allocator.prefer(AllocationRequest(free, (), 1))
    assert answer.devices == ("1",)  # keeps 4-7 whole and the NV2 pair 2-3
    candidates = allocator.candidates(AllocationRequest(free, (), 1))
    by_gpu = {c.positions[0]: c for c in candidates}
    assert why_lost(by_gpu[1], by_gpu[4]) == (
        "leaves a worse 4-GPU set free (link score 840 < 1120)"
    )
    assert why_lost(by_gpu[1], by_gpu[3]).startswith("leaves worse pairs free")


@pytest.mark.parametrize("name", ["dgx1-v100", "dgx1-p100", "ws-4xrtx8000"])
def test_one_gpu_never_splits_a_free_nvlink_pair(name: str) -> None:
    node = load_node(f"builtin:{name}")
    allocator = Allocator(node)
    indexes = [g.index for g in node.gpus]

    def nvlinked(a: int, b: int) -> bool:
        link = node.link(a, b)
        return link is not None and link.nvlinks > 0

    checked = 0
    for mask in range(1, 1 << len(indexes)):
        free = [i for bit, i in enumerate(indexes) if mask >> bit & 1]
        alone = [i for i in free if not any(nvlinked(i, j) for j in free if j != i)]
        if not alone or len(alone) == len(free):
            continue
        answer = allocator.prefer(AllocationRequest(tuple(map(str, free)), (), 1))
        assert int(answer.devices[0]) in alone, f"free {free}: took {answer.devices[0]}"
        checked += 1
    assert checked > 0
