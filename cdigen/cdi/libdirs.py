"""Where the driver root's loader finds libraries: the standard directories, then those named
in its ``ld.so.cache`` (parsed here, without running ``ldconfig``)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from cdigen.cdi.hostfs import HOST, HostFS, host_path

# Multiarch first (Debian/Ubuntu), then RPM-style lib64; ld.so.cache adds what else is configured.
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib",
    "/lib",
)
LD_CACHE = "/etc/ld.so.cache"

_LD_CACHE_NEW_MAGIC = b"glibc-ld.so.cache1.1"
_LD_CACHE_OLD_MAGIC = b"ld.so-1.7.0"
_LD_FLAG_ELF_LIBC6 = 0x0003
# 64-bit library flags in ld.so.cache (glibc's ldconfig.h): x86-64, powerpc64, s390x, aarch64.
_LD_FLAGS_64BIT = frozenset({0x0300, 0x0500, 0x0600, 0x0A00})


def read_ld_cache(path: str | Path, fs: HostFS = HOST) -> list[tuple[str, str]]:
    """``(soname, path)`` of the 64-bit libraries in an ``ld.so.cache`` file; [] if unreadable.

    Handles the new format (glibc >= 2.32 writes only this) and the old format with the new one
    appended. String offsets in new-format entries count from the start of the new header.
    """
    try:
        data = fs.read_bytes(str(path))
    except OSError:
        return []
    try:
        return _ld_cache_entries(data)
    except (struct.error, ValueError):  # truncated or corrupt: a short header, a string sans NUL
        return []


def _ld_cache_entries(data: bytes) -> list[tuple[str, str]]:
    start = 0
    if data.startswith(_LD_CACHE_OLD_MAGIC):
        (old_count,) = struct.unpack_from("<I", data, 12)
        start = (16 + old_count * 12 + 7) & ~7
    if data[start : start + len(_LD_CACHE_NEW_MAGIC)] != _LD_CACHE_NEW_MAGIC:
        return []
    (count,) = struct.unpack_from("<I", data, start + 20)
    entries = []
    for i in range(count):
        flags, key, value, _os, _hwcap = struct.unpack_from("<iIIIQ", data, start + 48 + 24 * i)
        if flags & 0xFF != _LD_FLAG_ELF_LIBC6 or flags & 0xFF00 not in _LD_FLAGS_64BIT:
            continue
        entries.append((_c_string(data, start + key), _c_string(data, start + value)))
    return entries


def _c_string(data: bytes, offset: int) -> str:
    end = data.index(b"\0", offset)
    return data[offset:end].decode("utf-8", "replace")


def _unique_dirs(root: str | Path, candidates: list[str], fs: HostFS) -> list[str]:
    seen: set[str] = set()
    dirs: list[str] = []
    for d in candidates:
        real = fs.realpath(host_path(root, d))
        if real in seen or not fs.isdir(host_path(root, d)):
            continue
        seen.add(real)
        dirs.append(d)
    return dirs


def library_dirs(driver_root: str | Path, fs: HostFS = HOST) -> list[str]:
    """Container paths of the library directories: the standard ones, then those in ld.so.cache."""
    cache = read_ld_cache(host_path(driver_root, LD_CACHE), fs)
    cached = [os.path.dirname(p) for _, p in cache]
    return _unique_dirs(driver_root, [*LIBRARY_DIRS, *dict.fromkeys(cached)], fs)
