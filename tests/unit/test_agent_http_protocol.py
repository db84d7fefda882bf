"""HTTP/1.x as the node agent's worker speaks it, over real sockets to a real worker process:
keep-alive by version and ``Connection``, pipelined requests answered in order, requests it
will not serve answered with their status and closed, keep-alive clients beyond the connection
limit served in turn; and the request head parser alone, table by table."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdigen.plugin.agent.http import TEXT, AgentHttpServer
from cdigen.plugin.agent.http_messages import (
    MAX_HEADERS,
    HttpRequest,
    Refusal,
    head_end,
    parse_head,
)

MAX = 4  # connections: small, so that the limit is easy to reach


@pytest.fixture
def served() -> Iterator[AgentHttpServer]:
    server = AgentHttpServer(
        ("127.0.0.1", 0), {"/healthz": lambda: (200, b"ok\n", TEXT)}, max_connections=MAX
    )
    server.start()
    try:
        yield server
    finally:
        server.close()


def _connect(server: AgentHttpServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)


def _answers(sock: socket.socket, count: int) -> list[tuple[str, dict[str, str], bytes]]:
    """Read ``count`` answers (status line, headers, body) from ``sock``."""
    data, out = b"", []
    while len(out) < count:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            status, *fields = data[:end].decode("latin-1").split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
            size = int(headers["content-length"])
            if len(data) >= end + 4 + size:
                out.append((status, headers, data[end + 4 : end + 4 + size]))
                data = data[end + 4 + size :]
                continue
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"closed after {len(out)} answers")
        data += chunk
    return out


def _closed(sock: socket.socket, within_s: float = 3.0) -> bool:
    """Whether the worker closes ``sock`` within ``within_s``."""
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_http_1_1_keeps_the_connection_for_the_next_request(served: AgentHttpServer) -> None:
    with _connect(served) as sock:
        for _ in range(3):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n")
            ((status, headers, body),) = _answers(sock, 1)
            assert (status, body) == ("HTTP/1.1 200 OK", b"ok\n")
            assert "connection" not in headers


def test_http_1_0_closes_unless_asked_to_keep_alive(served: AgentHttpServer) -> None:
    with _connect(served) as sock:
        sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        ((_, headers, _),) = _answers(sock, 1)
        assert headers["connection"] == "close" and _closed(sock)
    with _connect(served) as sock:
        sock.sendall(b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" * 2)
        answers = _answers(sock, 2)
        assert [h["connection"] for _, h, _ in answers] == ["keep-alive"] * 2


def test_pipelined_requests_are_answered_in_order(served: AgentHttpServer) -> None:
    with _connect(served) as sock:
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\n\r\nGET /nope HTTP/1.1\r\n\r\n"
            b"HEAD /healthz HTTP/1.1\r\nConnection: close\r\n\r\n"
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    statuses = re.findall(rb"HTTP/1\.1 \d{3} [^\r]*", data)
    assert statuses == [b"HTTP/1.1 200 OK", b"HTTP/1.1 404 Not Found", b"HTTP/1.1 200 OK"]
    assert data.endswith(b"\r\n\r\n")  # the HEAD answer has no body


@pytest.mark.parametrize(
    ("sent", "status"),
    [
        (b"POST /healthz HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi", "405 Method Not Allowed"),
        (b"hello\r\n\r\n", "400 Bad Request"),
        (b"GET /healthz HTTP/2.0\r\n\r\n", "505 HTTP Version Not Supported"),
        (b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n", "400 Bad Request"),
        (b"GET /healthz HTTP/1.1\r\nX: " + b"y" * 20000, "431 Request Header Fields Too Large"),
    ],
)
def test_a_request_it_will_not_serve_is_its_status_then_closed(
    served: AgentHttpServer, sent: bytes, status: str
) -> None:
    with _connect(served) as sock:
        sock.sendall(sent)
        ((line, headers, _),) = _answers(sock, 1)
        assert line == f"HTTP/1.1 {status}" and headers["connection"] == "close"
        assert _closed(sock)
    with _connect(served) as sock:  # and the worker serves on
        sock.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        assert _answers(sock, 1)[0][0] == "HTTP/1.1 200 OK"


def test_keep_alive_clients_beyond_the_limit_are_served_in_turn(served: AgentHttpServer) -> None:
    held = []
    try:
        for _ in range(MAX):  # every slot: a scraper that keeps its connection between scrapes
            sock = _connect(served)
            sock.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
            _answers(sock, 1)
            held.append(sock)
        started = time.monotonic()
        with _connect(served) as late:
            late.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
            assert _answers(late, 1)[0][0] == "HTTP/1.1 200 OK"
        assert time.monotonic() - started < 5  # not the 10 s idle timeout of one held
        # the one idle longest made room; the others stay open
        assert [_closed(sock, within_s=0.5) for sock in held] == [True] + [False] * (MAX - 1)
    finally:
        for sock in held:
            sock.close()


def test_at_the_limit_with_clients_waiting_an_answer_closes_its_connection(
    served: AgentHttpServer,
) -> None:
    held = []
    try:
        for _ in range(MAX):  # every slot: a busy keep-alive scraper, never idle for long
            sock = _connect(served)
            sock.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
            _answers(sock, 1)
            held.append(sock)
        with _connect(served) as late:  # waits in the listen queue
            late.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
            time.sleep(0.1)
            held[0].sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
            ((status, headers, _),) = _answers(held[0], 1)
            assert (status, headers.get("connection")) == ("HTTP/1.1 200 OK", "close")
            assert _closed(held[0])
            assert _answers(late, 1)[0][0] == "HTTP/1.1 200 OK"
        # nobody waits any more: answers keep their connections again
        held[1].sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        ((status, headers, _),) = _answers(held[1], 1)
        assert (status, headers.get("connection")) == ("HTTP/1.1 200 OK", None)
    finally:
        for sock in held:
            sock.close()


def test_a_head_sent_a_byte_at_a_time_is_cut_off_at_the_timeout() -> None:
    server = AgentHttpServer(
        ("127.0.0.1", 0), {"/healthz": lambda: (200, b"ok\n", TEXT)}, timeout_s=0.5
    )
    server.start()
    try:
        with _connect(server) as sock:
            started = time.monotonic()
            with contextlib.suppress(OSError):  # the worker hangs up mid-trickle
                for byte in b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"y" * 100:
                    sock.sendall(bytes([byte]))
                    time.sleep(0.05)  # each byte well within the timeout
            assert _closed(sock)
            assert time.monotonic() - started < 2.5  # not the 6 s the trickle would take
    finally:
        server.close()


def test_the_worker_is_one_thread_however_many_connections(served: AgentHttpServer) -> None:
    socks = [_connect(served) for _ in range(MAX)]
    try:
        for sock in socks:
            sock.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        for sock in socks:
            _answers(sock, 1)
        (worker,) = [p for p in Path("/proc").glob("[0-9]*") if _is_our_worker(p)]
        assert "Threads:\t1\n" in (worker / "status").read_text()
    finally:
        for sock in socks:
            sock.close()


def _is_our_worker(proc: Path) -> bool:
    """Whether ``proc`` is an HTTP worker started by this test process."""
    try:
        cmdline, status = (proc / "cmdline").read_bytes(), (proc / "status").read_text()
    except OSError:
        return False  # gone meanwhile
    return b"http_worker" in cmdline and f"PPid:\t{os.getpid()}\n" in status


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b"GET /metrics HTTP/1.1\r\n\r\n", HttpRequest("GET", "/metrics", True, False)),
        (b"GET /metrics?x=1 HTTP/1.1\n\n", HttpRequest("GET", "/metrics", True, False)),
        (b"HEAD /h HTTP/1.1\r\nConnection: Close\r\n\r\n", HttpRequest("HEAD", "/h", False, False)),
        (b"GET /h HTTP/1.0\r\n\r\n", HttpRequest("GET", "/h", False, True)),
        (b"GET /h HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", HttpRequest("GET", "/h", True, 1)),
        (b"GET /h HTTP/1.1\r\nContent-Length: 5\r\n\r\n", HttpRequest("GET", "/h", False, 0)),
        (b"GET /h HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", HttpRequest("GET", "/h", 0, 0)),
        (b"GET /h\r\n\r\n", Refusal(400, "a request line is METHOD TARGET HTTP/1.1")),
        (b"GET /h HTTP/3\r\n\r\n", Refusal(505, "HTTP/1.0 and HTTP/1.1 only")),
        (b"GET /h SPDY/1\r\n\r\n", Refusal(400, "a request line ends in HTTP/1.0 or HTTP/1.1")),
        (b"DELETE /h HTTP/1.1\r\n\r\n", Refusal(405, "GET and HEAD only", allow=True)),
        (b"GET /h HTTP/1.1\r\n Folded: x\r\n\r\n", Refusal(400, "a header line is NAME: VALUE")),
        (b"GET /h HTTP/1.1\r\n" + b"A: b\r\n" * (MAX_HEADERS + 1) + b"\r\n",
         Refusal(431, f"more than {MAX_HEADERS} header lines")),
    ],
)  # fmt: skip
def test_a_request_head_reads_as(head: bytes, expected: HttpRequest | Refusal) -> None:
    assert head_end(head) == len(head)
    assert parse_head(head) == expected


@pytest.mark.parametrize("partial", [b"", b"GET / HTTP/1.1\r\n", b"GET / HTTP/1.1\r\nA: b\r\n\r"])
def test_an_unfinished_head_has_no_end(partial: bytes) -> None:
    assert head_end(partial) == -1
