"""The console sessions of README.md and docs/*.md: each ``$ COMMAND`` line of a fenced block
(a ```console block, or any block where a line starts with ``$ cdigen``), with the lines the doc
shows after it, and which of them need a node, a cluster or root (and so cannot run on a bare
machine), with why.

``tests/e2e/test_installed_wheel.py`` runs every session of cdigen that can run, from a built
wheel installed into a fresh venv; the in-process tests of single docs (dra, sharing, labels)
read their blocks their own way.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Commands that find the GPUs themselves when --node is not given (NVML).
DISCOVERING = ("generate", "discover", "topo", "labels")


@dataclass(frozen=True)
class Session:
    doc: str  # relative to the repository
    line: int  # of the command, 1-based
    command: str  # as the doc writes it, without "$ " (continuation lines joined)
    shown: tuple[str, ...]  # the lines after it, up to the next command or the block's end

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def sessions(paths: list[Path] | None = None) -> list[Session]:
    """Every ``$ `` command of every fenced block that is a console block or shows cdigen run."""
    out: list[Session] = []
    for path in paths or docs():
        text = path.read_text(encoding="utf-8")
        doc = str(path.relative_to(REPO))
        for fence in re.finditer(r"^```([a-z]*)\n(.*?)^```", text, re.S | re.M):
            body = fence.group(2)
            if fence.group(1) != "console" and not re.search(r"^\$ cdigen", body, re.M):
                continue
            first = text.count("\n", 0, fence.start(2)) + 1
            lines = body.splitlines()
            at = 0
            while at < len(lines):
                if not lines[at].startswith("$ "):
                    at += 1
                    continue
                start, command = at, lines[at][2:]
                while command.endswith("\\") and at + 1 < len(lines):
                    at += 1
                    command = command[:-1] + " " + lines[at].strip()
                at += 1
                shown = []
                while at < len(lines) and not lines[at].startswith("$ "):
                    shown.append(lines[at])
                    at += 1
                out.append(Session(doc, first + start, command, tuple(shown)))
    return out


def shown_files(doc: str) -> dict[str, str]:
    """The files ``doc`` shows: each fenced block whose first line is ``# NAME.yaml`` (or
    .json, .jsonl, .txt), perhaps followed by ``: what it is``."""
    text = (REPO / doc).read_text(encoding="utf-8")
    return {
        m.group(1): m.group(0).split("\n", 1)[1]
        for m in re.finditer(
            r"(?<=^```)[a-z]*\n# ([\w.-]+\.(?:yaml|json|jsonl|txt))(?:[ :][^\n]*)?\n.*?(?=^```)",
            text,
            re.S | re.M,
        )
    }


def words(command: str) -> list[str]:
    """The words of the first command of ``command``'s pipeline, comments left out."""
    return shlex.split(command.split(" | ")[0].split(" && ")[0], comments=True)


def not_runnable(session: Session) -> str | None:
    """Why ``session`` cannot run on a machine with no GPU, cluster or root; None if it can."""
    argv = words(session.command)
    if not argv or argv[0] != "cdigen":
        return "not a cdigen command"
    sub = [w for w in argv[1:] if not w.startswith("-")][:2]
    if "serve" in sub:
        return "a server: tests/e2e serve it to the kubelet simulators"
    if sub[:2] == ["dra", "why"]:
        return "asks a live API server: tests/unit/test_dra_why.py asks the fake one"
    discovers = sub[:1] and sub[0] in DISCOVERING and sub[:2] != ["topo", "import"]
    if discovers and not any(w == "--node" or w.startswith("--node=") for w in argv):
        return "needs a GPU and its driver (NVML)"
    if sub[:1] in (["list"], ["validate"]) and len(argv) == 2:
        return "reads the host's /etc/cdi and /var/run/cdi"
    for word in argv:
        value = word.split("=", 1)[-1]
        if value.startswith("/") and not value.startswith("/tmp/") and value != "/tmp":
            return f"reads or writes the host's {value}"
        if value.startswith("~"):
            return f"reads {value}"
    return None


def expected_exit(session: Session) -> int:
    """The exit code the doc's output implies: 2 for an error, 1 for a failed check or a claim
    that does not fit, else 0."""
    if any(line.startswith("cdigen: error:") for line in session.shown):
        return 2
    failed = re.compile(r"^cdigen: .*failed|not allocatable|\tCONFLICT: ")
    if any(failed.search(line) for line in session.shown):
        return 1
    return 0
