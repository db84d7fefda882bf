"""Fixtures every test folder may use."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

import pytest


class _WingsByTheirInstalledName(importlib.abc.MetaPathFinder):
    """Once plugin/ and policies/ install as cdigen.plugin and cdigen.policies, the old names
    import only from a checkout (its root is on sys.path), never from the wheel: refuse them
    here so that a test meets what an installed cdigen would."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in ("plugin", "policies"):
            raise ModuleNotFoundError(f"No module named {fullname!r}: import cdigen.{fullname}")
        return None


if (Path(__file__).resolve().parents[1] / "cdigen" / "plugin").is_symlink():
    sys.meta_path.insert(0, _WingsByTheirInstalledName())


@pytest.fixture
def umask_000() -> Iterator[None]:
    """Run the test under umask 000, as a careless service manager may start cdigen."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)
