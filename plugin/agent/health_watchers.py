"""The watchers that feed the health board (:mod:`cdigen.plugin.agent.health`), polled by one
:class:`Poller` thread: :class:`NodeWatcher` (a node file that changed, or a periodic
re-discovery, handed to the plugin) and :class:`SpecDirWatcher` (every CDI name the plugin can
hand out must exist in the spec dirs)."""

from __future__ import annotations

import logging
import os
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from cdigen.cdi.cache import SpecCache
from cdigen.cdi.names import capability_of
from cdigen.model import Node
from cdigen.plugin.agent.health import SOURCE_SPEC, HealthBoard

log = logging.getLogger("cdigen.plugin")

# how often both wings probe their GPUs through NVML (and the device plugin checks its files)
DEFAULT_POLL_INTERVAL_S = 0.5
LOGGED_NAMES = 3  # CDI names quoted in the missing-names line; then "and N more"


class Pollable(Protocol):
    """A watcher checked periodically by :class:`Poller`."""

    def poll(self) -> None:
        """Look once and report what changed."""


class Poller:
    """Calls ``poll()`` on each watcher every ``interval_s`` in one daemon thread."""

    def __init__(self, watchers: Sequence[Pollable], interval_s: float) -> None:
        self._watchers = list(watchers)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-poll", daemon=True)

    def start(self) -> None:
        """Start polling."""
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            for watcher in self._watchers:
                try:
                    watcher.poll()
                except Exception:  # one broken watcher must not stop the others
                    log.exception("health watcher %s failed", type(watcher).__name__)

    def stop(self) -> None:
        """Stop polling and wait for the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


def _file_signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class NodeWatcher:
    """Re-discovers the node (a node file when it changes, NVML every ``interval_s``) and hands
    each new Node to ``apply`` (health and MIG layout); a failed discovery is logged and the
    last good node stays in force."""

    def __init__(
        self,
        load: Callable[[], Node],
        apply: Callable[[Node], object],
        *,
        path: Path | None = None,
        interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load = load
        self._apply = apply
        self._path = path
        self._interval_s = interval_s
        self._clock = clock
        self._signature = _file_signature(path) if path is not None else None
        self._next = clock() + interval_s

    def poll(self) -> None:
        """Re-discover when due (file changed, or the rescan interval passed)."""
        if self._path is not None:
            signature = _file_signature(self._path)
            if signature == self._signature:
                return
            self._signature = signature
        else:
            now = self._clock()
            if now < self._next:
                return
            self._next = now + self._interval_s
        try:
            node = self._load()
        except Exception as exc:
            log.error("re-discovering the node failed (%s); keeping the current layout", exc)
            return
        self._apply(node)


class SpecDirWatcher:
    """Checks that every CDI name the plugin can return resolves in the spec dirs (on every change).

    ``names`` maps each device ID to the CDI names Allocate may return for it; ``cache`` is the
    plugin's one :class:`~cdigen.cdi.cache.SpecCache` (the loading rules of runtimes and of
    ``cdigen list``). A device with a missing name is held Unhealthy until the spec has it.
    """

    def __init__(
        self,
        cache: SpecCache,
        names: Mapping[str, Sequence[str]],
        board: HealthBoard,
        node_source: str = "nvml",
    ) -> None:
        self.cache = cache
        self._names = names
        self._node_source = node_source  # the plugin's --node, for the fix hint
        self._board = board
        self._checked: object = None  # the cache state last checked
        self._said: tuple[str, ...] = ()  # the missing names last logged: said once, not per check

    @property
    def spec_dirs(self) -> tuple[Path, ...]:
        """The directories watched."""
        return self.cache.spec_dirs

    def set_names(self, names: Mapping[str, Sequence[str]]) -> None:
        """Check these names from now on (a new layout), and check them now."""
        self._names = names
        self.check()

    def poll(self) -> None:
        """Re-check the names if the spec dirs changed since the last check (always the first
        time). Another reader of the cache (Allocate) may have reloaded it first: what counts is
        whether the state differs from the one last checked."""
        try:
            state = self.cache.state()
        except Exception:
            state = None  # check() reports it
        if state is not None and state is self._checked:
            return
        self.check()

    def check(self) -> dict[str, list[str]]:
        """Check now; the missing names per device.

        A spec file that fails to load only lacks its own names (the cache skips it, as runtimes
        do). Should loading fail as a whole, health stays as it was: a fault in the check is no
        evidence that our devices are gone.
        """
        try:
            state = self.cache.state()
            known = state.devices
        except Exception as exc:
            log.error(
                "CDI spec dirs %s could not be checked (%s): device health left as it was",
                _show(self.spec_dirs),
                exc,
            )
            return {}
        if state is not self._checked:
            for path, problem in state.errors.items():  # skipped, as runtimes do
                log.warning("CDI spec %s fails to load and is skipped: %s", path, problem)
            for name, paths in state.conflicts.items():
                log.warning(
                    "CDI device %s is defined in %s: runtimes drop it",
                    name,
                    " and ".join(map(str, paths)),
                )
            self._checked = state
        missing = {d: [n for n in names if n not in known] for d, names in self._names.items()}
        reasons: dict[str, str | None] = {
            d: f"CDI name {gone[0]} missing from the spec dirs" if gone else None
            for d, gone in missing.items()
        }
        absent = [(d, gone) for d, gone in missing.items() if gone]
        # each name once: the shares of a GPU all lack that GPU's one name
        names = list(dict.fromkeys(n for _, gone in absent for n in gone))
        if absent and tuple(names) != self._said:  # one line for all, not one per GPU or check
            self._said = tuple(names)
            caps = list(dict.fromkeys(c for c in map(capability_of, names) if c))
            node = (
                "" if self._node_source == "nvml" else f" --node {shlex.quote(self._node_source)}"
            )
            log.error(
                "CDI %s %s%s not defined in %s: %d device(s) advertised Unhealthy until the "
                "spec has them (run 'cdigen generate%s --output-dir %s%s')",
                "name" if len(names) == 1 else "names",
                ", ".join(names[:LOGGED_NAMES]),
                (f" and {len(names) - LOGGED_NAMES} more" if len(names) > LOGGED_NAMES else "")
                + (" is" if len(names) == 1 else " are"),
                _show(self.spec_dirs),
                len(absent),
                node,
                self.spec_dirs[0] if self.spec_dirs else "DIR",
                f" --capability-devices {','.join(caps)}" if caps else "",
            )
        if not absent:
            self._said = ()
        self._board.set_reasons(SOURCE_SPEC, reasons)
        return {d: g for d, g in missing.items() if g}


def _show(dirs: Sequence[Path]) -> str:
    return ", ".join(str(d) for d in dirs) or "(no spec dir)"
