"""Running ``cdigen`` in-process the way the bad-input tests do."""

from __future__ import annotations

import signal

import pytest

from cdigen.cli import main


def error_lines(err: str) -> list[str]:
    """stderr less argparse's usage block and the servers' timestamped log lines."""
    return [
        line
        for line in err.splitlines()
        if line.strip() and not line.startswith(("usage:", " ")) and not line[:4].isdigit()
    ]


def _took_too_long(signum: int, frame: object) -> None:
    raise TimeoutError("still running after 20 s: the bad input was taken (a server started?)")


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``main(argv)`` in-process, stopped by SIGALRM after 20 s (a server that started)."""
    previous = signal.signal(signal.SIGALRM, _took_too_long)
    signal.alarm(20)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 2
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    out, err = capsys.readouterr()
    return code, out, err
