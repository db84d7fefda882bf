"""The one way both wings serve gRPC on a unix socket: a thread pool of a given size, the
services added by the caller, the socket bound owner-only (0600, in a private directory and
renamed into place: :func:`cdigen.plugin.agent.sockets.bind_socket`), then started. The device
plugin serves one socket per resource, the DRA plugin its plugin and registration sockets."""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

from cdigen.plugin.agent.sockets import bind_socket


def serve_unix(
    path: Path,
    add: Callable[[Any], None],
    *,
    workers: int,
    thread_prefix: str,
    flag: str = "--plugin-dir",
) -> tuple[Any, tuple[int, int]]:
    """A started ``grpc.Server`` on the unix socket ``path`` with the services ``add`` puts on
    it, and the socket's (device, inode); ``flag`` names the setting an error points at."""
    import grpc

    pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=thread_prefix)
    server = grpc.server(pool)
    add(server)
    try:
        socket_id = bind_socket(server, path, flag)
    except BaseException:
        server.stop(None)
        raise
    server.start()
    return server, socket_id
