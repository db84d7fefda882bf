"""MIG devices made per claim (``--mig-strategy dynamic``): at prepare, the GPU instance at the
allocated placement and a compute instance filling it, through NVML; at unprepare, both
destroyed. What was made is kept in the checkpoint (:class:`MigDoc`), so that a restarted plugin
still destroys it.

A create that fails leaves nothing: the GPU instance goes when its compute instance cannot be
made, and the claim fails with what NVML said.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from cdigen.cdi.devnodes import caps_node
from cdigen.discover.nvml import read_mig_minors, text
from cdigen.errors import CdigenError
from cdigen.mig_profiles import MigGeometry, MigProfile
from cdigen.model import Gpu, MigDevice
from cdigen.policies.device_view import DeviceView

log = logging.getLogger(__name__)


# the GPU and compute instance IDs the driver hands out (what mig-minors lists: gi0..gi14,
# ci0..ci7), scanned for an instance whose ID was never recorded
MAX_GPU_INSTANCE_IDS = 15
MAX_COMPUTE_INSTANCE_IDS = 8


class MigError(CdigenError):
    """NVML could not make or unmake a MIG device."""


class MigDoc(TypedDict):
    """A MIG device made for a claim, in the checkpoint."""

    device: str  # the placement device it was made for
    gpuUUID: str
    gi: int
    ci: int
    uuid: str


@dataclass(frozen=True)
class MadeMig:
    """A MIG device just made: the model's view of it, its checkpoint record, and the major of
    the nvidia-caps devices (from /proc/devices; None if not there)."""

    mig: MigDevice
    doc: MigDoc
    caps_major: int | None = None


def caps_major(proc_root: Path) -> int | None:
    """The char major of ``nvidia-caps`` in ``<proc_root>/devices``, or None."""
    try:
        lines = (proc_root / "devices").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[1] == "nvidia-caps" and parts[0].isdecimal():
            return int(parts[0])
    return None


def complete_cap_nodes(spec: Mapping[str, Any], made: Sequence[MadeMig]) -> None:
    """Give the nvidia-caps nodes of the MIG devices ``made`` their type, major and minor where
    the host has no such node yet (the driver makes the instance, not its /dev entry): with
    them the runtime makes the node in the container, without one on the host."""
    wanted = {
        caps_node(minor): (one.caps_major, minor) for one in made for minor in one.mig.cap_minors
    }
    for device in spec.get("devices", []):
        for node in device.get("containerEdits", {}).get("deviceNodes", []):
            major, minor = wanted.get(node["path"], (None, 0))
            if major is None or "type" in node:
                continue
            node.update(type="c", major=major, minor=minor, fileMode=0o444, permissions="r")


def mig_doc_problem(doc: Any) -> str | None:
    """What is wrong with one checkpoint record (``.field: why``, ``: why``), or None."""
    if not isinstance(doc, dict):
        return ": not an object"
    for key in ("device", "gpuUUID", "uuid"):
        if not isinstance(doc.get(key), str):
            return f".{key}: not a string"
    for key in ("gi", "ci"):
        value = doc.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f".{key}: not an ID"
    return None


def _nvml_says(exc: Exception) -> str:
    """``NVML says: <its text> (NVMLError_<Name>)``: the class name too, since pynvml's text
    comes from the library (a bare code without it)."""
    name = type(exc).__name__
    return f"NVML says: {exc}" + (f" ({name})" if name != "NVMLError" else "")


# the GPU instance profiles offered: whole memory and compute slices, no media-engine or
# graphics variants (those share engines the counters do not model)
_PLAIN_PROFILES = (
    *(f"NVML_GPU_INSTANCE_PROFILE_{n}_SLICE" for n in (1, 2, 3, 4, 6, 7, 8)),
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2",
)


class MigMaker:
    """Makes and unmakes MIG devices through an NVML module (pynvml or a test double)."""

    def __init__(self, nvml: Any, proc_root: str | Path = "/proc") -> None:
        self._nvml = nvml
        self._proc_root = Path(proc_root)
        self._minors: dict[tuple[int, ...], int] = {}  # read_mig_minors', read when first needed

    def geometries(self, gpus: Iterable[Gpu]) -> dict[str, MigGeometry]:
        """How each MIG-enabled GPU of ``gpus`` partitions, by UUID, as NVML tells it (the
        GPUs it cannot tell are left out: cdigen's table stands in)."""
        out: dict[str, MigGeometry] = {}
        for gpu in gpus:
            if not gpu.mig_enabled:
                continue
            try:
                geometry = self._geometry(self._nvml.nvmlDeviceGetHandleByUUID(gpu.uuid))
            except self._nvml.NVMLError as exc:
                log.warning("GPU %d: NVML gives no MIG profiles (%s)", gpu.index, exc)
                continue
            if geometry is not None:
                out[gpu.uuid] = geometry
        return out

    def taken(
        self, gpus: Iterable[Gpu], ours: Collection[tuple[str, int]]
    ) -> dict[str, list[range]]:
        """The memory slices held by GPU instances that were not made for a claim (by hand, by
        a MIG manager), by GPU UUID: no placement over them can be made. ``ours``: (GPU UUID,
        GI ID) of those made for claims."""
        out: dict[str, list[range]] = {}
        for gpu in gpus:
            gis = sorted(
                {m.gi_id for m in gpu.mig_devices} - {gi for u, gi in ours if u == gpu.uuid}
            )
            for gi in gis:
                try:
                    handle = self._nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
                    info = self._nvml.nvmlGpuInstanceGetInfo(
                        self._nvml.nvmlDeviceGetGpuInstanceById(handle, gi)
                    )
                except self._nvml.NVMLError as exc:
                    log.warning("GPU %d: no placement for GPU instance %d (%s)", gpu.index, gi, exc)
                    continue
                start = int(info.placement.start)
                out.setdefault(gpu.uuid, []).append(range(start, start + int(info.placement.size)))
                log.warning(
                    "GPU %d: GPU instance %d, not made for a claim, holds memory slices %d-%d: "
                    "the placements over them are not offered",
                    gpu.index, gi, start, start + int(info.placement.size) - 1,
                )  # fmt: skip
        return out

    def _geometry(self, handle: Any) -> MigGeometry | None:
        nvml = self._nvml
        profiles = []
        for constant in _PLAIN_PROFILES:
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, getattr(nvml, constant))
            except nvml.NVMLError:  # not offered by this GPU
                continue
            name = text(info.name).removeprefix("MIG ").strip()
            ci = getattr(nvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{info.sliceCount}_SLICE", None)
            if not name or ci is None or info.instanceCount < 1:
                continue
            found = (nvml.c_nvmlGpuInstancePlacement_t * info.instanceCount)()
            count = ctypes.c_uint(info.instanceCount)
            nvml.nvmlDeviceGetGpuInstancePossiblePlacements(
                handle, info.id, found, ctypes.byref(count)
            )
            places = [found[i] for i in range(count.value)]
            if not places:
                continue
            starts = tuple(sorted(int(p.start) for p in places))
            size = int(places[0].size)
            profiles.append(
                MigProfile(name, getattr(nvml, constant), ci, size, int(info.sliceCount),
                           int(info.memorySizeMB), starts)
            )  # fmt: skip
        if not profiles:
            return None
        memory = max(s + p.memory_slices for p in profiles for s in p.starts)
        compute = max(p.compute_slices for p in profiles)
        profiles.sort(key=lambda p: (p.compute_slices, p.memory_slices, p.name))
        return MigGeometry(memory, compute, tuple(profiles))

    def create(self, view: DeviceView) -> MadeMig:
        """Make the MIG device of placement ``view``; MigError (one line) when NVML cannot,
        with nothing left made."""
        nvml, placement = self._nvml, view.placement
        assert placement is not None, view.name
        what = (
            f"creating MIG {placement.profile.name} at memory slice {placement.start} of GPU "
            f"{view.gpu.index} ({view.gpu.uuid}) for device {view.name}"
        )
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(view.gpu.uuid)
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, placement.profile.gi_profile)
            where = nvml.c_nvmlGpuInstancePlacement_t()
            where.start, where.size = placement.start, placement.profile.memory_slices
            gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, where)
        except nvml.NVMLError as exc:
            raise MigError(f"{what}: {_nvml_says(exc)}") from None
        ci = None
        try:
            ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, placement.profile.ci_profile, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
            ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
            gi_id = int(nvml.nvmlGpuInstanceGetInfo(gi).id)
            ci_id = int(nvml.nvmlComputeInstanceGetInfo(ci).id)
            mig = self._mig_device(handle, view, gi_id, ci_id)
        except (nvml.NVMLError, MigError) as exc:
            self._undo(gi, ci, what)
            detail = str(exc) if isinstance(exc, MigError) else _nvml_says(exc)
            raise MigError(f"{what}: {detail}") from None
        log.info("made MIG device %s (GI %d, CI %d) for %s", mig.uuid, gi_id, ci_id, view.name)
        doc: MigDoc = {
            "device": view.name,
            "gpuUUID": view.gpu.uuid,
            "gi": gi_id,
            "ci": ci_id,
            "uuid": mig.uuid,
        }
        return MadeMig(mig, doc, caps_major(self._proc_root))

    def _undo(self, gi: Any, ci: Any, what: str) -> None:
        """Destroy what a failed create made (logged, never raised: the create's error wins)."""
        nvml = self._nvml
        try:
            if ci is not None:
                nvml.nvmlComputeInstanceDestroy(ci)
            nvml.nvmlGpuInstanceDestroy(gi)
        except nvml.NVMLError as exc:
            log.error("%s failed, and its GPU instance could not be destroyed: %s", what, exc)

    def _mig_device(self, handle: Any, view: DeviceView, gi: int, ci: int) -> MigDevice:
        """The MIG device NVML now lists for GI ``gi``, CI ``ci``, with its nvidia-caps minors."""
        nvml, gpu = self._nvml, view.gpu
        assert view.placement is not None
        # the driver writes mig-minors once, at load: read again only when a minor is missing
        minors = self._minors
        caps = (minors.get((gpu.minor, gi)), minors.get((gpu.minor, gi, ci)))
        if caps[0] is None or caps[1] is None:
            minors = self._minors = read_mig_minors(self._proc_root)
            caps = (minors.get((gpu.minor, gi)), minors.get((gpu.minor, gi, ci)))
        if caps[0] is None or caps[1] is None:
            raise MigError(
                f"no nvidia-caps minors for GI {gi} CI {ci} of GPU minor {gpu.minor} in "
                f"{self._proc_root}/driver/nvidia-caps/mig-minors"
            )
        mig = self._listed(handle, gi, ci)
        if mig is None:
            raise MigError(f"NVML does not list the MIG device of GI {gi} CI {ci}")
        return MigDevice(
            uuid=text(nvml.nvmlDeviceGetUUID(mig)),
            profile=view.placement.profile.name,
            gi_id=gi,
            ci_id=ci,
            memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(mig).total),
            cap_minors=(caps[0], caps[1]),
        )

    def _listed(self, handle: Any, gi: int, ci: int) -> Any:
        """The MIG device handle NVML lists for GI ``gi``, CI ``ci`` of GPU ``handle``, or None."""
        nvml = self._nvml
        for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError:
                continue  # an empty slot
            ids = (nvml.nvmlDeviceGetGpuInstanceId(mig), nvml.nvmlDeviceGetComputeInstanceId(mig))
            if ids == (gi, ci):
                return mig
        return None

    def destroy_at(
        self, gpu_uuid: str, start: int, size: int, keep: Collection[tuple[str, int]] = ()
    ) -> str:
        """Destroy the GPU instance (and its compute instances) at memory slices ``start`` ..
        ``start + size - 1`` of GPU ``gpu_uuid``, if there is one and its (GPU UUID, GI ID) is
        not in ``keep``: what a plugin killed between a create and its checkpoint record left,
        a GPU instance without its compute instance included. None there is fine. The error
        (one line), or ""."""
        nvml = self._nvml
        what = f"the GPU instance at memory slices {start}-{start + size - 1} of GPU {gpu_uuid}"
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
            for gi_id in range(MAX_GPU_INSTANCE_IDS):
                if (gpu_uuid, gi_id) in keep:
                    continue
                try:
                    gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
                except nvml.NVMLError_NotFound:
                    continue
                info = nvml.nvmlGpuInstanceGetInfo(gi)
                if (int(info.placement.start), int(info.placement.size)) != (start, size):
                    continue
                for ci_id in range(MAX_COMPUTE_INSTANCE_IDS):
                    try:
                        ci = nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
                    except nvml.NVMLError_NotFound:
                        continue
                    nvml.nvmlComputeInstanceDestroy(ci)
                nvml.nvmlGpuInstanceDestroy(gi)
                log.info("destroyed %s (GI %d), left by a prepare that did not finish", what, gi_id)
        except nvml.NVMLError as exc:
            return f"destroying {what}: {_nvml_says(exc)}"
        return ""

    def destroy(self, doc: MigDoc) -> str:
        """Destroy the compute and GPU instance of ``doc``; one already gone is fine. The
        error (one line), or ""."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(doc["gpuUUID"])
            try:
                gi = nvml.nvmlDeviceGetGpuInstanceById(handle, doc["gi"])
            except nvml.NVMLError_NotFound:
                log.info("MIG device %s was already gone", doc["uuid"])
                return ""
            listed = self._listed(handle, doc["gi"], doc["ci"])
            if listed is not None and text(nvml.nvmlDeviceGetUUID(listed)) != doc["uuid"]:
                # ours went (a GPU reset), and the IDs were given to another MIG device since
                log.info("MIG device %s was already gone (its GI is reused)", doc["uuid"])
                return ""
            with contextlib.suppress(nvml.NVMLError_NotFound):  # the CI alone already gone
                nvml.nvmlComputeInstanceDestroy(
                    nvml.nvmlGpuInstanceGetComputeInstanceById(gi, doc["ci"])
                )
            nvml.nvmlGpuInstanceDestroy(gi)
        except nvml.NVMLError as exc:
            return (
                f"destroying MIG device {doc['uuid']} (GI {doc['gi']}, CI {doc['ci']}) of GPU "
                f"{doc['gpuUUID']}: {_nvml_says(exc)}"
            )
        log.info("destroyed MIG device %s (GI %d, CI %d)", doc["uuid"], doc["gi"], doc["ci"])
        return ""
