"""How each wing turns the kubelet's answer into :class:`Holding` rows, through what it
advertised (device plugin: its resources, made from the device catalogue) or prepared (DRA: the
claims in its checkpoint, whose device names the catalogue's entries carry).

Each wing also says which GPUs it serves, which devices it has on each (the "slots" whose use the
metrics count) and which of them are in use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from cdigen.catalogue import CatalogueEntry
from cdigen.constants import MIB
from cdigen.model import Gpu
from plugin.attribution.holdings import Holding
from plugin.attribution.podresources import ContainerResources

if TYPE_CHECKING:
    from plugin.dra.checkpoint import ClaimDoc, PreparedDeviceDoc
    from plugin.resources import AdvertisedDevice, Resource


@dataclass(frozen=True)
class Slot:
    """One device a wing offers on a GPU: a share, a MIG device, a whole GPU or a DRA device."""

    resource: str  # the extended resource, or the DRA driver
    device: str  # its device ID (device plugin) or name (DRA)
    gpu_uuid: str


class Wing(Protocol):
    """What the attribution collector asks of a wing; each call reads the wing's state now."""

    @property
    def name(self) -> str:
        """``plugin`` or ``dra``."""
        ...

    def gpus(self) -> Sequence[Gpu]:
        """The physical GPUs the wing serves."""
        ...

    def slots(self) -> Sequence[Slot]:
        """Every device the wing offers now, with its GPU."""
        ...

    def holdings(self, containers: Iterable[ContainerResources]) -> list[Holding]:
        """What each container holds of the wing's devices."""
        ...

    def used(self, holdings: Sequence[Holding]) -> set[tuple[str, str]]:
        """The ``(resource, device)`` slots in use."""
        ...


def entry_memory(entry: CatalogueEntry) -> int:
    """The memory of a catalogue device in bytes: its MIG device's (made or to be made at
    prepare), else its GPU's."""
    if entry.mig is not None:
        return entry.mig.memory_bytes
    if entry.placement is not None:
        return entry.placement.profile.memory_bytes
    return entry.gpu.memory_bytes


def short_name(entry: CatalogueEntry) -> str:
    """How the table names a device: a share by its number on the GPU (``#3``; the GPU and the
    kind have their own columns), anything else by its DRA name (``gpu-0-mig-1-0``)."""
    return f"#{entry.share.index}" if entry.share is not None else entry.dra_name


# --- the device plugin ---------------------------------------------------------------------


def plugin_limit(resource: Resource, held: Sequence[AdvertisedDevice]) -> int | None:
    """The memory one container was given on one GPU by ``held`` devices of ``resource``.

    Memory slices: their size each; replicas: the GPU's memory in proportion, under MPS only
    (plain time-slicing limits nothing), as Allocate sets CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
    (plugin.sharing._mps_env: MiB floored); MIG devices and whole GPUs: their memory.
    """
    sharing = resource.sharing
    entry = held[0].entry
    if sharing is None or entry.share is None:
        return sum(entry_memory(d.entry) for d in held)
    if sharing.memory_slice_mib is not None:
        return len(held) * sharing.memory_slice_mib * MIB
    if sharing.mps_pipe_directory is None or not sharing.replicas:
        return None
    return ((entry.gpu.memory_bytes >> 20) * len(held) // sharing.replicas) << 20


def plugin_holdings(
    containers: Iterable[ContainerResources], resources: Sequence[Resource]
) -> list[Holding]:
    """The rows of the device IDs the kubelet allocated from ``resources``; IDs no longer
    advertised (a MIG layout changed under a running pod) are left out."""
    by_name = {r.name: (r, {d.id: d for d in r.devices}) for r in resources}
    rows = []
    for c in containers:
        for resource_name, ids in c.devices:
            found = by_name.get(resource_name)
            if found is None:
                continue  # another plugin's resource
            resource, devices = found
            by_gpu: dict[str, list[AdvertisedDevice]] = {}
            for device_id in ids:
                device = devices.get(device_id)
                if device is not None:
                    by_gpu.setdefault(device.gpu_uuid, []).append(device)
            for gpu_uuid, held in by_gpu.items():
                entry = held[0].entry
                rows.append(
                    Holding(
                        namespace=c.namespace,
                        pod=c.pod,
                        container=c.container,
                        gpu_uuid=gpu_uuid,
                        gpu_index=entry.gpu.index,
                        kind=entry.kind,
                        source=resource_name,
                        devices=tuple(d.id for d in held),
                        allocation=f"{c.namespace}/{c.pod}/{c.container}/{resource_name}",
                        memory_limit_bytes=plugin_limit(resource, held),
                        names=tuple(short_name(d.entry) for d in held),
                    )
                )
    return rows


@dataclass(frozen=True)
class PluginWing:
    """The device plugin's side: its resources now (the layout in force)."""

    resources: Callable[[], Sequence[Resource]]
    name: str = "plugin"

    def gpus(self) -> Sequence[Gpu]:
        seen: dict[str, Gpu] = {}
        for resource in self.resources():
            for d in resource.devices:
                seen.setdefault(d.gpu_uuid, d.entry.gpu)
        return sorted(seen.values(), key=lambda g: g.index)

    def slots(self) -> Sequence[Slot]:
        return [Slot(r.name, d.id, d.gpu_uuid) for r in self.resources() for d in r.devices]

    def holdings(self, containers: Iterable[ContainerResources]) -> list[Holding]:
        return plugin_holdings(containers, self.resources())

    def used(self, holdings: Sequence[Holding]) -> set[tuple[str, str]]:
        return {(h.source, d) for h in holdings for d in h.devices}


# --- DRA ------------------------------------------------------------------------------------


def dra_limit(device: PreparedDeviceDoc, entry: CatalogueEntry) -> int:
    """The memory a claim was given of one device: the memory capacity it consumed (a device
    shared through consumable capacity), else the device's memory."""
    from policies.cel import parse_quantity

    consumed = (device.get("consumedCapacity") or {}).get("memory")
    if consumed is not None:
        try:
            return int(parse_quantity(consumed))
        except ValueError:
            pass  # the checkpoint checked it; a bad one counts as the whole device
    return entry_memory(entry)


def dra_holdings(
    containers: Iterable[ContainerResources],
    claims: Mapping[str, ClaimDoc],
    entries: Mapping[str, CatalogueEntry],
) -> list[Holding]:
    """The rows of the claims our plugin prepared (``claims``: the checkpoint's, by UID) that
    the kubelet reports a container uses; ``entries``: the catalogue's devices by DRA name."""
    by_ref = {(doc["namespace"], doc["name"]): (uid, doc) for uid, doc in claims.items()}
    rows = []
    for c in containers:
        for claim in c.claims:
            found = by_ref.get((claim.namespace, claim.name))
            if found is None:
                continue  # another driver's claim, or not prepared by us
            uid, doc = found
            by_gpu: dict[str, list[tuple[PreparedDeviceDoc, CatalogueEntry]]] = {}
            for device in doc["devices"]:
                entry = entries.get(device["deviceName"])
                if entry is not None:
                    by_gpu.setdefault(entry.gpu_uuid, []).append((device, entry))
            for gpu_uuid, held in by_gpu.items():
                entry = held[0][1]
                shared = any(device.get("shareId") for device, _ in held)
                rows.append(
                    Holding(
                        namespace=c.namespace,
                        pod=c.pod,
                        container=c.container,
                        gpu_uuid=gpu_uuid,
                        gpu_index=entry.gpu.index,
                        kind="shared" if shared else entry.kind,
                        source=f"{claim.namespace}/{claim.name}",
                        devices=tuple(device["deviceName"] for device, _ in held),
                        allocation=uid,
                        memory_limit_bytes=sum(dra_limit(d, e) for d, e in held),
                    )
                )
    return rows


@dataclass(frozen=True)
class DraWing:
    """The DRA plugin's side: its devices (catalogue entries by DRA name) and prepared claims."""

    driver: str
    entries: Callable[[], Mapping[str, CatalogueEntry]]
    claims: Callable[[], Mapping[str, ClaimDoc]]
    name: str = "dra"

    def gpus(self) -> Sequence[Gpu]:
        seen = {e.gpu_uuid: e.gpu for e in self.entries().values()}
        return sorted(seen.values(), key=lambda g: g.index)

    def slots(self) -> Sequence[Slot]:
        return [Slot(self.driver, name, e.gpu_uuid) for name, e in self.entries().items()]

    def holdings(self, containers: Iterable[ContainerResources]) -> list[Holding]:
        return dra_holdings(containers, self.claims(), self.entries())

    def used(self, holdings: Sequence[Holding]) -> set[tuple[str, str]]:
        # a device is in use while a claim holds it prepared, whether or not its pod runs yet
        return {
            (self.driver, device["deviceName"])
            for doc in self.claims().values()
            for device in doc["devices"]
        }
