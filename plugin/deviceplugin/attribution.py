"""Per-pod attribution, the device plugin's side: the kubelet's device IDs mapped to GPUs through
the resources the plugin advertises (made from the device catalogue), for ``cdigen plugin pods``
(:mod:`cdigen.plugin.deviceplugin.pods_cli`) and for the series the plugin's /metrics carries
(:class:`~cdigen.plugin.agent.attribution.AttributionCollector`, the part both wings share).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdigen.catalogue import CatalogueEntry
from cdigen.model import Gpu
from cdigen.plugin.agent.attribution import AttributionCollector, Slot
from cdigen.plugin.agent.holdings import Holding
from cdigen.plugin.agent.podresources import ContainerResources, socket_path

if TYPE_CHECKING:
    from cdigen.plugin.deviceplugin.resources import AdvertisedDevice, Resource
    from cdigen.plugin.deviceplugin.runner import Plugin


def short_name(entry: CatalogueEntry) -> str:
    """How the table names a device: a share by its number on the GPU (``#3``; the GPU and the
    kind have their own columns), anything else by its DRA name (``gpu-0-mig-1-0``)."""
    return f"#{entry.share.index}" if entry.share is not None else entry.dra_name


# --- the device plugin ---------------------------------------------------------------------


def plugin_limit(resource: Resource, held: Sequence[AdvertisedDevice]) -> int | None:
    """The memory one container was given on one GPU by ``held`` devices of ``resource``.

    Memory slices: their size each; replicas: the GPU's memory in proportion, under MPS only
    (plain time-slicing limits nothing), as Allocate sets CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
    (:meth:`cdigen.plugin.deviceplugin.sharing.Sharing.memory_limit`); MIG devices and whole GPUs:
    their memory.
    """
    sharing = resource.sharing
    entry = held[0].entry
    if sharing is None or entry.share is None:
        return sum(d.entry.memory_bytes for d in held)
    return sharing.memory_limit(entry.gpu, len(held))


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


def attach_plugin(plugin: Plugin) -> AttributionCollector | None:
    """Register attribution into the device plugin's metrics (None when it serves none); the
    kubelet's socket is beside the plugin dir (``/var/lib/kubelet/pod-resources``)."""
    if plugin.metrics is None:
        return None
    wing = PluginWing(lambda: plugin.layout.resources)
    collector = AttributionCollector(
        wing, socket_path(plugin.config.plugin_dir.parent), board=plugin.board
    )
    plugin.metrics.registry.register(collector)
    return collector
