"""The skip reason of a test that needs ../shared is true in every case (issue 26: it said the
piece "comes with ../shared beside the checkout, as in CI" even where CI was running it), and no
test waits for a tool from ../shared (issue 36: those never ran anywhere)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import shared

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def top(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout at ``<top>/repo`` with nothing beside it."""
    (tmp_path / "repo").mkdir()
    monkeypatch.setattr(shared, "REPO", tmp_path / "repo")
    return tmp_path


def reason(relative: str) -> str:
    with pytest.raises(pytest.skip.Exception) as skipped:
        shared.require_shared(relative)
    return str(skipped.value)


def test_no_shared_at_all(top: Path) -> None:
    text = reason("reference/cdi-schema")
    assert text.startswith(f"{top}/shared/reference/cdi-schema is absent: there is no ../shared")
    assert "optional" in text and "as in CI" not in text


def test_a_shared_without_the_piece(top: Path) -> None:
    (top / "shared" / "reference").mkdir(parents=True)
    text = reason("reference/go-gpuallocator/x.jsonl")
    assert text.startswith(
        f"{top}/shared/reference/go-gpuallocator/x.jsonl is absent: "
        f"{top}/shared has no reference/go-gpuallocator/x.jsonl"
    )
    assert "as in CI" not in text


def test_a_worktree_finds_shared_two_levels_up(top: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (top / "wt" / "me").mkdir(parents=True)
    monkeypatch.setattr(shared, "REPO", top / "wt" / "me")
    (top / "shared" / "reference").mkdir(parents=True)
    assert shared.require_shared("reference") == top / "shared" / "reference"
    assert reason("reference/cel-scheduler").startswith(
        f"{top}/shared/reference/cel-scheduler is absent: {top}/shared"
    )


def test_no_test_waits_for_a_tool_from_shared() -> None:
    """Every ``tests.helpers.shared`` import names ``require_shared`` (reference texts) only,
    and no test module spells a path under ``tools/bin`` of ../shared."""
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "tests.helpers.shared":
                offenders += [
                    f"{path.name} imports {a.name}"
                    for a in node.names
                    if a.name not in ("require_shared", "shared_path")
                ]
        if path.name != "test_shared_skips.py" and "tools/bin" in text:
            offenders.append(f"{path.name} names tools/bin")
    assert offenders == []
