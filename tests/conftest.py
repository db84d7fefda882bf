"""Fixtures every test folder may use."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture
def umask_000() -> Iterator[None]:
    """Run the test under umask 000, as a careless service manager may start cdigen."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)
