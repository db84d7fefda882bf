"""Discovery through NVML (the ``pynvml`` module of nvidia-ml-py).

The module is a parameter (tests pass ``tests/fakes/fake_pynvml``); its library is loaded by
:mod:`cdigen.discover.nvml_library`. Host files are read below ``sysfs_root`` (NUMA fallback)
and ``proc_root`` (MIG capability minors), never from ``/`` directly.

A failing call on one GPU does not stop discovery: that GPU carries ``error`` (and is advertised
unhealthy later); fields that could not be read get placeholders (``uuid: GPU-unknown-index<N>``,
``minor: -1``, empty strings, 0). Calls that a GPU merely does not support (NVLink on a PCIe card,
MIG on a GeForce) are not errors.

NVLink rule: for each link ``l < NVML_NVLINK_MAX_LINKS`` whose state is enabled, the remote PCI
bus ID says where it goes. A remote that is another GPU counts one NVLink for that pair. A remote
that is not a GPU is an NVSwitch: the GPU is on the switch fabric, and every pair of GPUs that
are both on it gets ``min(switch links of a, switch links of b)`` NVLinks, because traffic between
them crosses at most that many links at either end.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cdigen import logs
from cdigen.discover.nvml_library import NO_NVML_HINT, start_nvml
from cdigen.discover.sources import NVML
from cdigen.errors import DiscoveryError
from cdigen.families import FAMILIES
from cdigen.model import Gpu, Link, MigDevice, Node, PcieLevel
from cdigen.nodefile import normalize_bus_id

log = logs.logger("cdigen.discover.nvml")

T = TypeVar("T")
V = TypeVar("V")

NODE_SET_WORDS = 4  # nvmlDeviceGetMemoryAffinity node-set size in 64-bit words: 256 NUMA nodes
_MIG_PROFILE = re.compile(r"MIG\s+((?:\d+c\.)?\d+g\.\d+gb(?:\+\w+)*)\s*$")
_MIG_MINOR = re.compile(r"^gpu(\d+)/gi(\d+)(?:/ci(\d+))?/access\s+(\d+)$")

_ARCHITECTURES = {f.nvml: f.name for f in FAMILIES if f.nvml}
_BRANDS = {
    "NVML_BRAND_QUADRO": "Quadro",
    "NVML_BRAND_TESLA": "Tesla",
    "NVML_BRAND_NVS": "NVS",
    "NVML_BRAND_GRID": "GRID",
    "NVML_BRAND_GEFORCE": "GeForce",
    "NVML_BRAND_TITAN": "Titan",
    "NVML_BRAND_NVIDIA_RTX": "NVIDIA RTX",
    "NVML_BRAND_NVIDIA": "NVIDIA",
    "NVML_BRAND_GEFORCE_RTX": "GeForce RTX",
    "NVML_BRAND_QUADRO_RTX": "Quadro RTX",
    "NVML_BRAND_TITAN_RTX": "Titan RTX",
}
_PCIE_LEVELS: dict[str, PcieLevel] = {
    "NVML_TOPOLOGY_INTERNAL": "PIX",  # two GPUs on one board: closest PCIe relation there is
    "NVML_TOPOLOGY_SINGLE": "PIX",
    "NVML_TOPOLOGY_MULTIPLE": "PXB",
    "NVML_TOPOLOGY_HOSTBRIDGE": "PHB",
    "NVML_TOPOLOGY_NODE": "NODE",
    "NVML_TOPOLOGY_SYSTEM": "SYS",
}


def constant_names(nvml: Any, table: Mapping[str, V]) -> dict[int, V]:
    """``table`` keyed by the values of the NVML constants it names (those ``nvml`` has)."""
    return {getattr(nvml, k): v for k, v in table.items() if hasattr(nvml, k)}


def text(value: object) -> str:
    """A string from an NVML return value (older pynvml returns bytes)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version number (12040) as ``12.4``."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def discover_nvml(
    nvml: Any = None,
    *,
    sysfs_root: Path,
    proc_root: Path,
    driver_root: str = "/",
    host_root: str = "/",
) -> Node:
    """The Node NVML describes; DiscoveryError (exit 2) if NVML cannot start at all.

    NVML's library is loaded from ``driver_root`` (a host path, under ``host_root``) first.
    """
    if nvml is None:
        try:
            import pynvml

            nvml = pynvml
        except ImportError:
            raise DiscoveryError(
                "the NVML binding (pynvml, from nvidia-ml-py) is not installed", hint=NO_NVML_HINT
            ) from None
    start_nvml(nvml, driver_root=driver_root, host_root=host_root)
    try:
        return _Discovery(nvml, sysfs_root, proc_root).node()
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            log.debug("nvmlShutdown failed: %s", exc)


def read_mig_minors(proc_root: Path) -> dict[tuple[int, ...], int]:
    """``<proc_root>/driver/nvidia-caps/mig-minors``: (gpu minor, gi[, ci]) -> nvidia-cap minor."""
    path = proc_root / "driver" / "nvidia-caps" / "mig-minors"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return {}
    minors: dict[tuple[int, ...], int] = {}
    for line in lines:
        match = _MIG_MINOR.match(line.strip())
        if match:
            gpu, gi, ci, minor = match.groups()
            key = (int(gpu), int(gi)) if ci is None else (int(gpu), int(gi), int(ci))
            minors[key] = int(minor)
    return minors


def read_sysfs_numa(sysfs_root: Path, bus_id: str) -> int | None:
    """``<sysfs>/bus/pci/devices/<bdf>/numa_node``; None when missing, unreadable or -1."""
    path = sysfs_root / "bus" / "pci" / "devices" / bus_id / "numa_node"
    try:
        value = int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


@dataclass
class _Probe:
    """Calls on one GPU, collecting failures instead of raising them."""

    nvml: Any
    errors: list[str] = field(default_factory=list)

    def call(self, fn: Callable[..., T], *args: Any, default: T) -> T:
        """``fn(*args)``, or ``default`` with the failure recorded."""
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            self.errors.append(f"{fn.__name__} failed: {exc}")
            return default

    def optional(self, fn: Callable[..., T], *args: Any, default: T) -> T:
        """``fn(*args)``; "not supported" answers give ``default`` without an error."""
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            if _unsupported(self.nvml, exc):
                return default
            self.errors.append(f"{fn.__name__} failed: {exc}")
            return default


def _unsupported(nvml: Any, exc: Exception) -> bool:
    codes = {
        getattr(nvml, name, None)
        for name in (
            "NVML_ERROR_NOT_SUPPORTED",
            "NVML_ERROR_FUNCTION_NOT_FOUND",
            "NVML_ERROR_INVALID_ARGUMENT",
            "NVML_ERROR_NOT_FOUND",
        )
    }
    return getattr(exc, "value", None) in codes


@dataclass
class _Found:
    gpu: Gpu
    handle: Any
    nvlink_remotes: list[str]


class _Discovery:
    def __init__(self, nvml: Any, sysfs_root: Path, proc_root: Path) -> None:
        self.nvml = nvml
        self.sysfs_root = sysfs_root
        self.mig_minors = read_mig_minors(proc_root)
        self.architectures = constant_names(nvml, _ARCHITECTURES)
        self.brands = constant_names(nvml, _BRANDS)

    def node(self) -> Node:
        nvml = self.nvml
        try:
            driver = text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError as exc:
            log.warning("cannot read the driver version: %s", exc)
            driver = ""
        try:
            cuda = cuda_version_text(int(nvml.nvmlSystemGetCudaDriverVersion()))
        except nvml.NVMLError as exc:
            log.warning("cannot read the CUDA driver version: %s", exc)
            cuda = ""
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            raise DiscoveryError(f"NVML cannot count the GPUs: {exc}", hint=NO_NVML_HINT) from None
        found = [self.gpu(index) for index in range(count)]
        return Node(
            gpus=tuple(f.gpu for f in found),
            links=self.links(found),
            driver_version=driver,
            cuda_driver_version=cuda,
            discovered_by=NVML,
        )

    def gpu(self, index: int) -> _Found:
        nvml = self.nvml
        probe = _Probe(nvml)
        handle = probe.call(nvml.nvmlDeviceGetHandleByIndex, index, default=None)
        if handle is None:
            return _Found(self._unknown_gpu(index, probe.errors), None, [])
        uuid = text(probe.call(nvml.nvmlDeviceGetUUID, handle, default=""))
        minor = int(probe.call(nvml.nvmlDeviceGetMinorNumber, handle, default=-1))
        name = text(probe.call(nvml.nvmlDeviceGetName, handle, default=""))
        memory = probe.call(nvml.nvmlDeviceGetMemoryInfo, handle, default=None)
        pci = probe.call(nvml.nvmlDeviceGetPciInfo, handle, default=None)
        bus_id = normalize_bus_id(text(pci.busId)) if pci is not None else ""
        cc = probe.call(nvml.nvmlDeviceGetCudaComputeCapability, handle, default=None)
        arch = probe.optional(nvml.nvmlDeviceGetArchitecture, handle, default=None)
        brand = probe.optional(nvml.nvmlDeviceGetBrand, handle, default=None)
        mig_mode = probe.optional(nvml.nvmlDeviceGetMigMode, handle, default=None)
        mig_enabled = bool(mig_mode) and mig_mode[0] == nvml.NVML_DEVICE_MIG_ENABLE
        migs = self.mig_devices(probe, handle, minor) if mig_enabled else ()
        remotes = self.nvlink_remotes(probe, handle)
        gpu = Gpu(
            index=index,
            minor=minor,
            uuid=uuid or f"GPU-unknown-index{index}",
            name=name,
            architecture=self.architectures.get(arch, "") if arch is not None else "",
            cuda_compute_capability=f"{cc[0]}.{cc[1]}" if cc else "",
            memory_bytes=int(memory.total) if memory is not None else 0,
            pci_bus_id=bus_id,
            numa_node=self.numa(handle, bus_id),
            brand=self.brands.get(brand, "") if brand is not None else "",
            mig_enabled=mig_enabled,
            mig_devices=migs,
            error="; ".join(probe.errors) or None,
        )
        if gpu.error:
            log.warning("GPU %d: %s", index, gpu.error)
        return _Found(gpu, handle, remotes)

    def _unknown_gpu(self, index: int, errors: list[str]) -> Gpu:
        log.warning("GPU %d: %s", index, "; ".join(errors))
        return Gpu(
            index=index,
            minor=-1,
            uuid=f"GPU-unknown-index{index}",
            name="",
            architecture="",
            cuda_compute_capability="",
            memory_bytes=0,
            pci_bus_id="",
            error="; ".join(errors),
        )

    def numa(self, handle: Any, bus_id: str) -> int | None:
        """NUMA node from NVML memory affinity, else sysfs; None where unknown."""
        nvml = self.nvml
        try:
            words = nvml.nvmlDeviceGetMemoryAffinity(
                handle, NODE_SET_WORDS, nvml.NVML_AFFINITY_SCOPE_NODE
            )
            nodes = [
                w * 64 + bit for w, word in enumerate(words) for bit in range(64) if word >> bit & 1
            ]
            if len(nodes) == 1:
                return nodes[0]
        except (nvml.NVMLError, AttributeError) as exc:
            log.debug("memory affinity unavailable (%s); reading sysfs", exc)
        return read_sysfs_numa(self.sysfs_root, bus_id) if bus_id else None

    def mig_devices(self, probe: _Probe, handle: Any, gpu_minor: int) -> tuple[MigDevice, ...]:
        nvml = self.nvml
        count = int(probe.call(nvml.nvmlDeviceGetMaxMigDeviceCount, handle, default=0))
        devices = []
        for slot in range(count):
            mig = probe.optional(
                nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot, default=None
            )
            if mig is None:
                continue  # an empty slot
            name = text(probe.call(nvml.nvmlDeviceGetName, mig, default=""))
            profile = _MIG_PROFILE.search(name)
            if profile is None:
                probe.errors.append(f"MIG device {slot}: no profile in its name {name!r}")
                continue
            gi = int(probe.call(nvml.nvmlDeviceGetGpuInstanceId, mig, default=-1))
            ci = int(probe.call(nvml.nvmlDeviceGetComputeInstanceId, mig, default=-1))
            memory = probe.call(nvml.nvmlDeviceGetMemoryInfo, mig, default=None)
            uuid = text(probe.call(nvml.nvmlDeviceGetUUID, mig, default=""))
            if gi < 0 or ci < 0 or memory is None or not uuid:
                continue  # the failure is recorded on the GPU
            cap = (self.mig_minors.get((gpu_minor, gi)), self.mig_minors.get((gpu_minor, gi, ci)))
            devices.append(
                MigDevice(
                    uuid=uuid,
                    profile=profile.group(1),
                    gi_id=gi,
                    ci_id=ci,
                    memory_bytes=int(memory.total),
                    cap_minors=(cap[0], cap[1])
                    if cap[0] is not None and cap[1] is not None
                    else (),
                )
            )
        return tuple(devices)

    def nvlink_remotes(self, probe: _Probe, handle: Any) -> list[str]:
        """Bus IDs at the far end of each active NVLink (a GPU's or an NVSwitch's)."""
        nvml = self.nvml
        remotes = []
        for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            state = probe.optional(nvml.nvmlDeviceGetNvLinkState, handle, link, default=None)
            if state != nvml.NVML_FEATURE_ENABLED:
                continue
            pci = probe.optional(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link, default=None)
            if pci is not None:
                remotes.append(normalize_bus_id(text(pci.busId)))
        return remotes

    def links(self, found: list[_Found]) -> tuple[Link, ...]:
        nvml = self.nvml
        levels = constant_names(nvml, _PCIE_LEVELS)
        by_bus = {f.gpu.pci_bus_id: f.gpu.index for f in found if f.gpu.pci_bus_id}
        direct: Counter[tuple[int, int]] = Counter()
        switch_links: dict[int, int] = {}
        for f in found:
            for remote in f.nvlink_remotes:
                peer = by_bus.get(remote)
                if peer is None:
                    switch_links[f.gpu.index] = switch_links.get(f.gpu.index, 0) + 1
                elif peer != f.gpu.index:
                    direct[(f.gpu.index, peer)] += 1
        links = []
        for i, fa in enumerate(found):
            for fb in found[i + 1 :]:
                a, b = fa.gpu.index, fb.gpu.index
                nvlinks = max(direct[(a, b)], direct[(b, a)])
                if a in switch_links and b in switch_links:
                    nvlinks += min(switch_links[a], switch_links[b])
                pcie: PcieLevel | None = None
                if fa.handle is not None and fb.handle is not None:
                    try:
                        level = nvml.nvmlDeviceGetTopologyCommonAncestor(fa.handle, fb.handle)
                        pcie = levels.get(int(level))
                    except nvml.NVMLError as exc:
                        log.debug("no PCIe level for GPUs %d-%d: %s", a, b, exc)
                if pcie is not None or nvlinks:
                    links.append(Link(a=min(a, b), b=max(a, b), pcie=pcie, nvlinks=nvlinks))
        return tuple(links)
