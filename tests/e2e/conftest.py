"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def kubelet_dir() -> Iterator[Path]:
    """A short temp dir for the kubelet's sockets (unix socket paths hold 107 bytes, pytest's
    tmp_path can be longer)."""
    path = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
