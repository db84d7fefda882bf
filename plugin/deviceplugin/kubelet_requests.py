"""One kubelet request at a time: the typed request the gRPC edge checks once, quoting IDs, the
policy's queue, and answers without a policy.

Allocate and GetPreferredAllocation are checked here, once, against the devices the service
advertises: :func:`allocation_requests` and :func:`preference_requests` turn the kubelet's
message into typed values holding the advertised devices themselves (each with its catalogue
entry: GPU, position, kind), or raise :class:`RequestInvalid` (``INVALID_ARGUMENT``). The layers
after them (the policy's engine, the share hand-out, the response) take those values as they
are and never look an ID up again."""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from cdigen.errors import CdigenError
from cdigen.plugin.deviceplugin.api import deviceplugin_pb2 as pb
from cdigen.plugin.deviceplugin.resources import AdvertisedDevice

ECHOED_ID_CHARS = 64  # an ID quoted in an error or a log line is cut to this many characters

log = logging.getLogger("cdigen.plugin")


def call_ended(context: Any) -> threading.Event:
    """An event set when the gRPC call ends (cancelled, past its deadline, server stopping)."""
    ended = threading.Event()
    if not context.add_callback(ended.set):  # it has ended already
        ended.set()
    return ended


def short_id(device_id: str) -> str:
    """``device_id`` as errors and logs quote it: whole when short, else its first 64 characters
    and its length (a 1 MB ID would overflow gRPC's 8 KB metadata limit in a status message)."""
    if len(device_id) <= ECHOED_ID_CHARS:
        return device_id
    return f"{device_id[:ECHOED_ID_CHARS]}…({len(device_id.encode(errors='replace'))} bytes)"


def id_list_problem(ids: Sequence[str], what: str) -> str | None:
    """Why the device ID list ``ids`` (named ``what`` in the message) is malformed: empty, or an
    ID listed more than once; None when it is fine."""
    if not ids:
        return f"no {what} device IDs: the request must list at least one"
    if len(set(ids)) == len(ids):
        return None
    counts = Counter(ids)
    twice = next(d for d in ids if counts[d] > 1)
    return (
        f"{what} device {short_id(twice)} is listed {counts[twice]} times: "
        "each device may appear once"
    )


class RequestInvalid(Exception):
    """The kubelet's request itself is malformed (answered ``INVALID_ARGUMENT``); the message
    names the container request when there are several."""


class AllocateRefused(CdigenError):
    """A well-formed Allocate the plugin cannot serve with what is in force (the CDI specs, the
    config): answered ``FAILED_PRECONDITION`` with the message."""


@dataclass(frozen=True)
class PreferenceRequest:
    """One container's GetPreferredAllocation request, checked (see :func:`check_preference`).

    ``candidates``: the advertised devices the answer may hold: those of the available list the
    service advertises, in the kubelet's order, then any must-include device that list lacks;
    ``ids`` are their IDs, in the same order (the strings the kubelet sent, kept so that no
    layer reads them back out of the devices). ``must``: indexes into ``candidates`` of the
    must-include devices, in the order asked. ``ignored``: available IDs the service does not
    advertise (left out; the kubelet may list devices of an older layout). ``outside``: the
    must-include IDs the available list lacked."""

    candidates: tuple[AdvertisedDevice, ...]
    ids: tuple[str, ...]
    must: tuple[int, ...]
    size: int
    ignored: tuple[str, ...] = ()
    outside: tuple[str, ...] = ()

    @cached_property
    def must_ids(self) -> tuple[str, ...]:
        """The must-include devices' IDs, in the order asked."""
        return tuple(self.ids[k] for k in self.must)


def check_preference(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    devices: Mapping[str, AdvertisedDevice],
    resource: str,
) -> PreferenceRequest:
    """One container's preferred-allocation request against the advertised ``devices`` (by ID)
    of ``resource``; RequestInvalid saying what is malformed."""
    if size < 1:
        raise RequestInvalid(f"allocation size {size}: must be at least 1")
    problem = id_list_problem(available, "available")
    if problem is None and must_include:
        problem = id_list_problem(must_include, "must-include")
    if problem is not None:
        raise RequestInvalid(problem)
    if len(must_include) > size:
        raise RequestInvalid(
            f"{len(must_include)} must-include devices but the allocation size is {size}: "
            "they cannot all be in the answer"
        )
    must_devices = []
    for device_id in must_include:
        device = devices.get(device_id)
        if device is None:
            raise RequestInvalid(
                f"must-include device {short_id(device_id)} is not advertised by {resource}"
            )
        must_devices.append(device)
    candidates: list[AdvertisedDevice] = []
    ids: list[str] = []
    ignored: list[str] = []
    for device_id in available:
        device = devices.get(device_id)
        if device is None:
            ignored.append(device_id)
        else:
            candidates.append(device)
            ids.append(device_id)
    must: tuple[int, ...] = ()
    outside: list[str] = []
    if must_devices:
        # The kubelet lists its must-include devices among the available ones; NVIDIA's
        # plugin answers with them included whatever the list says, and so do we.
        at = {device_id: k for k, device_id in enumerate(ids)}  # IDs are unique: checked
        for device_id, device in zip(must_include, must_devices, strict=True):
            if device_id not in at:
                at[device_id] = len(ids)
                outside.append(device_id)
                candidates.append(device)
                ids.append(device_id)
        must = tuple(at[device_id] for device_id in must_include)
    if size > len(candidates):
        raise RequestInvalid(f"allocation size {size} but {len(candidates)} device(s) available")
    return PreferenceRequest(
        tuple(candidates), tuple(ids), must, size, tuple(ignored), tuple(outside)
    )


def preference_requests(
    request: pb.PreferredAllocationRequest, devices: Mapping[str, AdvertisedDevice], resource: str
) -> tuple[PreferenceRequest, ...]:
    """Every container request of a GetPreferredAllocation, checked; RequestInvalid naming the
    container request at fault."""
    if not request.container_requests:
        raise RequestInvalid("no container requests")
    out = []
    for index, creq in enumerate(request.container_requests):
        try:
            out.append(
                check_preference(  # each protobuf string read once
                    tuple(creq.available_deviceIDs),
                    tuple(creq.must_include_deviceIDs),
                    int(creq.allocation_size),
                    devices,
                    resource,
                )
            )
        except RequestInvalid as exc:
            raise RequestInvalid(f"container request {index}: {exc}") from None
    return tuple(out)


def check_allocation(
    ids: Sequence[str], devices: Mapping[str, AdvertisedDevice], resource: str
) -> tuple[AdvertisedDevice, ...]:
    """The advertised devices one container is allocated, in the kubelet's order;
    RequestInvalid for an empty list, an ID listed twice or one ``resource`` does not
    advertise."""
    problem = id_list_problem(ids, "allocated")
    if problem is not None:
        raise RequestInvalid(problem)
    out = []
    for device_id in ids:
        device = devices.get(device_id)
        if device is None:
            raise RequestInvalid(
                f"unknown device {short_id(device_id)} for {resource} "
                f"(advertised: {len(devices)} devices)"
            )
        out.append(device)
    return tuple(out)


def allocation_requests(
    request: pb.AllocateRequest, devices: Mapping[str, AdvertisedDevice], resource: str
) -> tuple[tuple[AdvertisedDevice, ...], ...]:
    """Per container request of an Allocate, its devices, checked; RequestInvalid naming the
    container request at fault."""
    if not request.container_requests:
        raise RequestInvalid("no container requests")
    out = []
    for index, creq in enumerate(request.container_requests):
        try:
            out.append(check_allocation(tuple(creq.devices_ids), devices, resource))
        except RequestInvalid as exc:
            raise RequestInvalid(f"container request {index}: {exc}") from None
    return tuple(out)


class FifoGate:
    """One holder at a time, served in arrival order; a waiter leaves when its call ends.

    The allocation policy runs behind it, one computation per resource at a time: the policy is
    CPU-bound, so several at once only share the interpreter lock with each other and with the
    gRPC threads that answer Allocate, and every call gets slower (see benchmarks/bench_load.py).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: deque[threading.Event] = deque()
        self._busy = False

    def try_acquire(self) -> bool:
        """Take the gate if it is open and nobody waits (True); never waits."""
        with self._lock:
            if self._busy:
                return False
            self._busy = True
            return True

    def acquire(self, turn: threading.Event) -> bool:
        """Wait until ``turn`` is set: by :meth:`release` handing the gate over (True), or by
        the caller when its call ended while it waited (False, not holding the gate)."""
        with self._lock:
            if not self._busy:
                self._busy = True
                return True
            self._waiting.append(turn)
        turn.wait()
        with self._lock:
            if turn in self._waiting:  # woken by the caller, not handed over: leave the queue
                self._waiting.remove(turn)
                return False
        return True

    @property
    def waiting(self) -> int:
        """How many callers wait for their turn."""
        with self._lock:
            return len(self._waiting)

    def release(self) -> None:
        """Hand the gate to the longest waiter, or open it."""
        with self._lock:
            if self._waiting:
                self._waiting.popleft().set()
            else:
                self._busy = False


def describe_response(response: pb.ContainerAllocateResponse) -> str:
    """What one container is handed, in one short phrase for the Allocate log line."""
    parts = []
    if response.cdi_devices:
        parts.append("cdi_devices=[" + ",".join(d.name for d in response.cdi_devices) + "]")
    if response.annotations:
        parts.append("annotations=" + ",".join(f"{k}={v}" for k, v in response.annotations.items()))
    if response.envs:
        parts.append("envs=" + ",".join(f"{k}={v}" for k, v in sorted(response.envs.items())))
    if response.devices:
        parts.append(f"{len(response.devices)} device node(s)")
    if response.mounts:
        parts.append(f"{len(response.mounts)} mount(s)")
    return "; ".join(parts) or "nothing"


def fallback_preference(request: PreferenceRequest) -> tuple[str, ...]:
    """A valid answer without any policy: the must-include devices, then the first candidates
    (the check made sure they are no more than the size, and the candidates enough)."""
    chosen = list(request.must_ids)
    for device_id in request.ids:
        if len(chosen) == request.size:
            break
        if device_id not in chosen:
            chosen.append(device_id)
    return tuple(chosen)
