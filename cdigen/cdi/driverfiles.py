"""The driver's user-space files under a driver root: versioned libraries with their SONAME
links, binaries, GSP firmware, ICD/vendor config files, IPC sockets and the CDI hook.

Every function takes its root as a parameter and returns *container* paths (the path as seen from
inside that root) beside the host path, so that a driver installed under ``/run/nvidia/driver``
is mounted at ``/usr/lib/...`` in the container. Files are read through a
:class:`~cdigen.cdi.hostfs.HostFS` (``--host-root``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cdigen.cdi.hostfs import HOST, HostFS, host_path
from cdigen.cdi.ipc import IPC_PATHS, ipc_problem
from cdigen.cdi.libdirs import library_dirs

BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
HOOK_PROGRAM = "nvidia-cdi-hook"
BINARY_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin")
FIRMWARE_DIRS = ("/lib/firmware/nvidia", "/usr/lib/firmware/nvidia")
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


def _first_file(
    driver_root: str | Path, dirs: Sequence[str], relative: str, fs: HostFS
) -> tuple[str, str] | None:
    """The first of ``dirs`` holding the regular file ``relative`` under the driver root, and
    its host path; None when none does."""
    for d in dirs:
        full = host_path(driver_root, f"{d}/{relative}")
        if fs.isfile(full):
            return d, full
    return None


def _binaries(driver_root: str | Path, fs: HostFS) -> list[HostFile]:
    found = []
    for name in BINARIES:
        if hit := _first_file(driver_root, BINARY_DIRS, name, fs):
            found.append(HostFile(path=f"{hit[0]}/{name}", host_path=hit[1]))
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
        if hit := _first_file(driver_root, CONFIG_DIRS, relative, fs):
            found.append(HostFile(path=f"{container_dir}/{relative}", host_path=hit[1]))
    return found


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
