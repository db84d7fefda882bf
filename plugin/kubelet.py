"""Talking to the kubelet: registration with backoff, and watching the plugin directory.

The kubelet removes every socket in its plugin directory when it restarts and re-creates
``kubelet.sock``; a plugin that does not notice is left unregistered and the node loses its
GPUs. :class:`PluginDirWatcher` notices both events (by polling ``stat``, no inotify needed).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cdigen.errors import CdigenError

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"

log = logging.getLogger("cdigen.plugin")

_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class RegistrationError(CdigenError):
    """The kubelet refused or could not take our registration."""


def resource_name_problem(name: str) -> str | None:
    """Why the kubelet would refuse ``name`` as an extended resource, or None if it is fine."""
    if "/" not in name:
        return f"resource name {name!r} has no domain (DOMAIN/NAME)"
    domain, _, short = name.partition("/")
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return f"resource name {name!r} uses a kubernetes.io domain, reserved for native resources"
    if name.startswith("requests."):
        return f"resource name {name!r} must not start with 'requests.'"
    if len(domain) > 253 or not _DNS_SUBDOMAIN.match(domain):
        return f"resource name {name!r}: {domain!r} is not a DNS subdomain"
    # The kubelet checks that "requests.<name>" is a qualified name: the part after the slash is
    # at most 63 characters of [-A-Za-z0-9_.], starting and ending alphanumeric.
    if len(short) > 63 or not _QUALIFIED_NAME.match(short):
        return f"resource name {name!r}: {short!r} is not a valid name (63 chars, [-A-Za-z0-9_.])"
    return None


def socket_name(resource: str) -> str:
    """The file name of our socket for ``resource``: ``cdigen-nvidia.com-gpu.sock``."""
    return "cdigen-" + resource.replace("/", "-") + ".sock"


def register(
    plugin_dir: Path,
    *,
    endpoint: str,
    resource_name: str,
    timeout_s: float = 5.0,
) -> None:
    """Register once with ``plugin_dir/kubelet.sock``; :class:`RegistrationError` on failure."""
    import grpc

    from plugin.api import deviceplugin_pb2 as pb
    from plugin.api import deviceplugin_pb2_grpc as pb_grpc

    kubelet = plugin_dir / KUBELET_SOCKET
    request = pb.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource_name,
        options=pb.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        ),
    )
    with grpc.insecure_channel("unix:" + str(kubelet)) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout_s)
            pb_grpc.RegistrationStub(channel).Register(request, timeout=timeout_s)
        except grpc.FutureTimeoutError:
            raise RegistrationError(
                "kubelet not reachable", where=str(kubelet), hint="is the kubelet running?"
            ) from None
        except grpc.RpcError as exc:
            raise RegistrationError(
                f"kubelet refused registration of {resource_name}: {exc.details()}",
                where=str(kubelet),
            ) from None


@dataclass(frozen=True)
class Backoff:
    """Delays between registration attempts: doubling from ``first_s`` up to ``max_s``."""

    first_s: float = 0.05
    max_s: float = 2.0

    def after(self, delay: float | None) -> float:
        """The delay that follows ``delay`` (None: the first one)."""
        return self.first_s if delay is None else min(delay * 2, self.max_s)


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class PluginDirWatcher:
    """Notices a re-created ``kubelet.sock`` and removed sockets of ours (by polling ``stat``)."""

    def __init__(self, plugin_dir: Path, our_sockets: Callable[[], Sequence[Path]]) -> None:
        self.plugin_dir = plugin_dir
        self._our_sockets = our_sockets
        self._kubelet_id = _identity(plugin_dir / KUBELET_SOCKET)

    def rebase(self) -> None:
        """Take the current kubelet socket as the known one (just before registering)."""
        self._kubelet_id = _identity(self.plugin_dir / KUBELET_SOCKET)

    def kubelet_present(self) -> bool:
        """Whether ``kubelet.sock`` exists now."""
        return (self.plugin_dir / KUBELET_SOCKET).exists()

    def check(self) -> str | None:
        """One poll: what changed that needs a restart and re-registration, or None."""
        current = _identity(self.plugin_dir / KUBELET_SOCKET)
        if current is not None and current != self._kubelet_id:
            self._kubelet_id = current
            return "kubelet.sock was re-created"
        if current is None:
            self._kubelet_id = None
        for sock in self._our_sockets():
            if not sock.exists():
                return f"our socket {sock.name} was removed"
        return None


class RegistrationObserver(Protocol):
    """Told about registrations (the plugin's metrics)."""

    def observe_registration(self, resource: str, *, ok: bool) -> None:
        """One registration attempt for ``resource`` and whether the kubelet took it."""

    def mark_registered(self, resource: str | None = None) -> None:
        """``resource`` is registered with the kubelet now."""

    def mark_unregistered(self, resource: str | None = None) -> None:
        """``resource`` is no longer registered (None: all of them)."""


class Registrar:
    """Keeps every resource registered: registers with backoff while the kubelet is down, and
    restarts the servers and registers again when the kubelet restarts.

    One daemon thread polls the plugin directory every ``interval_s``. ``endpoints`` gives
    (resource, socket path) of the servers; ``restart`` restarts them on fresh sockets.
    """

    def __init__(
        self,
        plugin_dir: Path,
        endpoints: Callable[[], Sequence[tuple[str, Path]]],
        restart: Callable[[], None],
        *,
        interval_s: float = 0.1,
        backoff: Backoff = Backoff(),
        clock: Callable[[], float] = time.monotonic,
        observer: RegistrationObserver | None = None,
    ) -> None:
        self.plugin_dir = plugin_dir
        self._observer = observer
        self._endpoints = endpoints
        self._restart = restart
        self._interval_s = interval_s
        self._backoff = backoff
        self._clock = clock
        self._watcher = PluginDirWatcher(plugin_dir, lambda: [p for _, p in endpoints()])
        self.registered = threading.Event()
        self._done: set[str] = set()  # resources the kubelet has taken since the last restart
        self.registrations = 0  # accepted rounds, for logs and tests
        self._delay: float | None = None
        self._next_attempt = 0.0
        self._failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def forget(self, resource: str) -> None:
        """``resource`` is no longer served (its server stopped): stop tracking it."""
        self._done.discard(resource)

    def step(self) -> None:
        """One round: restart if the kubelet restarted, then register what is not yet
        registered (new resources after a layout change, too) when due."""
        reason = self._watcher.check()
        if reason and (self._done or "removed" in reason):
            log.warning("%s: restarting the plugin server and re-registering", reason)
            self.registered.clear()
            self._done.clear()
            if self._observer is not None:
                self._observer.mark_unregistered(None)
            self._restart()
            self._delay, self._next_attempt = None, 0.0
        elif reason:  # the kubelet appeared while we waited for it: register now
            self._delay, self._next_attempt = None, 0.0
        endpoints = list(self._endpoints())
        pending = [(r, p) for r, p in endpoints if r not in self._done]
        if not pending:
            if endpoints:
                self.registered.set()
            return
        self.registered.clear()
        if not self._watcher.kubelet_present() or self._clock() < self._next_attempt:
            return
        self._watcher.rebase()
        started = self._clock()
        resource = ""
        try:
            for resource, path in pending:
                register(self.plugin_dir, endpoint=path.name, resource_name=resource, timeout_s=2.0)
                self._done.add(resource)
                if self._observer is not None:
                    self._observer.observe_registration(resource, ok=True)
                    self._observer.mark_registered(resource)
        except RegistrationError as exc:
            if self._observer is not None:
                self._observer.observe_registration(resource, ok=False)
            self._failures += 1
            self._delay = self._backoff.after(self._delay)
            self._next_attempt = self._clock() + self._delay
            level = (
                logging.WARNING
                if self._failures in (1, 10) or self._failures % 50 == 0
                else logging.DEBUG
            )
            log.log(level, "registration attempt %d failed: %s", self._failures, exc)
            return
        self.registrations += 1
        self._failures = 0
        self._delay = None
        self.registered.set()
        names = ", ".join(r for r, _ in pending)
        log.info(
            "registered %s with the kubelet in %.0f ms", names, (self._clock() - started) * 1000
        )

    def start(self) -> None:
        """Register and watch in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="kubelet-registrar", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # keep watching: the next round gets another try
                log.exception("registration round failed")
            self._stop.wait(self._interval_s)

    def stop(self) -> None:
        """Stop the thread (a registration in flight finishes first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
