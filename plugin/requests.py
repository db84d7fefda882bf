"""One kubelet request at a time: checking ID lists, quoting IDs, the policy's queue, and
answers without a policy."""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any

from plugin.api import deviceplugin_pb2 as pb

ECHOED_ID_CHARS = 64  # an ID quoted in an error or a log line is cut to this many characters


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


def fallback_preference(
    available: tuple[str, ...], must_include: tuple[str, ...], size: int
) -> tuple[str, ...]:
    """A valid answer without any policy: the must-include devices, then the first available."""
    chosen = list(dict.fromkeys(must_include))
    for device in available:
        if len(chosen) >= size:
            break
        if device not in chosen:
            chosen.append(device)
    return tuple(chosen[:size])
