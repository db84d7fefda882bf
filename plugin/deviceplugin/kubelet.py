"""Talking to the kubelet: registration with backoff, and watching the plugin directory.

A kubelet that starts removes every socket in its plugin directory and then creates
``kubelet.sock``; this happens on node boot (plugin first), on every kubelet restart, and not
at all when the plugin starts second. :class:`Registrar` handles all three by polling ``stat``
(no inotify needed): it registers only with a ``kubelet.sock`` that exists, once per kubelet
start, and only after checking that our own sockets are still in place.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cdigen.errors import CdigenError
from cdigen.plugin.deviceplugin.registration import (
    KUBELET_SOCKET,
    REGISTER_TIMEOUT_S,
    KubeletUnreachable,
    RegistrationCancelled,
    RegistrationError,
    register,
)

log = logging.getLogger("cdigen.plugin")


@dataclass(frozen=True)
class Backoff:
    """Delays between registration attempts: doubling from ``first_s`` up to ``max_s``."""

    first_s: float = 0.05
    max_s: float = 2.0

    def after(self, delay: float | None) -> float:
        """The delay that follows ``delay`` (None: the first one)."""
        return self.first_s if delay is None else min(delay * 2, self.max_s)


def file_identity(path: Path) -> tuple[int, int, int] | None:
    """``(device, inode, ctime)`` of ``path``, or None when there is nothing there.

    The ctime tells a re-created file from the old one when the inode number is reused.
    """
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class Endpoint(Protocol):
    """A served resource as the registrar sees it
    (a :class:`cdigen.plugin.deviceplugin.runner.ResourceServer`)."""

    @property
    def resource(self) -> str:
        """The resource name it advertises."""

    @property
    def socket_path(self) -> Path:
        """The socket it listens on."""

    def socket_intact(self) -> bool:
        """Whether the file at ``socket_path`` is still the socket it listens on."""


class RegistrationObserver(Protocol):
    """Told about registrations (the plugin's metrics)."""

    def observe_registration(self, resource: str, *, ok: bool) -> None:
        """One registration attempt for ``resource`` and whether the kubelet took it."""

    def mark_registered(self, resource: str | None = None) -> None:
        """``resource`` is registered with the kubelet now."""

    def mark_unregistered(self, resource: str | None = None) -> None:
        """``resource`` is no longer registered (None: all of them)."""

    def set_waiting(self, kubelet_socket: str | None) -> None:
        """The plugin waits for the kubelet at ``kubelet_socket`` (None: it no longer waits)."""


class Registrar:
    """Registers every resource exactly once per kubelet start, in either boot order.

    One daemon thread polls the plugin directory every ``interval_s`` (``stat`` only):

    - while ``kubelet.sock`` is absent it waits and registers nothing (a kubelet that starts
      deletes every socket in the directory before it creates ``kubelet.sock``, so a socket
      registered before that would be gone when the kubelet dials back); it logs the socket it
      waits for once, then every ``wait_log_every_s``;
    - a ``kubelet.sock`` it has not seen before is a new kubelet that knows none of our
      registrations: every resource is registered again;
    - before registering, servers whose socket file vanished or was replaced are restarted
      (``restart`` gets their resource names), so the kubelet always dials a live socket.

    A failed attempt is retried with ``backoff``; a refusal by the kubelet, an unreachable
    kubelet and our own timeout are told apart in the log.
    """

    def __init__(
        self,
        plugin_dir: Path,
        endpoints: Callable[[], Sequence[Endpoint]],
        restart: Callable[[Sequence[str]], None],
        *,
        interval_s: float = 0.1,
        backoff: Backoff = Backoff(),
        clock: Callable[[], float] = time.monotonic,
        observer: RegistrationObserver | None = None,
        wait_log_every_s: float = 30.0,
        register_timeout_s: float = REGISTER_TIMEOUT_S,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.kubelet_socket = plugin_dir / KUBELET_SOCKET
        self._observer = observer
        self._endpoints = endpoints
        self._restart = restart
        self._interval_s = interval_s
        self._backoff = backoff
        self._clock = clock
        self._wait_log_every_s = wait_log_every_s
        self._register_timeout_s = register_timeout_s
        self.registered = threading.Event()
        self._kubelet_id: tuple[int, int, int] | None = None  # the kubelet we registered with
        self._done: set[str] = set()  # resources that kubelet has taken
        self.registrations = 0  # accepted rounds, for logs and tests
        self._delay: float | None = None
        self._next_attempt = 0.0
        self._failures = 0
        self._waiting_since: float | None = None
        self._next_wait_log = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def waiting(self) -> bool:
        """True while ``kubelet.sock`` is absent and the plugin waits for it."""
        return self._waiting_since is not None

    def forget(self, resource: str) -> None:
        """``resource`` is no longer served (its server stopped): stop tracking it."""
        self._done.discard(resource)

    def step(self) -> None:
        """One round: wait while there is no kubelet; on a new kubelet forget what was
        registered; restart servers whose socket is gone; then register what is pending."""
        current = file_identity(self.kubelet_socket)
        if current is None:
            if self._kubelet_id is not None:
                log.info("%s is gone: the kubelet stopped", self.kubelet_socket)
                self._kubelet_id = None
                self._unregister_all()
            self._wait("it does not exist yet")
            return
        new_kubelet = current != self._kubelet_id  # one we have not registered with
        if new_kubelet:
            if self._kubelet_id is not None:
                log.info("%s was re-created: the kubelet restarted", self.kubelet_socket)
            self._kubelet_id = current
            self._unregister_all()
            self._delay, self._next_attempt = None, 0.0
        endpoints = self._repair(list(self._endpoints()), by_kubelet=new_kubelet)
        pending = [e for e in endpoints if e.resource not in self._done]
        if not pending:
            if endpoints:
                self.registered.set()
            return
        self.registered.clear()
        if self._clock() < self._next_attempt:
            return
        self._register(pending)

    def _wait(self, why: str) -> None:
        """Note that we wait for the kubelet: one info line now, then one every 30 s."""
        now = self._clock()
        if self._waiting_since is None:
            self._waiting_since = now
            self._next_wait_log = now
            if self._observer is not None:
                self._observer.set_waiting(str(self.kubelet_socket))
        if now >= self._next_wait_log:
            waited = now - self._waiting_since
            if waited < self._wait_log_every_s:
                log.info("waiting for the kubelet at %s (%s)", self.kubelet_socket, why)
            else:
                log.info(
                    "still waiting for the kubelet at %s (%s, %.0f s)",
                    self.kubelet_socket,
                    why,
                    waited,
                )
            self._next_wait_log = now + self._wait_log_every_s

    def _end_wait(self) -> None:
        if self._waiting_since is None:
            return
        waited = self._clock() - self._waiting_since
        log.info("the kubelet at %s is up after %.1f s of waiting", self.kubelet_socket, waited)
        self._waiting_since = None
        if self._observer is not None:
            self._observer.set_waiting(None)

    def _unregister_all(self) -> None:
        if self._done and self._observer is not None:
            self._observer.mark_unregistered(None)
        self._done.clear()
        self.registered.clear()

    def _repair(self, endpoints: list[Endpoint], *, by_kubelet: bool) -> list[Endpoint]:
        """Restart the servers whose socket file vanished or was replaced; the endpoints after.

        ``by_kubelet``: a kubelet has just started, and it removes every socket (expected)."""
        broken = [e.resource for e in endpoints if not e.socket_intact()]
        if not broken:
            return endpoints
        log.log(
            logging.INFO if by_kubelet else logging.WARNING,
            "socket of %s was removed or replaced%s: restarting %s on a fresh socket",
            ", ".join(broken),
            " by the starting kubelet" if by_kubelet else "",
            "its server" if len(broken) == 1 else "their servers",
        )
        for resource in broken:
            if resource in self._done:
                self._done.discard(resource)
                if self._observer is not None:
                    self._observer.mark_unregistered(resource)
        self._restart(broken)
        return list(self._endpoints())

    def _register(self, pending: Sequence[Endpoint]) -> None:
        started = self._clock()
        resource = ""
        try:
            for endpoint in pending:
                resource = endpoint.resource
                register(
                    self.plugin_dir,
                    endpoint=endpoint.socket_path.name,
                    resource_name=resource,
                    timeout_s=self._register_timeout_s,
                    cancel=self._stop,
                )
                self._done.add(resource)
                if self._observer is not None:
                    self._observer.observe_registration(resource, ok=True)
        except RegistrationCancelled:
            return
        except RegistrationError as exc:
            if self._observer is not None:
                self._observer.observe_registration(resource, ok=False)
            self._failures += 1
            self._delay = self._backoff.after(self._delay)
            self._next_attempt = self._clock() + self._delay
            if isinstance(exc, KubeletUnreachable):  # e.g. a stale kubelet.sock after a reboot
                self._wait(f"it refuses connections: {exc.message}")
                return
            level = (
                logging.WARNING
                if self._failures in (1, 10) or self._failures % 50 == 0
                else logging.DEBUG
            )
            log.log(level, "registration attempt %d failed: %s", self._failures, exc)
            return
        self._end_wait()
        self.registrations += 1
        self._failures = 0
        self._delay = None
        self.registered.set()
        log.info(
            "registered %s with the kubelet in %.0f ms",
            ", ".join(e.resource for e in pending),
            (self._clock() - started) * 1000,
        )

    def start(self) -> None:
        """Register and watch in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="kubelet-registrar", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        said = ""
        while not self._stop.is_set():
            try:
                self.step()
                said = ""
            except CdigenError as exc:  # e.g. a server that cannot listen: said once, retried
                if str(exc) != said:
                    log.error("%s", exc)
                said = str(exc)
            except Exception:  # keep watching: the next round gets another try
                log.exception("registration round failed")
            self._stop.wait(self._interval_s)

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop the thread; a registration in flight is cancelled (bounded by ``timeout_s``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
