"""The DRA plugin against a kubelet that restarts and an API server that goes away, hangs, fails
and has its slices deleted or changed behind our back (tests/fake_apiserver.py's faults, the
kubelet simulator's slice wipe at start)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cdigen.nodefile import dump_node
from tests.cdihost import FakeHost, build_host, make_node
from tests.dra_kubelet_sim import DraKubeletSim
from tests.fake_apiserver import FakeApiServer
from tests.helpers.dra import DRIVER, NODE_NAME, Harness

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path / "host", make_node(2))


def _until(check: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until ``check()`` held; fails after ``timeout_s``."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"not within {timeout_s} s")
        time.sleep(0.02)
    return time.monotonic() - start


def _devices(api: FakeApiServer) -> list[str]:
    with api.lock:
        return sorted(
            d["name"] for s in api.slices.values() for d in s.get("spec", {}).get("devices", [])
        )


# --------------------------------------------------------------------------- slices stay published


def test_a_restarted_kubelet_wipes_the_slices_and_they_are_back_within_5_s(
    harness: Harness,
) -> None:
    harness.start(resync_s=60)  # no periodic check in time: the registration brings them back
    published = _devices(harness.api)
    assert published == ["gpu-0", "gpu-1"]
    kubelet = DraKubeletSim(harness.kubelet_dir, api=harness.api, node_name=NODE_NAME)
    assert kubelet.wiped and _devices(harness.api) == [], "the kubelet starts by wiping them"
    kubelet.register()
    took = _until(lambda: _devices(harness.api) == published, 5)
    print(f"slices back {took:.2f} s after the kubelet registered again")
    ref = harness.claim("new", "uid-new", published[0])
    assert kubelet.prepare([ref]).claims["uid-new"].error == ""


def test_a_slice_deleted_or_changed_by_someone_else_is_put_back(harness: Harness) -> None:
    harness.start()
    (name,) = harness.api.slices
    wanted = json.loads(json.dumps(harness.api.slices[name]["spec"]))
    harness.api.delete_slices()
    took = _until(lambda: _devices(harness.api) == ["gpu-0", "gpu-1"], 5)
    print(f"deleted slice back in {took:.2f} s")
    (name,) = harness.api.slices
    harness.api.change_slice(name, {**wanted, "devices": []})
    _until(lambda: _devices(harness.api) == ["gpu-0", "gpu-1"], 5)
    ref = harness.claim("b", "uid-b", "gpu-1")
    assert harness.kubelet.prepare([ref]).claims["uid-b"].error == ""


# --------------------------------------------------------------------------- the API server away


def test_during_an_api_outage_the_plugin_registers_serves_unprepare_and_publishes_later(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = harness.start()
    ref = harness.claim("a", "uid-a", "gpu-0")
    assert harness.kubelet.prepare([ref]).claims["uid-a"].error == ""
    harness.stop()
    harness.api.delete_slices()
    harness.api.fail = {"slices": 500, "nodes": 500, "claims": 500}
    start = time.monotonic()
    plugin = harness.start_unpublished()
    assert plugin.registration.wait_registered(15)
    print(f"registered {time.monotonic() - start:.2f} s into an API outage")
    assert plugin.health_problem() is None
    # the first publish runs beside the registration: on a loaded box it may not have failed yet
    deadline = time.monotonic() + 5
    report = plugin.health_report()
    while "500" not in str(report["slicesProblem"]) and time.monotonic() < deadline:
        time.sleep(0.05)
        report = plugin.health_report()
    assert report["registered"] is True and report["slicesPublished"] is False
    assert "500" in str(report["slicesProblem"])
    assert harness.kubelet.unprepare([ref]).claims["uid-a"].error == ""
    time.sleep(1.5)  # several retries: still one line for this kind of failure
    lines = [r.getMessage() for r in caplog.records if "cannot publish" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "\n" not in lines[0] and "500" in lines[0]
    harness.api.fail = {}
    assert plugin.wait_published(5), "published once the API server is back"
    assert _devices(harness.api) == ["gpu-0", "gpu-1"]


def test_an_api_error_is_one_bounded_line_in_the_claim_error(harness: Harness) -> None:
    harness.start()
    ref = harness.claim("a", "uid-a", "gpu-0")
    harness.api.fail = {"claims": 500}
    error = harness.kubelet.prepare([ref]).claims["uid-a"].error
    assert "\n" not in error and len(error) < 400, error
    assert "500 InternalError: injected failure for claims" in error
    assert "HTTP response headers" not in error and "Content-Type" not in error


def test_four_hung_claim_reads_do_not_starve_unprepare(harness: Harness) -> None:
    harness.start(api_timeout_s=30)  # longer than the test: the worker pool, not the timeout
    ref = harness.claim("a", "uid-a", "gpu-0")
    assert harness.kubelet.prepare([ref]).claims["uid-a"].error == ""
    harness.api.hang = {"claims"}
    slow = DraKubeletSim(harness.kubelet_dir, timeout_s=30)
    slow.plugin = harness.kubelet.plugin
    hung = [
        threading.Thread(
            target=slow.prepare, args=([harness.claim(f"h{i}", f"u-h{i}", "gpu-1")],), daemon=True
        )
        for i in range(4)
    ]
    try:
        for thread in hung:
            thread.start()
        _until(lambda: sum(1 for m, p in harness.api.requests if "resourceclaims/h" in p) >= 4, 5)
        start = time.monotonic()
        answer = harness.kubelet.unprepare([ref])
        took = time.monotonic() - start
    finally:
        harness.api.release.set()
    assert answer.claims["uid-a"].error == ""
    print(f"unprepare answered in {took:.3f} s beside four hung claim reads")
    assert took < 5


def test_a_hung_api_call_gives_up_after_the_api_timeout(harness: Harness) -> None:
    harness.start(api_timeout_s=1.0)
    ref = harness.claim("a", "uid-a", "gpu-0")
    harness.api.hang = {"claims"}
    try:
        start = time.monotonic()
        error = harness.kubelet.prepare([ref]).claims["uid-a"].error
        took = time.monotonic() - start
    finally:
        harness.api.release.set()
    assert took < 3, took
    assert "unreachable" in error and "timed out" in error.lower(), error


# --------------------------------------------------------------------------- the process


@pytest.fixture
def served(
    api: FakeApiServer, host: FakeHost, kubelet_dir: Path, tmp_path: Path
) -> Iterator[Callable[..., tuple[subprocess.Popen[str], Path]]]:
    """Start ``cdigen dra serve`` as a process against the fake API server."""
    procs: list[subprocess.Popen[str]] = []
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    node_file = tmp_path / "node.yaml"
    node_file.write_text(dump_node(host.node, "yaml"))

    def start(*flags: str) -> tuple[subprocess.Popen[str], Path]:
        """``flags`` after the fixture's own (the last of a repeated option counts)."""
        log = tmp_path / f"serve-{len(procs)}.log"
        command = [
            sys.executable, "-m", "cdigen.cli", "dra", "serve",
            "--node", str(node_file), "--node-name", NODE_NAME,
            "--driver-name", DRIVER, "--kubelet-dir", str(kubelet_dir),
            "--cdi-dir", str(tmp_path / "run-cdi"), "--kubeconfig", str(kubeconfig),
            "--driver-root", str(host.driver_root), "--dev-root", str(host.dev_root),
            "--sysfs-root", str(host.sysfs_root), "--health-address", "127.0.0.1:0",
            "--api-timeout", "2", *flags,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        with log.open("w") as out:
            proc = subprocess.Popen(command, stderr=out, stdout=out, text=True, env=env)
        procs.append(proc)
        return proc, log

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_health_port_in_use_fails_the_start_in_one_line_before_the_kubelet_sees_it(
    served: Callable[..., tuple[subprocess.Popen[str], Path]], kubelet_dir: Path
) -> None:
    """The port is bound at start (its worker starts only once registered): a port in use is
    the start's one-line error, exit 2, and no socket is left for the kubelet to find."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc, log = served("--health-address", f"127.0.0.1:{port}")
        assert proc.wait(60) == 2, log.read_text()
    text = log.read_text()
    assert "Traceback" not in text, text
    error = text.strip().splitlines()[-1]
    assert f"--health-address: cannot listen on 127.0.0.1:{port}" in error, text
    assert not list(kubelet_dir.rglob("*.sock")), "the kubelet would find a socket"


def test_healthz_says_not_ready_until_the_kubelet_registers_the_driver(
    served: Callable[..., tuple[subprocess.Popen[str], Path]], kubelet_dir: Path
) -> None:
    """With no kubelet the HTTP worker starts after a wait (a probe waits in the listen
    queue), and answers 503 with what is pending; once registered, 200."""
    proc, log = served()
    kubelet = DraKubeletSim(kubelet_dir)
    kubelet.wait_for_socket(30)
    status, report = _healthz(log)
    assert status == 503 and report["registered"] is False, report
    kubelet.register()
    status, report = _healthz(log)
    assert status == 200 and report["registered"] is True, report
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def _healthz(log: Path) -> tuple[int, dict[str, Any]]:
    match = _until_match(log, r"/healthz on (http://\S+)")
    try:
        with urllib.request.urlopen(f"{match}/healthz", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _until_match(log: Path, pattern: str) -> str:
    found: list[str] = []

    def seen() -> bool:
        match = re.search(pattern, log.read_text())
        if match:
            found.append(match.group(1))
        return bool(match)

    _until(seen, 30)
    return found[0]


def test_sigterm_with_a_health_stream_open_exits_within_2_s(
    served: Callable[..., tuple[subprocess.Popen[str], Path]], kubelet_dir: Path
) -> None:
    proc, log = served()
    kubelet = DraKubeletSim(kubelet_dir, timeout_s=60)
    kubelet.wait_for_socket(30)
    kubelet.register()
    got: list[Any] = []
    watcher = threading.Thread(target=kubelet.watch_health, args=(99, got), daemon=True)
    watcher.start()
    _until(lambda: len(got) == 1, 10)
    status, report = _healthz(log)
    assert status == 200 and report["registered"] is True
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    took = time.monotonic() - start
    print(f"exited {took:.2f} s after SIGTERM with a health stream open")
    assert took <= 2.0, log.read_text()
    watcher.join(2)
    assert not watcher.is_alive(), "the health stream ended"


def test_a_hung_api_server_at_start_does_not_block_registration_or_sigterm(
    api: FakeApiServer,
    served: Callable[..., tuple[subprocess.Popen[str], Path]],
    kubelet_dir: Path,
) -> None:
    api.hang = {"slices", "nodes"}
    try:
        proc, log = served()
        kubelet = DraKubeletSim(kubelet_dir)
        kubelet.wait_for_socket(15)
        kubelet.register()
        status, report = _healthz(log)
        assert status == 200
        assert report == {
            "registered": True,
            "slicesPublished": False,
            "slicesProblem": report["slicesProblem"],
        }
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert time.monotonic() - start <= 2.0
    finally:
        api.release.set()
    text = log.read_text()
    assert "Traceback" not in text


@pytest.mark.parametrize(
    ("flags", "where"),
    [
        (["--api-timeout", "0"], "--api-timeout"),
        (["--api-timeout", "nan"], "--api-timeout"),
        (["--health-address", "nowhere"], "--health-address"),
    ],
)
def test_bad_api_timeout_or_health_address_is_one_line_exit_2(flags: list[str], where: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cdigen.cli", "dra", "serve", "--node", "builtin:rtx4090",
         "--node-name", NODE_NAME, *flags],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)},
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert where in result.stderr
