"""One GPU server per node: ``cdigen plugin serve`` (the device plugin) and ``cdigen dra serve``
(the DRA plugin) must never hand out the same GPUs, so each holds an exclusive ``flock`` on one
file under the kubelet's directory for as long as it runs, and the second to start is refused.

The file is ``<kubelet dir>/plugins/cdigen-gpus.lock`` (the kubelet leaves ``plugins/`` alone,
while it empties ``device-plugins/`` when it starts). It holds the holder's name and pid, for the
message; the lock itself goes with the process, however it ends.

The file is opened as what it must be, as root on a node: never through a symlink
(``O_NOFOLLOW``), and used only when it is a regular file with one link owned by this user; a
hard link to another file, a FIFO or a device is refused in one line and left untouched
(nothing is truncated or written). A lock that cannot be taken at all (a read-only or
immutable file or directory) refuses to serve too: two servers without a lock would both hand
out the node's GPUs.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

from cdigen.errors import EXIT_CHECK_FAILED, CdigenError, InputError, printable
from cdigen.fileio import file_kind, make_dirs

LOCK_NAME = "cdigen-gpus.lock"
LOCK_MODE = 0o644
HOLDER_BYTES = 200  # the holder's line is about 40 bytes; more is not ours


class LockUnavailable(CdigenError):
    """The lock cannot be taken (EPERM, EROFS, ...): the server does not serve without it."""

    exit_code = EXIT_CHECK_FAILED


class GpuServerLock:
    """The node's GPU-server lock, held by ``who`` (``cdigen plugin serve``, ...) once taken."""

    def __init__(self, kubelet_dir: Path, who: str) -> None:
        self.path = kubelet_dir / "plugins" / LOCK_NAME
        self.who = who
        self._fd: int | None = None

    def take(self) -> None:
        """Take the lock, or raise: InputError (one line, exit 2) naming the server holding it
        or what is wrong with the file; LockUnavailable (exit 1) when it cannot be opened."""
        fd = self._open()
        try:
            self._check(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise self._held(fd) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{self.who} (pid {os.getpid()})\n".encode(), 0)
        except OSError as exc:
            os.close(fd)
            raise self._unavailable(exc) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _open(self) -> int:
        try:
            make_dirs(self.path.parent)  # 0755 whatever the umask, the kubelet dir too
        except CdigenError as exc:
            raise LockUnavailable(
                f"cannot take the GPU-server lock: {exc.message}",
                where=str(self.path),
                hint="the kubelet dir must be writable by the server; it does not serve "
                "without the lock",
            ) from None
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
        try:
            return os.open(self.path, flags, LOCK_MODE)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise InputError(
                    "the GPU-server lock is a symlink; it is never followed",
                    where=str(self.path),
                    hint="it must be a regular file, which cdigen creates: remove the link",
                ) from None
            if exc.errno in (errno.EISDIR, errno.ENXIO):
                raise InputError(
                    f"the GPU-server lock is not a regular file: {exc.strerror}",
                    where=str(self.path),
                    hint="it must be a regular file, which cdigen creates: remove what is there",
                ) from None
            raise self._unavailable(exc) from None

    def _check(self, fd: int) -> None:
        """Refuse, before writing a byte, a file that is not ours alone to write."""
        info = os.fstat(fd)
        problem = None
        if not stat.S_ISREG(info.st_mode):
            problem = f"it is {file_kind(info.st_mode)}, not a regular file"
        elif info.st_nlink != 1:
            problem = f"it has {info.st_nlink} hard links (another file shares it)"
        elif info.st_uid != os.geteuid():
            problem = f"it is owned by uid {info.st_uid}, not by this server (uid {os.geteuid()})"
        if problem is not None:
            raise InputError(
                f"refusing the GPU-server lock: {problem}; it was left untouched",
                where=str(self.path),
                hint="it must be a regular file, which cdigen creates: remove what is there",
            )

    def _held(self, fd: int) -> InputError:
        raw = os.pread(fd, HOLDER_BYTES, 0).decode("utf-8", "replace").strip()
        holder = printable(raw) if raw else "another process"
        return InputError(
            f"this node's GPUs are already served by {holder}; a node is served by the "
            "device plugin or by DRA, never both",
            where=str(self.path),
            hint="stop the other one on this node first (docs/dra.md, 'Moving a node from "
            "the device plugin to DRA')",
        )

    def _unavailable(self, exc: OSError) -> LockUnavailable:
        return LockUnavailable(
            f"cannot take the GPU-server lock: {exc.strerror or exc}",
            where=str(self.path),
            hint="it must be a writable regular file (not immutable, not on a read-only "
            "filesystem); the server does not serve without it, so the device plugin and DRA "
            "never both serve this node",
        )

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
