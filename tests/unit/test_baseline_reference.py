"""The best-effort baseline answers as NVIDIA's go-gpuallocator does.

The recorded answers in ``../shared/reference/go-gpuallocator`` (its README says how they were
made) cover every request on five built-in nodes; the cases below them need no ``../shared``.
``pcie-8x4090.jsonl`` was recorded on the node as captured, every pair SYS: since issue 26 that
node is ``builtin:pcie-8x4090-allsys``, and ``builtin:pcie-8x4090`` has its same-socket pairs at
NODE, where the policy answers otherwise.
"""

from __future__ import annotations

import json

import pytest

from cdigen.discover import load_node
from cdigen.policies.baseline import BestEffortBaseline, partition_count
from tests.helpers.shared import require_shared

# recording -> (the built-in node it was made on, how many requests it holds)
RECORDED = {
    "dgx-a100": ("dgx-a100", 5632),
    "dgx1-v100": ("dgx1-v100", 5632),
    "pcie-8gpu-phb": ("pcie-8gpu-phb", 5632),
    "pcie-8x4090": ("pcie-8x4090-allsys", 5632),
    "ws-4xv100": ("ws-4xv100", 112),
}


def differing(recording: str, node_name: str) -> list[str]:
    """The recorded requests of ``recording`` the port answers otherwise on ``node_name``."""
    path = require_shared(f"reference/go-gpuallocator/{recording}.jsonl")
    baseline = BestEffortBaseline(load_node(f"builtin:{node_name}"))
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == RECORDED[recording][1]
    differ = []
    for line in lines:
        case = json.loads(line)
        got = baseline.allocate(case["available"], case["must"], case["size"])
        if got != case["answer"]:
            differ.append(f"{case} -> {got}")
    return differ


@pytest.mark.parametrize("recording", sorted(RECORDED))
def test_every_recorded_answer_is_reproduced(recording: str) -> None:
    differ = differing(recording, RECORDED[recording][0])
    assert not differ, f"{len(differ)} differ, e.g. {differ[:3]}"


def test_the_4090_recording_is_of_the_all_sys_node_not_the_current_one() -> None:
    assert differing("pcie-8x4090", "pcie-8x4090")


def test_it_takes_the_best_cut_not_the_best_set() -> None:
    """On a free DGX-1 the best pair is 2-3 (two NVLinks, 250); the cut into four pairs that
    scores most ({0,3} {1,2} {4,7} {5,6}, 230 each) has no room for it, so 0-3 comes back."""
    baseline = BestEffortBaseline(load_node("builtin:dgx1-v100"))
    assert baseline.set_score([2, 3]) == 250
    assert baseline.allocate(list(range(8)), [], 2) == [0, 3]
    assert baseline.allocate(list(range(8)), [], 4) == [0, 1, 2, 3]


def test_ties_go_to_the_first_cut_and_answers_keep_the_callers_order() -> None:
    """Every pair of pcie-8x4090-allsys is SYS (10): all cuts tie, and the first in canonical
    order (the lowest slot's group first, companions in order) wins."""
    baseline = BestEffortBaseline(load_node("builtin:pcie-8x4090-allsys"))
    assert baseline.allocate([3, 1, 5, 7], [], 2) == [3, 1]
    assert baseline.allocate([3, 1, 5, 7], [7], 2) == [5, 7]
    # 3 GPUs for pairs: one empty slot pads them to 4; the must-include GPU needs a full group.
    assert baseline.allocate([3, 1, 5], [5], 2) == [3, 5]


def test_no_answer_where_the_request_cannot_be_met() -> None:
    baseline = BestEffortBaseline(load_node("builtin:ws-4xv100"))
    assert baseline.allocate([0, 1], [], 3) == []
    assert baseline.allocate([0, 1, 2], [0, 1], 1) == []
    assert baseline.allocate([0, 1, 2], [3], 2) == []
    assert baseline.allocate([0, 1, 2], [], 0) == []


def test_partition_count_is_the_number_of_cuts() -> None:
    assert partition_count(8, 2) == 105
    assert partition_count(5, 4) == 35  # padded to 8
    assert partition_count(16, 3) == 190_590_400
