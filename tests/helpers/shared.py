"""The one way tests find ``../shared``: the consumer tools and reference texts beside the repo.

CI clones the repository into a folder with ``shared/`` beside it, as /work/main has; a git
worktree at ``<top>/wt/<name>`` finds ``<top>/shared`` one level higher. A test that needs a
piece of it skips, naming the missing path, where a user's clone has none.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def shared_path(relative: str) -> Path:
    """``../shared/<relative>`` beside the checkout (or one level higher for a worktree); the
    path beside the checkout where neither exists, so a skip reason names where it belongs."""
    for base in (REPO.parent, REPO.parent.parent):
        path = base / "shared" / relative
        if path.exists():
            return path
    return REPO.parent / "shared" / relative


def missing_reason(path: Path) -> str:
    """The skip reason for a missing piece of ../shared."""
    return f"{path} is absent (it comes with ../shared beside the checkout, as in CI)"


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
