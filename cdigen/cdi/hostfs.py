"""Reading the host's files by host path: :class:`HostFS`, and :func:`host_path` under a root.

All file access of the host scan goes through a :class:`HostFS`. Run on the host, it is plain
``os``. Run in a container with the host's ``/`` mounted at ``DIR`` (``cdigen generate --host-root
DIR``), it reads ``DIR/<path>`` for the host path ``<path>`` and resolves every symlink inside
``DIR``, as ``chroot DIR`` would: absolute targets start at ``DIR`` and ``..`` stops there, so
nothing outside ``DIR`` is read and the paths returned are the host's own.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

_MAX_SYMLINKS = 40  # as Linux's MAXSYMLINKS: more links in one lookup is ELOOP


@dataclass(frozen=True)
class HostFS:
    """Reads the host's files by host path, with the host's ``/`` at ``root`` in this process.

    Confined lookups remember resolved directories: make one per scan of the host.
    """

    root: str = "/"
    # directory (host path) -> its resolved components under root
    _dirs: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def confined(self) -> bool:
        """Whether paths are looked up under another root (else they are used as they are)."""
        return self.root not in ("", "/")

    def locate(self, path: str, *, follow: bool = True) -> str:
        """Where the host path ``path`` is for this process, symlinks resolved inside the root
        (the last one only if ``follow``); OSError(ELOOP) on a symlink loop."""
        if not self.confined:
            return path
        parent, _, name = path.rstrip("/").rpartition("/")
        parts = self._directory(parent)
        if not follow and name not in ("", ".", ".."):
            return os.path.join(self.root, *parts, name)
        return os.path.join(self.root, *self._walk(list(parts), [name], path))

    def _directory(self, path: str) -> tuple[str, ...]:
        """The resolved components of the directory ``path``, remembered for the next lookup."""
        cached = self._dirs.get(path)
        if cached is None:
            cached = self._dirs[path] = tuple(self._walk([], path.split("/")[::-1], path))
        return cached

    def _walk(self, done: list[str], pending: list[str], path: str) -> list[str]:
        """Append ``pending`` (a reversed list of components) to the resolved ``done``."""
        hops = 0
        while pending:
            name = pending.pop()
            if name in ("", "."):
                continue
            if name == "..":
                if done:
                    done.pop()
                continue
            try:
                target = os.readlink(os.path.join(self.root, *done, name))
            except OSError:  # not a symlink, or missing: the name stays as it is
                done.append(name)
                continue
            hops += 1
            if hops > _MAX_SYMLINKS:
                raise OSError(errno.ELOOP, "too many levels of symbolic links", path)
            if target.startswith("/"):
                done.clear()
            pending.extend(target.split("/")[::-1])
        return done

    def stat(self, path: str) -> os.stat_result:
        """``os.stat`` of a host path (follows symlinks)."""
        return os.stat(self.locate(path))

    def lstat(self, path: str) -> os.stat_result:
        """``os.lstat`` of a host path (the last component is not followed)."""
        return os.lstat(self.locate(path, follow=False))

    def listdir(self, path: str) -> list[str]:
        """``os.listdir`` of a host path."""
        return os.listdir(self.locate(path))

    def readlink(self, path: str) -> str:
        """``os.readlink`` of a host path: the link text, unresolved."""
        return os.readlink(self.locate(path, follow=False))

    def read_bytes(self, path: str) -> bytes:
        """The content of a host file."""
        return Path(self.locate(path)).read_bytes()

    def realpath(self, path: str) -> str:
        """A canonical name for ``path`` (under the root when confined), for spotting aliases."""
        try:
            return self.locate(path) if self.confined else os.path.realpath(path)
        except OSError:
            return path

    def _holds(self, path: str, test: Callable[[str], bool], *, follow: bool = True) -> bool:
        try:
            where = self.locate(path, follow=follow)
        except OSError:  # a symlink loop: like ELOOP from the kernel, nothing is there
            return False
        return test(where)

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists (following symlinks)."""
        return self._holds(path, os.path.exists)

    def lexists(self, path: str) -> bool:
        """Whether ``path`` exists as anything, a broken symlink included."""
        return self._holds(path, os.path.lexists, follow=False)

    def isfile(self, path: str) -> bool:
        """Whether ``path`` is a regular file (following symlinks)."""
        return self._holds(path, os.path.isfile)

    def isdir(self, path: str) -> bool:
        """Whether ``path`` is a directory (following symlinks)."""
        return self._holds(path, os.path.isdir)

    def islink(self, path: str) -> bool:
        """Whether ``path`` itself is a symlink."""
        return self._holds(path, os.path.islink, follow=False)

    def is_executable(self, path: str) -> bool:
        """Whether ``path`` is a regular file this process may execute."""
        return self._holds(path, lambda where: os.path.isfile(where) and os.access(where, os.X_OK))


HOST = HostFS()


def host_path(root: str | Path, path: str) -> str:
    """``path`` (absolute, as in the container) under ``root`` on the host."""
    root_text = str(root)
    if root_text in ("", "/"):
        return path
    return str(Path(root_text) / path.lstrip("/"))
