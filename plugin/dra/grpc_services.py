"""The DRA kubelet plugin's gRPC services: thin translations between messages and the library.

- ``DRAPlugin`` (dra/v1 and dra/v1beta1, the same handlers): NodePrepareResources and
  NodeUnprepareResources, one answer per claim, an error belonging to its claim only.
- ``Registration`` (pluginregistration/v1): the kubelet's plugin watcher asks GetInfo and tells
  us the result in NotifyRegistrationStatus.
- ``DRAResourceHealth`` (dra-health/v1alpha1): a stream of device health for kubelets that ask.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from cdigen.plugin.agent.health import HealthBoard
from cdigen.plugin.dra.claims import ClaimRef
from cdigen.plugin.dra.metrics import DraMetrics
from cdigen.plugin.dra.prepare import Preparer
from cdigen.plugin.dra.status import StatusWriter

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# The kubelet matches these strings exactly, newest first.
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
HEALTH_RESEND_S = 30.0
# Prepare may wait on the API server; at most this many run at once, so that unprepare (which
# needs no API) and the health stream always find a worker of the DRA server's pool.
PREPARE_SLOTS = 8
DRA_WORKERS = 32


def _claim_refs(request: Any) -> list[ClaimRef]:
    """The request's claims, each UID once (the answer is a map by UID)."""
    refs = {c.uid: ClaimRef(c.namespace, c.uid, c.name) for c in request.claims}
    return list(refs.values())


class DraService:
    """``DRAPlugin`` for one API version (``pb`` is its generated ``*_pb2`` module)."""

    def __init__(
        self,
        preparer: Preparer,
        pb: ModuleType,
        slots: threading.BoundedSemaphore | None = None,
        metrics: DraMetrics | None = None,
        status: StatusWriter | None = None,
    ) -> None:
        self._preparer = preparer
        self._pb = pb
        self._slots = slots or threading.BoundedSemaphore(PREPARE_SLOTS)
        self._metrics = metrics
        self._status = status

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        """Prepare every claim of the request; each answer carries its devices or its error."""
        if self._metrics is None:
            return self._prepare(request)
        with self._metrics.observe_call("NodePrepareResources"):
            response = self._prepare(request)
        for answer in response.claims.values():
            if answer.error:
                self._metrics.observe_claim_error("NodePrepareResources")
        return response

    def _unprepare(self, request: Any, response: Any) -> None:
        for ref in _claim_refs(request):
            error = response.claims[ref.uid].error = self._preparer.unprepare(ref)
            if not error and self._status is not None:
                self._status.unprepared(ref.namespace, ref.name, ref.uid)

    def _prepare(self, request: Any) -> Any:
        pb = self._pb
        response = pb.NodePrepareResourcesResponse()
        for ref in _claim_refs(request):
            with self._slots:
                result = self._preparer.prepare(ref)
            answer = response.claims[ref.uid]
            if result.error:
                answer.error = result.error
                continue
            if self._status is not None:
                self._status.prepared(ref.namespace, ref.name, ref.uid, result.devices)
            for device in result.devices:
                entry = answer.devices.add(
                    request_names=device["requestNames"],
                    pool_name=device["poolName"],
                    device_name=device["deviceName"],
                    cdi_device_ids=device["cdiDeviceIds"],
                )
                if device["shareId"] and "share_id" in entry.DESCRIPTOR.fields_by_name:
                    entry.share_id = device["shareId"]
        return response

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        """Unprepare every claim of the request (unknown claims are a success)."""
        response = self._pb.NodeUnprepareResourcesResponse()
        if self._metrics is None:
            self._unprepare(request, response)
            return response
        with self._metrics.observe_call("NodeUnprepareResources"):
            self._unprepare(request, response)
        for answer in response.claims.values():
            if answer.error:
                self._metrics.observe_claim_error("NodeUnprepareResources")
        return response


@dataclass
class RegistrationState:
    """What the kubelet last told us about our registration (for logs, /healthz and tests)."""

    registered: bool = False
    error: str = ""
    calls: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)
    # set the first time the kubelet registers us, never cleared: the HTTP worker starts then
    once: threading.Event = field(default_factory=threading.Event)

    def wait_registered(self, timeout_s: float) -> bool:
        """Block until the kubelet reports a successful registration, or the timeout."""
        with self.changed:
            return self.changed.wait_for(lambda: self.registered, timeout=timeout_s)


class RegistrationService:
    """``pluginregistration.Registration`` for one DRA driver."""

    def __init__(
        self,
        driver: str,
        endpoint: Path,
        state: RegistrationState,
        on_register: Callable[[], None] | None = None,
    ) -> None:
        self._driver = driver
        self._endpoint = endpoint
        self.state = state
        # a (re-)registration: a restarted kubelet has deleted the node's slices
        self._on_register = on_register or (lambda: None)

    def GetInfo(self, request: Any, context: Any) -> Any:
        """Our type, driver name, DRA socket (as the kubelet sees it) and API versions."""
        from cdigen.plugin.dra.api import pluginregistration_v1_pb2 as reg_pb

        self._on_register()
        return reg_pb.PluginInfo(
            type=PLUGIN_TYPE,
            name=self._driver,
            endpoint=str(self._endpoint),
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        """Log the kubelet's verdict; a refusal is logged with the kubelet's reason."""
        from cdigen.plugin.dra.api import pluginregistration_v1_pb2 as reg_pb

        with self.state.changed:
            self.state.calls += 1
            self.state.registered = request.plugin_registered
            self.state.error = request.error
            self.state.changed.notify_all()
        if request.plugin_registered:
            self.state.once.set()
        if request.plugin_registered:
            log.info("the kubelet registered DRA driver %s", self._driver)
            self._on_register()
        else:
            log.error("the kubelet refused DRA driver %s: %s", self._driver, request.error)
        return reg_pb.RegistrationStatusResponse()


class HealthService:
    """``DRAResourceHealth``: every device's health now, then again on each change."""

    def __init__(self, board: HealthBoard, pool: str, stop: threading.Event) -> None:
        self._board = board
        self._pool = pool
        self._stop = stop

    def _message(self, reasons: dict[str, tuple[str, ...]]) -> Any:
        from cdigen.plugin.dra.api import dra_health_v1alpha1_pb2 as health_pb

        now = int(time.time())
        response = health_pb.NodeWatchResourcesResponse()
        for device, why in sorted(reasons.items()):
            response.devices.add(
                device=health_pb.DeviceIdentifier(pool_name=self._pool, device_name=device),
                health=health_pb.UNHEALTHY if why else health_pb.HEALTHY,
                last_updated_time=now,
                message="; ".join(why),
            )
        return response

    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
        """Stream the health of every device until the client or the plugin goes away."""
        version, reasons = self._board.snapshot()
        yield self._message(reasons)
        while not self._stop.is_set() and context.is_active():
            seen = version
            version = self._board.wait_for_change(seen, HEALTH_RESEND_S)
            if self._stop.is_set():
                return
            if version != seen:
                version, reasons = self._board.snapshot()
                yield self._message(reasons)


class UnixServer:
    """A gRPC server on a unix socket, with its services added by ``add``; 0600 socket."""

    def __init__(self, path: Path, add: Callable[[Any], None], *, workers: int = 4) -> None:
        self.path = path
        self._add = add
        self._workers = workers
        self._server: Any = None

    def start(self) -> None:
        """Listen on a fresh socket (a stale file at the path is removed first)."""
        from cdigen.plugin.agent.grpc_unix import serve_unix
        from cdigen.plugin.agent.sockets import make_plugin_dir

        # the device plugin's socket handling: 0755 dirs and a 0600 socket, whatever the umask
        make_plugin_dir(self.path.parent, flag="--kubelet-dir")
        self._server, _ = serve_unix(
            self.path, self._add, workers=self._workers, thread_prefix="dra", flag="--kubelet-dir"
        )
        log.info("listening on %s", self.path)

    def stop(self) -> None:
        """Stop serving and remove the socket."""
        if self._server is not None:
            self._server.stop(grace=0.2).wait(timeout=2)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def dra_services(
    preparer: Preparer,
    health: HealthService,
    metrics: DraMetrics | None = None,
    status: StatusWriter | None = None,
) -> Callable[[Any], None]:
    """Adds dra/v1, dra/v1beta1 and dra-health/v1alpha1 to a server."""

    def add(server: Any) -> None:
        from cdigen.plugin.dra.api import (
            dra_health_v1alpha1_pb2_grpc,
            dra_v1_pb2,
            dra_v1_pb2_grpc,
            dra_v1beta1_pb2,
            dra_v1beta1_pb2_grpc,
        )

        slots = threading.BoundedSemaphore(PREPARE_SLOTS)  # shared by both API versions
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
            DraService(preparer, dra_v1_pb2, slots, metrics, status), server
        )
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
            DraService(preparer, dra_v1beta1_pb2, slots, metrics, status), server
        )
        dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(health, server)

    return add


def registration_service(service: RegistrationService) -> Callable[[Any], None]:
    """Adds pluginregistration/v1 to a server."""

    def add(server: Any) -> None:
        from cdigen.plugin.dra.api import pluginregistration_v1_pb2_grpc

        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(service, server)

    return add


def socket_paths(kubelet_dir: Path, driver: str) -> tuple[Path, Path]:
    """``(registration socket, DRA socket)`` under the kubelet dir, as the kubelet expects."""
    return (
        kubelet_dir / "plugins_registry" / f"{driver}-reg.sock",
        kubelet_dir / "plugins" / driver / "dra.sock",
    )
