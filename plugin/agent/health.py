"""Device health: one board of reasons per device, fed by independent watchers.

A device is Healthy when no watcher holds a reason against it. Every watcher sets and clears
only its own reasons, so a device whose Xid storm has passed returns to Healthy even while
another watcher (a missing CDI name, say) still holds it down, and vice versa.

Watchers (:mod:`cdigen.plugin.agent.health_watchers` and :mod:`cdigen.plugin.agent.xid`):
- :func:`node_reasons` — discovery errors and simulated ``healthy: false`` in a node file;
  ``NodeWatcher`` re-reads the file when it changes (or re-runs NVML discovery periodically)
  and hands the node to the plugin, which also applies a new MIG layout.
- ``XidHealth`` — critical Xid errors from NVML events, with recovery after a quiet period when
  the device still answers (NVIDIA's plugin never recovers).
- ``SpecDirWatcher`` — every CDI name the plugin can hand out must exist in the spec dirs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from cdigen.model import Node

log = logging.getLogger("cdigen.plugin")

SOURCE_NODE = "node"
SOURCE_XID = "xid"
SOURCE_SPEC = "cdi-spec"


class Reason(str):
    """A health reason: its text (what the kubelet and the logs show) and, when an Xid event is
    the cause, the Xid as a number, so that no reader parses it back out of the text."""

    xid: int | None

    def __new__(cls, text: str, xid: int | None = None) -> Reason:
        reason = super().__new__(cls, text)
        reason.xid = xid
        return reason


class HealthBoard:
    """Thread-safe health reasons per device ID, with a version that changes on every change.

    ``parents`` maps a device ID to the GPU UUIDs it lives on (a MIG device: its parent GPU):
    a reason reported against a GPU UUID that is not itself a device applies to every device on
    that GPU, so an Xid on a MIG-enabled GPU marks all its MIG devices Unhealthy.

    The board is the one owner of health. A change is published in two steps: listeners first
    (the plugin rebuilds its layout there), then the version moves and waiting streams wake, so
    a kubelet that sees a device Healthy again gets preferences from an engine that knows it.
    """

    def __init__(
        self, device_ids: Iterable[str], parents: Mapping[str, Sequence[str]] | None = None
    ) -> None:
        self._reasons: dict[str, dict[str, str]] = {d: {} for d in device_ids}
        self._children = _children(self._reasons, parents or {})
        self._version = 0
        self._wakes = 0  # bumped by wake_waiters: a waiter returns though the version did not move
        self._changed = threading.Condition()
        self._listeners: list[Callable[[dict[str, tuple[str, ...]]], None]] = []
        self._held = 0  # > 0 inside hold(): changes are published when the last hold ends
        self._pending = False

    def subscribe(self, listener: Callable[[dict[str, tuple[str, ...]]], None]) -> None:
        """Call ``listener(reasons)`` now and after every change (as :meth:`snapshot` gives),
        before the version moves."""
        self._listeners.append(listener)
        listener(self.snapshot()[1])

    @property
    def version(self) -> int:
        """Bumped on every health change."""
        with self._changed:
            return self._version

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Make several changes one: nothing is published until the block ends (the reasons
        themselves change at once, so :meth:`snapshot` inside the block sees them)."""
        with self._changed:
            self._held += 1
        try:
            yield
        finally:
            with self._changed:
                self._held -= 1
                publish = self._held == 0 and self._pending
                if publish:
                    self._pending = False
            if publish:
                self._publish()

    def _changed_locked(self) -> bool:
        """Record a change (lock held); True when the caller must publish it."""
        if self._held:
            self._pending = True
            return False
        return True

    def _publish(self) -> None:
        """Listeners first, then the new version for the waiting streams."""
        if self._listeners:
            current = self.snapshot()[1]
            for listener in self._listeners:
                listener(current)
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def reset_devices(
        self, device_ids: Iterable[str], parents: Mapping[str, Sequence[str]] | None = None
    ) -> None:
        """Track ``device_ids`` from now on (a new layout): devices that stay keep their reasons,
        new ones start Healthy; a GPU's reasons pass to the devices now on it. Always a change."""
        with self._changed:
            old_reasons, old_children = self._reasons, self._children
            self._reasons = {d: dict(old_reasons.get(d, {})) for d in device_ids}
            self._children = _children(self._reasons, parents or {})
            for gpu, devices in self._children.items():
                inherited: dict[str, str] = {}
                for old in old_children.get(gpu, (gpu,)):
                    inherited.update(old_reasons.get(old, {}))
                for device in devices:
                    for source, reason in inherited.items():
                        self._reasons[device].setdefault(source, reason)
            publish = self._changed_locked()
        if publish:
            self._publish()

    def set_reasons(self, source: str, reasons: Mapping[str, str | None]) -> bool:
        """Set (reason) or clear (None) ``source``'s reason for each device or GPU UUID; True if
        any changed."""
        changed = False
        with self._changed:
            expanded: dict[str, str | None] = {}
            for key, reason in reasons.items():
                for device in self._children.get(key, (key,)):
                    # a device named directly wins over its GPU's entry in the same report
                    if device == key or device not in reasons:
                        expanded[device] = reason
            # one line per reason (the shares of one GPU have one), not one per device
            went: dict[str, list[str]] = {}
            back: dict[str, list[str]] = {}
            for device, reason in expanded.items():
                held = self._reasons.get(device)
                if held is None:
                    continue  # not a device we advertise
                if reason is None:
                    was = held.pop(source, None)
                    if was is not None:
                        changed = True
                        if not held:
                            back.setdefault(was, []).append(device)
                elif held.get(source) != reason:
                    if not held:
                        went.setdefault(reason, []).append(device)
                    held[source] = reason
                    changed = True
            for devices in back.values():
                log.info("%s Healthy again", _devices_are(devices))
            for reason, devices in went.items():
                log.warning("%s Unhealthy: %s", _devices_are(devices), reason)
            publish = changed and self._changed_locked()
        if publish:
            self._publish()
        return changed

    def healthy(self, device: str) -> bool:
        """True when no watcher holds a reason against ``device``."""
        with self._changed:
            return not self._reasons.get(device)

    def snapshot(self) -> tuple[int, dict[str, tuple[str, ...]]]:
        """The version and every device's reasons (empty: Healthy), taken atomically."""
        with self._changed:
            return self._version, {d: tuple(r.values()) for d, r in self._reasons.items()}

    def touch(self) -> None:
        """Bump the version without a health change: open streams resend their device lists."""
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def wake_waiters(self) -> None:
        """Wake every :meth:`wait_for_change` caller (a stream ending) without a change."""
        with self._changed:
            self._wakes += 1
            self._changed.notify_all()

    def wait_for_change(self, seen_version: int, timeout_s: float) -> int:
        """Block until the version differs from ``seen_version``, :meth:`wake_waiters` or the
        timeout; the version."""
        with self._changed:
            wakes = self._wakes
            self._changed.wait_for(
                lambda: self._version != seen_version or self._wakes != wakes, timeout=timeout_s
            )
            return self._version


def _children(
    devices: Mapping[str, object], parents: Mapping[str, Sequence[str]]
) -> dict[str, tuple[str, ...]]:
    """GPU UUID -> the devices on it, for GPUs that are not devices themselves."""
    out: dict[str, list[str]] = {}
    for device, gpus in parents.items():
        for gpu in gpus:
            if gpu != device and gpu not in devices:
                out.setdefault(gpu, []).append(device)
    return {gpu: tuple(ids) for gpu, ids in out.items()}


def node_reasons(node: Node) -> dict[str, str | None]:
    """Per GPU UUID: why the node source says it is unhealthy, or None."""
    out: dict[str, str | None] = {}
    for gpu in node.gpus:
        if gpu.error:
            out[gpu.uuid] = f"discovery failed: {gpu.error}"
        elif not gpu.healthy:
            out[gpu.uuid] = "marked unhealthy by the node source"
        else:
            out[gpu.uuid] = None
    return out


def with_board_health(node: Node, down: frozenset[str]) -> Node:
    """``node`` with the GPUs in ``down`` marked unhealthy (the board owns health; the node
    source's own flags reach the board first, as one of its sources)."""
    if not any(g.uuid in down and g.healthy for g in node.gpus):
        return node
    gpus = tuple(dataclasses.replace(g, healthy=False) if g.uuid in down else g for g in node.gpus)
    return dataclasses.replace(node, gpus=gpus)


def _devices_are(devices: Sequence[str]) -> str:
    """``device X is`` for one device, ``23 devices (X … Y) are`` for several."""
    if len(devices) == 1:
        return f"device {devices[0]} is"
    return f"{len(devices)} devices ({devices[0]} … {devices[-1]}) are"
