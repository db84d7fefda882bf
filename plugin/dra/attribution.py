"""Per-pod attribution, the DRA plugin's side: the claims the kubelet reports a container uses,
mapped to GPUs through the claims this plugin prepared (its checkpoint, whose device names the
catalogue's entries carry), for ``cdigen dra pods`` (:mod:`cdigen.plugin.dra.pods_cli`) and for the
series the plugin's /metrics carries
(:class:`~cdigen.plugin.agent.attribution.AttributionCollector`, the part both wings share).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdigen.catalogue import CatalogueEntry
from cdigen.model import Gpu
from cdigen.plugin.agent.attribution import AttributionCollector, Slot
from cdigen.plugin.agent.holdings import Holding
from cdigen.plugin.agent.podresources import ContainerResources, socket_path

if TYPE_CHECKING:
    from cdigen.plugin.dra.checkpoint import ClaimDoc, PreparedDeviceDoc
    from cdigen.plugin.dra.kubelet_plugin import DraPlugin


def dra_limit(device: PreparedDeviceDoc, entry: CatalogueEntry) -> int:
    """The memory a claim was given of one device: the memory capacity it consumed (a device
    shared through consumable capacity), else the device's memory."""
    from cdigen.policies.cel import parse_quantity

    consumed = (device.get("consumedCapacity") or {}).get("memory")
    if consumed is not None:
        try:
            return int(parse_quantity(consumed))
        except ValueError:
            pass  # the checkpoint checked it; a bad one counts as the whole device
    return entry.memory_bytes


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


def attach_dra(plugin: DraPlugin) -> AttributionCollector:
    """Register attribution into the DRA plugin's metrics."""
    wing = DraWing(
        plugin.options.driver,
        lambda: {v.name: v.entry for v in plugin.views},
        plugin.preparer.prepared,
    )
    collector = AttributionCollector(
        wing, socket_path(plugin.options.kubelet_dir), board=plugin.board
    )
    plugin.metrics.registry.register(collector)
    return collector
