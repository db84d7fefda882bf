"""docs/sharing.md: the ``cdigen policy`` sessions in it print what the doc says."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from cdigen.cli import main
from cdigen.errors import InputError
from cdigen.plugin.deviceplugin.sharing import sharing_from_doc

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


PLUGIN_DOC = DOC.with_name("plugin.md")  # its check session runs a config shown here


def _check_sessions() -> list[tuple[str, str]]:
    """(command, expected output) for each ``$ cdigen plugin config check`` of the doc (and of
    plugin.md)."""
    out = []
    text = DOC.read_text(encoding="utf-8") + PLUGIN_DOC.read_text(encoding="utf-8")
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        lines = block.splitlines()
        for at, line in enumerate(lines):
            if line.startswith("$ cdigen plugin config check "):
                rest = lines[at + 1 :]
                end = next((k for k, x in enumerate(rest) if x.startswith("$ ")), len(rest))
                out.append((line[2:], "\n".join(rest[:end])))
    return out


CHECKS = _check_sessions()


def test_the_doc_checks_the_first_recipe_and_an_overlap() -> None:
    assert len(CHECKS) >= 3


@pytest.mark.parametrize(("command", "expected"), CHECKS, ids=[c for c, _ in CHECKS])
def test_config_check_sessions_print_what_the_doc_shows(
    command: str,
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The doc's `# NAME.yaml` blocks written as files, the command run where they are: the
    output and the exit code (1 when it prints an error) are the doc's."""
    for block in re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S):
        named = re.match(r"# ([\w.-]+\.yaml)", block)
        if named:
            (tmp_path / named.group(1)).write_text(block)
    monkeypatch.chdir(tmp_path)
    code = main(shlex.split(command)[1:])
    captured = capsys.readouterr()
    assert (captured.out + captured.err).rstrip("\n") == expected.rstrip("\n")
    assert code == (1 if "cdigen: error:" in expected else 0)
