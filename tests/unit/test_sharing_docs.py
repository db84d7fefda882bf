"""docs/sharing.md: the ``cdigen policy`` sessions in it print what the doc says."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from cdigen.cli import main
from cdigen.errors import InputError
from plugin.sharing import sharing_from_doc

DOC = Path(__file__).resolve().parents[2] / "docs" / "sharing.md"


def _sessions() -> list[tuple[str, str]]:
    """(command, expected output) for each ``$ cdigen policy`` line of the console blocks."""
    out = []
    for block in re.findall(r"```console\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S):
        command, expected = None, []
        for line in block.splitlines():
            if line.startswith("$ "):
                if command is not None:
                    out.append((command, "\n".join(expected)))
                command, expected = line[2:], []
            else:
                expected.append(line)
        if command is not None:
            out.append((command, "\n".join(expected)))
    return [(c, e) for c, e in out if c.startswith("cdigen policy ")]


SESSIONS = _sessions()


def test_the_doc_has_policy_sessions() -> None:
    assert len(SESSIONS) >= 4


@pytest.mark.parametrize(("command", "expected"), SESSIONS, ids=[c for c, _ in SESSIONS])
def test_policy_session_output_matches(
    command: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(shlex.split(command)[1:]) == 0
    assert capsys.readouterr().out.rstrip("\n") == expected.rstrip("\n")


def test_the_quoted_config_error_is_what_users_get() -> None:
    text = DOC.read_text(encoding="utf-8")
    quoted = re.search(r"e\.g\.\n`(resources\[0\]\.sharing: [^`]*)`", text)
    assert quoted is not None
    with pytest.raises(InputError) as caught:
        sharing_from_doc({}, where="resources[0].sharing")
    assert str(caught.value) == quoted.group(1)
