"""The node agent's one HTTP server, as both wings run it (issue 36, finding 9 and point 6): a
bounded number of connections and threads however many half-open connections arrive, idle ones
closed, HEAD and HTTP/1.1, a client hanging up early is no traceback; and the connections are
served by a worker process, so scrapers cost the plugin at most a few renders a second, every
answer is fresh, and the worker goes when the plugin goes."""

from __future__ import annotations

import contextlib
import http.client
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cdigen.plugin.agent.http import MAX_CONNECTIONS, TEXT, AgentHttpServer, Answer
from cdigen.plugin.deviceplugin.metrics import PluginMetrics


@pytest.fixture
def server() -> Iterator[AgentHttpServer]:
    metrics = PluginMetrics()
    metrics.declare_resource("nvidia.com/gpu")
    metrics.observe_registration("nvidia.com/gpu", ok=True)
    served, _ = metrics.start_http_server("127.0.0.1:0")
    try:
        yield served
    finally:
        served.close()


def _serve(routes: dict[str, Callable[[], Answer]], **options: float) -> AgentHttpServer:
    served = AgentHttpServer(("127.0.0.1", 0), routes, **options)  # type: ignore[arg-type]
    served.start()
    return served


def _get(port: int, method: str = "GET", path: str = "/healthz") -> tuple[int, bytes, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read(), "1.1" if response.version == 11 else "1.0"
    finally:
        conn.close()


def _children() -> list[int]:
    """The pids of this process's children, as ps shows them."""
    pids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            pids += [int(p) for p in (task / "children").read_text().split()]
    return pids


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no thread count for {pid}")


def _worker_of(served: AgentHttpServer) -> int:
    _get(served.server_address[1])  # the worker is up
    (pid,) = [p for p in _children() if b"http_worker" in Path(f"/proc/{p}/cmdline").read_bytes()]
    return pid


def test_300_half_open_connections_hold_a_bounded_number_of_threads(
    server: AgentHttpServer,
) -> None:
    port = server.server_address[1]
    worker = _worker_of(server)
    before_here, before_worker = threading.active_count(), _threads(worker)
    idle = []
    try:
        for _ in range(300):  # connect and send nothing, as a slowloris does
            sock = socket.socket()
            sock.setblocking(False)  # beyond the listen queue the kernel drops the handshake
            sock.connect_ex(("127.0.0.1", port))
            idle.append(sock)
        time.sleep(0.5)
        assert threading.active_count() == before_here  # none of it in the plugin
        assert _threads(worker) == before_worker == 1  # one loop serves them all
        # each connection a socket, up to the limit; the rest wait in the kernel's queue
        assert len(list(Path(f"/proc/{worker}/fd").iterdir())) <= MAX_CONNECTIONS + 8
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 15  # once the idle ones are gone, a scrape gets through
    while True:
        try:
            assert _get(port)[0] == 200
            break
        except (OSError, http.client.HTTPException):
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_an_idle_connection_is_closed_after_the_timeout() -> None:
    served = _serve({"/healthz": lambda: (200, b"ok\n", TEXT)}, timeout_s=0.3)
    try:
        sock = socket.create_connection(("127.0.0.1", served.server_address[1]), timeout=5)
        try:
            started = time.monotonic()
            assert sock.recv(1) == b""  # the server hung up
            assert time.monotonic() - started < 3
        finally:
            sock.close()
    finally:
        served.close()


def test_head_and_http_1_1(server: AgentHttpServer) -> None:
    status, body, version = _get(server.server_address[1], "HEAD", "/metrics")
    assert (status, body, version) == (200, b"", "1.1")


def test_a_client_that_hangs_up_early_is_no_traceback(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    with caplog.at_level(logging.DEBUG):
        served = _serve({"/metrics": lambda: (200, b"x" * 200_000, TEXT)})
        try:
            port = served.server_address[1]
            for _ in range(20):
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                sock.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
                sock.close()  # RST: the answer meets a closed connection
            time.sleep(0.5)
            assert _get(port, path="/metrics")[0] == 200
        finally:
            served.close()
    assert any(
        r.levelno == logging.DEBUG and "cdigen-http" in r.getMessage() for r in caplog.records
    )
    assert not any(r.exc_info for r in caplog.records)
    assert not any("Traceback" in r.getMessage() for r in caplog.records)
    assert "Traceback" not in capfd.readouterr().err  # nor from the worker process


def test_64_scrapers_cost_the_plugin_a_few_renders_a_second() -> None:
    renders = []
    served = _serve({"/metrics": lambda: renders.append(1) or (200, b"m\n", TEXT)})
    stop = threading.Event()
    answered = []

    def scrape() -> None:
        while not stop.is_set():
            # connections over MAX_CONNECTIONS wait in the listen queue: none is refused
            answered.append(_get(served.server_address[1], path="/metrics")[0])

    try:
        scrapers = [threading.Thread(target=scrape) for _ in range(64)]
        for thread in scrapers:
            thread.start()
        time.sleep(2.0)
        stop.set()
        for thread in scrapers:
            thread.join()
    finally:
        served.close()
    assert len(answered) >= MAX_CONNECTIONS
    assert set(answered) == {200}
    assert len(renders) <= 2.0 / 0.25 + 3  # one render a quarter second, shared by all


def test_a_costly_render_is_asked_for_less_often() -> None:
    """A render of 5 ms of CPU may be asked for once per 2.5 s (0.2 % of the plugin's time),
    however many scrapers wait."""
    renders = []

    def costly() -> Answer:
        renders.append(time.monotonic())
        started = time.thread_time()
        while time.thread_time() - started < 0.005:
            pass
        return 200, b"m\n", TEXT

    served = _serve({"/metrics": costly})
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            _get(served.server_address[1], path="/metrics")

    try:
        scrapers = [threading.Thread(target=scrape) for _ in range(8)]
        for thread in scrapers:
            thread.start()
        time.sleep(4.0)
        stop.set()
        for thread in scrapers:
            thread.join()
    finally:
        served.close()
    gaps = [b - a for a, b in itertools.pairwise(renders)]
    assert gaps and min(gaps) >= 2.5 * 0.95, gaps


def test_an_answer_shows_what_the_plugin_did_before_the_scrape() -> None:
    count = [0]
    served = _serve({"/metrics": lambda: (200, f"{count[0]}\n".encode(), TEXT)})
    try:
        for n in range(1, 6):
            count[0] = n
            assert _get(served.server_address[1], path="/metrics")[1] == f"{n}\n".encode()
    finally:
        served.close()


def test_a_route_that_fails_is_500_and_one_error_line(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> Answer:
        raise RuntimeError("no registry")

    served = _serve({"/metrics": broken, "/healthz": lambda: (200, b"ok\n", TEXT)})
    try:
        port = served.server_address[1]
        with caplog.at_level(logging.ERROR):
            assert _get(port, path="/metrics")[0] == 500
        assert _get(port)[0] == 200  # still serving
    finally:
        served.close()
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "answering /metrics failed: no registry" in line


def test_a_plugin_that_does_not_answer_is_503_not_a_hung_probe() -> None:
    release = threading.Event()
    served = _serve(
        {"/healthz": lambda: release.wait(10) and (200, b"ok\n", TEXT)}, answer_deadline_s=0.5
    )
    try:
        started = time.monotonic()
        status, body, _ = _get(served.server_address[1])
        assert (status, body) == (503, b"the plugin did not answer within 0.5 s\n")
        assert time.monotonic() - started < 3
    finally:
        release.set()
        served.close()


def test_a_worker_that_dies_is_started_again(caplog: pytest.LogCaptureFixture) -> None:
    served = _serve({"/healthz": lambda: (200, b"ok\n", TEXT)})
    try:
        worker = _worker_of(served)
        with caplog.at_level(logging.WARNING):
            os.kill(worker, signal.SIGKILL)
            deadline = time.monotonic() + 15
            while True:
                try:
                    if _get(served.server_address[1])[0] == 200:
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert any("HTTP worker exited (code -9)" in r.getMessage() for r in caplog.records)
    finally:
        served.close()


PLUGIN = """
import sys, time
from cdigen.plugin.deviceplugin.metrics import PluginMetrics
server, port = PluginMetrics().start_http_server("127.0.0.1:0")
print(port, flush=True)
time.sleep(600)
"""


def test_the_worker_goes_with_a_killed_plugin_and_frees_the_port() -> None:
    plugin = subprocess.Popen([sys.executable, "-c", PLUGIN], stdout=subprocess.PIPE, text=True)
    try:
        assert plugin.stdout is not None
        port = int(plugin.stdout.readline())
        assert _get(port)[0] == 503  # served (not registered yet)
    finally:
        plugin.kill()
        plugin.wait()
    deadline = time.monotonic() + 10
    while True:  # the worker read the end of its feed and exited, closing the port
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_slow_metrics_render_does_not_hold_up_healthz() -> None:
    release = threading.Event()
    served = _serve(
        {
            "/metrics": lambda: release.wait(10) and (200, b"m\n", TEXT),
            "/healthz": lambda: (200, b"ok\n", TEXT),
        }
    )
    port = served.server_address[1]
    slow = threading.Thread(target=_get, args=(port, "GET", "/metrics"))
    try:
        slow.start()
        time.sleep(0.3)  # /metrics is being rendered, and waits
        started = time.monotonic()
        assert _get(port)[:2] == (200, b"ok\n")
        assert time.monotonic() - started < 1  # a kubelet probe's default timeout
    finally:
        release.set()
        slow.join()
        served.close()
