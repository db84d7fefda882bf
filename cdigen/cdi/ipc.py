"""The driver daemons' IPC paths (sockets, the MPS pipe directory) and the check that one is
safe to mount into a container."""

from __future__ import annotations

import os
import stat

from cdigen.cdi.hostfs import HOST, HostFS

# Sockets of the driver's daemons. The MPS pipe directory is not here: it reaches only the
# containers of resources that use MPS, through the plugin's Allocate response.
IPC_PATHS = (
    "/run/nvidia-persistenced/socket",
    "/var/run/nvidia-persistenced/socket",
    "/run/nvidia-fabricmanager/socket",
    "/var/run/nvidia-fabricmanager/socket",
)
MPS_PIPE_DIR = "/tmp/nvidia-mps"  # nvidia-cuda-mps-control's default CUDA_MPS_PIPE_DIRECTORY


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
