"""An engine derived for another health state of its node (``Allocator.for_health``) answers
exactly as one built afresh, and reuses the subset tables instead of rebuilding them."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from cdigen.discover import load_node
from cdigen.model import Node
from cdigen.policies.allocator import AllocationRequest, Allocator
from cdigen.policies.policy import Policy, builtin_policy, load_policy

NOT_GPU3 = (
    "apiVersion: cdigen/v1alpha1\nkind: AllocationPolicy\nmetadata: {name: not-gpu3}\n"
    'spec:\n  selector: device.attributes["cdigen.dev"].index != 3\n'
)


def _with_down(node: Node, down: set[int]) -> Node:
    gpus = tuple(dataclasses.replace(g, healthy=g.index not in down) for g in node.gpus)
    return dataclasses.replace(node, gpus=gpus)


def _policy(name: str, tmp_path: Path) -> Policy:
    if name != "not-gpu3":
        return builtin_policy(name)
    path = tmp_path / "not-gpu3.yaml"
    path.write_text(NOT_GPU3, encoding="utf-8")
    return load_policy(path)


def _same_answers(derived: Allocator, fresh: Allocator, rng: random.Random, shares: int) -> None:
    """Equal answers on random requests: positions (GPUs unhealthy or not, shares of a GPU,
    must-include devices, slices), IDs, and explain's candidates."""
    count = len(fresh.node.gpus)
    for _ in range(25):
        available = [
            p for p in rng.sample(range(count), rng.randint(1, count)) for _ in range(shares)
        ]
        size = rng.randint(1, len(available))
        must = rng.sample(range(len(available)), rng.randint(0, min(2, size)))
        slices = shares > 1 and rng.random() < 0.3
        asked = (available, must, size)
        assert derived.prefer_positions(*asked, slices=slices) == fresh.prefer_positions(
            *asked, slices=slices
        )
        uuids = tuple(dict.fromkeys(fresh.node.gpus[p].uuid for p in available))
        request = AllocationRequest(uuids, uuids[:1], rng.randint(1, len(uuids)))
        assert derived.prefer(request) == fresh.prefer(request)
        assert derived.candidates(request) == fresh.candidates(request)


@pytest.mark.parametrize("name", ["dgx1-v100", "dgx-a100", "pcie-8x4090"])
@pytest.mark.parametrize("policy", ["default", "pack", "spread", "single-numa", "not-gpu3"])
def test_a_derived_engine_answers_as_a_fresh_one(name: str, policy: str, tmp_path: Path) -> None:
    """Down from a start state (GPU 3, which the not-gpu3 selector rejects, among them), then
    GPUs fail and recover; each state's engine derives from the last one."""
    node = load_node(f"builtin:{name}")
    chosen = _policy(policy, tmp_path)
    rng = random.Random(f"{name}-{policy}")
    states = [{3}, set(), {1, 6}, {6}, {0, 3, 5}, set(range(8)), {2}]
    engine = Allocator(_with_down(node, states[0]), chosen)
    for down in states[1:]:
        state = _with_down(node, down)
        derived = engine.for_health(state)
        assert derived.exact.full_table is engine.exact.full_table  # reused, not rebuilt
        _same_answers(derived, Allocator(state, chosen), rng, shares=2 if "4090" in name else 1)
        engine = derived


def test_sixteen_gpus_reuse_the_table_and_answer_as_a_fresh_engine() -> None:
    """dgx2-v100: the 16-GPU table is the costly part; a derived engine shares it."""
    node = load_node("builtin:dgx2-v100")
    engine = Allocator(node)
    sick = _with_down(node, {4, 11})
    derived = engine.for_health(sick)
    assert derived.exact.full_table is engine.exact.full_table is not None
    _same_answers(derived, Allocator(sick), random.Random(16), shares=1)
    assert derived.unusable == {4: "unhealthy", 11: "unhealthy"}


def test_only_health_may_differ() -> None:
    node = load_node("builtin:dgx1-v100")
    other = dataclasses.replace(node, gpus=node.gpus[:-1])
    with pytest.raises(ValueError, match="more than GPU health"):
        Allocator(node).for_health(other)
