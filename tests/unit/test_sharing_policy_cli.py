"""``cdigen policy explain|replay|simulate`` with replicas and memory slices, through main()."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from cdigen.cli import main


def run(command: str | list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``cdigen COMMAND``: exit code, stdout, stderr."""
    code = main(shlex.split(command) if isinstance(command, str) else command)
    out, err = capsys.readouterr()
    return code, out, err


def test_explain_slices_on_the_rtx4090(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        "policy explain --node builtin:rtx4090 --slice-mib 1024 --available 0 --size 3",
        capsys,
    )
    assert code == 0
    assert "chosen: {0::slice-0, 0::slice-1, 0::slice-2}" in out
    assert "0: 23 free, 3 chosen, 20 left" in out


def test_explain_json_shows_the_best_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        "policy explain --node builtin:pcie-8x4090 --slice-mib 1024 "
        "--available 0=10,1=4,2 --size 4 --format json",
        capsys,
    )
    doc = json.loads(out)
    assert code == 0 and doc["devices"] == [f"1::slice-{k}" for k in range(19, 23)]
    assert {row["gpu"]: row["free"] for row in doc["sharesPerGpu"]} == {"0": 10, "1": 4, "2": 23}


def test_explain_says_when_slices_must_span(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        "policy explain --node builtin:pcie-8x4090 --slice-mib 1024 --available 0=2,1=2 --size 3",
        capsys,
    )
    assert code == 0 and "no single GPU has 3 free slices" in out


def test_explain_replicas_spread_and_pack(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["policy", "explain", "--node", "builtin:pcie-8x4090", "--replicas", "4"]
    base += ["--available", "0,1=2,2=1", "--size", "2", "--format", "json"]
    _, out, _ = run(base, capsys)
    assert len({d.split("::")[0] for d in json.loads(out)["devices"]}) == 2
    _, out, _ = run([*base, "--policy", "builtin:pack"], capsys)
    assert json.loads(out)["devices"] == ["1::2", "1::3"]  # the fullest GPU that fits


def test_replay_recognises_slices_by_their_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    requests = tmp_path / "requests.jsonl"
    available = [f"0::slice-{k}" for k in range(2)] + [f"1::slice-{k}" for k in range(5)]
    requests.write_text(json.dumps({"available": available, "size": 3}) + "\n", encoding="utf-8")
    code, out, _ = run(
        ["policy", "replay", "--node", "builtin:pcie-8x4090", "--requests", str(requests)], capsys
    )
    assert code == 0 and json.loads(out)["devices"] == ["1::slice-0", "1::slice-1", "1::slice-2"]


def test_simulate_slices_no_avoidable_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        "policy simulate --node builtin:pcie-8x4090 --slice-mib 1024 --steps 600",
        capsys,
    )
    assert code == 0
    row = next(line for line in out.splitlines() if "although one GPU had room" in line)
    ours, theirs = (int(x) for x in row.split()[-2:])
    assert ours == 0 and theirs > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slice-mib", "0", "--available", "0"], "--slice-mib must be at least 1"),
        (["--replicas", "4", "--available", "9"], "unknown GPU 9"),
        (["--replicas", "4", "--available", "0=5"], "at most 4"),
    ],
)
def test_bad_share_flags_are_one_line_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(
        ["policy", "explain", "--node", "builtin:rtx4090", "--size", "1", *args], capsys
    )
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
