"""The one HTTP server of a node agent: ``/metrics`` and ``/healthz`` of both wings.

A DaemonSet binds it on the node's address (0.0.0.0:9465), where anything on the network may
connect, so it is bounded: at most :data:`MAX_CONNECTIONS` connections are served at once (one
thread each; the next is closed at once, and a scraper retries), and a connection that sends
nothing for :data:`CONNECTION_TIMEOUT_S` is closed (half-open or idle keep-alive connections
hold nothing for long). HTTP/1.1 with keep-alive, GET and HEAD; a client that hangs up early
is one DEBUG line, never a traceback. Each wing gives its routes: path -> a function answering
(status, body, content type).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("cdigen.plugin.http")

MAX_CONNECTIONS = 32
CONNECTION_TIMEOUT_S = 10.0
TEXT = "text/plain; charset=utf-8"

Answer = tuple[int, bytes, str]  # status, body, content type
Route = Callable[[], Answer]


class AgentHttpServer(ThreadingHTTPServer):
    """Serves ``routes`` on ``address`` from a daemon thread once :meth:`start` is called;
    :meth:`close` stops it and releases the port."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(
        self,
        address: tuple[str, int],
        routes: Mapping[str, Route],
        *,
        name: str = "cdigen-http",
        max_connections: int = MAX_CONNECTIONS,
        timeout_s: float = CONNECTION_TIMEOUT_S,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.routes = dict(routes)
        self.name = name
        self.timeout_s = timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)
        self._thread: threading.Thread | None = None
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            log.debug("%s: %d connections open, closing a new one", self.name, MAX_CONNECTIONS)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed (the client hung up mid-answer): one DEBUG line."""
        import sys

        exc = sys.exc_info()[1]
        log.debug("%s: connection from %s ended: %s", self.name, client_address, exc)

    def start(self) -> None:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.2}, name=self.name, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving, wait for the thread, and release the port."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: AgentHttpServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.timeout_s)  # each read and write of it

    def do_GET(self) -> None:
        route = self.server.routes.get(self.path.split("?", 1)[0])
        if route is None:
            paths = " or ".join(sorted(self.server.routes))
            self._send((404, f"not found: try {paths}\n".encode(), TEXT))
            return
        self._send(route())

    def do_HEAD(self) -> None:
        self.do_GET()

    def _send(self, answer: Answer) -> None:
        status, body, content_type = answer
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug(f"{self.server.name}: " + format, *args)
