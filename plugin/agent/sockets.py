"""The sockets a plugin listens on: its gRPC unix socket in a kubelet directory (bound in a
private directory, then renamed into place, owner-only) and a ``HOST:PORT`` for HTTP."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path
from typing import Any

from cdigen.errors import CdigenError, InputError

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
    _check_socket_path(path, flag)
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


def _check_socket_path(path: Path, flag: str) -> None:
    """Why :func:`bind_socket` cannot take ``path``, raised: too long for a unix socket, served
    by a live process, or a directory."""
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


def parse_address(address: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` for IPv6; empty host = all interfaces) into its parts."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise InputError(
            f"metrics address {address!r} is not HOST:PORT",
            where="--metrics-address",
            hint="e.g. 127.0.0.1:9465, or :0 for any free port",
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port_text)
