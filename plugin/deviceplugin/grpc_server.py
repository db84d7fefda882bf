"""One DevicePlugin gRPC server per resource, on a unix socket in the kubelet's plugin dir."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cdigen.plugin.agent.grpc_unix import serve_unix
from cdigen.plugin.deviceplugin.registration import socket_name
from cdigen.plugin.deviceplugin.servicer import DevicePluginService

log = logging.getLogger("cdigen.plugin")

SERVER_THREADS = 64  # gRPC threads per resource server (created on demand)
SWITCH_INTERVAL_S = 0.0005  # the interpreter's thread switch interval while serving


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
        from cdigen.plugin.deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc

        self._stop_streams = threading.Event()
        self.service = self._make_service(self._stop_streams)
        path = self.socket_path
        # while a policy computes, gRPC's threads wait up to the switch interval for each turn
        # at the interpreter lock: 5 ms by default, several turns per call (benchmarks/bench_load)
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        service = self.service
        # a thread per concurrent call up to SERVER_THREADS: a call waiting for the policy
        # (one computation at a time) must not keep Allocate calls queued behind it
        self._server, self._socket_id = serve_unix(
            path,
            lambda server: pb_grpc.add_DevicePluginServicer_to_server(service, server),
            workers=SERVER_THREADS,
            thread_prefix="grpc",
        )
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
