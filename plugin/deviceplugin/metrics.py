"""Prometheus metrics and the ``/healthz`` endpoint of a serving plugin.

The plugin owns one :class:`PluginMetrics` (its own ``CollectorRegistry``, never the process-wide
one, so that tests and several plugins in one process do not share counters) and calls it from
its servicer and its registration loop:

- ``declare_resource(resource)``: once per advertised resource, before serving; its series
  start at zero.
- ``set_devices(resource, healthy=, unhealthy=)``: whenever the device list sent to the kubelet
  changes.
- ``with observe_request(method, resource):`` around each ``Allocate`` and
  ``GetPreferredAllocation``; an exception inside counts as an error and propagates.
- ``observe_request_failed(method, resource)``: an error answered without raising (a gRPC abort).
- ``observe_link_score(resource, score, fallback=)``: each preferred allocation the allocator made.
- ``observe_registration(resource, ok=)``: each registration attempt with the kubelet (a success
  also marks the resource registered); ``mark_unregistered(resource)`` when the kubelet restarts;
  ``set_waiting(socket)`` while there is no kubelet to register with (``None`` once there is).
- ``observe_policy_reload(ok=)``: each (re)load of the policies; ``set_policies({resource:
  policy_name})`` after a successful one.

``start_http_server("127.0.0.1:9465")`` serves ``/metrics`` (Prometheus text format) and
``/healthz`` (200 ``ok`` once every declared resource is registered with the kubelet, else 503
with one line: ``waiting for kubelet at <socket>`` while there is no kubelet, or naming the
resources that are not registered) from a daemon thread and returns ``(server, bound_port)``; port 0
picks a free port. ``server.close()`` stops it. Metric names all start with ``cdigen_plugin_``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from cdigen.errors import InputError
from cdigen.plugin.agent.http import TEXT, AgentHttpServer, Answer
from cdigen.plugin.agent.sockets import parse_address

log = logging.getLogger("cdigen.plugin.metrics")

Method = Literal["Allocate", "GetPreferredAllocation"]
METHODS: tuple[Method, ...] = ("Allocate", "GetPreferredAllocation")
HEALTH_STATES = ("Healthy", "Unhealthy")  # the kubelet's own words (v1beta1 Device.health)

# Link scores are sums over GPU pairs of 100 x NVLinks + a PCIe weight: a pair of PCIe GPUs scores
# tens, a DGX A100 (8 GPUs, 12 NVLinks per pair) about 34 000, a 16-GPU NVSwitch box about 72 000.
LINK_SCORE_BUCKETS = (0, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000)
# The allocator answers in micro- to milliseconds; the kubelet gives up after seconds.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class PluginMetrics:
    """The plugin's counters, gauges and histograms, and its readiness, in one registry."""

    def __init__(self) -> None:
        """Every metric of the plugin, in its own registry, at zero.

        Long: one flat list of the metrics, each declared once, read top to bottom.
        """
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._devices = Gauge(
            "cdigen_plugin_devices",
            "Devices advertised to the kubelet, by resource and health.",
            ["resource", "health"],
            registry=r,
        )
        self._requests = Counter(
            "cdigen_plugin_requests",
            "Device plugin calls from the kubelet, by method and resource.",
            ["method", "resource"],
            registry=r,
        )
        self._errors = Counter(
            "cdigen_plugin_request_errors",
            "Device plugin calls that ended in an error, by method and resource.",
            ["method", "resource"],
            registry=r,
        )
        self._latency = Histogram(
            "cdigen_plugin_request_duration_seconds",
            "Time to answer a device plugin call, by method and resource.",
            ["method", "resource"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._link_score = Histogram(
            "cdigen_plugin_preferred_allocation_link_score",
            "Link score of each preferred allocation (sum over GPU pairs of 100 x NVLinks + PCIe "
            "weight).",
            ["resource"],
            buckets=LINK_SCORE_BUCKETS,
            registry=r,
        )
        self._fallbacks = Counter(
            "cdigen_plugin_preferred_allocation_fallbacks",
            "Preferred allocations where no set met the policy and the allocator fell back.",
            ["resource"],
            registry=r,
        )
        self._registrations = Counter(
            "cdigen_plugin_registrations",
            "Registration attempts with the kubelet, by resource and result.",
            ["resource", "result"],
            registry=r,
        )
        self._registered = Gauge(
            "cdigen_plugin_registered",
            "1 while the resource is registered with the kubelet, else 0.",
            ["resource"],
            registry=r,
        )
        self._reloads = Counter(
            "cdigen_plugin_policy_reloads",
            "Loads and reloads of the allocation policies (successful or not).",
            registry=r,
        )
        self._reload_failures = Counter(
            "cdigen_plugin_policy_reload_failures",
            "Policy loads that failed; the plugin keeps the policies it had.",
            registry=r,
        )
        self._policy = Gauge(
            "cdigen_plugin_policy_info",
            "1 for the policy each resource uses now.",
            ["resource", "policy"],
            registry=r,
        )
        self._lock = threading.Lock()
        self._resources: dict[str, bool] = {}  # resource -> registered with the kubelet now
        self._plugin_registered = False  # mark_registered() before any resource was declared
        self._waiting_for: str | None = None  # the kubelet socket the plugin waits for
        self._policies: dict[str, str] = {}
        self._children: dict[tuple[str, str], _RequestChildren] = {}
        self._link_children: dict[str, Any] = {}

    # -- what the servicer reports ------------------------------------------------------------

    def declare_resource(self, resource: str) -> None:
        """Start every series of ``resource`` at zero, so dashboards show it before any call."""
        with self._lock:
            self._resources.setdefault(resource, False)
        for method in METHODS:
            self._requests.labels(method, resource)
            self._errors.labels(method, resource)
            self._latency.labels(method, resource)
        for health in HEALTH_STATES:
            self._devices.labels(resource, health)
        for result in ("success", "failure"):
            self._registrations.labels(resource, result)
        self._link_score.labels(resource)
        self._fallbacks.labels(resource)
        self._registered.labels(resource).set(0)

    def set_devices(self, resource: str, *, healthy: int, unhealthy: int) -> None:
        """Record how many devices of ``resource`` are advertised Healthy and Unhealthy."""
        self._devices.labels(resource, "Healthy").set(healthy)
        self._devices.labels(resource, "Unhealthy").set(unhealthy)

    def observe_request(self, method: Method, resource: str) -> _RequestTimer:
        """Count and time one call (a ``with`` block); an exception inside counts as an error."""
        return _RequestTimer(self._request_children(method, resource))

    def _request_children(self, method: Method, resource: str) -> _RequestChildren:
        # Resolving labels costs microseconds per call; the children are cached per series.
        key = (method, resource)
        children = self._children.get(key)
        if children is None:
            children = _RequestChildren(
                self._requests.labels(method, resource),
                self._errors.labels(method, resource),
                self._latency.labels(method, resource),
            )
            self._children[key] = children
        return children

    def observe_request_failed(self, method: Method, resource: str) -> None:
        """Count an error the servicer answered without raising through ``observe_request``."""
        self._request_children(method, resource).errors.inc()

    def observe_link_score(self, resource: str, score: int, *, fallback: bool = False) -> None:
        """Record one preferred allocation's link score, and whether the allocator fell back."""
        histogram = self._link_children.get(resource)
        if histogram is None:
            histogram = self._link_children[resource] = self._link_score.labels(resource)
        histogram.observe(score)
        if fallback:
            self._fallbacks.labels(resource).inc()

    # -- what the registration loop and the policy loader report ------------------------------

    def observe_registration(self, resource: str, *, ok: bool) -> None:
        """Count one registration attempt; a success also marks ``resource`` registered."""
        self._registrations.labels(resource, "success" if ok else "failure").inc()
        if ok:
            self.mark_registered(resource)

    def retire_resource(self, resource: str) -> None:
        """``resource`` is no longer served (its MIG profile disappeared): it no longer counts
        for readiness, and its device and registration gauges drop to zero."""
        with self._lock:
            self._resources.pop(resource, None)
        for health in HEALTH_STATES:
            self._devices.labels(resource, health).set(0)
        self._registered.labels(resource).set(0)

    def mark_registered(self, resource: str | None = None) -> None:
        """The kubelet accepted ``resource``; None: every declared resource (or the plugin)."""
        self._set_registered(resource, True)

    def mark_unregistered(self, resource: str | None = None) -> None:
        """``resource`` (None: all) is no longer registered, e.g. the kubelet restarted: 503."""
        self._set_registered(resource, False)

    def _set_registered(self, resource: str | None, registered: bool) -> None:
        with self._lock:
            if resource is None and not self._resources:
                self._plugin_registered = registered
            names = list(self._resources) if resource is None else [resource]
            for name in names:
                self._resources[name] = registered
        for name in names:
            self._registered.labels(name).set(1 if registered else 0)

    def set_waiting(self, kubelet_socket: str | None) -> None:
        """The plugin waits for the kubelet at ``kubelet_socket`` (None: no longer)."""
        with self._lock:
            self._waiting_for = kubelet_socket

    def health_problem(self) -> str | None:
        """Why ``/healthz`` says not ready, as one line, or None when it is ready."""
        with self._lock:
            waiting = self._waiting_for
        if waiting is not None:
            return f"waiting for kubelet at {waiting}"
        missing = self.unregistered_resources()
        if missing:
            return f"not registered with the kubelet: {', '.join(missing)}"
        return None

    def observe_policy_reload(self, *, ok: bool) -> None:
        """Count one load of the policies; ``ok=False`` also counts a failure."""
        self._reloads.inc()
        if not ok:
            self._reload_failures.inc()

    def set_policies(self, policies: Mapping[str, str]) -> None:
        """Record the policy name each resource uses now (replacing the previous ones)."""
        with self._lock:
            old, self._policies = self._policies, dict(policies)
        for resource, name in old.items():
            if policies.get(resource) != name:
                with contextlib.suppress(KeyError):
                    self._policy.remove(resource, name)
        for resource, name in policies.items():
            self._policy.labels(resource, name).set(1)

    # -- reading it back ----------------------------------------------------------------------

    def unregistered_resources(self) -> list[str]:
        """Declared resources not registered with the kubelet now (all of them: not ready)."""
        with self._lock:
            if not self._resources:
                return [] if self._plugin_registered else ["the device plugin"]
            return sorted(name for name, ok in self._resources.items() if not ok)

    def ready(self) -> bool:
        """True once every declared resource is registered with the kubelet."""
        return not self.unregistered_resources()

    def exposition(self) -> bytes:
        """The metrics in the Prometheus text format."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def start_http_server(self, address: str, *, serve: bool = True) -> tuple[MetricsServer, int]:
        """Serve ``/metrics`` and ``/healthz`` on ``host:port`` (its HTTP worker process).
        ``serve=False``: only bind the port (connections wait in its listen queue) and leave
        ``server.start()`` to the caller, who has more urgent work first."""
        host, port = parse_address(address)
        try:
            server = MetricsServer((host, port), self)
        except OSError as exc:
            raise InputError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                where="--metrics-address",
                hint="pick a free port, or :0 for any",
            ) from None
        if serve:
            server.start()
        bound_port = int(server.server_address[1])
        log.info("metrics and /healthz on http://%s:%d", host, bound_port)
        return server, bound_port


@dataclass(frozen=True)
class _RequestChildren:
    """The three series one (method, resource) pair updates on every call."""

    requests: Any
    errors: Any
    latency: Any


class _RequestTimer:
    """Counts a call on entry; on exit records its duration and, on an exception, an error."""

    __slots__ = ("_children", "_start")

    def __init__(self, children: _RequestChildren) -> None:
        self._children = children
        self._start = 0.0

    def __enter__(self) -> None:
        self._children.requests.inc()
        self._start = time.perf_counter()

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self._children.latency.observe(time.perf_counter() - self._start)
        if kind is not None:
            self._children.errors.inc()


class MetricsServer(AgentHttpServer):
    """``/metrics`` and ``/healthz`` of the device plugin on the agent's one HTTP server
    (plugin/agent/http.py: bounded connections, per-connection timeouts, HEAD, HTTP/1.1)."""

    def __init__(self, address: tuple[str, int], metrics: PluginMetrics) -> None:
        self.metrics = metrics
        super().__init__(
            address, {"/metrics": self._metrics, "/healthz": self._healthz}, name="cdigen-metrics"
        )

    def _metrics(self) -> Answer:
        from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4

        return 200, self.metrics.exposition(), CONTENT_TYPE_PLAIN_0_0_4

    def _healthz(self) -> Answer:
        problem = self.metrics.health_problem()
        if problem is not None:
            return 503, f"{problem}\n".encode(), TEXT
        return 200, b"ok\n", TEXT
