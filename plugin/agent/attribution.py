"""Per-pod attribution, the part both wings share: which pod and container hold which GPU,
share, MIG device or claim, with which memory limit, as Prometheus series read at scrape time into
a plugin's own registry.

The kubelet's PodResources API (:mod:`cdigen.plugin.agent.podresources`) says which device IDs
(device plugin) and which ResourceClaims (DRA) each container got; each wing (a :class:`Wing`:
:mod:`cdigen.plugin.deviceplugin.attribution` for the device plugin,
:mod:`cdigen.plugin.dra.attribution` for DRA) maps them to GPUs through what it advertised or
prepared, into
:class:`~cdigen.plugin.agent.holdings.Holding` rows.

Per container (labels ``namespace``, ``pod``, ``container``, ``gpu_uuid``, plus ``kind`` and
``source``): ``cdigen_pod_gpu_devices`` (devices or shares held) and
``cdigen_pod_gpu_memory_limit_bytes`` (left out where nothing limits the memory). Per GPU
(``gpu_uuid``): ``cdigen_gpu_shares{resource,state}`` (the wing's devices on it, ``used`` or
``free``), ``cdigen_gpu_memory_bytes`` and ``cdigen_gpu_memory_allocated_bytes``,
``cdigen_gpu_healthy`` (1 or 0), ``cdigen_gpu_xid_events_total`` and ``cdigen_gpu_last_xid``.
``cdigen_pod_resources_up``: 1 when the kubelet answered this scrape's ``List``.

Each scrape asks the kubelet once (its own deadline, shorter than Prometheus' scrape timeout);
a kubelet that does not answer leaves the per-pod series out and ``..._up`` at 0, logged once
per change of problem.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cdigen.plugin.agent.holdings import Holding, printable_name
from cdigen.plugin.agent.podresources import ContainerResources, PodResourcesError, list_resources

if TYPE_CHECKING:
    from cdigen.model import Gpu
    from cdigen.plugin.agent.health import HealthBoard

log = logging.getLogger("cdigen.plugin.attribution")

# Prometheus' default scrape timeout is 10 s; the kubelet answers List in milliseconds.
SCRAPE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Slot:
    """One device a wing offers on a GPU: a share, a MIG device, a whole GPU or a DRA device."""

    resource: str  # the extended resource, or the DRA driver
    device: str  # its device ID (device plugin) or name (DRA)
    gpu_uuid: str


class Wing(Protocol):
    """What the attribution collector asks of a wing; each call reads the wing's state now."""

    @property
    def name(self) -> str:
        """``plugin`` or ``dra``."""
        ...

    def gpus(self) -> Sequence[Gpu]:
        """The physical GPUs the wing serves."""
        ...

    def slots(self) -> Sequence[Slot]:
        """Every device the wing offers now, with its GPU."""
        ...

    def holdings(self, containers: Iterable[ContainerResources]) -> list[Holding]:
        """What each container holds of the wing's devices."""
        ...

    def used(self, holdings: Sequence[Holding]) -> set[tuple[str, str]]:
        """The ``(resource, device)`` slots in use."""
        ...


class XidCounter:
    """Critical Xid events per GPU, from the health board: each new Xid reason on a GPU (one
    it did not hold a moment ago) counts once. A GPU's reason reaches every device on it; the
    counts are per GPU, however many devices it has."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, frozenset[int]] = {}
        self.events: dict[str, int] = {}
        self.last: dict[str, int] = {}

    def update(self, reasons: Mapping[str, Sequence[str]], gpu_of: Mapping[str, str]) -> None:
        """The board's reasons now (device -> reasons); ``gpu_of``: device -> GPU UUID."""
        now: dict[str, set[int]] = {}
        for device, device_reasons in reasons.items():
            gpu = gpu_of.get(device, device)
            for reason in device_reasons:
                xid = getattr(reason, "xid", None)
                if xid is not None:
                    now.setdefault(gpu, set()).add(int(xid))
        with self._lock:
            for gpu, xids in now.items():
                new = xids - self._held.get(gpu, frozenset())
                if new:
                    self.events[gpu] = self.events.get(gpu, 0) + len(new)
                    self.last[gpu] = max(new)
            self._held = {gpu: frozenset(xids) for gpu, xids in now.items()}

    def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """Events and last Xid per GPU UUID."""
        with self._lock:
            return dict(self.events), dict(self.last)


class AttributionCollector:
    """The custom collector: everything read from the wing, the board and the kubelet when
    scraped."""

    def __init__(
        self,
        wing: Wing,
        socket: Path,
        *,
        board: HealthBoard | None = None,
        timeout_s: float = SCRAPE_TIMEOUT_S,
    ) -> None:
        self.wing = wing
        self.socket = socket
        self._board = board
        self._timeout_s = timeout_s
        self._problem: str | None = None
        self.xids = XidCounter()
        if board is not None:
            board.subscribe(self._on_health)

    def _on_health(self, reasons: dict[str, tuple[str, ...]]) -> None:
        self.xids.update(reasons, {s.device: s.gpu_uuid for s in self.wing.slots()})

    def describe(self) -> list[Any]:
        return []  # collected at scrape time only

    def _containers(self) -> tuple[list[Any], bool]:
        try:
            containers = list_resources(self.socket, timeout_s=self._timeout_s)
        except PodResourcesError as exc:
            if str(exc) != self._problem:
                log.warning("per-pod attribution: %s", exc)
                self._problem = str(exc)
            return [], False
        if self._problem is not None:
            log.info("per-pod attribution: the kubelet's PodResources API answers again")
            self._problem = None
        return containers, True

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        containers, up = self._containers()
        holdings = self.wing.holdings(containers)
        yield GaugeMetricFamily(
            "cdigen_pod_resources_up",
            "1 when the kubelet's PodResources API answered this scrape, else 0.",
            1 if up else 0,
        )
        yield from _pod_families(holdings)
        gpus = self.wing.gpus()
        slots = self.wing.slots()
        used = self.wing.used(holdings)
        shares = GaugeMetricFamily(
            "cdigen_gpu_shares",
            "Devices the plugin offers on each GPU (shares, MIG devices, the GPU itself), by "
            "resource (or DRA driver) and state (used or free).",
            labels=["gpu_uuid", "resource", "state"],
        )
        counts: dict[tuple[str, str], list[int]] = {}
        for slot in slots:
            pair = counts.setdefault((slot.gpu_uuid, slot.resource), [0, 0])
            pair[0 if (slot.resource, slot.device) in used else 1] += 1
        for (gpu_uuid, resource), (n_used, n_free) in sorted(counts.items()):
            shares.add_metric([gpu_uuid, resource, "used"], n_used)
            shares.add_metric([gpu_uuid, resource, "free"], n_free)
        yield shares
        total = GaugeMetricFamily(
            "cdigen_gpu_memory_bytes", "Memory of each GPU.", labels=["gpu_uuid"]
        )
        allocated = GaugeMetricFamily(
            "cdigen_gpu_memory_allocated_bytes",
            "Memory of each GPU given to containers as limits (each allocation once).",
            labels=["gpu_uuid"],
        )
        given = _allocated(holdings)
        for gpu in gpus:
            total.add_metric([gpu.uuid], gpu.memory_bytes)
            allocated.add_metric([gpu.uuid], given.get(gpu.uuid, 0))
        yield total
        yield allocated
        yield from self._health_families(gpus, slots)
        events, last = self.xids.counts()
        xid_events = CounterMetricFamily(
            "cdigen_gpu_xid_events",
            "Critical Xid events that changed a GPU's health reason.",
            labels=["gpu_uuid"],
        )
        last_xid = GaugeMetricFamily(
            "cdigen_gpu_last_xid",
            "The last critical Xid of each GPU (0: none since the plugin started).",
            labels=["gpu_uuid"],
        )
        for gpu in gpus:
            xid_events.add_metric([gpu.uuid], events.get(gpu.uuid, 0))
            last_xid.add_metric([gpu.uuid], last.get(gpu.uuid, 0))
        yield xid_events
        yield last_xid

    def _health_families(self, gpus: Sequence[Any], slots: Sequence[Any]) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        down: set[str] = set()
        if self._board is not None:
            reasons = self._board.snapshot()[1]
            down = {s.gpu_uuid for s in slots if reasons.get(s.device)}
        healthy = GaugeMetricFamily(
            "cdigen_gpu_healthy",
            "1 while no device on the GPU is Unhealthy, else 0.",
            labels=["gpu_uuid"],
        )
        for gpu in gpus:
            healthy.add_metric([gpu.uuid], 0 if gpu.uuid in down else 1)
        yield healthy


def _pod_families(holdings: Sequence[Holding]) -> Iterator[Any]:
    from prometheus_client.core import GaugeMetricFamily

    labels = ["namespace", "pod", "container", "gpu_uuid", "kind", "source"]
    devices = GaugeMetricFamily(
        "cdigen_pod_gpu_devices",
        "Devices (whole GPU, MIG devices, shares) a container holds of a GPU, by source "
        "(extended resource or claim).",
        labels=labels,
    )
    limits = GaugeMetricFamily(
        "cdigen_pod_gpu_memory_limit_bytes",
        "Memory a container was given on a GPU (absent where nothing limits it).",
        labels=labels,
    )
    for h in holdings:
        values = [
            printable_name(h.namespace),
            printable_name(h.pod),
            printable_name(h.container),
            h.gpu_uuid,
            h.kind,
            printable_name(h.source),
        ]
        devices.add_metric(values, len(h.devices))
        if h.memory_limit_bytes is not None:
            limits.add_metric(values, h.memory_limit_bytes)
    yield devices
    yield limits


def _allocated(holdings: Sequence[Holding]) -> dict[str, int]:
    """Per GPU UUID: the memory limits given, each allocation counted once."""
    seen: dict[tuple[str, str], int] = {}
    for h in holdings:
        if h.memory_limit_bytes is not None:
            seen[(h.gpu_uuid, h.allocation)] = h.memory_limit_bytes
    out: dict[str, int] = {}
    for (gpu, _), limit in seen.items():
        out[gpu] = out.get(gpu, 0) + limit
    return out


__all__ = ["AttributionCollector", "Slot", "Wing", "XidCounter"]
