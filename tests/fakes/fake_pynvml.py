"""A test double of the ``pynvml`` module (nvidia-ml-py), driven by a :class:`cdigen.model.Node`.

Same function names and argument order as pynvml, the real NVML structs (``nvmlPciInfo_t``,
``c_nvmlMemory_t``) and the real ``NVMLError`` subclasses and codes: constants, error classes and
anything not faked here come from the real ``pynvml`` module, which imports without a GPU.

    nvml = FakeNvml(load_node("builtin:dgx-a100"))
    nvml = FakeNvml(node, fail={"nvmlDeviceGetMemoryInfo": {2: pynvml.NVML_ERROR_GPU_IS_LOST}})
    nvml = FakeNvml(node, library_missing=True)      # nvmlInit raises NVMLError_LibraryNotFound

NVLink: pairs are wired directly (one lane per NVLink, remote = the peer's bus ID) when every GPU
has at most ``NVML_NVLINK_MAX_LINKS`` lanes; otherwise (DGX A100/H100, DGX-2) every GPU's lanes go
to NVSwitches, which needs all NVLink pairs to carry the same count. ``nvswitch=`` forces either.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from cdigen.model import Gpu, Node

SWITCH_COUNT = 6  # NVSwitch chips on a DGX A100 baseboard; lanes are spread over them
MAX_MIG_DEVICES = 7


@dataclass(frozen=True)
class Handle:
    """An opaque device handle, like pynvml's c_nvmlDevice_t pointer."""

    index: int
    mig_slot: int | None = None


def _nvml_bus_id(bus_id: str) -> str:
    """``0000:07:00.0`` as NVML prints it: ``00000000:07:00.0``, upper-case hex."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


def _reverse(prefix: str, names: Mapping[str, str]) -> dict[str, int]:
    return {
        label: getattr(pynvml, const) for const, label in names.items() if const.startswith(prefix)
    }


_ARCH = {
    "Kepler": "KEPLER", "Maxwell": "MAXWELL", "Pascal": "PASCAL", "Volta": "VOLTA",
    "Turing": "TURING", "Ampere": "AMPERE", "Ada Lovelace": "ADA", "Hopper": "HOPPER",
    "Blackwell": "BLACKWELL",
}  # fmt: skip
_BRAND = {
    "Quadro": "QUADRO", "Tesla": "TESLA", "NVS": "NVS", "GRID": "GRID", "GeForce": "GEFORCE",
    "Titan": "TITAN", "NVIDIA RTX": "NVIDIA_RTX", "NVIDIA": "NVIDIA", "GeForce RTX": "GEFORCE_RTX",
    "Quadro RTX": "QUADRO_RTX", "Titan RTX": "TITAN_RTX",
}  # fmt: skip
_LEVEL = {
    "PIX": pynvml.NVML_TOPOLOGY_SINGLE,
    "PXB": pynvml.NVML_TOPOLOGY_MULTIPLE,
    "PHB": pynvml.NVML_TOPOLOGY_HOSTBRIDGE,
    "NODE": pynvml.NVML_TOPOLOGY_NODE,
    "SYS": pynvml.NVML_TOPOLOGY_SYSTEM,
}
_MIG_CAPABLE = {"Ampere", "Hopper", "Blackwell"}


class FakeNvml:
    """Module-like double of ``pynvml``; attributes it does not define come from real pynvml."""

    # as pynvml once its library is loaded: discovery's loader does not load another
    nvmlLib: Any = "FakeNvml"

    def __init__(
        self,
        node: Node,
        *,
        fail: Mapping[str, Mapping[int, int]] | None = None,
        library_missing: bool = False,
        nvswitch: bool | None = None,
        memory_affinity: bool = True,
        legacy_bytes: bool = False,
    ) -> None:
        self.node = node
        self.fail = {name: dict(by_gpu) for name, by_gpu in (fail or {}).items()}
        self.library_missing = library_missing
        self.memory_affinity = memory_affinity
        self.legacy_bytes = legacy_bytes  # pynvml < 11.5 returned bytes from string getters
        self.initialized = 0
        self.calls: list[str] = []
        self.lanes = self._wire_nvlinks(nvswitch)

    def __getattr__(self, name: str) -> Any:
        return getattr(pynvml, name)

    # -- helpers -------------------------------------------------------------------------------

    def _wire_nvlinks(self, nvswitch: bool | None) -> dict[int, list[str]]:
        """Per GPU index, the remote bus ID (NVML form) of each NVLink lane."""
        per_gpu = {g.index: sum(k.nvlinks for k in self.node.links if g.index in (k.a, k.b))
                   for g in self.node.gpus}  # fmt: skip
        if nvswitch is None:
            nvswitch = max(per_gpu.values(), default=0) > pynvml.NVML_NVLINK_MAX_LINKS
        lanes: dict[int, list[str]] = {g.index: [] for g in self.node.gpus}
        nv_links = [k for k in self.node.links if k.nvlinks]
        if nvswitch:
            counts = {k.nvlinks for k in nv_links}
            if len(counts) != 1:
                raise ValueError("an NVSwitch fabric needs the same NVLink count on every pair")
            (count,) = counts
            on_fabric = {i for k in nv_links for i in (k.a, k.b)}
            for index in on_fabric:
                lanes[index] = [
                    f"00000001:{0xC0 + lane % SWITCH_COUNT:02X}:00.0" for lane in range(count)
                ]
            return lanes
        for link in nv_links:
            for a, b in ((link.a, link.b), (link.b, link.a)):
                peer = self.node.gpu_by_index(b)
                assert peer is not None
                lanes[a].extend([_nvml_bus_id(peer.pci_bus_id)] * link.nvlinks)
        return lanes

    def _enter(self, name: str, index: int | None = None) -> None:
        self.calls.append(name)
        if not self.initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        code = self.fail.get(name, {}).get(index) if index is not None else None
        if code is not None:
            raise pynvml.NVMLError(code)

    def _gpu(self, name: str, handle: Handle) -> Gpu:
        self._enter(name, handle.index)
        gpu = self.node.gpu_by_index(handle.index)
        if gpu is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu

    def _str(self, value: str) -> str | bytes:
        return value.encode() if self.legacy_bytes else value

    def _mig(self, handle: Handle) -> Any:
        gpu = self.node.gpu_by_index(handle.index)
        assert gpu is not None and handle.mig_slot is not None
        return gpu.mig_devices[handle.mig_slot]

    # -- library -------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.library_missing:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._enter("nvmlSystemGetDriverVersion")
        return self._str(self.node.driver_version)

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        major, minor = (self.node.cuda_driver_version or "0.0").split(".")
        return int(major) * 1000 + int(minor) * 10

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.node.gpus)

    # -- devices -------------------------------------------------------------------------------

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._enter("nvmlDeviceGetHandleByIndex", index)
        if self.node.gpu_by_index(index) is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return Handle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Handle:
        self._enter("nvmlDeviceGetHandleByUUID")
        gpu = self.node.gpu_by_uuid(uuid.decode() if isinstance(uuid, bytes) else uuid)
        if gpu is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return Handle(gpu.index)

    def nvmlDeviceGetUUID(self, handle: Handle) -> str | bytes:
        gpu = self._gpu("nvmlDeviceGetUUID", handle)
        return self._str(self._mig(handle).uuid if handle.mig_slot is not None else gpu.uuid)

    def nvmlDeviceGetName(self, handle: Handle) -> str | bytes:
        gpu = self._gpu("nvmlDeviceGetName", handle)
        if handle.mig_slot is not None:
            return self._str(f"{gpu.name} MIG {self._mig(handle).profile}")
        return self._str(gpu.name)

    def nvmlDeviceGetMinorNumber(self, handle: Handle) -> int:
        return self._gpu("nvmlDeviceGetMinorNumber", handle).minor

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> Any:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        memory = pynvml.c_nvmlMemory_t()
        total = self._mig(handle).memory_bytes if handle.mig_slot is not None else gpu.memory_bytes
        memory.total, memory.free, memory.used = total, total, 0
        return memory

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> Any:
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
        return self._pci(_nvml_bus_id(gpu.pci_bus_id))

    @staticmethod
    def _pci(bus_id: str) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = bus_id.encode()
        info.busIdLegacy = bus_id[4:].encode()
        domain, bus, rest = bus_id.split(":")
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest[:2], 16)
        return info

    def nvmlDeviceGetCudaComputeCapability(self, handle: Handle) -> tuple[int, int]:
        gpu = self._gpu("nvmlDeviceGetCudaComputeCapability", handle)
        major, minor = gpu.cuda_compute_capability.split(".")
        return int(major), int(minor)

    def nvmlDeviceGetArchitecture(self, handle: Handle) -> int:
        gpu = self._gpu("nvmlDeviceGetArchitecture", handle)
        suffix = _ARCH.get(gpu.architecture)
        return (
            getattr(pynvml, f"NVML_DEVICE_ARCH_{suffix}")
            if suffix
            else pynvml.NVML_DEVICE_ARCH_UNKNOWN
        )

    def nvmlDeviceGetBrand(self, handle: Handle) -> int:
        gpu = self._gpu("nvmlDeviceGetBrand", handle)
        suffix = _BRAND.get(gpu.brand)
        return getattr(pynvml, f"NVML_BRAND_{suffix}") if suffix else pynvml.NVML_BRAND_UNKNOWN

    def nvmlDeviceGetMemoryAffinity(
        self, handle: Handle, node_set_size: int, scope: int
    ) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetMemoryAffinity", handle)
        if not self.memory_affinity or gpu.numa_node is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        words = [0] * node_set_size
        words[gpu.numa_node // 64] |= 1 << (gpu.numa_node % 64)
        return words

    def nvmlDeviceGetNumaNodeId(self, handle: Handle) -> int:
        self._gpu("nvmlDeviceGetNumaNodeId", handle)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # only GPUs that are NUMA nodes

    # -- MIG -----------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetMigMode", handle)
        if gpu.architecture not in _MIG_CAPABLE:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:
        gpu = self._gpu("nvmlDeviceGetMaxMigDeviceCount", handle)
        return MAX_MIG_DEVICES if gpu.architecture in _MIG_CAPABLE else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, index: int) -> Handle:
        gpu = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if not gpu.mig_enabled:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(gpu.mig_devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return Handle(handle.index, index)

    def nvmlDeviceIsMigDeviceHandle(self, handle: Handle) -> bool:
        self._gpu("nvmlDeviceIsMigDeviceHandle", handle)
        return handle.mig_slot is not None

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Handle) -> Handle:
        self._gpu("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
        return Handle(handle.index)

    def nvmlDeviceGetGpuInstanceId(self, handle: Handle) -> int:
        self._gpu("nvmlDeviceGetGpuInstanceId", handle)
        if handle.mig_slot is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(self._mig(handle).gi_id)

    def nvmlDeviceGetComputeInstanceId(self, handle: Handle) -> int:
        self._gpu("nvmlDeviceGetComputeInstanceId", handle)
        if handle.mig_slot is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(self._mig(handle).ci_id)

    # -- interconnect --------------------------------------------------------------------------

    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:
        self._gpu("nvmlDeviceGetNvLinkState", handle)
        lanes = self.lanes[handle.index]
        if not lanes:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= pynvml.NVML_NVLINK_MAX_LINKS:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED if link < len(lanes) else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Handle, link: int) -> Any:
        self._gpu("nvmlDeviceGetNvLinkRemotePciInfo", handle)
        lanes = self.lanes[handle.index]
        if link >= len(lanes):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._pci(lanes[link])

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Handle, device2: Handle) -> int:
        self._gpu("nvmlDeviceGetTopologyCommonAncestor", device1)
        self._gpu("nvmlDeviceGetTopologyCommonAncestor", device2)
        link = self.node.link(device1.index, device2.index)
        if link is None or link.pcie is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _LEVEL[link.pcie]

    # -- host files the real driver would provide ----------------------------------------------

    def write_host_files(
        self, *, sysfs_root: Path | None = None, proc_root: Path | None = None
    ) -> None:
        """Write the sysfs ``numa_node`` files and ``/proc`` MIG minors the node implies."""
        if sysfs_root is not None:
            for gpu in self.node.gpus:
                device = sysfs_root / "bus" / "pci" / "devices" / gpu.pci_bus_id
                device.mkdir(parents=True, exist_ok=True)
                numa = -1 if gpu.numa_node is None else gpu.numa_node
                (device / "numa_node").write_text(f"{numa}\n")
        if proc_root is not None:
            caps = proc_root / "driver" / "nvidia-caps"
            caps.mkdir(parents=True, exist_ok=True)
            lines = ["config 1", "monitor 2"]
            for gpu in self.node.gpus:
                for mig in gpu.mig_devices:
                    if len(mig.cap_minors) == 2:
                        lines.append(f"gpu{gpu.minor}/gi{mig.gi_id}/access {mig.cap_minors[0]}")
                        lines.append(
                            f"gpu{gpu.minor}/gi{mig.gi_id}/ci{mig.ci_id}/access {mig.cap_minors[1]}"
                        )
            (caps / "mig-minors").write_text("\n".join(lines) + "\n")
