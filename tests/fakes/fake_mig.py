"""A test double of pynvml's MIG create and destroy calls, on top of :class:`FakeNvml`.

Same names, argument order, structs (``c_nvmlGpuInstancePlacement_t``,
``c_nvmlGpuInstanceInfo_t``, ``c_nvmlComputeInstanceInfo_t``, the v2 profile infos) and
NVMLError codes as pynvml; a GPU instance takes the memory slices of its placement, and one that
overlaps another is refused (``NVML_ERROR_INSUFFICIENT_RESOURCES``). A compute instance made is
listed as a MIG device (``nvmlDeviceGetMigDeviceHandleByIndex``), as the driver does.

    nvml = MigNvml(node, fail={"nvmlGpuInstanceCreateComputeInstance": {0: code}})
    nvml = MigNvml(node, geometries={"NVIDIA A30": a30})  # a model cdigen's table lacks

How a GPU partitions comes from ``geometries`` (by product name), else cdigen's table.

With ``state`` (a file), the instances live on across processes as the driver's do across a
plugin's restart: loaded at construction, written (atomically) after every create and destroy.
``on_change`` is called with the NVML call's name after each of them (a test's crash point).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from cdigen.mig_profiles import MigGeometry, MigProfile, mig_geometry
from cdigen.model import Gpu, MigDevice
from tests.cdihost import CAPS_MAJOR
from tests.fakes.fake_pynvml import FakeNvml, Handle

MAX_GPU_INSTANCES = 15  # GI IDs 0..14, eight CIs each: what /proc's mig-minors lists


@dataclass(frozen=True)
class GiHandle:
    """Like c_nvmlGpuInstance_t."""

    index: int
    gi: int


@dataclass(frozen=True)
class CiHandle:
    """Like c_nvmlComputeInstance_t."""

    index: int
    gi: int
    ci: int


@dataclass
class _Instance:
    profile: MigProfile
    start: int
    cis: dict[int, str] = field(default_factory=dict)  # CI ID -> MIG device UUID


def cap_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """The nvidia-caps minor of a GI (or of one of its CIs), as the driver numbers them."""
    base = 3 + gpu_minor * MAX_GPU_INSTANCES * 9 + gi * 9
    return base if ci is None else base + 1 + ci


class MigNvml(FakeNvml):
    """:class:`FakeNvml` that also makes and unmakes GPU and compute instances."""

    def __init__(
        self,
        *args: Any,
        geometries: Mapping[str, MigGeometry] | None = None,
        state: Path | None = None,
        on_change: Callable[[str], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.geometries = dict(geometries or {})
        self.instances: dict[tuple[int, int], _Instance] = {}
        self._made = 0
        self._state = state
        self.on_change = on_change
        if state is not None and state.exists():
            self._load(state)

    def _load(self, path: Path) -> None:
        doc = json.loads(path.read_text())
        self._made = doc["made"]
        for gpu in self.node.gpus:
            self._set_migs(
                gpu,
                tuple(
                    MigDevice(**{**m, "cap_minors": tuple(m["cap_minors"])})
                    for m in doc["migs"].get(str(gpu.index), [])
                ),
            )
        for entry in doc["instances"]:
            gpu = self.node.gpu_by_index(entry["index"])
            assert gpu is not None
            self.instances[(entry["index"], entry["gi"])] = _Instance(
                self._profile(gpu, entry["profile"]),
                entry["start"],
                {int(ci): uuid for ci, uuid in entry["cis"].items()},
            )

    def _changed(self, call: str) -> None:
        """Write the state (temp file, rename: a kill leaves the old or the new), then tell."""
        if self._state is not None:
            doc = {
                "made": self._made,
                "migs": {
                    str(g.index): [dataclasses.asdict(m) for m in g.mig_devices]
                    for g in self.node.gpus
                },
                "instances": [
                    {"index": index, "gi": gi, "profile": i.profile.gi_profile,
                     "start": i.start, "cis": {str(c): u for c, u in i.cis.items()}}
                    for (index, gi), i in sorted(self.instances.items())
                ],
            }  # fmt: skip
            temp = self._state.with_name(self._state.name + ".tmp")
            temp.write_text(json.dumps(doc))
            os.replace(temp, self._state)
        if self.on_change is not None:
            self.on_change(call)

    def _profile(self, gpu: Gpu, gi_profile: int) -> MigProfile:
        geometry = self.geometries.get(gpu.name) or mig_geometry(gpu.name)
        if not gpu.mig_enabled or geometry is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        for profile in geometry.profiles:
            if profile.gi_profile == gi_profile:
                return profile
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _instance(self, name: str, handle: GiHandle) -> _Instance:
        self._enter(name, handle.index)
        found = self.instances.get((handle.index, handle.gi))
        if found is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return found

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, handle: Handle, profile: int, version: int = 2
    ) -> Any:
        gpu = self._gpu("nvmlDeviceGetGpuInstanceProfileInfo", handle)
        found = self._profile(gpu, profile)
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id, info.sliceCount, info.memorySizeMB = (
            profile,
            found.compute_slices,
            found.memory_mib,
        )
        info.instanceCount = len(found.starts)
        info.name = f"MIG {found.name}".encode()
        return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Handle, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        gpu = self._gpu("nvmlDeviceGetGpuInstancePossiblePlacements", device)
        profile = self._profile(gpu, profileId)
        count = countRef._obj  # a byref() of a c_uint: in, the room; out, how many
        if count.value < len(profile.starts):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for n, start in enumerate(profile.starts):
            placementsRef[n].start, placementsRef[n].size = start, profile.memory_slices
        count.value = len(profile.starts)
        return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: Handle, profileId: int, placement: Any
    ) -> GiHandle:
        gpu = self._gpu("nvmlDeviceCreateGpuInstanceWithPlacement", handle)
        profile = self._profile(gpu, profileId)
        if placement.start not in profile.starts or placement.size != profile.memory_slices:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        wanted = set(range(placement.start, placement.start + placement.size))
        for (index, _), other in self.instances.items():
            taken = range(other.start, other.start + other.profile.memory_slices)
            if index == handle.index and wanted & set(taken):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        used = {gi for index, gi in self.instances if index == handle.index}
        used |= {m.gi_id for m in gpu.mig_devices}
        gi = min(set(range(1, MAX_GPU_INSTANCES)) - used)
        self.instances[(handle.index, gi)] = _Instance(profile, placement.start)
        self._changed("nvmlDeviceCreateGpuInstanceWithPlacement")
        return GiHandle(handle.index, gi)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: GiHandle) -> Any:
        found = self._instance("nvmlGpuInstanceGetInfo", gpuInstance)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.id, info.profileId = gpuInstance.gi, found.profile.gi_profile
        info.placement.start, info.placement.size = found.start, found.profile.memory_slices
        return info

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: GiHandle, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        found = self._instance("nvmlGpuInstanceGetComputeInstanceProfileInfo", device)
        if profile != found.profile.ci_profile:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id, info.sliceCount = profile, found.profile.compute_slices
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: GiHandle, profileId: int) -> Any:
        found = self._instance("nvmlGpuInstanceCreateComputeInstance", gpuInstance)
        if found.cis:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gpu = self.node.gpu_by_index(gpuInstance.index)
        assert gpu is not None
        self._made += 1
        uuid = f"MIG-{gpuInstance.index:08x}-{gpuInstance.gi:04x}-4000-8000-{self._made:012x}"
        found.cis[0] = uuid
        mig = pynvml_mig(gpu, found.profile, uuid, gpuInstance.gi)
        self._set_migs(gpu, (*gpu.mig_devices, mig))
        self._changed("nvmlGpuInstanceCreateComputeInstance")
        return CiHandle(gpuInstance.index, gpuInstance.gi, 0)

    def nvmlComputeInstanceGetInfo(self, computeInstance: CiHandle) -> Any:
        self._compute(computeInstance)
        info = pynvml.c_nvmlComputeInstanceInfo_t()
        info.id = computeInstance.ci
        return info

    def _compute(self, handle: CiHandle) -> _Instance:
        found = self._instance("nvmlComputeInstance", GiHandle(handle.index, handle.gi))
        if handle.ci not in found.cis:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return found

    def nvmlDeviceGetGpuInstanceById(self, device: Handle, gpuInstanceId: int) -> GiHandle:
        self._gpu("nvmlDeviceGetGpuInstanceById", device)
        if (device.index, gpuInstanceId) not in self.instances:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return GiHandle(device.index, gpuInstanceId)

    def nvmlGpuInstanceGetComputeInstanceById(
        self, gpuInstance: GiHandle, computeInstanceId: int
    ) -> CiHandle:
        found = self._instance("nvmlGpuInstanceGetComputeInstanceById", gpuInstance)
        if computeInstanceId not in found.cis:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return CiHandle(gpuInstance.index, gpuInstance.gi, computeInstanceId)

    def nvmlComputeInstanceDestroy(self, computeInstance: CiHandle) -> int:
        self._enter("nvmlComputeInstanceDestroy", computeInstance.index)
        found = self._compute(computeInstance)
        uuid = found.cis.pop(computeInstance.ci)
        gpu = self.node.gpu_by_index(computeInstance.index)
        assert gpu is not None
        self._set_migs(gpu, tuple(m for m in gpu.mig_devices if m.uuid != uuid))
        self._changed("nvmlComputeInstanceDestroy")
        return int(pynvml.NVML_SUCCESS)

    def nvmlGpuInstanceDestroy(self, gpuInstance: GiHandle) -> int:
        found = self._instance("nvmlGpuInstanceDestroy", gpuInstance)
        if found.cis:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)
        del self.instances[(gpuInstance.index, gpuInstance.gi)]
        self._changed("nvmlGpuInstanceDestroy")
        return int(pynvml.NVML_SUCCESS)

    def _set_migs(self, gpu: Gpu, migs: tuple[Any, ...]) -> None:
        gpus = tuple(
            dataclasses.replace(g, mig_devices=migs) if g.index == gpu.index else g
            for g in self.node.gpus
        )
        self.node = dataclasses.replace(self.node, gpus=gpus)

    def write_mig_minors(self, proc_root: Path) -> None:
        """``<proc_root>/driver/nvidia-caps/mig-minors`` for every GI and CI of every GPU."""
        lines = ["config 1", "monitor 2"]
        for gpu in self.node.gpus:
            for gi in range(MAX_GPU_INSTANCES):
                lines.append(f"gpu{gpu.minor}/gi{gi}/access {cap_minor(gpu.minor, gi)}")
                for ci in range(8):
                    minor = cap_minor(gpu.minor, gi, ci)
                    lines.append(f"gpu{gpu.minor}/gi{gi}/ci{ci}/access {minor}")
        path = proc_root / "driver" / "nvidia-caps" / "mig-minors"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        (proc_root / "devices").write_text(
            f"Character devices:\n195 nvidia\n{CAPS_MAJOR} nvidia-caps\n\nBlock devices:\n"
        )


def pynvml_mig(gpu: Gpu, profile: MigProfile, uuid: str, gi: int) -> Any:
    """The MIG device the driver lists for a new compute instance 0 of GI ``gi``."""
    from cdigen.model import MigDevice

    caps = (cap_minor(gpu.minor, gi), cap_minor(gpu.minor, gi, 0))
    return MigDevice(uuid, profile.name, gi, 0, profile.memory_bytes, caps)
