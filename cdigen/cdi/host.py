"""What the host has: driver files (driver root), device nodes (dev root), DRM nodes (sysfs).

Every function takes its root as a parameter and returns *container* paths (the path as seen from
inside that root) beside the host path, so that a driver installed under ``/run/nvidia/driver``
is mounted at ``/usr/lib/...`` in the container.

All file access goes through a :class:`HostFS`. Run on the host, it is plain ``os``. Run in a
container with the host's ``/`` mounted at ``DIR`` (``cdigen generate --host-root DIR``), it
reads ``DIR/<path>`` for the host path ``<path>`` and resolves every symlink inside ``DIR``, as
``chroot DIR`` would: absolute targets start at ``DIR`` and ``..`` stops there, so nothing outside
``DIR`` is read and the paths returned are the host's own.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cdigen.nodefile import normalize_bus_id

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
# Sockets of the driver's daemons. The MPS pipe directory is not here: it reaches only the
# containers of resources that use MPS, through the plugin's Allocate response.
IPC_PATHS = (
    "/run/nvidia-persistenced/socket",
    "/var/run/nvidia-persistenced/socket",
    "/run/nvidia-fabricmanager/socket",
    "/var/run/nvidia-fabricmanager/socket",
)
MPS_PIPE_DIR = "/tmp/nvidia-mps"  # nvidia-cuda-mps-control's default CUDA_MPS_PIPE_DIRECTORY
# Driver libraries whose version is their own, not the driver's (EGL platform libraries).
OWN_VERSION_LIBRARY = re.compile(
    r"libnvidia-egl-(?:gbm|wayland|wayland2|xcb|xlib)\.so\.\d+(?:\.\d+)+"
)
LIBRARY_SUBDIRS = ("vdpau",)  # driver libraries in a subdirectory of a library directory
# Configuration files: (path relative to a config dir, container dir it goes to).
CONFIG_FILES = (
    ("OpenCL/vendors/nvidia.icd", "/etc"),
    ("vulkan/icd.d/nvidia_icd.json", "/usr/share"),
    ("vulkan/icd.d/nvidia_icd.x86_64.json", "/usr/share"),
    ("vulkan/icd.d/nvidia_layers.json", "/usr/share"),
    ("vulkan/implicit_layer.d/nvidia_layers.json", "/usr/share"),
    ("glvnd/egl_vendor.d/10_nvidia.json", "/usr/share"),
    ("egl/egl_external_platform.d/15_nvidia_gbm.json", "/usr/share"),
    ("egl/egl_external_platform.d/10_nvidia_wayland.json", "/usr/share"),
    ("egl/egl_external_platform.d/09_nvidia_wayland2.json", "/usr/share"),
    ("egl/egl_external_platform.d/20_nvidia_xcb.json", "/usr/share"),
    ("egl/egl_external_platform.d/20_nvidia_xlib.json", "/usr/share"),
    ("nvidia/nvoptix.bin", "/usr/share"),
    ("X11/xorg.conf.d/10-nvidia.conf", "/usr/share"),
    ("X11/xorg.conf.d/nvidia-drm-outputclass.conf", "/usr/share"),
)
CONFIG_DIRS = ("/etc", "/usr/share", "/usr/local/share")
LD_CACHE = "/etc/ld.so.cache"

_LD_CACHE_NEW_MAGIC = b"glibc-ld.so.cache1.1"
_LD_CACHE_OLD_MAGIC = b"ld.so-1.7.0"
_LD_FLAG_ELF_LIBC6 = 0x0003
# 64-bit library flags in ld.so.cache (glibc's ldconfig.h): x86-64, powerpc64, s390x, aarch64.
_LD_FLAGS_64BIT = frozenset({0x0300, 0x0500, 0x0600, 0x0A00})
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
    linker_names: tuple[str, ...] = ()  # ``.so`` links on the host, e.g. ("libcuda.so",)

    @property
    def stem(self) -> str:
        """The name before ``.so``: ``libcuda`` (what capabilities classify libraries by)."""
        return self.path.rpartition("/")[2].partition(".so")[0]

    @property
    def subdir(self) -> str:
        """The subdirectory of its library directory (``vdpau/``), or ""."""
        parent = self.path.rpartition("/")[0].rpartition("/")[2]
        return f"{parent}/" if parent in LIBRARY_SUBDIRS else ""


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
    configs: tuple[HostFile, ...] = ()  # ICD, vendor and platform files, at container paths


def host_path(root: str | Path, path: str) -> str:
    """``path`` (absolute, as in the container) under ``root`` on the host."""
    root_text = str(root)
    if root_text in ("", "/"):
        return path
    return str(Path(root_text) / path.lstrip("/"))


def device_node(dev_root: str | Path, path: str, fs: HostFS = HOST) -> DeviceNodeInfo:
    """The node ``path`` (e.g. ``/dev/nvidia0``) under ``dev_root``; stat fields None if absent."""
    where = host_path(dev_root, path)
    try:
        st = fs.stat(where)
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


def node_exists(dev_root: str | Path, path: str, fs: HostFS = HOST) -> bool:
    """Whether ``path`` exists under ``dev_root`` (as anything)."""
    return fs.lexists(host_path(dev_root, path))


def control_nodes(dev_root: str | Path, fs: HostFS = HOST) -> tuple[DeviceNodeInfo, ...]:
    """The NVIDIA control nodes that exist under ``dev_root``."""
    return tuple(
        device_node(dev_root, p, fs) for p in CONTROL_NODES if node_exists(dev_root, p, fs)
    )


def drm_nodes(sysfs_root: str | Path, pci_bus_id: str, fs: HostFS = HOST) -> tuple[str, ...]:
    """``/dev/dri/cardN`` and ``renderDN`` of a GPU, from ``<sysfs>/bus/pci/devices/<bdf>/drm``."""
    drm = Path(sysfs_root) / "bus" / "pci" / "devices" / normalize_bus_id(pci_bus_id) / "drm"
    try:
        names = fs.listdir(str(drm))
    except OSError:
        return ()
    found = [n for n in names if re.fullmatch(r"card\d+|renderD\d+", n)]
    # cards before render nodes, each in numeric order
    found.sort(key=lambda n: (n.startswith("render"), int(re.sub(r"\D", "", n))))
    return tuple(f"/dev/dri/{n}" for n in found)


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


def _links_by_target(directory: str, entries: list[str], fs: HostFS) -> dict[str, list[str]]:
    """Target file name -> names of the symlinks in ``directory`` that resolve to it."""
    targets: dict[str, str] = {}
    for name in entries:
        try:
            targets[name] = fs.readlink(os.path.join(directory, name))
        except OSError:  # not a symlink
            continue
    links: dict[str, list[str]] = {}
    for name, target in targets.items():
        for _ in range(8):  # follow links to names in the same directory without stat-ing paths
            if "/" in target or target not in targets:
                break
            target = targets[target]
        if "/" in target:
            target = os.path.basename(fs.realpath(os.path.join(directory, name)))
        links.setdefault(target, []).append(name)
    return links


def detect_driver_version(driver_root: str | Path, fs: HostFS = HOST) -> str:
    """The version in ``libcuda.so.<version>`` under the driver root, or "" if there is none."""
    for d in library_dirs(driver_root, fs):
        for name in sorted(fs.listdir(host_path(driver_root, d))):
            m = re.fullmatch(r"libcuda\.so\.(\d+\.\d+(?:\.\d+)?)", name)
            if m:
                return m.group(1)
    return ""


def _libraries_in(
    driver_root: str | Path, directory: str, pattern: re.Pattern[str], fs: HostFS
) -> list[Library]:
    """The driver libraries (regular files matching ``pattern``) in one container directory."""
    host_dir = host_path(driver_root, directory)
    try:
        entries = sorted(fs.listdir(host_dir))
    except OSError:
        return []
    links = _links_by_target(host_dir, entries, fs)
    found = []
    for name in entries:
        full = os.path.join(host_dir, name)
        if (
            (pattern.fullmatch(name) or OWN_VERSION_LIBRARY.fullmatch(name))
            and fs.isfile(full)
            and not fs.islink(full)
        ):
            names = links.get(name, ())
            found.append(
                Library(
                    path=f"{directory.rstrip('/')}/{name}",
                    host_path=full,
                    sonames=tuple(n for n in names if not n.endswith(".so")),
                    linker_names=tuple(n for n in names if n.endswith(".so")),
                )
            )
    return found


def _find_libraries(
    driver_root: str | Path, version: str, fs: HostFS
) -> tuple[list[Library], list[str]]:
    pattern = re.compile(rf"lib.+\.so\.{re.escape(version)}")
    libraries: list[Library] = []
    dirs_used: list[str] = []
    dirs = library_dirs(driver_root, fs)
    subdirs = {f"{d.rstrip('/')}/{sub}" for d in dirs for sub in LIBRARY_SUBDIRS}
    for d in dirs:
        if d in subdirs:  # vdpau/ named in ld.so.cache: scanned below, as a subdirectory
            continue
        found = _libraries_in(driver_root, d, pattern, fs)
        if found and d not in dirs_used:
            dirs_used.append(d)
        libraries += found
        for sub in LIBRARY_SUBDIRS:  # vdpau/: loaded by path, not through the loader's dirs
            if fs.isdir(host_path(driver_root, f"{d}/{sub}")):
                libraries += _libraries_in(driver_root, f"{d}/{sub}", pattern, fs)
    return libraries, dirs_used


def _first_existing(root: str | Path, paths: list[str], fs: HostFS) -> list[HostFile]:
    seen: set[str] = set()
    found = []
    for p in paths:
        full = host_path(root, p)
        real = fs.realpath(full)
        if fs.exists(full) and real not in seen:
            seen.add(real)
            found.append(HostFile(path=p, host_path=full))
    return found


def _binaries(driver_root: str | Path, fs: HostFS) -> list[HostFile]:
    found = []
    for name in BINARIES:
        for d in BINARY_DIRS:
            full = host_path(driver_root, f"{d}/{name}")
            if fs.isfile(full):
                found.append(HostFile(path=f"{d}/{name}", host_path=full))
                break
    return found


def _firmware(driver_root: str | Path, version: str, fs: HostFS) -> list[HostFile]:
    candidates = []
    for d in FIRMWARE_DIRS:
        host_dir = host_path(driver_root, f"{d}/{version}")
        if fs.isdir(host_dir):
            candidates += [
                f"{d}/{version}/{n}" for n in sorted(fs.listdir(host_dir)) if n.endswith(".bin")
            ]
    return _first_existing(driver_root, candidates, fs)


def _configs(driver_root: str | Path, fs: HostFS) -> list[HostFile]:
    """ICD, vendor and platform files: the first of /etc, /usr/share, /usr/local/share that has
    each one, at the container path its loader reads."""
    found = []
    for relative, container_dir in CONFIG_FILES:
        for d in CONFIG_DIRS:
            full = host_path(driver_root, f"{d}/{relative}")
            if fs.isfile(full):
                found.append(HostFile(path=f"{container_dir}/{relative}", host_path=full))
                break
    return found


def ipc_problem(
    path: str, fs: HostFS = HOST, *, directory: bool = False, shared: bool = False
) -> str | None:
    """Why the IPC path ``path`` (host path, as ``fs`` sees it) must not be mounted, or None.

    The driver's daemons make their sockets and the MPS pipe directory as root: accept only
    that, owned by root (or by the user running cdigen), not a symlink, not writable by others,
    and, but for the MPS pipe directory itself, not in a world-writable directory such as /tmp.
    ``shared``: a directory that clients of any user write in (the MPS daemon's shared memory,
    mode 1777 as /dev/shm is), so it may itself be world-writable.
    """
    try:
        st = fs.lstat(path)
        parent = fs.stat(os.path.dirname(path.rstrip("/")) or "/")
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symlink; give the real {'directory' if directory else 'socket'}"
    if directory and not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if not directory and not stat.S_ISSOCK(st.st_mode):
        return f"{path} is not a socket"
    if st.st_uid not in (0, os.geteuid()):
        return f"{path} is owned by uid {st.st_uid}, not root"
    if directory and st.st_mode & 0o002 and not shared:
        return f"{path} is world-writable"
    if parent.st_mode & 0o002 and not (directory and path.rstrip("/").endswith(MPS_PIPE_DIR)):
        return f"{path} is in a world-writable directory"
    return None


def _ipc(driver_root: str | Path, fs: HostFS) -> list[HostFile]:
    return [
        f
        for f in _first_existing(driver_root, list(IPC_PATHS), fs)
        if ipc_problem(f.host_path, fs) is None
    ]


def _confine(files: DriverFiles, driver_root: str) -> DriverFiles:
    """``files`` with every host path that leaves ``driver_root`` through an absolute symlink
    resolved inside the root instead, as ``--host-root`` does (dropped if nothing is there)."""
    inside = HostFS(driver_root)
    real_root = os.path.realpath(driver_root)

    def fix(host: str) -> str | None:
        real = os.path.realpath(host)
        if real == real_root or real.startswith(real_root.rstrip("/") + "/"):
            return host
        try:
            where = inside.locate("/" + os.path.relpath(host, driver_root))
        except OSError:
            return None
        return where if os.path.exists(where) else None

    def fix_all(items: tuple[HostFile, ...]) -> tuple[HostFile, ...]:
        out = []
        for f in items:
            host = fix(f.host_path)
            if host is not None:
                out.append(HostFile(path=f.path, host_path=host))
        return tuple(out)

    libraries = []
    for lib in files.libraries:
        host = fix(lib.host_path)
        if host is not None:
            libraries.append(
                Library(lib.path, host, sonames=lib.sonames, linker_names=lib.linker_names)
            )
    return DriverFiles(
        driver_version=files.driver_version,
        libraries=tuple(libraries),
        binaries=fix_all(files.binaries),
        firmware=fix_all(files.firmware),
        ipc=fix_all(files.ipc),
        library_dirs=files.library_dirs,
        configs=fix_all(files.configs),
    )


def scan_driver(
    driver_root: str | Path, driver_version: str = "", fs: HostFS = HOST
) -> DriverFiles:
    """Find the driver's libraries, binaries, GSP firmware, config files and IPC sockets under
    ``driver_root``.

    ``driver_version`` selects ``lib*.so.<version>``; when empty it is read from ``libcuda.so.*``.
    With a driver root but no host root, a path that an absolute symlink leads out of the driver
    root is resolved inside it instead (see :func:`_confine`).
    """
    version = driver_version or detect_driver_version(driver_root, fs)
    libraries, dirs_used = _find_libraries(driver_root, version, fs) if version else ([], [])
    files = DriverFiles(
        driver_version=version,
        libraries=tuple(libraries),
        binaries=tuple(_binaries(driver_root, fs)),
        firmware=tuple(_firmware(driver_root, version, fs)) if version else (),
        ipc=tuple(_ipc(driver_root, fs)),
        library_dirs=tuple(dirs_used),
        configs=tuple(_configs(driver_root, fs)),
    )
    root = str(driver_root)
    if fs.confined or root in ("", "/"):
        return files
    return _confine(files, root)


def find_hook(driver_root: str | Path, fs: HostFS = HOST) -> str | None:
    """The host path of ``nvidia-cdi-hook`` in the driver root's binary directories, or None."""
    for d in BINARY_DIRS:
        full = host_path(driver_root, f"{d}/{HOOK_PROGRAM}")
        if fs.is_executable(full):
            return full
    return None
