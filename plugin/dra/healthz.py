"""``/healthz`` and ``/metrics`` of the DRA plugin, and the process that serves it until a
signal."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from cdigen.errors import InputError
from cdigen.plugin.agent.http import AgentHttpServer, Answer
from cdigen.plugin.agent.lifecycle import HTTP_WAIT_S
from cdigen.plugin.agent.lifecycle import serve_until_signalled as run_until_signalled

if TYPE_CHECKING:
    from cdigen.plugin.dra.kubelet_plugin import DraPlugin

log = logging.getLogger(__name__)


class HealthServer(AgentHttpServer):
    """``/healthz`` for the DRA plugin: 200 once registered with the kubelet, else 503; the
    body says what is pending (JSON: registered, slicesPublished, slicesProblem). And
    ``/metrics``, the plugin's Prometheus series (plugin/dra/metrics.py). On the agent's one
    HTTP server (plugin/agent/http.py)."""

    def __init__(self, address: tuple[str, int], plugin: DraPlugin) -> None:
        self.plugin = plugin
        super().__init__(
            address, {"/healthz": self._healthz, "/metrics": self._metrics}, name="cdigen-healthz"
        )

    def _metrics(self) -> Answer:
        from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4

        return 200, self.plugin.metrics.exposition(), CONTENT_TYPE_PLAIN_0_0_4

    def _healthz(self) -> Answer:
        problem = self.plugin.health_problem()
        body = json.dumps(self.plugin.health_report(), sort_keys=True) + "\n"
        return 503 if problem else 200, body.encode(), "application/json"


def serve_until_signalled(plugin: DraPlugin, health_address: str | None = None) -> int:
    """Run ``plugin`` (and ``/healthz`` on ``health_address``) until SIGTERM/SIGINT; exit 0,
    within the agent's stop deadline
    (:func:`cdigen.plugin.agent.lifecycle.serve_until_signalled`). The port is bound first (a
    port in use fails the start); its worker starts once the kubelet has registered the
    plugin, or :data:`HTTP_WAIT_S` later, as the device plugin's does."""
    health: HealthServer | None = None
    if health_address:
        from cdigen.plugin.agent.sockets import parse_address

        try:
            health = HealthServer(parse_address(health_address), plugin)
        except OSError as exc:
            raise InputError(
                f"cannot listen on {health_address}: {exc.strerror or exc}",
                where="--health-address",
                hint="pick a free port, or :0 for any",
            ) from None
        # a probe before then waits in the listen queue, and is told 503 if still unregistered
        health.start(after=plugin.registration.once, wait_s=HTTP_WAIT_S)
        log.info("/healthz on http://%s:%d", *health.server_address[:2])

    try:
        return run_until_signalled(plugin, name="cdigen DRA plugin")
    finally:
        if health is not None:
            health.close()
