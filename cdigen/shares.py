"""Share IDs: how one GPU is advertised as several devices (time-slicing replicas, memory slices).

The grammar, shared by the allocator, ``cdigen policy`` and the plugin:

- a whole GPU: its UUID (or, on the command line, its index);
- a replica: ``<gpu>::<k>`` (``k`` from 0), as NVIDIA's time-slicing plugin names them;
- a memory slice: ``<gpu>::slice-<k>`` (``k`` from 0), so that a recorded request says by its
  IDs alone that its devices are slices (and ``policy replay`` treats them as such).
"""

from __future__ import annotations

from typing import Literal

from cdigen.constants import MIB
from cdigen.model import Gpu

SHARE_SEPARATOR = "::"
SLICE_MARKER = "slice-"
# The most replicas of one GPU, wherever they are given (plugin config, dra serve, policy CLI).
MAX_REPLICAS = 1024

ShareKind = Literal["replica", "slice"]
IdKind = Literal["gpu"] | ShareKind  # what an ID names: a whole GPU or a share


def gpu_part(device_id: str) -> str:
    """The GPU part of an ID (the ID itself for a whole GPU)."""
    return device_id.split(SHARE_SEPARATOR, 1)[0]


def share_kind(device_id: str) -> IdKind:
    """Whether ``device_id`` names a whole GPU, a replica or a memory slice."""
    _, sep, rest = device_id.partition(SHARE_SEPARATOR)
    if not sep:
        return "gpu"
    return "slice" if rest.startswith(SLICE_MARKER) else "replica"


def replica_ids(gpu_id: str, replicas: int) -> tuple[str, ...]:
    """The ``replicas`` replica IDs of one GPU."""
    return tuple(f"{gpu_id}{SHARE_SEPARATOR}{k}" for k in range(replicas))


def slice_count(gpu: Gpu, slice_mib: int) -> int:
    """How many whole slices of ``slice_mib`` MiB the GPU's memory holds (floor)."""
    return (gpu.memory_bytes // MIB) // slice_mib


def no_slices_reason(gpu: Gpu, slice_mib: int) -> str | None:
    """Why ``gpu`` holds no memory slice of ``slice_mib`` MiB (for a message), or None if it
    holds one or more."""
    if slice_count(gpu, slice_mib) > 0:
        return None
    if gpu.memory_bytes == 0:
        return (
            f"GPU {gpu.index} has memoryBytes: 0 (its memory is unknown, e.g. a 'topo import' "
            "without --memory or a known --gpu-name), so it holds no memory slices; set its "
            "memoryBytes in the node file"
        )
    return (
        f"GPU {gpu.index} has {gpu.memory_bytes // MIB} MiB, less than one {slice_mib} MiB "
        "slice; use a smaller slice size"
    )


def slice_ids(gpu_id: str, count: int) -> tuple[str, ...]:
    """The ``count`` memory-slice IDs of one GPU."""
    return tuple(f"{gpu_id}{SHARE_SEPARATOR}{SLICE_MARKER}{k}" for k in range(count))
