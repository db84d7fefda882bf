"""One GPU server per node: ``cdigen plugin serve`` (the device plugin) and ``cdigen dra serve``
(the DRA plugin) must never hand out the same GPUs, so each holds an exclusive ``flock`` on one
file under the kubelet's directory for as long as it runs, and the second to start is refused.

The file is ``<kubelet dir>/plugins/cdigen-gpus.lock`` (the kubelet leaves ``plugins/`` alone,
while it empties ``device-plugins/`` when it starts). It holds the holder's name and pid, for the
message; the lock itself goes with the process, however it ends.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from cdigen.errors import InputError

LOCK_NAME = "cdigen-gpus.lock"


class GpuServerLock:
    """The node's GPU-server lock, held by ``who`` (``cdigen plugin serve``, ...) once taken."""

    def __init__(self, kubelet_dir: Path, who: str) -> None:
        self.path = kubelet_dir / "plugins" / LOCK_NAME
        self.who = who
        self._fd: int | None = None

    def take(self) -> None:
        """Take the lock, or raise InputError (one line, exit 2) naming the server holding it.
        A kubelet dir that cannot hold the file (read-only, missing) is not ours to guard."""
        try:
            self.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT):
                return
            raise InputError(
                f"cannot open the GPU-server lock: {exc.strerror}",
                where=str(self.path),
                hint="it must be a regular file, which cdigen creates: remove what is there",
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise InputError(
                f"this node's GPUs are already served by {holder}; a node is served by the "
                "device plugin or by DRA, never both",
                where=str(self.path),
                hint="stop the other one on this node first (docs/dra.md, 'Moving a node from "
                "the device plugin to DRA')",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{self.who} (pid {os.getpid()})\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Give the lock up (it also goes when the process ends)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> GpuServerLock:
        self.take()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
