"""Device health from NVML Xid events (reported to :mod:`cdigen.plugin.agent.health`)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cdigen.plugin.agent.health import SOURCE_XID, HealthBoard, Reason

log = logging.getLogger(__name__)


@dataclass
class _XidState:
    last_xid: int
    last_seen: float


def xid_reason(xid: int) -> Reason:
    """The health reason of a critical Xid: its words, and the Xid as a number."""
    return Reason(f"critical Xid {xid}", xid=xid)


class XidHealth:
    """Health from NVML Xid events: critical Xids mark a GPU Unhealthy; after ``recover_after_s``
    without another critical Xid, a GPU that still answers a probe is Healthy again.

    ``nvml`` is the ``pynvml`` module (or a double shaped like it); it is initialised by the caller.
    """

    def __init__(
        self,
        nvml: Any,
        board: HealthBoard,
        uuids: Sequence[str],
        *,
        ignored_xids: Iterable[int],
        recover_after_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._board = board
        self._uuids = tuple(uuids)
        self._ignored = frozenset(ignored_xids)
        self._recover_after_s = recover_after_s
        self._clock = clock
        self._xids: dict[str, _XidState] = {}
        # the event thread and the poller both decide a GPU's Xid reason: one at a time, or a
        # poll that read no Xid state could clear an Xid that arrived while it probed
        self._xid_lock = threading.Lock()
        self._event_set: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self) -> None:
        """Create the event set and register every GPU for critical Xid events.

        A GPU that cannot be registered is reported Unhealthy: without events we could not
        tell when it fails.
        """
        nvml = self._nvml
        self._event_set = nvml.nvmlEventSetCreate()
        failed: dict[str, str | None] = {}
        for uuid in self._uuids:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                nvml.nvmlDeviceRegisterEvents(
                    handle, nvml.nvmlEventTypeXidCriticalError, self._event_set
                )
            except nvml.NVMLError as exc:
                failed[uuid] = f"cannot watch Xid events: {exc}"
        if failed:
            self._board.set_reasons(SOURCE_XID, failed)

    def handle_event(self, uuid: str, xid: int) -> None:
        """One Xid event on ``uuid``: critical ones mark it Unhealthy."""
        if xid in self._ignored:
            log.info("device %s: application Xid %d ignored", uuid, xid)
            return
        with self._xid_lock:
            self._xids[uuid] = _XidState(xid, self._clock())
            self._board.set_reasons(SOURCE_XID, {uuid: xid_reason(xid)})

    def wait_once(self, timeout_ms: int) -> bool:
        """Wait up to ``timeout_ms`` for one event and handle it; True if one arrived."""
        nvml = self._nvml
        try:
            data = nvml.nvmlEventSetWait_v2(self._event_set, timeout_ms)
        except nvml.NVMLError_Timeout:
            return False
        if data.eventType != nvml.nvmlEventTypeXidCriticalError:
            return True
        try:
            uuid = nvml.nvmlDeviceGetUUID(data.device)
        except nvml.NVMLError as exc:
            log.error("Xid %d on a device NVML cannot name (%s)", data.eventData, exc)
            return True
        if isinstance(uuid, bytes):
            uuid = uuid.decode()
        self.handle_event(str(uuid), int(data.eventData))
        return True

    def probe(self, uuid: str) -> str | None:
        """Ask NVML about the GPU; the failure, or None when it answers."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            nvml.nvmlDeviceGetMemoryInfo(handle)
        except nvml.NVMLError as exc:
            return str(exc) or type(exc).__name__
        return None

    def poll(self) -> None:
        """Periodic check: GPUs that stop answering go down; quiet ones that answer come back."""
        failures = {uuid: self.probe(uuid) for uuid in self._uuids}  # slow: outside the lock
        with self._xid_lock:
            now = self._clock()
            reasons: dict[str, str | None] = {}
            for uuid, failure in failures.items():
                state = self._xids.get(uuid)
                if failure is not None:
                    reasons[uuid] = f"NVML probe failed: {failure}"
                elif state is not None and now - state.last_seen < self._recover_after_s:
                    reasons[uuid] = xid_reason(state.last_xid)
                else:
                    self._xids.pop(uuid, None)
                    reasons[uuid] = None
            self._board.set_reasons(SOURCE_XID, reasons)

    def start(self) -> None:
        """Wait for events in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="xid-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.wait_once(500)
            except Exception:
                log.exception("waiting for NVML events failed; retrying in 1 s")
                self._stop.wait(1.0)

    def stop(self) -> None:
        """Stop waiting and free the event set."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._event_set is not None:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
