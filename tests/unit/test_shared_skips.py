"""The skip reason of a test that needs ../shared is true in every case (issue 26: it said the
piece "comes with ../shared beside the checkout, as in CI" even where CI was running it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import shared


@pytest.fixture
def top(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout at ``<top>/repo`` with nothing beside it."""
    (tmp_path / "repo").mkdir()
    monkeypatch.setattr(shared, "REPO", tmp_path / "repo")
    return tmp_path


def reason(name: str) -> str:
    with pytest.raises(pytest.skip.Exception) as skipped:
        shared.require_shared_tool(name)
    return str(skipped.value)


def test_no_shared_at_all(top: Path) -> None:
    text = reason("cdicheck")
    assert text.startswith(f"{top}/shared/tools/bin/cdicheck is absent: there is no ../shared")
    assert "optional" in text and "as in CI" not in text


def test_a_shared_without_the_tool(top: Path) -> None:
    (top / "shared" / "tools").mkdir(parents=True)
    text = reason("kubeletsim")
    assert text.startswith(
        f"{top}/shared/tools/bin/kubeletsim is absent: {top}/shared has no tools/bin/kubeletsim"
    )
    assert "as in CI" not in text


def test_a_worktree_finds_shared_two_levels_up(top: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (top / "wt" / "me").mkdir(parents=True)
    monkeypatch.setattr(shared, "REPO", top / "wt" / "me")
    (top / "shared" / "reference").mkdir(parents=True)
    assert shared.require_shared("reference") == top / "shared" / "reference"
    assert reason("cdicheck").startswith(f"{top}/shared/tools/bin/cdicheck is absent: {top}/shared")


def test_a_tool_that_is_not_executable(top: Path) -> None:
    tool = top / "shared" / "tools" / "bin" / "cdicheck"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    assert reason("cdicheck") == f"{tool} is there but not an executable file"
    tool.chmod(0o755)
    assert shared.require_shared_tool("cdicheck") == tool
