"""Moving a node from the device plugin to DRA (docs/dra.md): ``cdigen dra serve``, as a
process against the fake API server, says in one WARNING line at start that its Node still
advertises ``nvidia.com/gpu``, which one of its DeviceClasses serves, and how to remove it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cdigen.nodefile import dump_node
from tests.cdihost import FakeHost, build_host, make_node
from tests.fake_apiserver import FakeApiServer
from tests.helpers.deploy import extended_resource_classes, node_advertising
from tests.helpers.dra import DRIVER, NODE_NAME

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    for doc in extended_resource_classes():
        server.add_class(doc)
    yield server
    server.stop()


@pytest.fixture
def serve(api: FakeApiServer, kubelet_dir: Path, tmp_path: Path) -> Iterator[Callable[[], str]]:
    """Run ``cdigen dra serve`` until its slices are published; its log."""
    host: FakeHost = build_host(tmp_path / "host", make_node(2))
    node_file = tmp_path / "node.yaml"
    node_file.write_text(dump_node(host.node, "yaml"))
    procs: list[subprocess.Popen[str]] = []

    def run() -> str:
        log = tmp_path / f"serve-{len(procs)}.log"
        command = [
            sys.executable, "-m", "cdigen.cli", "dra", "serve",
            "--node", str(node_file), "--node-name", NODE_NAME, "--driver-name", DRIVER,
            "--kubelet-dir", str(kubelet_dir), "--cdi-dir", str(tmp_path / "run-cdi"),
            "--kubeconfig", str(api.kubeconfig(tmp_path / "kubeconfig")),
            "--driver-root", str(host.driver_root), "--dev-root", str(host.dev_root),
            "--sysfs-root", str(host.sysfs_root), "--api-timeout", "2",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        with log.open("w") as out:
            proc = subprocess.Popen(command, stderr=out, stdout=out, text=True, env=env)
        procs.append(proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            text = log.read_text()
            if ("stale extended resources" in text or "still advertises" in text) and api.slices:
                break
            if "DRA driver" in text and api.slices and time.monotonic() > deadline - 25:
                break  # published, and 5 s for the check
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        return log.read_text()

    yield run
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_serve_warns_once_at_start_when_the_node_still_advertises_nvidia_gpu(
    api: FakeApiServer, serve: Callable[[], str]
) -> None:
    api.nodes[NODE_NAME] = node_advertising(NODE_NAME, "1")
    log = serve()
    warnings = [line for line in log.splitlines() if "still advertises" in line]
    assert len(warnings) == 1, log
    (line,) = warnings
    assert "WARNING" in line
    assert f"node {NODE_NAME} still advertises nvidia.com/gpu: 1 (DeviceClass gpu.cdigen.dev " \
        "serves it)" in line  # fmt: skip
    assert f"kubectl patch node {NODE_NAME} --subresource=status --type=json" in line


def test_serve_says_nothing_when_the_node_is_clean(
    api: FakeApiServer, serve: Callable[[], str]
) -> None:
    api.nodes[NODE_NAME] = node_advertising(NODE_NAME, None)
    log = serve()
    assert "still advertises" not in log and "stale" not in log, log


def test_serve_without_rights_to_read_the_classes_says_so_in_one_info_line(
    api: FakeApiServer, serve: Callable[[], str]
) -> None:
    api.nodes[NODE_NAME] = node_advertising(NODE_NAME, "1")
    api.fail["classes"] = 403
    log = serve()
    lines = [line for line in log.splitlines() if "stale extended resources" in line]
    assert len(lines) == 1 and "INFO" in lines[0] and "403" in lines[0], log
    assert "still advertises" not in log
