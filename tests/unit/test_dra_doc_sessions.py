"""docs/dra.md, docs/dra-sharing.md and docs/mig.md: every ``$ cdigen ...`` session in them that
needs no cluster prints what the doc shows (a last line ``...`` stands for the rest; ``| head -N``
keeps the first N lines). Commands run in a copy of deploy/dra/examples, where the claim files
are, beside the files the doc shows (a block whose first line is ``# NAME.yaml``)."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from cdigen.cli import main

REPO = Path(__file__).resolve().parents[2]
DOCS = ("docs/dra.md", "docs/dra-sharing.md", "docs/mig.md")
EXAMPLES = REPO / "deploy" / "dra" / "examples"
LIVE = ("serve", "why")  # need a kubelet or an API server: tested against the simulators


def shown_files(doc: str) -> dict[str, str]:
    """The files ``doc`` shows: each fenced block whose first line is ``# NAME.yaml``."""
    text = (REPO / doc).read_text(encoding="utf-8")
    return {
        m.group(1): m.group(0).split("\n", 1)[1]
        for m in re.finditer(r"(?<=^```yaml\n)# ([\w.-]+\.yaml)\n.*?(?=^```)", text, re.S | re.M)
    }


def sessions() -> list[tuple[str, str, list[str]]]:
    """(doc, command, expected lines) for each ``$ cdigen`` line of a fenced block."""
    out = []
    for doc in DOCS:
        text = (REPO / doc).read_text(encoding="utf-8")
        for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M):
            command: str | None = None
            expected: list[str] = []
            for line in block.splitlines():
                if line.startswith("$ "):
                    if command is not None:
                        out.append((doc, command, expected))
                    command, expected = line[2:], []
                elif command is not None:
                    expected.append(line)
            if command is not None:
                out.append((doc, command, expected))
    return [
        (d, c, e)
        for d, c, e in out
        if c.startswith("cdigen ") and not any(f"cdigen dra {w}" in c for w in LIVE)
    ]


SESSIONS = sessions()


def test_the_docs_have_sessions() -> None:
    assert len(SESSIONS) >= 3


@pytest.mark.parametrize(("doc", "command", "expected"), SESSIONS, ids=[c for _, c, _ in SESSIONS])
def test_the_session_prints_what_the_doc_shows(
    doc: str,
    command: str,
    expected: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    here = tmp_path / "examples"
    shutil.copytree(EXAMPLES, here)
    for name, text in shown_files(doc).items():
        (here / name).write_text(text, encoding="utf-8")
    monkeypatch.chdir(here)
    command, _, pipe = command.partition(" | ")
    main(shlex.split(command)[1:])
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).rstrip("\n").splitlines()
    head = re.fullmatch(r"head -(\d+)", pipe.strip())
    if head:
        lines = lines[: int(head.group(1))]
    if expected and expected[-1].strip() == "...":
        expected = expected[:-1]
        lines = lines[: len(expected)]
    assert lines == expected, f"{doc}: {command}"
