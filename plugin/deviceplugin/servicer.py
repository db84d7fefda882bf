"""The DevicePlugin servicer: kubelet messages in, library calls, kubelet messages out."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from cdigen.plugin.agent.health import HealthBoard
from cdigen.plugin.deviceplugin.api import deviceplugin_pb2 as pb
from cdigen.plugin.deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc
from cdigen.plugin.deviceplugin.call_records import SUMMARY_INTERVAL_S, CallSummary, RequestRecorder
from cdigen.plugin.deviceplugin.kubelet_requests import (
    AllocateRefused,
    FifoGate,
    PreferenceRequest,
    RequestInvalid,
    allocation_requests,
    call_ended,
    describe_response,
    fallback_preference,
    preference_requests,
    short_id,
)
from cdigen.plugin.deviceplugin.native_edits import EditsLookup, add_mounts, fill_native
from cdigen.plugin.deviceplugin.resources import AdvertisedDevice
from cdigen.plugin.deviceplugin.resources import (
    advertised_devices as advertised_devices,  # re-exported
)
from cdigen.plugin.deviceplugin.sharing import ShareAllocation, ShareRefused

if TYPE_CHECKING:
    from cdigen.plugin.deviceplugin.metrics import Method, PluginMetrics

log = logging.getLogger("cdigen.plugin")

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
ANNOTATION_PREFIX = "cdi.k8s.io/"
PLUGIN_NAME = "cdigen"
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
DRIVER_CAPABILITIES_ENV = "NVIDIA_DRIVER_CAPABILITIES"  # read by nvidia-container-runtime
LOGGED_IDS = 3  # at most this many unknown IDs are named in one warning


@dataclass(frozen=True)
class Preference:
    """A policy's preferred devices, with its link score where the policy computed one."""

    devices: tuple[str, ...]
    link_score: int | None = None
    fallback: bool = False  # no set met the policy; the allocator fell back


Preferrer = Callable[[PreferenceRequest], Preference]
# Turns the shares allocated to one container into what it gets; raises ShareRefused.
ShareAllocator = Callable[[Sequence[AdvertisedDevice]], ShareAllocation]


@dataclass(frozen=True)
class Advertised:
    """What one service advertises: read once per call, swapped whole on a new layout, so a
    gRPC thread never checks a request against one layout and answers from another."""

    devices: tuple[AdvertisedDevice, ...]
    by_id: Mapping[str, AdvertisedDevice]  # the same devices, by the ID the kubelet sees

    @classmethod
    def of(cls, devices: Sequence[AdvertisedDevice]) -> Advertised:
        """``devices``, indexed by ID."""
        devices = tuple(devices)
        return cls(devices, {d.id: d for d in devices})


class DevicePluginService(pb_grpc.DevicePluginServicer):  # type: ignore[misc]
    """Serves one resource: its device list, health stream, preferences and allocations."""

    def __init__(
        self,
        *,
        resource: str,
        devices: Sequence[AdvertisedDevice],
        board: HealthBoard,
        cdi_kind: str,
        strategy: str,
        prefer: Callable[[], Preferrer],
        edits: EditsLookup | None = None,
        stop: threading.Event | None = None,
        watch_tick_s: float = 1.0,
        metrics: PluginMetrics | None = None,
        share: ShareAllocator | None = None,
        capability_names: Sequence[str] = (),
        driver_capabilities: Sequence[str] = (),
        recorder: RequestRecorder | None = None,
        summary_interval_s: float = SUMMARY_INTERVAL_S,
    ) -> None:
        self.resource = resource
        self._recorder = recorder
        self._share = share
        # capability devices every container gets after its GPUs (CDI strategies and native)
        self._capability_names = tuple(capability_names)
        # the same for the envvar strategy, as nvidia-container-runtime reads them ("" = its own)
        self._driver_capabilities = ",".join(driver_capabilities)
        self.cdi_kind = cdi_kind
        self._advertised = Advertised.of(devices)
        self._board = board
        self.strategy = strategy
        self._prefer = prefer
        self._edits = edits
        self._stop = stop or threading.Event()
        self._watch_tick_s = watch_tick_s
        self._metrics = metrics
        self._options = pb.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )
        self._policy_gate = FifoGate()  # one policy computation at a time (see FifoGate)
        self._allocate_summary = CallSummary(f"Allocate {resource}", self._stop, summary_interval_s)

    def set_devices(self, devices: Sequence[AdvertisedDevice]) -> None:
        """Advertise ``devices`` from now on (a new MIG layout); streams resend on the next
        health-board change."""
        self._advertised = Advertised.of(devices)

    def wake_streams(self) -> None:
        """Let open ListAndWatch streams notice that the server is stopping; log the calls
        since the last summary."""
        self._board.wake_waiters()
        self._allocate_summary.flush()

    def _observe(self, method: Method) -> contextlib.AbstractContextManager[None]:
        """Counts and times one call (an exception inside, aborts included, counts as an error)."""
        if self._metrics is None:
            return contextlib.nullcontext()
        return self._metrics.observe_request(method, self.resource)

    # --- the DevicePlugin service -------------------------------------------------------------

    def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        """Our options: no PreStartContainer, GetPreferredAllocation available."""
        return self._options

    def _device_list(self, reasons: dict[str, tuple[str, ...]]) -> pb.ListAndWatchResponse:
        """The full device list with health from ``reasons`` and NUMA affinity."""
        out = pb.ListAndWatchResponse()
        for device in self._advertised.devices:
            item = out.devices.add(
                ID=device.id, health=UNHEALTHY if reasons.get(device.id) else HEALTHY
            )
            if device.numa_node is not None:
                item.topology.nodes.add(ID=device.numa_node)
        return out

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:
        """The full list now, then again after every health change, until the stream ends."""
        sent = -1
        context.add_callback(self._board.wake_waiters)  # a cancelled stream ends at once
        while not self._stop.is_set() and context.is_active():
            version, reasons = self._board.snapshot()
            if version != sent:
                sent = version
                yield self._device_list(reasons)
            self._board.wait_for_change(sent, self._watch_tick_s)

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        """One preferred set per container request, chosen by the allocation policy."""
        out = pb.PreferredAllocationResponse()
        with self._observe("GetPreferredAllocation"):
            if self._recorder is not None:
                for creq in request.container_requests:
                    self._recorder.record(
                        creq.available_deviceIDs,
                        creq.must_include_deviceIDs,
                        int(creq.allocation_size),
                    )
            try:  # the one check of the request: the layers below take it as it is
                asks = preference_requests(request, self._advertised.by_id, self.resource)
            except RequestInvalid as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            for ask in asks:
                chosen = self.preferred(ask, ended=lambda: call_ended(context))
                if chosen is None:  # the call ended (client gone, server stopping) as it waited
                    context.abort(grpc.StatusCode.CANCELLED, "the call ended before its turn")
                    return out  # not reached: abort raises
                out.container_responses.add(deviceIDs=list(chosen))
        return out

    def preferred(
        self, request: PreferenceRequest, ended: Callable[[], threading.Event] | None = None
    ) -> tuple[str, ...] | None:
        """The preferred devices for a checked request (unknown available IDs were left out,
        never an error); None when the event ``ended`` makes was set (the call was cancelled
        or the server stops) while the request waited for its turn at the policy (it is made
        only when the request must wait)."""
        self._log_request_faults(request)
        gate = self._policy_gate
        if not gate.try_acquire() and not gate.acquire(ended() if ended else threading.Event()):
            return None
        try:
            answer = self._prefer()(request)
        except Exception as exc:  # the policy must never fail the kubelet's request
            log.error("allocation policy failed (%s); answering without it", exc)
            return fallback_preference(request)
        finally:
            self._policy_gate.release()
        chosen = answer.devices
        pool = set(request.ids)
        if (
            len(chosen) != request.size
            or not set(chosen) <= pool
            or not set(request.must_ids) <= set(chosen)
        ):
            log.error("allocation policy gave an invalid answer %s; answering without it", chosen)
            return fallback_preference(request)
        if self._metrics is not None and answer.link_score is not None:
            self._metrics.observe_link_score(
                self.resource, answer.link_score, fallback=answer.fallback
            )
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "GetPreferredAllocation %s: available=[%s] must=[%s] size=%d -> [%s] "
                "(link score %s%s)",
                self.resource,
                ",".join(request.ids),
                ",".join(request.must_ids),
                request.size,
                ",".join(chosen),
                answer.link_score,
                ", policy fell back" if answer.fallback else "",
            )
        return tuple(chosen)

    def _log_request_faults(self, request: PreferenceRequest) -> None:
        """One warning each for the unknown available IDs left out and the must-include
        devices the available list lacked."""
        ignored = request.ignored
        if ignored:
            log.warning(
                "preferred allocation: ignoring %d unknown available ID(s): %s%s",
                len(ignored),
                ", ".join(short_id(d) for d in ignored[:LOGGED_IDS]),
                ", …" if len(ignored) > LOGGED_IDS else "",
            )
        outside = request.outside
        if outside:
            log.warning(
                "preferred allocation for %s: must-include device(s) %s%s not in the request's "
                "available list; answering with them included",
                self.resource,
                ", ".join(short_id(d) for d in outside[:LOGGED_IDS]),
                ", …" if len(outside) > LOGGED_IDS else "",
            )

    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        """For each container: the devices, handed over as the configured strategy says."""
        start, ok = time.monotonic(), False
        try:
            with self._observe("Allocate"):
                response = self._allocate(request, context)
            ok = True
            return response
        finally:
            self._allocate_summary.record(time.monotonic() - start, ok=ok)

    def _allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        out = pb.AllocateResponse()
        try:  # the one check of the request: the layers below take it as it is
            containers = allocation_requests(request, self._advertised.by_id, self.resource)
        except RequestInvalid as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        for index, devices in enumerate(containers):
            try:
                response = self.container_response(devices)
            except (ShareRefused, AllocateRefused) as exc:
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION, f"container request {index}: {exc}"
                )
            out.container_responses.append(response)
            if log.isEnabledFor(logging.DEBUG):  # INFO: CallSummary's line every minute
                log.debug(
                    "Allocate %s: [%s] -> %s (%s)",
                    self.resource,
                    ",".join(d.id for d in devices),
                    describe_response(response),
                    self.strategy,
                )
        return out

    def container_response(
        self, devices: Sequence[AdvertisedDevice]
    ) -> pb.ContainerAllocateResponse:
        """The response for one container's checked ``devices``, following the device list
        strategy; shares of a GPU add their limits (environment) and the MPS pipe directory
        (mount); the resource's capability devices follow the GPUs' CDI names. AllocateRefused
        (or ShareRefused) when what is in force cannot serve them."""
        shared = self._share(devices) if self._share is not None else None
        if shared is not None:
            names = list(shared.cdi_names)
        else:
            # several IDs of one GPU carry the same CDI name: hand it over once
            names = list(dict.fromkeys(n for d in devices for n in d.cdi_names))
        names += [n for n in self._capability_names if n not in names]
        response = pb.ContainerAllocateResponse()
        if self.strategy == "cdi-cri":
            response.cdi_devices.extend(pb.CDIDevice(name=n) for n in names)
        elif self.strategy == "cdi-annotations":
            key = f"{ANNOTATION_PREFIX}{PLUGIN_NAME}_{uuidlib.uuid4()}"
            response.annotations[key] = ",".join(names)
        elif self.strategy == "envvar":
            visible = shared.gpu_uuids if shared is not None else (d.id for d in devices)
            response.envs[VISIBLE_DEVICES_ENV] = ",".join(visible)
            if self._driver_capabilities:
                response.envs[DRIVER_CAPABILITIES_ENV] = self._driver_capabilities
        elif self.strategy == "native":
            if self._edits is None:
                raise AllocateRefused("the native strategy needs CDI specs; none were loaded")
            fill_native(response, self._edits(names))
        else:  # config validation keeps this from happening
            raise AllocateRefused(f"unknown device list strategy {self.strategy}")
        if shared is not None:
            response.envs.update(shared.env_dict())
            add_mounts(response, shared.mounts)
        return response

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        """Nothing to do before a container starts."""
        return pb.PreStartContainerResponse()
