"""MPS limits of a claim on a shared GPU: the environment and the pipe-directory (read-only)
and shared-memory mounts that go into the claim's CDI spec (see docs/dra-sharing.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cdigen.cdi.driveredits import IPC_MOUNT_OPTIONS
from cdigen.cdi.types import MountDoc
from cdigen.errors import InputError
from cdigen.model import Gpu
from cdigen.plugin.agent.mps import GpuLimit, MpsDirectoryRefused, limits_env, mps_mounts
from cdigen.plugin.dra.claims import AllocatedDevice, quoted
from cdigen.plugin.dra.config import ClaimSharing, pinned_limit
from cdigen.policies.device_view import DeviceView

# The daemon's shared memory, as a runtime mounts a container's own /dev/shm: writable, no
# devices, no set-uid programs, nothing to execute.
SHM_MOUNT_OPTIONS = ["rw", "nosuid", "nodev", "noexec", "rbind", "rprivate"]


@dataclass(frozen=True)
class MpsSettings:
    """How a shared GPU's claims are limited (see docs/dra-sharing.md).

    A claim that consumed ``memory`` of a GPU (consumable capacity) gets that much as its MPS
    pinned-memory limit; with ``replicas`` a whole-GPU claim (a claim shared by several pods)
    gets 1/replicas of the memory. ``thread_percentage``: None sets no SM limit, 0 a share
    proportional to the memory share, 1-100 that fixed percentage. ``limit_key``: ``index``
    (the GPU's CUDA ordinal in the container, with CUDA_DEVICE_ORDER=PCI_BUS_ID) or ``uuid``.
    ``pipe_dir``: the MPS control daemon's pipe directory, mounted into the container; without
    it nothing enforces the limits. ``shm_dir``: the node directory the daemon has at /dev/shm,
    mounted at /dev/shm in the container (with ``pipe_dir`` only), so that clients reach the
    daemon's shared memory without the host's IPC namespace.
    """

    pipe_dir: str | None = None
    shm_dir: str | None = None
    thread_percentage: int | None = None
    replicas: int | None = None
    limit_key: str = "index"
    # the step of the memory shares (dra serve --memory-step): a claim that consumed so much of
    # a GPU that not one more step fits beside it holds the GPU whole, and gets no limit
    memory_step: int | None = None


def claim_limits(
    allocated: Sequence[AllocatedDevice],
    views: Mapping[str, DeviceView],
    mps: MpsSettings,
    sharing: ClaimSharing | None = None,
    *,
    where: str = "",
) -> tuple[list[str], list[MountDoc]]:
    """The MPS environment and mounts of one claim (nothing for exclusive whole GPUs).

    ``sharing``, the claim's own GpuConfig setting, overrides the node-wide ``mps``: TimeSlicing
    means no limits; MPS sets its SM percentage and memory limits (never above the memory the
    claim consumed) and needs the node's MPS daemon (``mps.pipe_dir``).
    """
    if sharing is not None and sharing.strategy == "TimeSlicing":
        return [], []
    claim_mps = sharing is not None
    if claim_mps and not mps.pipe_dir:
        raise InputError(
            "the claim asks for MPS sharing, but this driver runs with no MPS daemon",
            where=where,
            hint="start cdigen dra serve with --mps-pipe-dir (docs/dra-sharing.md), or drop "
            "sharing from the GpuConfig",
        )
    gpus = _memory_limits(allocated, views, mps, sharing, where)
    if not gpus:
        return [], []
    threads = sharing.thread_percentage if sharing is not None else mps.thread_percentage
    pairs = limits_env(
        [GpuLimit(gpu, limit) for gpu, limit in gpus.values()],
        [views[r.device].gpu for r in allocated],
        limit_key=mps.limit_key,
        thread_percentage=threads,
        pipe_dir=mps.pipe_dir or None,
    )
    env = [f"{name}={value}" for name, value in pairs]
    mounts = _daemon_mounts(mps)
    return env, mounts


def _memory_limits(
    allocated: Sequence[AllocatedDevice],
    views: Mapping[str, DeviceView],
    mps: MpsSettings,
    sharing: ClaimSharing | None,
    where: str,
) -> dict[str, tuple[Gpu, int | None]]:
    """Per whole GPU of the claim (by UUID): the GPU and its pinned-memory limit in bytes
    (None: none), from the claim's setting, the memory it consumed, or the node's replicas."""
    # the CUDA ordinal in the container: the claim's GPUs in PCI bus order (CUDA_DEVICE_ORDER)
    in_claim = sorted({views[r.device].gpu.pci_bus_id.lower() for r in allocated})
    per_device = dict(sharing.per_device_limits) if sharing is not None else {}
    gpus: dict[str, tuple[Gpu, int | None]] = {}  # uuid -> (GPU, limit in bytes or none)
    for result in allocated:
        view = views[result.device]
        if view.mig is not None:
            continue
        gpu, total = view.gpu, view.gpu.memory_bytes
        consumed = (
            consumed_memory(result) if result.consumed and "memory" in result.consumed else None
        )
        limit: int | None
        if sharing is not None:
            ordinal = str(in_claim.index(gpu.pci_bus_id.lower()))
            by_ordinal, by_uuid = per_device.pop(ordinal, None), per_device.pop(gpu.uuid, None)
            limit = by_ordinal or by_uuid or sharing.memory_limit or consumed
            if limit is not None and consumed is not None:
                limit = min(limit, consumed)  # what the scheduler counted for this claim
        elif consumed is not None:
            if mps.memory_step and consumed + mps.memory_step > total:
                continue  # the whole GPU (a claim naming no memory, by default): no MPS
            limit = consumed
        elif mps.replicas:
            limit = total // mps.replicas
        else:
            continue
        gpus[gpu.uuid] = (gpu, None if limit is None else min(limit, total))
    if per_device:
        raise InputError(
            f"defaultPerDevicePinnedMemoryLimit names {', '.join(sorted(per_device))}, not a "
            f"GPU of this claim (it has {len(in_claim)}: ordinals 0-{len(in_claim) - 1})",
            where=where,
            hint="key the limits by the GPU's CUDA ordinal in the container, or its UUID",
        )
    return gpus


def _daemon_mounts(mps: MpsSettings) -> list[MountDoc]:
    """The MPS daemon's pipe directory (read-only) and its shared memory at /dev/shm, as
    :func:`cdigen.plugin.agent.mps.mps_mounts` has them, as CDI mounts; InputError (the claim
    fails, saying why) if either exists but is no place to mount."""
    try:
        mounts = mps_mounts(mps.pipe_dir, mps.shm_dir)
    except MpsDirectoryRefused as exc:
        raise InputError(
            f"will not mount the MPS directory into the claim's containers: {exc.problem}",
            where="--mps-shm-dir" if exc.shm else "--mps-pipe-dir",
            hint="fix the node directory, or point the flag at the one the MPS daemon uses",
        ) from None
    return [
        {
            "hostPath": m.host_path,
            "containerPath": m.container_path,
            "options": list(SHM_MOUNT_OPTIONS if m.shm else IPC_MOUNT_OPTIONS),
        }
        for m in mounts
    ]


def consumed_memory(result: AllocatedDevice) -> int:
    """The bytes of memory ``result`` consumed, as its MPS pinned-memory limit; InputError
    (that claim's) unless it is a quantity of at least 1 MiB (:func:`pinned_limit`)."""
    return pinned_limit(
        (result.consumed or {}).get("memory", ""),
        f"device {quoted(result.device, 40)} consumedCapacity.memory",
        quantity_hint="the scheduler writes a quantity such as 4Gi",
        least_hint="give the claim's capacity request at least 1Mi (docs/dra-sharing.md)",
    )
