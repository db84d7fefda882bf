"""The ``cdigen policy`` commands end to end, through ``cdigen.cli.main``, on real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdigen.cli import main
from cdigen.nodefile import dump_node
from tests.helpers.nodes import dgx1_v100


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_explain_dgx1_v100_acceptance(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        [
            "policy",
            "explain",
            "--node",
            "builtin:dgx1-v100",
            "--available",
            "0,2,3,5",
            "--must",
            "0",
            "--size",
            "2",
        ],
        capsys,
    )
    assert code == 0
    assert "chosen: {0, 3}" in out
    assert "{0, 5}" in out and "lower link score" in out


def test_explain_dgx_a100_pair_is_same_numa(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        [
            "policy",
            "explain",
            "--node",
            "builtin:dgx-a100",
            "--available",
            "0,1,2,3,4,5,6,7",
            "--size",
            "2",
            "--format",
            "json",
        ],
        capsys,
    )
    assert code == 0
    doc = json.loads(out)
    assert len(doc["numaNodes"]) == 1 and len(doc["devices"]) == 2
    assert {"devices", "linkScore", "numaNodes", "alternatives", "selectorFailures"} <= set(doc)


def test_explain_lists_selector_failures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "apiVersion: cdigen/v1alpha1\nkind: AllocationPolicy\nmetadata: {name: not-gpu3}\n"
        'spec:\n  selector: device.attributes["cdigen.dev"].index != 3\n',
        encoding="utf-8",
    )
    code, out, _ = run(
        [
            "policy",
            "explain",
            "--node",
            "builtin:dgx1-v100",
            "--policy",
            str(policy),
            "--available",
            "0,2,3,5",
            "--must",
            "0",
            "--size",
            "2",
        ],
        capsys,
    )
    assert code == 0
    assert "chosen: {0, 2}" in out and "3: selector is false" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--available", "0,1", "--size", "3"], "3 devices but only 2"),
        (["--available", "0,1", "--size", "1", "--must", "4"], "not among the available"),
        (["--available", "0,17", "--size", "1"], "unknown device IDs 17"),
        (["--available", "0,0", "--size", "1"], "lists a device twice"),
        # issue 35 m: an empty entry is a device left out, not nothing
        (["--available", "0,,2", "--size", "1"], "'0,,2' has an empty entry (position 2)"),
        (["--available", "0,1", "--size", "1", "--must", "0,"], "--must: '0,' has an empty"),
        (["--available", "0,1", "--size", "-1"], "--size must be at least 1, got -1"),
        (["--available", "0,1", "--size", "0"], "--size must be at least 1, got 0"),
        (
            ["--available", "0,1", "--size", "1", "--alternatives", "-2"],
            "--alternatives must be at least 0, got -2",
        ),
    ],
)
def test_explain_bad_requests_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["policy", "explain", "--node", "builtin:dgx1-v100", *args], capsys)
    assert code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_replay_answers_in_the_form_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = dgx1_v100()
    node_file = tmp_path / "node.yaml"
    node_file.write_text(dump_node(node, "yaml"), encoding="utf-8")
    uuids = [g.uuid for g in node.gpus]
    requests = tmp_path / "requests.jsonl"
    requests.write_text(
        json.dumps({"available": ["0", "2", "3", "5"], "mustInclude": ["0"], "size": 2})
        + "\n\n"
        + json.dumps(
            {"available": [uuids[i] for i in (0, 2, 3, 5)], "mustInclude": [uuids[0]], "size": 2}
        )
        + "\n"
        + json.dumps({"available": [0, 1, 2, 3, 4, 5, 6, 7], "size": 4})
        + "\n",
        encoding="utf-8",
    )
    code, out, _ = run(
        ["policy", "replay", "--node", str(node_file), "--requests", str(requests)], capsys
    )
    assert code == 0
    answers = [json.loads(line) for line in out.splitlines()]
    assert answers[0] == {"devices": ["0", "3"], "linkScore": 200, "numaNodes": [0]}
    assert answers[1]["devices"] == [uuids[0], uuids[3]]
    assert sorted(answers[2]["devices"]) == ["0", "1", "2", "3"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "requests.jsonl:2: invalid JSON"),
        ('{"available": ["0"], "size": "1"}', "requests.jsonl:2: size must be an integer"),
        ('{"available": ["0"], "size": 2}', "requests.jsonl:2: request for 2 devices"),
        ('{"available": ["0"], "size": 1, "extra": 1}', "unknown keys ['extra']"),
    ],
)
def test_replay_bad_lines_name_the_line(
    tmp_path: Path, line: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    requests = tmp_path / "requests.jsonl"
    requests.write_text('{"available": ["0", "1"], "size": 1}\n' + line + "\n", encoding="utf-8")
    code, out, err = run(
        ["policy", "replay", "--node", "builtin:dgx1-v100", "--requests", str(requests)], capsys
    )
    assert code == 2 and message in err and "Traceback" not in err
    assert len(out.splitlines()) == 1  # the good line before it was answered


def test_replay_reports_every_bad_line_and_answers_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: replay stopped at the first bad line."""
    requests = tmp_path / "requests.jsonl"
    good = '{"available": ["0", "1", "2", "3"], "size": 2}'
    lines = [good, "{not json", good, '{"available": ["0"], "size": 5}', "", good]
    requests.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, out, err = run(
        ["policy", "replay", "--node", "builtin:dgx1-v100", "--requests", str(requests)], capsys
    )
    assert code == 2
    assert [json.loads(line)["devices"] for line in out.splitlines()] == [["2", "3"]] * 3
    assert err.splitlines() == [
        f"cdigen: error: {requests}:2: invalid JSON at column 2: Expecting property name "
        "enclosed in double quotes",
        f"cdigen: error: {requests}:4: request for 5 devices but only 1 are available; ask for "
        "at most as many devices as are available",
        f"cdigen: error: {requests}: 2 of 5 request lines could not be answered (listed "
        "above); the other 3 were answered on stdout",
    ]


def test_simulate_prints_both_engines(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        ["policy", "simulate", "--node", "builtin:dgx1-v100", "--seed", "1", "--steps", "300"],
        capsys,
    )
    assert code == 0
    assert "cdigen" in out and "best-effort" in out
    best_line = next(line for line in out.splitlines() if "best link score" in line)
    ours, theirs = best_line.split()[-2:]
    assert ours.endswith("%") and theirs.endswith("%")
    assert float(ours[:-1]) >= float(theirs[:-1])


def test_simulate_is_deterministic_per_seed(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["policy", "simulate", "--node", "builtin:pcie-8x4090", "--seed", "7", "--steps", "200"]
    first = run(args, capsys)[1]
    assert run(args, capsys)[1] == first


def test_simulate_output_explains_itself(capsys: pytest.CaptureFixture[str]) -> None:
    """Was: ``(1 GPUs)``, ``jobs placed (multi-GPU) 10 (0)``, a best-link share of 100.0% with no
    multi-GPU job, and ``pods (admitted) 560 (504)`` with nothing saying which was which."""
    code, out, _ = run(["policy", "simulate", "--node", "builtin:rtx4090", "--steps", "50"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("node rtx4090 (1 GPU), ")
    assert [line.split()[-2:] for line in lines if "of them multi-GPU" in line] == [["0", "0"]]
    assert lines[-1].split() == [
        "link",
        "scores,",
        "NUMA",
        "spans",
        "n/a",
        "(no",
        "multi-GPU",
        "jobs)",
    ]
    assert "%" not in "".join(lines[1:])

    args = [
        "policy",
        "simulate",
        "--node",
        "builtin:pcie-8x4090",
        "--slice-mib",
        "1024",
        "--steps",
        "1000",
    ]
    code, out, _ = run(args, capsys)
    rows = {line[:44].strip(): line[44:].split() for line in out.splitlines()[2:]}
    arrived, admitted = rows["pods that arrived"], rows["admitted"]
    rejected, refused = (
        rows["rejected: fewer free shares than asked"],
        rows["refused in Allocate: slices on 2+ GPUs"],
    )
    for column in (0, 1):  # every pod that arrived is admitted, rejected or refused
        parts = (admitted, rejected, refused)
        assert int(arrived[column]) == sum(int(p[column]) for p in parts)
