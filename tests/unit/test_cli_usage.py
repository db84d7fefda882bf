"""Usage mistakes and a stderr that cannot be written, through the real CLI entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cdigen.cli import main

REPO = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "command", "wrong", "right"),
    [
        # once read as "argument import: invalid choice: 'dot' (choose from 'import')"
        (["topo", "--node", "builtin:dgx-a100", "--fromat", "dot"], "topo", "--fromat", "--format"),
        (["topo", "--node", "builtin:dgx-a100", "--fromat"], "topo", "--fromat", "--format"),
        # once "cdigen: error: unrecognized arguments: --fromat json", blaming the top level
        (["discover", "--fromat", "json"], "discover", "--fromat", "--format"),
        (["topo", "import", "t.txt", "--gpu-nme", "X"], "topo import", "--gpu-nme", "--gpu-name"),
        (["generate", "--ouptut-dir=/tmp/x"], "generate", "--ouptut-dir", "--output-dir"),
    ],
)
def test_a_misspelt_option_is_named_with_the_right_one(
    capsys: pytest.CaptureFixture[str], argv: list[str], command: str, wrong: str, right: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err == (
        f"cdigen {command}: error: unknown option '{wrong}': did you mean '{right}'? "
        f"(see 'cdigen {command} --help')\n"
    )


def test_an_unknown_option_with_nothing_close_is_still_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--zzz", "discover"])
    assert exited.value.code == 2
    assert (
        capsys.readouterr().err == "cdigen: error: unknown option '--zzz' (see 'cdigen --help')\n"
    )


def test_abbreviations_and_option_values_still_work(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "topo", "--node", "builtin:rtx4090", "--form", "json")
    assert code == 0 and out.startswith("{")
    with pytest.raises(SystemExit):  # a bad value is still argparse's message
        main(["topo", "--format", "dott"])
    assert "invalid choice: 'dott'" in capsys.readouterr().err


def cdigen_shell(command: str) -> subprocess.CompletedProcess[bytes]:
    """``cdigen`` run by a shell, so that ``command`` can redirect its stderr."""
    return subprocess.run(
        ["sh", "-c", f'"$0" -m cdigen.cli {command}', sys.executable],
        capture_output=True,
        cwd=REPO,
        timeout=60,
    )


@pytest.mark.parametrize("redirect", ["2>/dev/full", "2>&-"], ids=["full", "closed"])
def test_a_warning_stderr_cannot_take_does_not_change_the_command(redirect: str) -> None:
    # generate on a sample warns (no driver libraries); the spec on stdout must be the same,
    # exit 0, whether or not the warning could be written.
    command = "generate --node builtin:rtx4090 --dry-run"
    fine = cdigen_shell(command)
    assert fine.returncode == 0 and b"warning" in fine.stderr
    broken = cdigen_shell(f"{command} {redirect}")
    assert broken.returncode == 0 and broken.stdout == fine.stdout
    assert b"Traceback" not in broken.stdout + broken.stderr


def test_an_error_stderr_cannot_take_keeps_its_exit_code() -> None:
    broken = cdigen_shell("topo --node builtin:nope 2>/dev/full")
    assert broken.returncode == 2 and broken.stdout == b""


def test_a_stderr_reader_that_has_gone_is_no_traceback() -> None:
    # the warning goes into a pipe nobody reads any more (EPIPE)
    child = subprocess.Popen(
        [sys.executable, "-m", "cdigen.cli", "generate", "--node", "builtin:rtx4090", "--dry-run"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    assert child.stderr is not None and child.stdout is not None
    child.stderr.close()
    out = child.stdout.read()
    assert child.wait(timeout=60) == 0
    assert b"cdiVersion" in out and b"Traceback" not in out
