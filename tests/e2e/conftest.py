"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cdihost import FakeHost
from tests.fake_apiserver import FakeApiServer
from tests.helpers.dra import NODE_NAME, Harness


@pytest.fixture
def kubelet_dir() -> Iterator[Path]:
    """A short temp dir for the kubelet's sockets (unix socket paths hold 107 bytes, pytest's
    tmp_path can be longer)."""
    path = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    """The fake API server, knowing the node the DRA tests run on."""
    server = FakeApiServer().start()
    server.nodes[NODE_NAME] = {"metadata": {"name": NODE_NAME, "uid": "node-uid-1"}}
    yield server
    server.stop()


@pytest.fixture
def harness(
    api: FakeApiServer, host: FakeHost, kubelet_dir: Path, tmp_path: Path
) -> Iterator[Harness]:
    """A DRA plugin for the test module's ``host``, against the fake API server."""
    h = Harness(api, host, kubelet_dir, tmp_path)
    yield h
    h.stop()
