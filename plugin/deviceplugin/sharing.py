"""Sharing one GPU between pods: advertised share devices and what Allocate hands out for them.

Pure functions and frozen records, no gRPC. A resource with ``sharing: {replicas: N}`` advertises
each GPU as N devices ``<uuid>::<k>`` (time-slicing); one with ``sharing: {memorySliceMiB: M}``
advertises floor(memory / M) devices ``<uuid>::slice-<k>`` (see :mod:`cdigen.shares`).
:func:`hand_out_shares` turns the shares the kubelet allocated (catalogue entries, each with its
GPU) into the GPU's CDI name (once per GPU), the MPS limits in the environment and the MPS
pipe-directory and shared-memory mounts, or refuses with
:class:`ShareRefused` (the service answers it with ``FAILED_PRECONDITION``).

Without an MPS control daemon the limits are advisory: nothing stops a pod from using the
whole GPU's memory and compute (see docs/sharing.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdigen.catalogue import CatalogueEntry, catalogue
from cdigen.errors import CdigenError, InputError
from cdigen.model import Gpu, Node
from cdigen.plugin.agent.mps import (
    LIMIT_KEYS,
    MPS_MEMORY_ENV,
    MPS_SHM_PATH,
    PIPE_HINT,
    PROPORTIONAL,
    SHM_HINT,
    GpuLimit,
    MpsDirectoryRefused,
    limits_env,
    mps_mounts,
    shm_directory_problem,
)
from cdigen.plugin.deviceplugin.cdi_names import entry_cdi_name
from cdigen.shares import MAX_REPLICAS, no_slices_reason


class ShareRefused(CdigenError):
    """Allocate cannot honour a set of shares (slices on several GPUs, too many replicas)."""


@dataclass(frozen=True)
class Sharing:
    """A resource's ``sharing`` block: exactly one of ``replicas`` and ``memory_slice_mib``."""

    replicas: int | None = None
    memory_slice_mib: int | None = None
    fail_requests_greater_than_one: bool = False
    mps_pipe_directory: str | None = None
    mps_shm_directory: str | None = None
    mps_limit_key: str = "index"  # pinned-memory limits keyed by CUDA ordinal, or "uuid"

    @property
    def kind(self) -> str:
        """``replica`` or ``slice``: the share kind this resource advertises."""
        return "replica" if self.replicas is not None else "slice"

    def memory_limit(self, gpu: Gpu, count: int) -> int | None:
        """The pinned memory ``count`` shares of ``gpu`` give one container, in bytes (whole
        MiB, as CUDA_MPS_PINNED_DEVICE_MEM_LIMIT states it): slices their size each, replicas
        the GPU's memory in proportion under MPS only (None without: plain time-slicing limits
        nothing)."""
        if self.memory_slice_mib is not None:
            return count * self.memory_slice_mib << 20
        if self.mps_pipe_directory is None or not self.replicas:
            return None
        return (gpu.memory_bytes >> 20) * count // self.replicas << 20


@dataclass(frozen=True)
class BindMount:
    """A bind mount for the container."""

    host_path: str
    container_path: str
    read_only: bool = False


@dataclass(frozen=True)
class ShareAllocation:
    """What one container gets for its shares."""

    gpu_uuids: tuple[str, ...]  # each GPU once, in the order of the request
    cdi_names: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    mounts: tuple[BindMount, ...]
    shares_per_gpu: tuple[int, ...]

    def env_dict(self) -> dict[str, str]:
        """The environment as a mapping."""
        return dict(self.env)


def _positive_int(doc: Mapping[str, Any], key: str, where: str, top: int | None = None) -> int:
    value = doc[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError(f"{key} must be a positive integer, got {value!r}", where=where)
    if top is not None and value > top:
        raise InputError(f"{key} must be at most {top}, got {value}", where=where)
    return value


def sharing_from_doc(doc: Mapping[str, Any] | None, *, where: str) -> Sharing | None:
    """The :class:`Sharing` of a config ``sharing`` block (None when there is none)."""
    if doc is None:
        return None
    if not isinstance(doc, Mapping):
        raise InputError("sharing must be a mapping", where=where)
    known = {"replicas", "memorySliceMiB", "failRequestsGreaterThanOne", "mps"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise InputError(
            f"unknown sharing keys {unknown}", where=where, hint=f"use {', '.join(sorted(known))}"
        )
    if ("replicas" in doc) == ("memorySliceMiB" in doc):
        raise InputError(
            "sharing needs exactly one of replicas and memorySliceMiB",
            where=where,
            hint="e.g. sharing: {replicas: 4} or sharing: {memorySliceMiB: 1024}",
        )
    fail = doc.get("failRequestsGreaterThanOne", False)
    if not isinstance(fail, bool):
        raise InputError("failRequestsGreaterThanOne must be true or false", where=where)
    if fail and "replicas" not in doc:
        raise InputError(
            "failRequestsGreaterThanOne applies to replicas only",
            where=where,
            hint="a memory-slice request is always for one GPU",
        )
    pipe, shm, limit_key = _mps_settings(doc.get("mps") or {}, where)
    return Sharing(
        replicas=_positive_int(doc, "replicas", where, MAX_REPLICAS) if "replicas" in doc else None,
        memory_slice_mib=(
            _positive_int(doc, "memorySliceMiB", where) if "memorySliceMiB" in doc else None
        ),
        fail_requests_greater_than_one=fail,
        mps_pipe_directory=pipe,
        mps_shm_directory=shm,
        mps_limit_key=limit_key,
    )


def _mps_settings(mps: Any, where: str) -> tuple[str | None, str | None, str]:
    """A ``sharing.mps`` block's pipe directory, shm directory and limit key, checked."""
    if not isinstance(mps, Mapping) or set(mps) - {"pipeDirectory", "shmDirectory", "limitKey"}:
        raise InputError(
            "mps must be a mapping with pipeDirectory, shmDirectory and limitKey only",
            where=f"{where}.mps",
        )
    limit_key = mps.get("limitKey", "index")
    if limit_key not in LIMIT_KEYS:
        raise InputError(
            f"mps.limitKey must be one of {', '.join(LIMIT_KEYS)}, got {limit_key!r}",
            where=where,
            hint="index (the CUDA ordinal in the container, the default) or uuid",
        )
    pipe = mps.get("pipeDirectory")
    if pipe is not None and (not isinstance(pipe, str) or not pipe.startswith("/")):
        raise InputError(
            f"mps.pipeDirectory must be an absolute path, got {pipe!r}",
            where=where,
            hint=PIPE_HINT,
        )
    shm = mps.get("shmDirectory")
    if shm is not None:
        problem = shm_directory_problem(shm, pipe)
        if problem:
            raise InputError(f"mps.shmDirectory {problem}", where=where, hint=SHM_HINT)
    return pipe, shm, limit_key


def share_devices(node: Node, sharing: Sharing) -> tuple[CatalogueEntry, ...]:
    """Every share of every GPU of ``node``, from the node's catalogue, GPUs in NVML index order.

    MIG-enabled GPUs are left out: their memory belongs to their MIG devices.
    """
    entries = catalogue(node, mig_strategy="mixed", sharing=sharing)
    return tuple(e for e in entries if e.share is not None)


def no_slices_warnings(node: Node, sharing: Sharing, resource: str) -> tuple[str, ...]:
    """One start-up warning per whole GPU that holds no memory slice of ``resource``."""
    if sharing.memory_slice_mib is None:
        return ()
    reasons = (
        no_slices_reason(g, sharing.memory_slice_mib) for g in node.gpus if not g.mig_enabled
    )
    return tuple(f"{resource}: {reason}" for reason in reasons if reason)


def shares_by_gpu(devices: Iterable[CatalogueEntry]) -> dict[str, tuple[str, ...]]:
    """GPU UUID -> its share IDs: a GPU's health applies to all of them."""
    out: dict[str, list[str]] = {}
    for device in devices:
        out.setdefault(device.gpu_uuid, []).append(device.id)
    return {uuid: tuple(ids) for uuid, ids in out.items()}


def advisory_warning(sharing: Sharing, resource: str) -> str | None:
    """The start-up warning when limits are not enforced (no MPS pipe directory), else None."""
    if sharing.mps_pipe_directory is not None:
        return None
    if sharing.kind == "slice":
        return (
            f"{resource}: memory slices without sharing.mps.pipeDirectory: "
            f"{MPS_MEMORY_ENV} is advisory, nothing enforces it; a pod can use the whole GPU"
        )
    return (
        f"{resource}: time-sliced replicas without MPS: pods share the GPU's memory and "
        "compute with no limits and no isolation"
    )


def _mps_env(
    uuids: Sequence[str], per_gpu: Mapping[str, int], gpus: Mapping[str, Gpu], sharing: Sharing
) -> tuple[tuple[str, str], ...]:
    """The MPS client limits (:func:`cdigen.plugin.agent.mps.limits_env`): the memory of the shares
    per GPU, and an SM share in proportion. Slices always carry them (advisory without MPS);
    replicas only when MPS is configured, since plain time-slicing has no limits to state."""
    if sharing.kind == "replica" and sharing.mps_pipe_directory is None:
        return ()
    limits = [GpuLimit(gpus[u], sharing.memory_limit(gpus[u], per_gpu[u])) for u in uuids]
    env = limits_env(
        limits,
        [gpus[u] for u in uuids],
        limit_key=sharing.mps_limit_key,
        thread_percentage=PROPORTIONAL,
        pipe_dir=sharing.mps_pipe_directory,
    )
    return tuple(env)


def share_env(
    shares: Sequence[CatalogueEntry], sharing: Sharing, *, resource: str
) -> tuple[tuple[str, str], ...]:
    """The environment (MPS limits) a container gets for ``shares`` (catalogue entries, each
    carrying its GPU, as an advertised resource holds them), as :func:`hand_out_shares` gives
    it, without touching the MPS directories: what ``plugin config check`` shows."""
    per_gpu = _shares_per_gpu(shares, sharing, resource)
    gpus = {e.gpu_uuid: e.gpu for e in shares}
    return _mps_env(tuple(per_gpu), per_gpu, gpus, sharing)


def allocate_shares(
    ids: Sequence[str],
    node: Node,
    sharing: Sharing,
    *,
    cdi_kind: str,
    resource: str,
) -> ShareAllocation:
    """What a container gets for the share IDs ``ids`` (as a recorded request or a test names
    them): :func:`hand_out_shares` of the shares of ``node`` they name. ShareRefused as there,
    and for an ID that is not one of this resource's shares."""
    advertised = {d.id: d for d in share_devices(node, sharing)}
    shares = _shares_of(ids, advertised, sharing, resource)
    return hand_out_shares(shares, sharing, cdi_kind=cdi_kind, resource=resource)


def hand_out_shares(
    shares: Sequence[CatalogueEntry], sharing: Sharing, *, cdi_kind: str, resource: str
) -> ShareAllocation:
    """What a container gets for the shares the kubelet allocated to it (catalogue entries,
    each carrying its GPU). Raises ShareRefused for a slice set on several GPUs, for more than
    one replica when ``failRequestsGreaterThanOne`` is set, and when an MPS directory is not
    what the daemon makes."""
    per_gpu = _shares_per_gpu(shares, sharing, resource)
    by_gpu: dict[str, CatalogueEntry] = {}  # a share of each GPU asked for
    for share in shares:
        by_gpu.setdefault(share.gpu_uuid, share)
    gpus = {uuid: e.gpu for uuid, e in by_gpu.items()}
    uuids = tuple(per_gpu)
    env = _mps_env(uuids, per_gpu, gpus, sharing)
    mounts = _mps_mounts(sharing, resource)
    return ShareAllocation(
        gpu_uuids=uuids,
        cdi_names=tuple(entry_cdi_name(cdi_kind, by_gpu[u]) for u in uuids),
        env=env,
        mounts=mounts,
        shares_per_gpu=tuple(per_gpu[u] for u in uuids),
    )


def _shares_of(
    ids: Sequence[str], advertised: Mapping[str, CatalogueEntry], sharing: Sharing, resource: str
) -> tuple[CatalogueEntry, ...]:
    """The shares ``ids`` name, looked up once; ShareRefused for an ID that names none."""
    out = []
    for device_id in ids:
        share = advertised.get(device_id)
        if share is None:
            raise ShareRefused(
                f"{device_id} is not a {sharing.kind} of a GPU on this node",
                where=resource,
                hint="expected IDs like <uuid>::0"
                if sharing.kind == "replica"
                else "expected IDs like <uuid>::slice-0",
            )
        out.append(share)
    return tuple(out)


def _shares_per_gpu(
    shares: Sequence[CatalogueEntry], sharing: Sharing, resource: str
) -> dict[str, int]:
    """GPU UUID -> how many of ``shares`` are its shares, in the order of ``shares``;
    ShareRefused as :func:`hand_out_shares` says."""
    per_gpu: dict[str, int] = {}
    for share in shares:
        per_gpu[share.gpu_uuid] = per_gpu.get(share.gpu_uuid, 0) + 1
    if sharing.kind == "replica":
        if sharing.fail_requests_greater_than_one and len(shares) > 1:
            raise ShareRefused(
                f"request for {resource}: {len(shares)} too large: failRequestsGreaterThanOne "
                "allows one replica per container",
                where=resource,
                hint=f"ask for {resource}: 1, or use whole GPUs",
            )
    elif len(per_gpu) > 1:
        size = sharing.memory_slice_mib
        raise ShareRefused(
            f"no single GPU has {len(shares)} free slices ({len(shares) * (size or 0)} MiB) for "
            f"one container; the offered slices span GPUs {', '.join(per_gpu)}",
            where=resource,
            hint="wait for slices to free up on one GPU, or ask for fewer",
        )
    return per_gpu


def _mps_mounts(sharing: Sharing, resource: str) -> tuple[BindMount, ...]:
    """The MPS pipe directory (read-only) and shared-memory directory (at /dev/shm), as
    :func:`cdigen.plugin.agent.mps.mps_mounts` has them; ShareRefused if one exists but is not
    what the MPS daemon makes (see :func:`cdigen.cdi.ipc.ipc_problem`)."""
    try:
        mounts = mps_mounts(sharing.mps_pipe_directory, sharing.mps_shm_directory)
    except MpsDirectoryRefused as exc:
        if exc.shm:
            raise ShareRefused(
                f"will not mount the MPS shared-memory directory at {MPS_SHM_PATH}: {exc.problem}",
                where=resource,
                hint="point sharing.mps.shmDirectory at the directory the MPS daemon has at "
                "/dev/shm",
            ) from None
        raise ShareRefused(
            f"will not mount the MPS pipe directory: {exc.problem}",
            where=resource,
            hint="point sharing.mps.pipeDirectory at the directory nvidia-cuda-mps-control made",
        ) from None
    return tuple(BindMount(m.host_path, m.container_path, read_only=m.read_only) for m in mounts)
