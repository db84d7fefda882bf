"""An independent oracle for the engine and ``policy explain``: brute force over every subset.

The oracle knows nothing of the engine: it reads the node's links and ranks every candidate set
by the objective as docs/policies.md and the design state it (selector failures, link score,
NUMA nodes, then what is left free: its best 4-GPU set, its best pairing, the links cut, then
the smallest GPU indexes), enumerating subsets, 4-sets and pairings outright.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from functools import cache
from itertools import combinations
from pathlib import Path

import pytest

from cdigen.cli import main
from cdigen.discover import load_node
from cdigen.model import Node
from cdigen.policies.allocator import AllocationRequest, Allocator
from cdigen.policies.policy import load_policy

WEIGHTS = {"PIX": 50, "PXB": 40, "PHB": 30, "NODE": 20, "SYS": 10}  # design.md; NVLink: 100 each
EIGHT_GPU_NODES = ("dgx1-v100", "dgx1-p100", "dgx-a100", "dgx-h100", "pcie-8x4090", "pcie-8gpu-phb")
# what `explain` says a set lost on, for each term of the oracle's key, in order
LOST_ON = (
    "fail the selector",
    "lower link score",
    "spans more NUMA nodes",
    "-GPU set free",
    "leaves worse pairs free",
    "fragments the free devices more",
    "tie-break: higher GPU indexes",
)


class Oracle:
    """Every candidate set of a node ranked by the lexicographic objective, by brute force."""

    def __init__(self, node: Node, selector_fails: frozenset[int] = frozenset()) -> None:
        self.numa = {g.index: g.numa_node for g in node.gpus}
        self.fails = selector_fails
        self.pair: dict[tuple[int, int], int] = {}
        for a in self.numa:
            for b in self.numa:
                link = node.link(a, b) if a != b else None
                score = 0 if link is None else 100 * link.nvlinks + WEIGHTS.get(link.pcie or "", 0)
                self.pair[(a, b)] = score

    def score(self, group: Sequence[int]) -> int:
        return sum(self.pair[(a, b)] for a, b in combinations(group, 2))

    @cache  # noqa: B019 (one oracle per test)
    def best_pairing(self, left: frozenset[int]) -> int:
        """The highest total score of disjoint pairs within ``left`` (some may stay unpaired)."""
        if len(left) < 2:
            return 0
        first = min(left)
        rest = left - {first}
        options = [self.best_pairing(rest)]  # ``first`` stays unpaired
        options += [self.pair[(first, b)] + self.best_pairing(rest - {b}) for b in rest]
        return max(options)

    def key(self, group: tuple[int, ...], available: Sequence[int]) -> tuple[object, ...]:
        left = [g for g in available if g not in group]
        best_quad = max((self.score(q) for q in combinations(left, 4)), default=0)
        cut = sum(self.pair[(a, b)] for a in group for b in left)
        numa = {self.numa[g] for g in group} - {None}
        return (
            sum(1 for g in group if g in self.fails),
            -self.score(group),
            len(numa),
            -best_quad,
            -self.best_pairing(frozenset(left)),
            cut,
            group,
        )

    def ranking(
        self, available: Sequence[int], must: Sequence[int], size: int
    ) -> list[tuple[tuple[object, ...], tuple[int, ...]]]:
        """Every valid set (GPU indexes, ascending) with its key, best first."""
        rest = sorted(set(available) - set(must))
        ranked = []
        for extra in combinations(rest, size - len(must)):
            group = tuple(sorted([*must, *extra]))
            ranked.append((self.key(group, available), group))
        return sorted(ranked)


def _ask(allocator: Allocator, available: Sequence[int], must: Sequence[int], size: int) -> tuple:
    request = AllocationRequest(tuple(map(str, available)), tuple(map(str, must)), size)
    return tuple(sorted(int(d) for d in allocator.prefer(request).devices))


@pytest.mark.parametrize("name", EIGHT_GPU_NODES)
def test_prefer_is_the_oracles_best_on_the_whole_objective(name: str) -> None:
    node = load_node(f"builtin:{name}")
    allocator, oracle = Allocator(node), Oracle(node)
    rng = random.Random(name)
    indexes = [g.index for g in node.gpus]
    for _ in range(30):
        available = sorted(rng.sample(indexes, rng.randint(1, len(indexes))))
        size = rng.randint(1, len(available))
        must = sorted(rng.sample(available, rng.randint(0, min(2, size))))
        expected = oracle.ranking(available, must, size)[0][1]
        assert _ask(allocator, available, must, size) == expected, (available, must, size)


LARGE_NODES = Path(__file__).resolve().parent.parent / "fixtures" / "nodes"


@pytest.mark.parametrize(
    "name", ["pcie-20gpu-2socket", "nvswitch-24gpu", "nvswitch-32gpu", "pcie-24gpu-2socket"]
)
def test_prefer_is_the_oracles_best_above_16_gpus(name: str) -> None:
    """Nodes of 20-32 GPUs (searched by classes of interchangeable GPUs), on sampled requests
    the brute force can afford: up to 12 available GPUs; more, with at most three left over
    or (up to 18 available) one GPU chosen."""
    node = load_node(str(LARGE_NODES / f"{name}.yaml"))
    allocator, oracle = Allocator(node), Oracle(node)
    assert allocator.exact.classes is not None
    rng = random.Random(name)
    indexes = [g.index for g in node.gpus]
    for _ in range(12):
        available = sorted(rng.sample(indexes, rng.randint(1, len(indexes))))
        if len(available) <= 12:
            size = rng.randint(1, len(available))
        elif len(available) <= 18 and rng.random() < 0.3:
            size = 1
        else:
            size = rng.randint(len(available) - 3, len(available))
        must = sorted(rng.sample(available, rng.randint(0, min(2, size))))
        expected = oracle.ranking(available, must, size)[0][1]
        assert _ask(allocator, available, must, size) == expected, (available, must, size)


def _explain(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["policy", "explain", "--format", "json", "--alternatives", "40", *args]) == 0
    return json.loads(capsys.readouterr().out)


def _check_explain(
    doc: dict, oracle: Oracle, available: Sequence[int], must: Sequence[int], size: int
) -> None:
    ranked = oracle.ranking(available, must, size)
    winner_key, winner = ranked[0]
    assert tuple(sorted(int(d) for d in doc["devices"])) == winner
    assert doc["linkScore"] == oracle.score(winner)
    shown = [tuple(sorted(int(d) for d in alt["devices"])) for alt in doc["alternatives"]]
    assert shown == [group for _, group in ranked[1 : 1 + len(shown)]]
    assert len(shown) == min(40, len(ranked) - 1)
    for alt, (key, group) in zip(doc["alternatives"], ranked[1:], strict=False):
        assert alt["linkScore"] == oracle.score(group)
        term = next(i for i, (a, b) in enumerate(zip(winner_key, key, strict=True)) if a != b)
        assert LOST_ON[term] in alt["lostBecause"], (group, alt["lostBecause"], LOST_ON[term])


@pytest.mark.parametrize(
    ("name", "available", "must", "size"),
    [
        ("dgx1-v100", [0, 2, 3, 5], [0], 2),  # the acceptance case of test_policy_cli
        ("dgx1-v100", [1, 2, 3, 4, 5, 6, 7], [], 1),  # fragmentation decides
        ("dgx1-v100", [0, 1, 2, 3, 4, 5, 6, 7], [], 3),
        ("dgx-a100", [0, 1, 2, 3, 4, 5, 6, 7], [], 2),
        ("pcie-8gpu-phb", [0, 1, 3, 4, 6, 7], [4], 3),
        ("ws-4xrtx8000", [0, 1, 2, 3], [], 1),
    ],
)
def test_policy_explain_agrees_with_the_oracle(
    name: str,
    available: list[int],
    must: list[int],
    size: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--node", f"builtin:{name}", "--available", ",".join(map(str, available))]
    args += ["--size", str(size)] + (["--must", ",".join(map(str, must))] if must else [])
    doc = _explain(args, capsys)
    _check_explain(doc, Oracle(load_node(f"builtin:{name}")), available, must, size)


def test_policy_explain_with_a_selector_agrees_with_the_oracle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "apiVersion: cdigen/v1alpha1\nkind: AllocationPolicy\nmetadata: {name: not-gpu3}\n"
        'spec:\n  selector: device.attributes["cdigen.dev"].index != 3\n',
        encoding="utf-8",
    )
    load_policy(policy)  # the file is valid
    available, must, size = [0, 2, 3, 5, 6], [0], 3
    args = ["--node", "builtin:dgx1-v100", "--policy", str(policy), "--size", str(size)]
    doc = _explain([*args, "--available", "0,2,3,5,6", "--must", "0"], capsys)
    oracle = Oracle(load_node("builtin:dgx1-v100"), selector_fails=frozenset({3}))
    _check_explain(doc, oracle, available, must, size)
