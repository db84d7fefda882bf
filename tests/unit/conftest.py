"""Fixtures shared by the unit tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.servicer import Harness


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    """The servicer harness of tests/helpers/servicer.py, registered with the kubelet simulator."""
    with Harness(tmp_path) as h:
        yield h


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """Undo what a test's in-process ``main()`` did to the root logger.

    The CLI installs a handler on the stream that is ``sys.stderr`` at the time, which under
    pytest is that test's capture; a plugin thread that outlives the test would later log into
    the closed capture ("--- Logging error ---").
    """
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
