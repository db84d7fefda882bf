"""Checks that keep ``cdigen generate`` from writing a silently empty spec.

A root flag that points at nothing is bad input. A driver root without the libraries of the node's
driver gives a spec with device nodes only: containers would start without ``libcuda``. For a node
NVML reported (the hardware itself) that is an error; for a simulated node (a built-in sample or a
node file) it is expected on a machine without that driver, so it is one warning line.
"""

from __future__ import annotations

import os

from cdigen.cdi.driverfiles import detect_driver_version
from cdigen.cdi.hostfs import HostFS, host_path
from cdigen.cdi.libdirs import library_dirs
from cdigen.discover.sources import from_hardware
from cdigen.errors import InputError
from cdigen.model import Node

CONTAINERIZED_DRIVER_ROOT = "/run/nvidia/driver"  # where the GPU Operator's driver container is


def _under(fs: HostFS) -> str:
    return f" under --host-root {fs.root}" if fs.confined else ""


def require_dir(path: str, flag: str, fs: HostFS, hint: str) -> None:
    """InputError unless the host path ``path`` (given with ``flag``) is a directory."""
    try:
        where = fs.locate(path)
    except OSError as e:  # a symlink loop: following it further could leave the root
        raise InputError(
            f"cannot resolve {path}: {e.strerror}",
            where=f"--host-root {fs.root}" if fs.confined else flag,
            hint="fix the symlinks",
        ) from e
    if os.path.isdir(where):
        return
    what = "is not a directory" if os.path.lexists(where) else "does not exist"
    raise InputError(f"{path!r} {what}{_under(fs)}", where=flag, hint=hint)


def check_roots(
    *, driver_root: str, dev_root: str, sysfs_root: str, hook_path: str | None, fs: HostFS
) -> None:
    """InputError (exit 2) for the first root flag that points at nothing, and for a
    ``--hook-path`` that is not an executable file."""
    require_dir(
        driver_root,
        "--driver-root",
        fs,
        f"give the directory the driver is installed under: / for a driver on the host, "
        f"{CONTAINERIZED_DRIVER_ROOT} for a containerized one",
    )
    require_dir(dev_root, "--dev-root", fs, "give the directory holding dev/nvidia* (default: /)")
    require_dir(sysfs_root, "--sysfs-root", fs, "give the sysfs mount (default: /sys)")
    if hook_path is not None and not fs.is_executable(hook_path):
        what = "is not an executable file" if fs.exists(hook_path) else "does not exist"
        raise InputError(
            f"{hook_path!r} {what}{_under(fs)}",
            where="--hook-path",
            hint="give the host path of nvidia-cdi-hook, or leave --hook-path out (then it is "
            "looked for under the driver root)",
        )


def has_libcuda(driver_root: str, version: str, fs: HostFS) -> bool:
    """Whether ``libcuda.so.<version>`` is in one of the driver root's library directories."""
    return any(
        fs.isfile(host_path(driver_root, f"{d.rstrip('/')}/libcuda.so.{version}"))
        for d in library_dirs(driver_root, fs)
    )


def _said_by(source: str) -> str:
    return "NVML" if from_hardware(source) else f"NVML, as {source} records it"


def check_driver_libraries(
    node: Node, driver_root: str, fs: HostFS, *, source: str, hardware: bool
) -> str | None:
    """None when the spec will mount the node's driver libraries from ``driver_root``.

    Otherwise, for a node from the hardware (``hardware``: NVML) an InputError naming the root
    and both versions; for a simulated node (``source`` names it) the warning to print, one line.
    """
    wanted = node.driver_version
    if wanted and has_libcuda(driver_root, wanted, fs):
        return None
    present = detect_driver_version(driver_root, fs)
    if present and (not wanted or present == wanted):
        return None
    where = f"--driver-root {driver_root}{_under(fs)}"
    if hardware:
        if present:
            raise InputError(
                f"the libraries there are driver {present}'s, but the running driver is "
                f"{wanted} ({_said_by(source)})",
                where=where,
                hint="the spec would start containers without libcuda; point --driver-root at "
                f"the running driver's files (a containerized driver: {CONTAINERIZED_DRIVER_ROOT})"
                ", or finish the driver upgrade (reboot or reload the kernel module)",
            )
        raise InputError(
            f"no libraries of the running driver {wanted or '(version unknown)'} "
            f"({_said_by(source)}) there "
            "(no libcuda.so.*)",
            where=where,
            hint="the spec would start containers without libcuda; point --driver-root at the "
            f"driver's files ({CONTAINERIZED_DRIVER_ROOT} for a containerized driver, / for one "
            "installed on the host)",
        )
    if present:
        why = (
            f"{source} says driver {wanted} but {driver_root}{_under(fs)} has driver "
            f"{present}'s libraries"
        )
    else:
        why = f"no NVIDIA driver libraries (libcuda.so.*) under {where}"
    return (
        f"the spec lists device nodes only, no driver libraries: {why} "
        f"(fine to try out a simulated node; on a GPU node use --node nvml)"
    )
