"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.servicer import Harness


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    """The servicer harness of tests/helpers/servicer.py, registered with the kubelet simulator."""
    with Harness(tmp_path) as h:
        yield h
