"""MPS for both plugins: the client limits a container's environment carries, and the mounts of
the MPS control daemon's pipe and shared-memory directories, with the checks that decide whether
a node directory may be mounted at all. Each wing words a refusal in its own settings' names.

A pinned-memory limit is keyed by default by the GPU's CUDA ordinal in the container, with
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that the ordinals follow PCI bus order: NVIDIA's device plugin
moved from UUID keys to index keys (v0.15.0) because the driver ignored UUID-keyed limits.
``uuid`` keys remain a choice. The SM share has one rule: the client's memory limit as a share
of the GPU's memory, in whole percent (at least 1), unless a fixed percentage is asked for.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from cdigen.model import Gpu

MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
MPS_MEMORY_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
DEVICE_ORDER_ENV = "CUDA_DEVICE_ORDER"
# where an MPS client looks for the daemon's shared memory: the node's shm directory goes there
MPS_SHM_PATH = "/dev/shm"
LIMIT_KEYS = ("index", "uuid")
PIPE_HINT = "the directory the node's nvidia-cuda-mps-control uses, e.g. /run/nvidia/mps"
PROPORTIONAL = 0  # as a thread percentage: the client's share of the GPU's memory


@dataclass(frozen=True)
class GpuLimit:
    """One GPU of a container and the pinned memory its MPS client may use (None: no limit)."""

    gpu: Gpu
    memory_bytes: int | None


def limits_env(
    limits: Sequence[GpuLimit],
    container_gpus: Sequence[Gpu],
    *,
    limit_key: str = "index",
    thread_percentage: int | None = PROPORTIONAL,
    pipe_dir: str | None = None,
) -> list[tuple[str, str]]:
    """The MPS client environment of one container: a pinned-memory limit per GPU of
    ``limits`` (keyed by CUDA ordinal among ``container_gpus`` in PCI bus order, or by UUID),
    the SM share (None: none; PROPORTIONAL; or 1-100) and the daemon's pipe directory."""
    in_bus_order = sorted({g.pci_bus_id.lower() for g in container_gpus})
    memory = []
    shares = []
    for limit in limits:
        if limit.memory_bytes is None:
            continue
        gpu = limit.gpu
        key = gpu.uuid if limit_key == "uuid" else str(in_bus_order.index(gpu.pci_bus_id.lower()))
        memory.append(f"{key}={limit.memory_bytes >> 20}M")
        shares.append(limit.memory_bytes / gpu.memory_bytes if gpu.memory_bytes else 1.0)
    env = [(MPS_MEMORY_ENV, ",".join(memory))] if memory else []
    if memory and limit_key == "index":
        env.append((DEVICE_ORDER_ENV, "PCI_BUS_ID"))
    if thread_percentage == PROPORTIONAL:
        # one percentage per client process: the smallest share, so no GPU gets more than its part
        env.append((MPS_THREADS_ENV, str(max(1, min(100, int(100 * min(shares or [1.0])))))))
    elif thread_percentage is not None:
        env.append((MPS_THREADS_ENV, str(thread_percentage)))
    if pipe_dir is not None:
        env.append((MPS_PIPE_ENV, pipe_dir))
    return env


SHM_HINT = (
    "a node directory (a tmpfs) that the MPS control daemon has at /dev/shm, "
    "e.g. /run/nvidia/mps-shm"
)


def shm_directory_problem(shm: object, pipe: str | None) -> str | None:
    """Why ``shm`` cannot be the MPS daemon's shared-memory directory, or None: it must be an
    absolute path, not the host's own /dev/shm (every pod would share the node's), not the
    pipe directory, and it needs a pipe directory (without MPS nobody uses it).

    The text follows the name of the setting (``mps.shmDirectory``, ``--mps-shm-dir``).
    """
    if not isinstance(shm, str) or not shm.startswith("/"):
        return f"must be an absolute path, got {shm!r}"
    normal = os.path.normpath(shm)
    if normal == MPS_SHM_PATH:
        return f"must not be the node's own {MPS_SHM_PATH}, got {shm!r}"
    if pipe is None:
        return f"{shm!r} needs an MPS pipe directory as well (clients reach the daemon there)"
    if normal == os.path.normpath(pipe):
        return f"must not be the pipe directory {pipe!r}"
    return None


def mps_directory_problem(path: str, *, shared: bool = False) -> str | None:
    """Why the MPS directory ``path`` must not be mounted into a container, or None. One that
    is not there yet is fine: the runtime makes it, and the daemon's own mount of the same path
    then shares it. ``shared``: the shared-memory directory, world-writable as /dev/shm is
    (see :func:`cdigen.cdi.ipc.ipc_problem`)."""
    from cdigen.cdi.ipc import ipc_problem

    return ipc_problem(path, directory=True, shared=shared) if os.path.lexists(path) else None


@dataclass(frozen=True)
class MpsMount:
    """A directory of the MPS control daemon bound into a container: the pipe directory at its
    own path, read-only (clients only connect to the daemon's sockets and open its named pipes,
    which a read-only mount allows: the kernel refuses writes there only to regular files,
    directories and symlinks), or the shared-memory directory at /dev/shm, writable (clients
    make their segments there)."""

    host_path: str
    container_path: str
    shm: bool  # the shared-memory directory; False: the pipe directory

    @property
    def read_only(self) -> bool:
        """Whether the container sees it read-only: the pipe directory is."""
        return not self.shm


class MpsDirectoryRefused(Exception):
    """An MPS directory exists but is no place to mount (:func:`mps_directory_problem`):
    ``shm`` says which one, ``problem`` why; the wing words the refusal in its settings."""

    def __init__(self, path: str, problem: str, *, shm: bool) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem
        self.shm = shm


def mps_mounts(pipe_dir: str | None, shm_dir: str | None) -> list[MpsMount]:
    """The MPS mounts of a limited container: none without a pipe directory, then the pipe
    directory and the shared-memory directory when there is one; MpsDirectoryRefused for the
    first that exists but is no place to mount. One not there yet is mounted anyway: the
    runtime makes it, and the daemon's own mount of the same path then shares it."""
    if not pipe_dir:
        return []
    mounts = [MpsMount(pipe_dir, pipe_dir, shm=False)]
    if shm_dir:
        mounts.append(MpsMount(shm_dir, MPS_SHM_PATH, shm=True))
    for mount in mounts:
        problem = mps_directory_problem(mount.host_path, shared=mount.shm)
        if problem:
            raise MpsDirectoryRefused(mount.host_path, problem, shm=mount.shm)
    return mounts
