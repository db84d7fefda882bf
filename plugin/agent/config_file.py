"""The one reader of a node agent's config files (``plugin serve --config-dir``): files read as
root from a directory that a ConfigMap fills.

A file is read only when it is what it must be: a regular file with one link that lies under
the directory once every symlink is resolved (a mounted ConfigMap's ``NAME -> ..data/NAME``
stays inside; ``ln -s /etc/shadow evil.yaml`` does not), opened without following a last
symlink, and no larger than the input limit, checked on the open file before a byte is read (a
symlink to a 1 GiB sparse file costs nothing). Its errors are one line naming the file and what
is wrong, never its content.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cdigen.errors import InputError, printable
from cdigen.fileio import file_kind, max_input_bytes


def read_config_file(directory: Path, path: Path, *, limit: int | None = None) -> bytes:
    """The bytes of config file ``path`` in ``directory``, or a one-line InputError (see the
    module)."""
    where = printable(str(path))
    limit = max_input_bytes() if limit is None else limit
    try:
        real_dir = os.path.realpath(directory, strict=True)
        real = os.path.realpath(path, strict=True)
    except OSError as exc:
        raise InputError(f"cannot read it: {exc.strerror}", where=where) from None
    if os.path.commonpath([real_dir, real]) != real_dir or real == real_dir:
        raise InputError(
            "it leads out of the config directory (a symlink to a file elsewhere); not read",
            where=where,
            hint=f"put the config itself under {printable(str(directory))}",
        )
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(real, flags)
    except OSError as exc:  # ELOOP: swapped for a symlink since; EACCES, ...
        raise InputError(f"cannot read it: {exc.strerror}", where=where) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"it is {file_kind(info.st_mode)}, not a regular file", where=where)
        if info.st_nlink != 1:
            raise InputError(
                f"it has {info.st_nlink} hard links (another file shares it); not read",
                where=where,
                hint="a config is a file of its own",
            )
        if info.st_size > limit:
            raise InputError(
                f"it is {info.st_size} bytes, more than the {limit} a config may be; not read",
                where=where,
                hint="is it the right file? a plugin config is a few KiB",
            )
        data = os.read(fd, limit + 1)  # the size may have grown since fstat
        if len(data) > limit:
            raise InputError(f"it grew past {limit} bytes while read; not read", where=where)
        return data
    except OSError as exc:
        raise InputError(f"cannot read it: {exc.strerror}", where=where) from None
    finally:
        os.close(fd)
