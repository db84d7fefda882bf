"""The process around a plugin: NVML at start, signals, and a bounded stop."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import Any, Protocol

log = logging.getLogger("cdigen.plugin")


class Servable(Protocol):
    """A plugin the process runs: started once, stopped at the end (and reloaded on SIGHUP if
    it has a ``reload_policies() -> bool``)."""

    def start(self) -> None:
        """Start serving."""

    def stop(self) -> None:
        """Stop serving."""


class ReloadableServable(Servable, Protocol):
    """A plugin with policies to reload on SIGHUP."""

    def reload_policies(self) -> bool:
        """Reload the policies; False when the old ones stay."""
        ...


def open_nvml(source: str, driver_root: str = "/", host_root: str = "/") -> Any:
    """The initialised ``pynvml`` module when serving real GPUs, else None; its library is
    loaded from ``driver_root`` (a host path under ``host_root``) first (discovery's loader,
    with its errors)."""
    if source != "nvml":
        return None
    import pynvml

    from cdigen.discover.nvml_library import start_nvml

    start_nvml(pynvml, driver_root=driver_root, host_root=host_root)
    return pynvml


STOP_DEADLINE_S = 1.5  # SIGTERM ends the process within 2 s, whatever hangs
# Either plugin's HTTP worker (/metrics, /healthz) starts once the kubelet has registered it, or
# this long after the start even with no kubelet: starting a process never takes CPU from the
# registration, and a probe waits in the listen queue meanwhile.
HTTP_WAIT_S = 2.0


def _exit_after(deadline_s: float) -> None:
    """End the process ``deadline_s`` from now unless it has ended by itself (a daemon thread:
    an orderly exit, atexit joins included, simply ends it)."""

    def run() -> None:
        time.sleep(deadline_s)
        log.warning("stopping took more than %.1f s: exiting without waiting further", deadline_s)
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(0)

    threading.Thread(target=run, name="stop-deadline", daemon=True).start()


def serve_until_signalled(plugin: Servable, *, name: str = "cdigen device plugin") -> int:
    """Run ``plugin`` until SIGTERM/SIGINT (exit 0); SIGHUP reloads its policies when it has
    any (``reload_policies``).

    It owns the process: from the stop signal on, the process ends within
    :data:`STOP_DEADLINE_S` even if a thread hangs (a stuck call in a gRPC worker, say).
    """
    stop = threading.Event()
    reload = threading.Event()
    reload_policies = getattr(plugin, "reload_policies", None)

    def on_stop(signum: int, frame: FrameType | None) -> None:
        if not stop.is_set():
            log.info("signal %s: stopping", signal.Signals(signum).name)
            _exit_after(STOP_DEADLINE_S)
        stop.set()

    def on_hup(signum: int, frame: FrameType | None) -> None:
        reload.set()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    if reload_policies is not None:
        signal.signal(signal.SIGHUP, on_hup)
    try:
        plugin.start()
        log.info("%s ready (pid %d)", name, os.getpid())
        while not stop.wait(0.2):
            if reload.is_set() and reload_policies is not None:
                reload.clear()
                if reload_policies():
                    log.info("policies reloaded")
    finally:
        plugin.stop()
    return 0
