"""The one way tests find ``../shared``: reference texts beside the repo.

``../shared`` is not part of the repository: a folder beside the checkout (for a git worktree at
``<top>/wt/<name>``, ``<top>/shared``) that holds reference texts (``reference/cdi-schema``,
``reference/cel-scheduler``, ``reference/go-gpuallocator``); CI gets a copy beside the clone. A
test that needs a piece of it skips where the piece is missing, and its reason says which case it
is: no ``../shared`` at all, or one without that piece. (Test tools are not taken from here: the
consumers tests run, podman and runc, come from the package registries, as ``.ci/run`` installs
them.)
"""

from __future__ import annotations

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
    """The skip reason for ``path``, a piece of ../shared that is not there: true whoever runs
    the test (a clone without ../shared, CI, a machine with a partial one)."""
    root = shared_root()
    if root is None:
        return (
            f"{path} is absent: there is no ../shared beside the checkout (an optional folder of "
            "reference texts, not part of the repository; README.md, "
            "'Tests that need ../shared')"
        )
    return (
        f"{path} is absent: {root} has no {path.relative_to(root)} (an optional reference "
        "text, not part of the repository; README.md, 'Tests that need ../shared')"
    )


def require_shared(relative: str) -> Path:
    """``../shared/<relative>`` (a reference file or folder), or skip the calling test."""
    path = shared_path(relative)
    if not path.exists():
        pytest.skip(missing_reason(path))
    return path
