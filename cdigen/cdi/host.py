"""What the host has: driver files (driver root), device nodes (dev root), DRM nodes (sysfs).

Every function takes its root as a parameter and returns *container* paths (the path as seen from
inside that root) beside the host path, so that a driver installed under ``/run/nvidia/driver``
is mounted at ``/usr/lib/...`` in the container.
"""

from __future__ import annotations

import os
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

CONTROL_NODES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
HOOK_PROGRAM = "nvidia-cdi-hook"
BINARY_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin")
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
FIRMWARE_DIRS = ("/lib/firmware/nvidia", "/usr/lib/firmware/nvidia")
IPC_PATHS = (
    "/run/nvidia-persistenced/socket",
    "/var/run/nvidia-persistenced/socket",
    "/run/nvidia-fabricmanager/socket",
    "/var/run/nvidia-fabricmanager/socket",
    "/tmp/nvidia-mps",
)
LD_CACHE = "/etc/ld.so.cache"

_LD_CACHE_NEW_MAGIC = b"glibc-ld.so.cache1.1"
_LD_CACHE_OLD_MAGIC = b"ld.so-1.7.0"
_LD_FLAG_ELF_LIBC6 = 0x0003
# 64-bit library flags in ld.so.cache (glibc's ldconfig.h): x86-64, powerpc64, s390x, aarch64.
_LD_FLAGS_64BIT = frozenset({0x0300, 0x0500, 0x0600, 0x0A00})


@dataclass(frozen=True)
class DeviceNodeInfo:
    """A device node: its path in the container and on the host, and what ``stat`` says."""

    path: str
    host_path: str
    type: str | None = None  # "c" or "b"; None when the node is missing or not a device
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None  # permission bits only, as runc expects
    permissions: str | None = None  # cgroup access derived from the mode bits: "r", "w"


@dataclass(frozen=True)
class Library:
    """A versioned driver library and the SONAME links that point at it."""

    path: (
        str  # container path of the versioned file: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    )
    host_path: str
    sonames: tuple[str, ...] = ()  # e.g. ("libcuda.so.1",)


@dataclass(frozen=True)
class HostFile:
    """A file (binary, firmware, socket) to mount at the same path in the container."""

    path: str
    host_path: str


@dataclass(frozen=True)
class DriverFiles:
    """The driver's user-space files found under a driver root."""

    driver_version: str
    libraries: tuple[Library, ...] = ()
    binaries: tuple[HostFile, ...] = ()
    firmware: tuple[HostFile, ...] = ()
    ipc: tuple[HostFile, ...] = ()
    library_dirs: tuple[str, ...] = ()  # container paths of the directories holding libraries


def host_path(root: str | Path, path: str) -> str:
    """``path`` (absolute, as in the container) under ``root`` on the host."""
    root_text = str(root)
    if root_text in ("", "/"):
        return path
    return str(Path(root_text) / path.lstrip("/"))


def device_node(dev_root: str | Path, path: str) -> DeviceNodeInfo:
    """The node ``path`` (e.g. ``/dev/nvidia0``) under ``dev_root``; stat fields None if absent."""
    where = host_path(dev_root, path)
    try:
        st = os.stat(where)
    except OSError:
        return DeviceNodeInfo(path=path, host_path=where)
    if stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISBLK(st.st_mode):
        kind = "b"
    else:  # a plain file where a node should be: emit the path, let the runtime report it
        return DeviceNodeInfo(path=path, host_path=where)
    mode = stat.S_IMODE(st.st_mode)
    access = ("r" if mode & 0o444 else "") + ("w" if mode & 0o222 else "")
    return DeviceNodeInfo(
        path=path,
        host_path=where,
        type=kind,
        major=os.major(st.st_rdev),
        minor=os.minor(st.st_rdev),
        file_mode=mode,
        permissions=access or None,
    )


def node_exists(dev_root: str | Path, path: str) -> bool:
    """Whether ``path`` exists under ``dev_root`` (as anything)."""
    return os.path.lexists(host_path(dev_root, path))


def control_nodes(dev_root: str | Path) -> tuple[DeviceNodeInfo, ...]:
    """The NVIDIA control nodes that exist under ``dev_root``."""
    return tuple(device_node(dev_root, p) for p in CONTROL_NODES if node_exists(dev_root, p))


def sysfs_bus_id(pci_bus_id: str) -> str:
    """NVML's ``00000000:07:00.0`` -> sysfs's ``0000:07:00.0`` (4-digit domain, lower case)."""
    domain, _, rest = pci_bus_id.strip().lower().rpartition(":")
    domain, _, bus = domain.rpartition(":") if domain.count(":") else ("0", "", domain)
    try:
        return f"{int(domain or '0', 16):04x}:{bus}:{rest}"
    except ValueError:
        return pci_bus_id.lower()


def drm_nodes(sysfs_root: str | Path, pci_bus_id: str) -> tuple[str, ...]:
    """``/dev/dri/cardN`` and ``renderDN`` of a GPU, from ``<sysfs>/bus/pci/devices/<bdf>/drm``."""
    drm = Path(sysfs_root) / "bus" / "pci" / "devices" / sysfs_bus_id(pci_bus_id) / "drm"
    try:
        names = os.listdir(drm)
    except OSError:
        return ()
    found = [n for n in names if re.fullmatch(r"card\d+|renderD\d+", n)]
    # cards before render nodes, each in numeric order
    found.sort(key=lambda n: (n.startswith("render"), int(re.sub(r"\D", "", n))))
    return tuple(f"/dev/dri/{n}" for n in found)


def read_ld_cache(path: str | Path) -> list[tuple[str, str]]:
    """``(soname, path)`` of the 64-bit libraries in an ``ld.so.cache`` file; [] if unreadable.

    Handles the new format (glibc >= 2.32 writes only this) and the old format with the new one
    appended. String offsets in new-format entries count from the start of the new header.
    """
    try:
        data = Path(path).read_bytes()
    except OSError:
        return []
    start = 0
    if data.startswith(_LD_CACHE_OLD_MAGIC):
        (old_count,) = struct.unpack_from("<I", data, 12)
        start = (16 + old_count * 12 + 7) & ~7
    if data[start : start + len(_LD_CACHE_NEW_MAGIC)] != _LD_CACHE_NEW_MAGIC:
        return []
    try:
        (count,) = struct.unpack_from("<I", data, start + 20)
        entries = []
        for i in range(count):
            flags, key, value, _os, _hwcap = struct.unpack_from("<iIIIQ", data, start + 48 + 24 * i)
            if flags & 0xFF != _LD_FLAG_ELF_LIBC6 or flags & 0xFF00 not in _LD_FLAGS_64BIT:
                continue
            entries.append((_c_string(data, start + key), _c_string(data, start + value)))
    except struct.error:
        return []
    return entries


def _c_string(data: bytes, offset: int) -> str:
    end = data.index(b"\0", offset)
    return data[offset:end].decode("utf-8", "replace")


def _unique_dirs(root: str | Path, candidates: list[str]) -> list[str]:
    seen: set[str] = set()
    dirs: list[str] = []
    for d in candidates:
        real = os.path.realpath(host_path(root, d))
        if real in seen or not os.path.isdir(real):
            continue
        seen.add(real)
        dirs.append(d)
    return dirs


def library_dirs(driver_root: str | Path) -> list[str]:
    """Container paths of the library directories: the standard ones, then those in ld.so.cache."""
    cached = [os.path.dirname(p) for _, p in read_ld_cache(host_path(driver_root, LD_CACHE))]
    return _unique_dirs(driver_root, [*LIBRARY_DIRS, *dict.fromkeys(cached)])


def _links_by_target(directory: str, entries: list[str]) -> dict[str, list[str]]:
    """Target file name -> names of the symlinks in ``directory`` that resolve to it.

    Bare ``.so`` links are left out: they are for the linker, and the hook creates them.
    """
    targets: dict[str, str] = {}
    for name in entries:
        try:
            targets[name] = os.readlink(os.path.join(directory, name))
        except OSError:  # not a symlink
            continue
    links: dict[str, list[str]] = {}
    for name, target in targets.items():
        if name.endswith(".so"):
            continue
        for _ in range(8):  # follow links to names in the same directory without stat-ing paths
            if "/" in target or target not in targets:
                break
            target = targets[target]
        if "/" in target:
            target = os.path.basename(os.path.realpath(os.path.join(directory, name)))
        links.setdefault(target, []).append(name)
    return links


def detect_driver_version(driver_root: str | Path) -> str:
    """The version in ``libcuda.so.<version>`` under the driver root, or "" if there is none."""
    for d in library_dirs(driver_root):
        for name in sorted(os.listdir(host_path(driver_root, d))):
            m = re.fullmatch(r"libcuda\.so\.(\d+\.\d+(?:\.\d+)?)", name)
            if m:
                return m.group(1)
    return ""


def _find_libraries(driver_root: str | Path, version: str) -> tuple[list[Library], list[str]]:
    pattern = re.compile(rf"lib.+\.so\.{re.escape(version)}")
    libraries: list[Library] = []
    dirs_used: list[str] = []
    for d in library_dirs(driver_root):
        host_dir = host_path(driver_root, d)
        entries = sorted(os.listdir(host_dir))
        links = _links_by_target(host_dir, entries)
        for name in entries:
            full = os.path.join(host_dir, name)
            if pattern.fullmatch(name) and os.path.isfile(full) and not os.path.islink(full):
                libraries.append(
                    Library(
                        path=f"{d.rstrip('/')}/{name}",
                        host_path=full,
                        sonames=tuple(links.get(name, ())),
                    )
                )
                if d not in dirs_used:
                    dirs_used.append(d)
    return libraries, dirs_used


def _first_existing(root: str | Path, paths: list[str]) -> list[HostFile]:
    seen: set[str] = set()
    found = []
    for p in paths:
        full = host_path(root, p)
        real = os.path.realpath(full)
        if os.path.exists(full) and real not in seen:
            seen.add(real)
            found.append(HostFile(path=p, host_path=full))
    return found


def _binaries(driver_root: str | Path) -> list[HostFile]:
    found = []
    for name in BINARIES:
        for d in BINARY_DIRS:
            full = host_path(driver_root, f"{d}/{name}")
            if os.path.isfile(full):
                found.append(HostFile(path=f"{d}/{name}", host_path=full))
                break
    return found


def _firmware(driver_root: str | Path, version: str) -> list[HostFile]:
    candidates = []
    for d in FIRMWARE_DIRS:
        host_dir = host_path(driver_root, f"{d}/{version}")
        if os.path.isdir(host_dir):
            candidates += [
                f"{d}/{version}/{n}" for n in sorted(os.listdir(host_dir)) if n.endswith(".bin")
            ]
    return _first_existing(driver_root, candidates)


def scan_driver(driver_root: str | Path, driver_version: str = "") -> DriverFiles:
    """Find the driver's libraries, binaries, GSP firmware and IPC sockets under ``driver_root``.

    ``driver_version`` selects ``lib*.so.<version>``; when empty it is read from ``libcuda.so.*``.
    """
    version = driver_version or detect_driver_version(driver_root)
    libraries, dirs_used = _find_libraries(driver_root, version) if version else ([], [])
    return DriverFiles(
        driver_version=version,
        libraries=tuple(libraries),
        binaries=tuple(_binaries(driver_root)),
        firmware=tuple(_firmware(driver_root, version)) if version else (),
        ipc=tuple(_first_existing(driver_root, list(IPC_PATHS))),
        library_dirs=tuple(dirs_used),
    )


def find_hook(driver_root: str | Path) -> str | None:
    """The host path of ``nvidia-cdi-hook`` in the driver root's binary directories, or None."""
    for d in BINARY_DIRS:
        full = host_path(driver_root, f"{d}/{HOOK_PROGRAM}")
        if os.path.isfile(full) and os.access(full, os.X_OK):
            return full
    return None
