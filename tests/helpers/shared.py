"""The one way tests find ``../shared``: optional test tools and reference texts beside the repo.

``../shared`` is not part of the repository: a folder beside the checkout (for a git worktree at
``<top>/wt/<name>``, ``<top>/shared``) that may hold consumer tools (``tools/bin/cdicheck``,
``tools/bin/kubeletsim``) and reference texts (``reference/cdi-schema``). A test that needs a
piece of it skips where the piece is missing, and its reason says which case it is: no
``../shared`` at all, one without that piece, or a tool that is not executable.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def shared_root() -> Path | None:
    """``../shared`` beside the checkout (or one level higher for a worktree), if there is one."""
    for base in (REPO.parent, REPO.parent.parent):
        if (base / "shared").is_dir():
            return base / "shared"
    return None


def shared_path(relative: str) -> Path:
    """``../shared/<relative>``; where there is no ``../shared``, the path beside the checkout,
    so that a skip reason names where it belongs."""
    return (shared_root() or REPO.parent / "shared") / relative


def missing_reason(path: Path) -> str:
    """The skip reason for ``path``, a piece of ../shared the test cannot use: true whoever runs
    the test (a clone without ../shared, CI, a machine with a partial one)."""
    root = shared_root()
    if root is None:
        return (
            f"{path} is absent: there is no ../shared beside the checkout (an optional folder of "
            "test tools and reference texts, not part of the repository; README.md, "
            "'Tests that need ../shared')"
        )
    if path.exists():
        return f"{path} is there but not an executable file"
    return (
        f"{path} is absent: {root} has no {path.relative_to(root)} (an optional test tool or "
        "reference text, not part of the repository; README.md, 'Tests that need ../shared')"
    )


def shared_tool(name: str) -> Path | None:
    """``../shared/tools/bin/<name>`` (``cdicheck``, ``kubeletsim``) if present and executable."""
    tool = shared_path(f"tools/bin/{name}")
    return tool if tool.is_file() and os.access(tool, os.X_OK) else None


def require_shared_tool(name: str) -> Path:
    """``../shared/tools/bin/<name>``, or skip the calling test with the reason."""
    tool = shared_tool(name)
    if tool is None:
        pytest.skip(missing_reason(shared_path(f"tools/bin/{name}")))
    return tool


def require_shared(relative: str) -> Path:
    """``../shared/<relative>`` (a reference file or folder), or skip the calling test."""
    path = shared_path(relative)
    if not path.exists():
        pytest.skip(missing_reason(path))
    return path


def needs_shared_tool(name: str) -> pytest.MarkDecorator:
    """A ``skipif`` mark for a module or test that cannot run without the tool."""
    path = shared_path(f"tools/bin/{name}")
    return pytest.mark.skipif(shared_tool(name) is None, reason=missing_reason(path))
