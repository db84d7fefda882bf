"""Device health from NVML Xid events (reported to :mod:`cdigen.plugin.agent.health`), and the
Xid policy both wings are given the same way: its defaults and the flags that change them
(``--ignored-xids``, ``--recover-after-seconds``: the device plugin's config keys
``health.ignoredXids`` and ``health.recoverAfterSeconds``)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdigen.errors import InputError
from cdigen.plugin.agent.health import SOURCE_XID, HealthBoard, Reason

if TYPE_CHECKING:
    import argparse

log = logging.getLogger(__name__)

# Application errors (bad kernel, illegal address, ...): the GPU itself is fine. NVIDIA's plugin
# skips the same set.
DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68, 109)
# Quiet time after a critical Xid before a GPU that answers a probe is Healthy again.
DEFAULT_RECOVER_AFTER_S = 60.0
MAX_RECOVER_AFTER_S = 604800.0  # a week: the config schema's maximum of recoverAfterSeconds
MAX_XID = 4294967295  # an Xid is an unsigned 32-bit number in NVML's event data


def add_xid_options(parser: argparse.ArgumentParser, *, defaults: str) -> None:
    """``--ignored-xids`` and ``--recover-after-seconds`` on ``parser``; ``defaults`` says in
    the help where an unset flag's value comes from. Both parse to None when not given."""
    ignored = ",".join(str(x) for x in DEFAULT_IGNORED_XIDS)
    parser.add_argument(
        "--ignored-xids",
        metavar="LIST",
        help="comma-separated Xids that leave a GPU healthy (application errors; config key "
        f"health.ignoredXids; {defaults} {ignored}; '' ignores none)",
    )
    parser.add_argument(
        "--recover-after-seconds",
        metavar="SECONDS",
        help="quiet time after a critical Xid before a GPU that answers NVML is healthy again "
        f"(config key health.recoverAfterSeconds; {defaults} {DEFAULT_RECOVER_AFTER_S:g})",
    )


def xid_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The flags of :func:`add_xid_options` that were given, parsed: ``ignored_xids`` (sorted)
    and ``recover_after_s``, the names of both wings' settings; InputError on a bad value."""
    out: dict[str, Any] = {}
    if args.ignored_xids is not None:
        xids = parse_xids(args.ignored_xids, where="--ignored-xids")
        out["ignored_xids"] = tuple(sorted(set(xids)))
    if args.recover_after_seconds is not None:
        out["recover_after_s"] = parse_recover_after(
            args.recover_after_seconds, where="--recover-after-seconds"
        )
    return out


def parse_xids(text: str, *, where: str) -> list[int]:
    """``13,31,43`` as Xid numbers; InputError naming ``where`` on anything else."""
    try:
        xids = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        xids = [-1]
    if any(not 0 <= x <= MAX_XID for x in xids):
        raise InputError(
            f"expected comma-separated Xid numbers, got {text!r}", where=where, hint="e.g. 13,31,43"
        )
    return xids


def parse_recover_after(text: str, *, where: str) -> float:
    """Seconds from 0 to a week; InputError naming ``where`` on anything else."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= MAX_RECOVER_AFTER_S:  # NaN fails too
        raise InputError(
            f"{text!r} is not a number of seconds from 0 to {MAX_RECOVER_AFTER_S:g}",
            where=where,
            hint="e.g. 60",
        )
    return seconds


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
        self._poller: threading.Thread | None = None

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

    def start(self, poll_interval_s: float | None = None) -> None:
        """Wait for events in a daemon thread; with ``poll_interval_s``, also :meth:`poll` that
        often in another, for a wing with no poller of its own (without polls a GPU that went
        quiet would never be Healthy again)."""
        self._thread = threading.Thread(target=self._run, name="xid-events", daemon=True)
        self._thread.start()
        if poll_interval_s is not None:
            self._poller = threading.Thread(
                target=self._poll_every, args=(poll_interval_s,), name="xid-poll", daemon=True
            )
            self._poller.start()

    def _poll_every(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.poll()
            except Exception:  # the next poll may succeed: keep polling
                log.exception("probing the GPUs failed")

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
        for thread in (self._thread, self._poller):
            if thread is not None:
                thread.join(timeout=5)
        if self._event_set is not None:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
