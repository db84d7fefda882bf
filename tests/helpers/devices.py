"""Advertised devices made by hand, for servicer tests that need a device or two and no node."""

from __future__ import annotations

from cdigen.catalogue import CatalogueEntry, Share
from cdigen.model import Gpu, MigDevice
from cdigen.plugin.deviceplugin.resources import AdvertisedDevice

KIND = "nvidia.com/gpu"


def gpu(uuid: str, index: int = 0, numa_node: int | None = 0) -> Gpu:
    """A GPU with only what a servicer reads: UUID, index, NUMA node."""
    return Gpu(
        index=index,
        minor=index,
        uuid=uuid,
        name="NVIDIA GeForce RTX 4090",
        architecture="Ada Lovelace",
        cuda_compute_capability="8.9",
        memory_bytes=24 << 30,
        pci_bus_id=f"0000:{index + 1:02x}:00.0",
        numa_node=numa_node,
    )


def whole(uuid: str, index: int = 0) -> AdvertisedDevice:
    """A whole GPU, handed out by its UUID's CDI name."""
    return AdvertisedDevice(CatalogueEntry(gpu(uuid, index), index), (f"{KIND}={uuid}",))


def replica(uuid: str, k: int, index: int = 0) -> AdvertisedDevice:
    """Replica ``k`` of a GPU (``<uuid>::<k>``), handed out as its GPU."""
    share = Share("replica", k, f"{uuid}::{k}")
    return AdvertisedDevice(
        CatalogueEntry(gpu(uuid, index), index, share=share), (f"{KIND}={uuid}",)
    )


def mig(uuid: str, parent: str, index: int = 0) -> AdvertisedDevice:
    """A 1g.10gb MIG device on GPU ``parent``, handed out by its own UUID's CDI name."""
    device = MigDevice(uuid, "1g.10gb", gi_id=7, ci_id=0, memory_bytes=10 << 30)
    entry = CatalogueEntry(gpu(parent, index), index, mig=device, mig_position=0)
    return AdvertisedDevice(entry, (f"{KIND}={uuid}",))
