"""``/healthz`` and ``/metrics`` of the DRA plugin, and the process that serves it until a
signal."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from cdigen.errors import InputError
from plugin.agent.lifecycle import serve_until_signalled as run_until_signalled

if TYPE_CHECKING:
    from plugin.dra.kubelet_plugin import DraPlugin

log = logging.getLogger(__name__)


class HealthServer(ThreadingHTTPServer):
    """``/healthz`` for the DRA plugin: 200 once registered with the kubelet, else 503; the
    body says what is pending (JSON: registered, slicesPublished, slicesProblem). And
    ``/metrics``, the plugin's Prometheus series (plugin/dra/metrics.py)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], plugin: DraPlugin) -> None:
        import socket

        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.plugin = plugin
        self._thread: threading.Thread | None = None
        super().__init__(address, _HealthHandler)

    def start(self) -> None:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the port."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=2)
            self._thread = None
        self.server_close()


class _HealthHandler(BaseHTTPRequestHandler):
    server: HealthServer

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4

            self._send(200, self.server.plugin.metrics.exposition(), CONTENT_TYPE_PLAIN_0_0_4)
            return
        if path != "/healthz":
            self._send(404, b"not found: try /healthz or /metrics\n")
            return
        plugin = self.server.plugin
        problem = plugin.health_problem()
        body = json.dumps(plugin.health_report(), sort_keys=True) + "\n"
        self._send(503 if problem else 200, body.encode())

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("healthz http: " + format, *args)


def serve_until_signalled(plugin: DraPlugin, health_address: str | None = None) -> int:
    """Run ``plugin`` (and ``/healthz`` on ``health_address``) until SIGTERM/SIGINT; exit 0,
    within the agent's stop deadline (:func:`plugin.agent.lifecycle.serve_until_signalled`)."""
    health: HealthServer | None = None
    if health_address:
        from plugin.agent.sockets import parse_address

        try:
            health = HealthServer(parse_address(health_address), plugin)
        except OSError as exc:
            raise InputError(
                f"cannot listen on {health_address}: {exc.strerror or exc}",
                where="--health-address",
                hint="pick a free port, or :0 for any",
            ) from None
        health.start()
        log.info("/healthz on http://%s:%d", *health.server_address[:2])

    try:
        return run_until_signalled(plugin, name="cdigen DRA plugin")
    finally:
        if health is not None:
            health.close()
