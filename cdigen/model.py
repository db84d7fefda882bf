"""The node description: frozen records shared by discovery, CDI, policies and the plugin.

Files use camelCase keys (see ``schemas/node.schema.json``); these records use snake_case.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

API_VERSION = "cdigen/v1alpha1"
NODE_KIND = "Node"

PcieLevel = Literal["PIX", "PXB", "PHB", "NODE", "SYS"]
PCIE_LEVELS: tuple[PcieLevel, ...] = ("PIX", "PXB", "PHB", "NODE", "SYS")

# Sane ranges, the same as the maxima in schemas/node.schema.json (a test keeps them equal).
MAX_GPU_INDEX = 4095  # NVML indexes and link ends
MAX_MINOR = 2**20 - 1  # Linux device minors have 20 bits
MAX_NUMA_NODE = 1023  # the kernel's NODES_SHIFT is at most 10
MAX_NVLINKS = 18  # NVLinks between two GPUs (H100: 18 per GPU)
MAX_MEMORY_BYTES = 2**44  # 16 TiB per GPU or MIG device
MAX_MIG_ID = 255  # GPU and compute instance IDs
# How MIG devices are offered: not at all (whole GPUs), as the one kind of every GPU, or each
# profile as its own kind (NVIDIA's device plugin's --mig-strategy words).
MIG_STRATEGIES = ("none", "single", "mixed")
# the DRA plugin also makes MIG devices per claim (KEP-4815, docs/mig.md)
DRA_MIG_STRATEGIES = (*MIG_STRATEGIES, "dynamic")
# The defaults differ, each for a reason its --help states. The device plugin: none, as NVIDIA's
# device plugin, because single and mixed change the resource names pods ask for. DRA: mixed,
# because a claim selects MIG devices by attribute (no resource name per profile), so offering
# the MIG devices that exist costs nothing, while none would offer a MIG-enabled GPU whole.
DEVICE_PLUGIN_MIG_STRATEGY = "none"
DRA_MIG_STRATEGY = "mixed"


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a GPU instance + compute instance) on a MIG-enabled GPU."""

    uuid: str
    profile: str  # e.g. "1g.10gb"
    gi_id: int
    ci_id: int
    memory_bytes: int
    cap_minors: tuple[int, ...] = ()  # /dev/nvidia-caps/nvidia-cap<N>: GI then CI


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as discovery sees it."""

    index: int  # NVML index
    minor: int  # /dev/nvidia<minor>
    uuid: str
    name: str  # productName
    architecture: str
    cuda_compute_capability: str  # "8.0"
    memory_bytes: int
    pci_bus_id: str  # "0000:07:00.0"
    numa_node: int | None = None
    brand: str = ""
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    healthy: bool = True  # simulation: node files may set healthy: false
    error: str | None = None  # a discovery call failed on this GPU; it is advertised unhealthy

    @property
    def usable(self) -> bool:
        """Whether the GPU may be given out: healthy, and discovery read it without error."""
        return self.healthy and self.error is None


@dataclass(frozen=True)
class Link:
    """What connects two GPUs (by NVML index, ``a < b``)."""

    a: int
    b: int
    pcie: PcieLevel | None = None  # None: unknown or hidden behind NVLink
    nvlinks: int = 0


@dataclass(frozen=True)
class Node:
    """Everything cdigen knows about one node's GPUs. Immutable: discovery makes a new one."""

    gpus: tuple[Gpu, ...]
    links: tuple[Link, ...] = ()
    driver_version: str = ""
    cuda_driver_version: str = ""
    name: str = ""  # a label for samples and reports; not used for decisions
    # "nvml" when discovery read the hardware (kept in the node file it writes); "" otherwise
    discovered_by: str = field(default="", compare=False)
    notes: tuple[str, ...] = field(default=(), compare=False)  # what discovery inferred

    @cached_property
    def _by_uuid(self) -> dict[str, Gpu]:
        return {g.uuid: g for g in self.gpus}

    @cached_property
    def _by_index(self) -> dict[int, Gpu]:
        return {g.index: g for g in self.gpus}

    @cached_property
    def _links(self) -> dict[tuple[int, int], Link]:
        return {(min(k.a, k.b), max(k.a, k.b)): k for k in self.links}

    def gpu_by_uuid(self, uuid: str) -> Gpu | None:
        """The GPU with this UUID, or None."""
        return self._by_uuid.get(uuid)

    def gpu_by_index(self, index: int) -> Gpu | None:
        """The GPU with this NVML index, or None."""
        return self._by_index.get(index)

    def link(self, a: int, b: int) -> Link | None:
        """The link between GPUs ``a`` and ``b`` (indexes, any order), or None if unknown."""
        return self._links.get((min(a, b), max(a, b)))
