"""Prometheus metrics of the DRA plugin, served at ``/metrics`` beside ``/healthz``
(``dra serve --health-address``). Names start with ``cdigen_dra_``, in the style of the device
plugin's ``cdigen_plugin_`` ones (plugin/deviceplugin/metrics.py):

- ``cdigen_dra_requests_total{method}`` and ``cdigen_dra_request_duration_seconds{method}``:
  NodePrepareResources / NodeUnprepareResources calls from the kubelet and their time;
- ``cdigen_dra_claim_errors_total{method}``: claims answered with an error;
- ``cdigen_dra_prepared_claims``: claims prepared now (the checkpoint's);
- ``cdigen_dra_slice_publishes_total{result}``: ResourceSlice publications, ``ok`` or ``error``;
- ``cdigen_dra_devices{health}``: published devices, ``Healthy`` or ``Unhealthy``;
- ``cdigen_dra_registered``: 1 while the kubelet has the driver registered.

Each plugin has its own registry (never the process-wide one), so tests and several plugins in
one process do not share series.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

# Prepare writes a spec and a checkpoint (milliseconds); a slow API server makes it seconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
METHODS = ("NodePrepareResources", "NodeUnprepareResources")


class DraMetrics:
    """The DRA plugin's series; the gauges are read from the plugin when scraped."""

    def __init__(
        self,
        *,
        prepared: Callable[[], int],
        health: Callable[[], Mapping[str, tuple[str, ...]]],
        registered: Callable[[], bool],
    ) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._requests = Counter(
            "cdigen_dra_requests", "DRA calls from the kubelet, by method.", ["method"], registry=r
        )
        self._latency = Histogram(
            "cdigen_dra_request_duration_seconds",
            "Time to answer a DRA call from the kubelet, by method.",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._claim_errors = Counter(
            "cdigen_dra_claim_errors",
            "Claims answered with an error (that claim's), by method.",
            ["method"],
            registry=r,
        )
        self._publishes = Counter(
            "cdigen_dra_slice_publishes",
            "ResourceSlice publications of this node's pool, by result (ok or error).",
            ["result"],
            registry=r,
        )
        for method in METHODS:
            self._requests.labels(method)
            self._latency.labels(method)
            self._claim_errors.labels(method)
        for result in ("ok", "error"):
            self._publishes.labels(result)
        r.register(_StateCollector(prepared, health, registered))

    @contextmanager
    def observe_call(self, method: str) -> Iterator[None]:
        """Around one DRA call: counts it and records its duration."""
        self._requests.labels(method).inc()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._latency.labels(method).observe(time.perf_counter() - start)

    def observe_claim_error(self, method: str) -> None:
        """One claim of a call answered with an error."""
        self._claim_errors.labels(method).inc()

    def observe_publish(self, *, ok: bool) -> None:
        """One publication of the slices, successful or not."""
        self._publishes.labels("ok" if ok else "error").inc()

    def exposition(self) -> bytes:
        """The Prometheus text format of every series."""
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))


class _StateCollector:
    """The gauges read at scrape time: prepared claims, devices by health, registration."""

    def __init__(
        self,
        prepared: Callable[[], int],
        health: Callable[[], Mapping[str, tuple[str, ...]]],
        registered: Callable[[], bool],
    ) -> None:
        self._prepared = prepared
        self._health = health
        self._registered = registered

    def describe(self) -> list[Any]:
        return []  # collected at scrape time only

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        yield GaugeMetricFamily(
            "cdigen_dra_prepared_claims", "Claims prepared on this node now.", self._prepared()
        )
        reasons = self._health()
        unhealthy = sum(1 for why in reasons.values() if why)
        devices = GaugeMetricFamily(
            "cdigen_dra_devices", "Published devices, by health.", labels=["health"]
        )
        devices.add_metric(["Healthy"], len(reasons) - unhealthy)
        devices.add_metric(["Unhealthy"], unhealthy)
        yield devices
        yield GaugeMetricFamily(
            "cdigen_dra_registered",
            "1 while the kubelet has the driver registered, else 0.",
            1 if self._registered() else 0,
        )
