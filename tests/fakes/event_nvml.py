"""A double of pynvml's event API (plus the probe calls) with events the test injects."""

from __future__ import annotations

import queue
from typing import Any

import pynvml


class EventNvml:
    """A double shaped like pynvml's event API (plus the probe calls), with injectable events."""

    NVMLError = pynvml.NVMLError
    NVMLError_Timeout = pynvml.NVMLError_Timeout
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    class EventData:
        def __init__(self, device: str, event_type: int, data: int) -> None:
            self.device = device
            self.eventType = event_type
            self.eventData = data
            self.gpuInstanceId = 0xFFFFFFFF
            self.computeInstanceId = 0xFFFFFFFF

    def __init__(self, uuids: list[str], *, unregistrable: tuple[str, ...] = ()) -> None:
        self.uuids = uuids
        self.lost: set[str] = set()
        self.unregistrable = unregistrable
        self.registered: list[tuple[str, int]] = []
        self.events: queue.Queue[EventNvml.EventData] = queue.Queue()
        self.freed = False

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.freed = True

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        if uuid not in self.uuids:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return f"handle:{uuid}"

    def nvmlDeviceGetUUID(self, handle: str) -> str:
        return handle.removeprefix("handle:")

    def nvmlDeviceRegisterEvents(self, handle: str, types: int, event_set: str) -> None:
        if self.nvmlDeviceGetUUID(handle) in self.unregistrable:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.registered.append((handle, types))

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> object:
        if self.nvmlDeviceGetUUID(handle) in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return object()

    def xid(self, uuid: str, xid: int) -> None:
        self.events.put(self.EventData(f"handle:{uuid}", self.nvmlEventTypeXidCriticalError, xid))
