"""Our port of go-gpuallocator's best-effort policy answers every recorded request as the real
Go code did (../shared/reference/go-gpuallocator), on the nodes the answers were recorded on.

``pcie-8x4090.jsonl`` was recorded on the node as captured, every pair SYS: since issue 26 that
node is ``builtin:pcie-8x4090-allsys``, and ``builtin:pcie-8x4090`` has its same-socket pairs at
NODE, where the policy answers differently.
"""

from __future__ import annotations

import json

import pytest

from cdigen.discover import load_node
from policies.baseline import BestEffortBaseline
from tests.helpers.shared import require_shared

# recording -> the built-in node it was made on
RECORDED_ON = {
    "dgx-a100": "dgx-a100",
    "dgx1-v100": "dgx1-v100",
    "pcie-8gpu-phb": "pcie-8gpu-phb",
    "pcie-8x4090": "pcie-8x4090-allsys",
    "ws-4xv100": "ws-4xv100",
}


def differing(recording: str, node_name: str) -> int:
    """How many recorded requests the port answers otherwise on ``builtin:<node_name>``."""
    path = require_shared(f"reference/go-gpuallocator/{recording}.jsonl")
    baseline = BestEffortBaseline(load_node(f"builtin:{node_name}"))
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) >= 112
    wrong = 0
    for line in lines:
        case = json.loads(line)
        answer = baseline.allocate(case["available"], case["must"], case["size"])
        wrong += list(answer) != case["answer"]
    return wrong


@pytest.mark.parametrize(("recording", "node_name"), sorted(RECORDED_ON.items()))
def test_the_port_answers_as_the_go_code_did(recording: str, node_name: str) -> None:
    assert differing(recording, node_name) == 0


def test_the_4090_recording_is_of_the_all_sys_node_not_the_current_one() -> None:
    assert differing("pcie-8x4090", "pcie-8x4090") > 0
