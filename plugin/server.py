"""One DevicePlugin gRPC server per resource, on a unix socket in the kubelet's plugin dir."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

from cdigen.errors import CdigenError, InputError
from plugin.kubelet import socket_name
from plugin.service import DevicePluginService

log = logging.getLogger("cdigen.plugin")

SERVER_THREADS = 64  # gRPC threads per resource server (created on demand)
SWITCH_INTERVAL_S = 0.0005  # the interpreter's thread switch interval while serving

SOCKET_MODE = 0o600  # the kubelet runs as root; nobody else may talk to the plugin
PLUGIN_DIR_MODE = 0o755
BIND_DIR_PREFIX = ".cdigen-"  # private directory a socket is bound in before it is renamed
UNIX_PATH_MAX = 107  # sun_path holds 107 bytes and a NUL


def make_plugin_dir(plugin_dir: Path, flag: str = "--plugin-dir") -> None:
    """Create ``plugin_dir`` and its missing parents with mode 0755, whatever the umask, and
    remove our own bind directories left by a killed run."""
    missing: list[Path] = []
    for path in (plugin_dir, *plugin_dir.parents):
        if path.exists() or path.is_symlink():
            break
        missing.append(path)
    try:
        for path in reversed(missing):
            with contextlib.suppress(FileExistsError):  # made meanwhile by someone else
                path.mkdir()
                os.chmod(path, PLUGIN_DIR_MODE)
        if not plugin_dir.is_dir():
            raise NotADirectoryError(20, "not a directory")
        for leftover in plugin_dir.glob(BIND_DIR_PREFIX + "*"):
            shutil.rmtree(leftover, ignore_errors=True)
    except OSError as exc:
        raise InputError(
            f"cannot create the plugin directory: {exc.strerror}",
            where=str(plugin_dir),
            hint=f"pass {flag} with a writable directory",
        ) from None


def socket_in_use(path: Path) -> bool:
    """Whether ``path`` is a unix socket that a live process accepts connections on (a stale
    socket, left by a plugin that was killed, refuses them)."""
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    with contextlib.closing(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(os.fspath(path))
        except OSError:
            return False
    return True


def bind_socket(server: Any, path: Path, flag: str = "--plugin-dir") -> tuple[int, int]:
    """Bind the gRPC ``server`` to the unix socket ``path`` with mode 0600 whatever the umask.

    The socket is bound in a private 0700 directory beside ``path``, made 0600 there and renamed
    into place, so it is never reachable with a looser mode. Returns its (device, inode). A
    stale socket at ``path`` is replaced; one that a live process serves on is refused: two
    plugins taking the path from each other would re-register with the kubelet for ever.
    """
    if len(os.fsencode(path)) > UNIX_PATH_MAX:
        raise CdigenError(
            f"cannot listen on {path}",
            where=str(path.parent),
            hint=f"the socket path is too long for a unix socket ({UNIX_PATH_MAX} bytes at most)",
        )
    if socket_in_use(path):
        raise CdigenError(
            f"cannot listen on {path}: another process serves on that socket (a second cdigen "
            "plugin for the same resource?)",
            where=str(path.parent),
            hint=f"stop the other plugin (one per resource and node), or pass another {flag}",
        )
    if path.is_dir() and not path.is_symlink():
        raise InputError(
            "the plugin's socket path is a directory",
            where=str(path),
            hint=f"remove that directory, or pass another {flag}",
        )
    try:
        private = Path(tempfile.mkdtemp(prefix=BIND_DIR_PREFIX, dir=path.parent))
        os.chmod(private, 0o700)
    except OSError as exc:
        raise CdigenError(
            f"cannot listen on {path}: {exc.strerror}",
            where=str(path.parent),
            hint="is the directory writable?",
        ) from None
    temp = private / "s"
    try:
        try:
            bound = server.add_insecure_port("unix:" + str(temp))
        except RuntimeError:  # grpcio raises where older versions returned 0
            bound = 0
        if bound == 0:
            raise CdigenError(
                f"cannot listen on {path}",
                where=str(path.parent),
                hint="the socket path is too long for a unix socket"
                if len(os.fsencode(temp)) > UNIX_PATH_MAX
                else "is the directory writable?",
            )
        os.chmod(temp, SOCKET_MODE)
        os.replace(temp, path)  # atomically replaces a stale socket of ours
        st = os.stat(path)
    except OSError as exc:
        raise CdigenError(
            f"cannot put the socket in place: {exc.strerror}",
            where=str(path),
            hint="is the plugin directory writable?",
        ) from None
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return (st.st_dev, st.st_ino)


class ResourceServer:
    """A DevicePlugin gRPC server on ``<plugin-dir>/cdigen-<resource>.sock``."""

    def __init__(
        self, plugin_dir: Path, make_service: Callable[[threading.Event], DevicePluginService]
    ):
        self._make_service = make_service
        self.plugin_dir = plugin_dir
        self._server: Any = None
        self._stop_streams = threading.Event()
        self._socket_id: tuple[int, int] | None = None
        self.service: DevicePluginService | None = None

    @property
    def resource(self) -> str:
        """The resource this server advertises."""
        assert self.service is not None
        return self.service.resource

    @property
    def socket_path(self) -> Path:
        """Where the server listens."""
        return self.plugin_dir / socket_name(self.resource)

    def socket_intact(self) -> bool:
        """Whether the file at :attr:`socket_path` is still the socket this server listens on
        (False once the kubelet, or anyone, removed or replaced it)."""
        if self._server is None or self._socket_id is None:
            return False
        try:
            st = os.stat(self.socket_path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._socket_id

    def start(self) -> None:
        """Listen on a fresh socket, mode 0600 (a stale file of ours is replaced)."""
        import grpc

        from plugin.api import deviceplugin_pb2_grpc as pb_grpc

        self._stop_streams = threading.Event()
        self.service = self._make_service(self._stop_streams)
        path = self.socket_path
        # a thread per concurrent call up to SERVER_THREADS: a call waiting for the policy
        # (one computation at a time) must not keep Allocate calls queued behind it
        pool = futures.ThreadPoolExecutor(max_workers=SERVER_THREADS, thread_name_prefix="grpc")
        # while a policy computes, gRPC's threads wait up to the switch interval for each turn
        # at the interpreter lock: 5 ms by default, several turns per call (benchmarks/bench_load)
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        server = grpc.server(pool)
        pb_grpc.add_DevicePluginServicer_to_server(self.service, server)
        self._socket_id = bind_socket(server, path)
        server.start()
        self._server = server
        log.info("serving %s on %s", self.resource, path)

    def halt(self) -> threading.Event | None:
        """Begin stopping: end open ListAndWatch streams, stop taking calls, remove our socket
        (only if it is still ours). Returns the event set once the server has stopped."""
        self._stop_streams.set()
        if self.service is not None:
            self.service.wake_streams()
            if self.socket_intact():
                with contextlib.suppress(FileNotFoundError):
                    self.socket_path.unlink()
        self._socket_id = None
        server, self._server = self._server, None
        if server is None:
            return None
        done: threading.Event = server.stop(grace=0.2)
        return done

    def stop(self) -> None:
        """Stop serving (ending open ListAndWatch streams) and remove the socket."""
        stop_servers([self])


def stop_servers(servers: Sequence[ResourceServer], timeout_s: float = 1.0) -> None:
    """Stop ``servers`` together, not one after another: ``timeout_s`` at most in all."""
    stopping = [server.halt() for server in servers]
    deadline = time.monotonic() + timeout_s
    for done in stopping:
        if done is not None:
            done.wait(max(0.0, deadline - time.monotonic()))
