"""The node agent's one HTTP server, as both wings run it (issue 36, finding 9): a bounded
number of connections and threads however many half-open connections arrive, idle ones
closed, HEAD and HTTP/1.1 on both wings, a client hanging up early is no traceback."""

from __future__ import annotations

import http.client
import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from cdigen.plugin.agent.http import MAX_CONNECTIONS, AgentHttpServer
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


def _get(port: int, method: str = "GET", path: str = "/healthz") -> tuple[int, bytes, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read(), "1.1" if response.version == 11 else "1.0"
    finally:
        conn.close()


def test_300_half_open_connections_hold_a_bounded_number_of_threads(
    server: AgentHttpServer,
) -> None:
    port = server.server_address[1]
    before = threading.active_count()
    idle = []
    try:
        for _ in range(300):  # connect and send nothing, as a slowloris does
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            idle.append(sock)
        time.sleep(0.5)
        assert threading.active_count() - before <= MAX_CONNECTIONS + 1
        # once an idle one is closed by its timeout or a slot frees, a scrape gets through
        server.timeout_s = 0.2  # new connections: shorter; the idle ones go within 10 s
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 15
    while True:
        try:
            assert _get(port)[0] == 200
            break
        except (OSError, http.client.HTTPException):
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_an_idle_connection_is_closed_after_the_timeout(server: AgentHttpServer) -> None:
    server.timeout_s = 0.3
    sock = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5)
    try:
        started = time.monotonic()
        assert sock.recv(1) == b""  # the server hung up
        assert time.monotonic() - started < 3
    finally:
        sock.close()


def test_head_and_http_1_1(server: AgentHttpServer) -> None:
    status, body, version = _get(server.server_address[1], "HEAD", "/metrics")
    assert (status, body, version) == (200, b"", "1.1")


def test_a_client_that_hangs_up_early_is_one_debug_line(
    server: AgentHttpServer, caplog: pytest.LogCaptureFixture
) -> None:
    port = server.server_address[1]
    with caplog.at_level(logging.DEBUG):
        for _ in range(20):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
            sock.close()  # RST: the answer meets a closed connection
        time.sleep(0.5)
    assert _get(port)[0] == 200
    assert not any(r.exc_info for r in caplog.records)
    assert not any("Traceback" in r.getMessage() for r in caplog.records)
