"""Starting NVML: finding ``libnvidia-ml.so.1`` under the driver root (its ``ld.so.cache``
first), loading it into pynvml before ``nvmlInit``, and the one-line error, with advice for the
case, when it cannot start."""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdigen import logs
from cdigen.cdi.checks import CONTAINERIZED_DRIVER_ROOT
from cdigen.cdi.hostfs import HOST, HostFS, host_path
from cdigen.cdi.libdirs import LD_CACHE, LIBRARY_DIRS, read_ld_cache
from cdigen.errors import DiscoveryError

log = logs.logger("cdigen.discover.nvml_library")

NO_NVML_HINT = (
    "to run without a GPU driver use --node builtin:NAME (e.g. builtin:rtx4090) "
    "or --node FILE with a node file"
)
NVML_SONAME = "libnvidia-ml.so.1"


@dataclass(frozen=True)
class LibraryAttempt:
    """One place NVML's library was looked for, and why it was not used ("" if it was)."""

    path: str
    error: str = ""


def nvml_library_paths(driver_root: str = "/", fs: HostFS = HOST) -> list[str]:
    """Where ``libnvidia-ml.so.1`` may be under ``driver_root``, as this process reaches it: the
    root's ``ld.so.cache`` entries first (what its loader would pick), then the usual library
    directories that exist there (``LIBRARY_DIRS``). Symlinks resolve inside ``fs``'s root."""
    cached = [p for _soname, p in read_ld_cache(host_path(driver_root, LD_CACHE), fs)]
    wanted = [p for p in cached if p.rpartition("/")[2] == NVML_SONAME]
    wanted += [f"{d}/{NVML_SONAME}" for d in LIBRARY_DIRS if fs.isdir(host_path(driver_root, d))]
    paths: dict[str, str] = {}  # the directory's canonical name -> the path to load
    for path in dict.fromkeys(wanted):
        where = host_path(driver_root, path)
        directory = fs.realpath(where.rpartition("/")[0])
        try:
            located = fs.locate(where)
        except OSError:  # a symlink loop: nothing loadable there
            located = fs.root.rstrip("/") + where if fs.confined else where
        paths.setdefault(directory, located)
    return list(dict.fromkeys(paths.values()))


def preload_nvml_library(
    nvml: Any,
    driver_root: str = "/",
    fs: HostFS = HOST,
    *,
    cdll: Callable[[str], Any] = ctypes.CDLL,
) -> list[LibraryAttempt] | None:
    """Load ``libnvidia-ml.so.1`` from ``driver_root`` into ``nvml`` (pynvml's ``nvmlLib``,
    under its ``libLoadLock``) before ``nvmlInit``, which otherwise loads it by name only.

    Returns the attempts, in order; the last has no error when a file was loaded. None when the
    module already holds a library (nothing is tried). When nothing loads, ``nvmlInit`` falls
    back to the dynamic loader's search by name, as pynvml does on its own.
    """
    lock = getattr(nvml, "libLoadLock", None)
    attempts: list[LibraryAttempt] = []
    with lock if lock is not None else contextlib.nullcontext():
        if getattr(nvml, "nvmlLib", None) is not None:
            return None
        for path in nvml_library_paths(driver_root, fs):
            if not os.path.lexists(path):
                attempts.append(LibraryAttempt(path, "no such file"))
                continue
            try:
                library = cdll(path)
            except OSError as exc:
                reason = str(exc).removeprefix(f"{path}: ")
                attempts.append(LibraryAttempt(path, reason or "cannot be loaded"))
                continue
            nvml.nvmlLib = library
            attempts.append(LibraryAttempt(path))
            log.debug("NVML library: %s", path)
            return attempts
    return attempts


def start_nvml(
    nvml: Any,
    *,
    driver_root: str = "/",
    host_root: str = "/",
    cdll: Callable[[str], Any] = ctypes.CDLL,
) -> None:
    """Load NVML's library (from ``driver_root`` first, see :func:`preload_nvml_library`, then by
    name) and ``nvmlInit``; a DiscoveryError naming every path tried, with advice for the case."""
    fs = HostFS(host_root)
    attempts = preload_nvml_library(nvml, driver_root, fs, cdll=cdll)
    loaded = attempts is not None and bool(attempts) and not attempts[-1].error
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        code = getattr(exc, "value", None)
        if code == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", object()):
            raise _library_not_found(attempts, driver_root, fs) from None
        where = f" (NVML from {attempts[-1].path})" if attempts and loaded else ""
        raise DiscoveryError(_init_failure(nvml, exc) + where, hint=NO_NVML_HINT) from None
    broken = [f"{a.path} ({a.error})" for a in attempts or () if a.error != "no such file"]
    if broken and not loaded:
        log.warning("NVML loaded by name, not from the driver root: %s", ", ".join(broken))


def _library_not_found(
    found: list[LibraryAttempt] | None, driver_root: str, fs: HostFS
) -> DiscoveryError:
    """The error for "no libnvidia-ml.so.1 could be loaded", with advice that fits the case;
    ``found`` is what :func:`preload_nvml_library` tried (None: nothing, a library was set)."""
    attempts = found or []
    root = f" under host root {fs.root}" if fs.confined else ""
    missing = [a.path.rpartition("/")[0] for a in attempts if a.error == "no such file"]
    tried = [f"not in {', '.join(missing)}"] if missing else []
    if found == []:
        tried.append(f"no library directory under {driver_root}{root}")
    tried += [f"{a.path}: {a.error}" for a in attempts if a.error != "no such file"]
    tried.append("not found by name by the dynamic loader")
    message = f"NVML library not found ({NVML_SONAME}): {'; '.join(tried)}"
    if any(a.error != "no such file" for a in attempts):
        hint = (
            f"the file under --driver-root {driver_root}{root} is not a library this process "
            "can load (another architecture, or broken): check the driver installation"
        )
    elif driver_root not in ("", "/"):
        hint = (
            f"--driver-root {driver_root}{root} holds no NVIDIA driver: point it at the driver's "
            f"root ({CONTAINERIZED_DRIVER_ROOT} for a containerized driver, / for one installed "
            "on the host)"
        )
    elif any(os.path.lexists(p) for p in nvml_library_paths(CONTAINERIZED_DRIVER_ROOT, fs)):
        hint = f"the driver is containerized: add --driver-root {CONTAINERIZED_DRIVER_ROOT}"
    else:
        hint = (
            "install the NVIDIA driver on this machine, or point --driver-root at a "
            f"containerized one (e.g. {CONTAINERIZED_DRIVER_ROOT}); {NO_NVML_HINT}"
        )
    return DiscoveryError(message, hint=hint)


def _init_failure(nvml: Any, exc: Exception) -> str:
    code = getattr(exc, "value", None)
    if code == getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", object()):
        return "the NVIDIA kernel driver is not loaded, so NVML cannot start"
    if code == getattr(nvml, "NVML_ERROR_NO_PERMISSION", object()):
        return "no permission to use NVML (run as root or with access to /dev/nvidia*)"
    return f"NVML could not start: {exc}"
