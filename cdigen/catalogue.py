"""The device catalogue: every device a node offers, built once from the node, for every consumer.

The spec generator names its devices from it, the device plugin advertises it, and the DRA wing
publishes it; each takes the entries and adds what only it knows (device nodes, resources,
attributes). An entry holds its parts as values: its GPU and that GPU's place in index order, its
MIG device and that device's place on the GPU, its share kind and number. No consumer needs to
read a device ID or a name back into parts.

Which devices a node offers depends on the MIG strategy and on sharing:

- ``none``: every GPU whole, MIG-enabled ones too (the device plugin leaves those out: it cannot
  hand out a GPU whose memory belongs to MIG devices);
- ``single`` and ``mixed``: a MIG-enabled GPU offers its MIG devices instead of itself (the
  device plugin adds the rules of ``single``);
- ``dynamic`` (DRA only): a MIG-enabled GPU whose geometry is known offers every MIG placement
  not overlapping the memory slices taken, each made into a MIG device when a claim is prepared;
  one whose geometry is unknown offers its MIG devices;
- with sharing, each whole GPU that is not MIG-enabled offers its shares instead of itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias

from cdigen.cdi.names import device_name, qualified_name
from cdigen.model import DRA_MIG_STRATEGIES, DRA_MIG_STRATEGY, Gpu, MigDevice, Node

# what only sharing and --mig-strategy dynamic need loads with them: generate runs at every boot
if TYPE_CHECKING:
    from cdigen.mig_profiles import MigGeometry, MigPlacement
    from cdigen.shares import ShareKind

DeviceKind: TypeAlias = 'Literal["gpu", "mig"] | ShareKind'


@dataclass(frozen=True)
class Share:
    """One share of a GPU: its kind, its number on the GPU (from 0) and its device ID."""

    kind: ShareKind
    index: int
    id: str  # ``<uuid>::<k>`` or ``<uuid>::slice-<k>`` (cdigen.shares)


@dataclass(frozen=True)
class CatalogueEntry:
    """One device of a node: a whole GPU, a MIG device or a share of a GPU."""

    gpu: Gpu
    position: int  # the GPU's place among the node's GPUs in NVML index order
    mig: MigDevice | None = None
    # the MIG device's place on its GPU by (GI, CI, UUID): the ``<n>`` of CDI name ``<index>:<n>``
    mig_position: int | None = None
    share: Share | None = None
    # --mig-strategy dynamic: the MIG device this one becomes at prepare (no ``mig`` till then)
    placement: MigPlacement | None = None

    @property
    def kind(self) -> DeviceKind:
        """``gpu``, ``mig``, ``replica`` or ``slice``."""
        if self.share is not None:
            return self.share.kind
        return "mig" if self.mig is not None or self.placement is not None else "gpu"

    @property
    def uuid(self) -> str:
        """The UUID of the device itself: the MIG device's, else the GPU's (a share's GPU)."""
        return self.mig.uuid if self.mig is not None else self.gpu.uuid

    @property
    def gpu_uuid(self) -> str:
        """The UUID of the physical GPU the device lives on (whose health it shares)."""
        return self.gpu.uuid

    @property
    def id(self) -> str:
        """The device ID the kubelet sees: the share's ID, else the device's UUID."""
        return self.share.id if self.share is not None else self.uuid

    @property
    def memory_bytes(self) -> int:
        """The device's memory in bytes: its MIG device's (made, or to be made at prepare from
        its placement), else its GPU's (a share's too: the GPU it shares)."""
        if self.mig is not None:
            return self.mig.memory_bytes
        if self.placement is not None:
            return self.placement.profile.memory_bytes
        return self.gpu.memory_bytes

    @property
    def numa_node(self) -> int | None:
        """The NUMA node of the device's GPU."""
        return self.gpu.numa_node

    @cached_property  # slices and prepare read it for every device; a placement's takes a regex
    def dra_name(self) -> str:
        """The DNS-label name DRA publishes: ``gpu-<index>``, ``gpu-<index>-mig-<gi>-<ci>``, or
        for a placement ``gpu-<index>-<profile>-at-<start>`` (``gpu-0-1g-10gb-at-3``)."""
        if self.placement is not None:
            slug = re.sub(r"[^a-z0-9]+", "-", self.placement.profile.name.lower()).strip("-")
            return f"gpu-{self.gpu.index}-{slug}-at-{self.placement.start}"
        if self.mig is not None:
            return f"gpu-{self.gpu.index}-mig-{self.mig.gi_id}-{self.mig.ci_id}"
        return f"gpu-{self.gpu.index}"

    def cdi_name(self, strategy: str) -> str:
        """The device's name in the generated spec under a naming strategy (``index``,
        ``uuid``, ``type-index``); a share goes by its GPU's name. A placement has none of its
        own: the spec of the claim that makes it names the MIG device."""
        return device_name(strategy, self.gpu.index, self.uuid, self.mig_position)

    def qualified_cdi_name(self, cdi_kind: str, strategy: str) -> str:
        """The fully-qualified CDI name (``nvidia.com/gpu=<name>``) under ``strategy``."""
        return qualified_name(cdi_kind, self.cdi_name(strategy))


class ShareCounts(Protocol):
    """How a GPU is shared: exactly one of the two is set (the plugin's ``Sharing``)."""

    @property
    def replicas(self) -> int | None: ...

    @property
    def memory_slice_mib(self) -> int | None: ...


def share_ids(gpu: Gpu, sharing: ShareCounts) -> tuple[str, ...]:
    """The share IDs one GPU is advertised as (none for a GPU smaller than one slice)."""
    from cdigen.shares import replica_ids, slice_count, slice_ids

    if sharing.replicas is not None:
        return replica_ids(gpu.uuid, sharing.replicas)
    assert sharing.memory_slice_mib is not None
    return slice_ids(gpu.uuid, slice_count(gpu, sharing.memory_slice_mib))


def gpu_entries(node: Node) -> tuple[CatalogueEntry, ...]:
    """Every GPU of ``node`` as a whole device, in NVML index order."""
    gpus = sorted(node.gpus, key=lambda g: g.index)
    return tuple(CatalogueEntry(gpu, position) for position, gpu in enumerate(gpus))


def whole_entry(node: Node, gpu: Gpu) -> CatalogueEntry:
    """One GPU of ``node`` as a whole device."""
    return CatalogueEntry(gpu, sum(1 for g in node.gpus if g.index < gpu.index))


def mig_entries(whole: CatalogueEntry) -> tuple[CatalogueEntry, ...]:
    """The MIG devices of a whole GPU's entry, by GI and CI ID: their places, and so their CDI
    names, must not depend on the order discovery listed them in."""
    migs = sorted(whole.gpu.mig_devices, key=lambda m: (m.gi_id, m.ci_id, m.uuid))
    return tuple(CatalogueEntry(whole.gpu, whole.position, mig, k) for k, mig in enumerate(migs))


def share_entries(whole: CatalogueEntry, sharing: ShareCounts) -> tuple[CatalogueEntry, ...]:
    """The shares of a whole GPU's entry."""
    kind: ShareKind = "replica" if sharing.replicas is not None else "slice"
    return tuple(
        CatalogueEntry(whole.gpu, whole.position, share=Share(kind, k, share_id))
        for k, share_id in enumerate(share_ids(whole.gpu, sharing))
    )


def placement_entries(
    whole: CatalogueEntry, geometry: MigGeometry, taken: Sequence[range] = ()
) -> tuple[CatalogueEntry, ...]:
    """Every MIG placement of a whole GPU's entry, partitioned as ``geometry`` says, that
    covers none of the memory slices ``taken``."""
    held = [set(r) for r in taken]
    return tuple(
        CatalogueEntry(whole.gpu, whole.position, placement=p)
        for p in geometry.placements()
        if not any(h & set(p.memory_slices) for h in held)
    )


def catalogue(
    node: Node,
    *,
    mig_strategy: str = DRA_MIG_STRATEGY,
    sharing: ShareCounts | None = None,
    geometries: Mapping[str, MigGeometry] | None = None,
    taken: Mapping[str, Sequence[range]] | None = None,
) -> tuple[CatalogueEntry, ...]:
    """Every device ``node`` offers under ``mig_strategy`` and ``sharing`` (see the module),
    GPUs in index order, each GPU's devices together.

    For ``dynamic``: ``geometries`` (by GPU UUID, as NVML tells them) say how GPUs partition,
    cdigen's table (:mod:`cdigen.mig_profiles`) for those it leaves out; ``taken`` (by GPU
    UUID) the memory slices no placement may cover."""
    if mig_strategy not in DRA_MIG_STRATEGIES:
        raise ValueError(f"unknown MIG strategy {mig_strategy!r}")
    out: list[CatalogueEntry] = []
    for whole in gpu_entries(node):
        gpu = whole.gpu
        geometry = None
        if gpu.mig_enabled and mig_strategy == "dynamic":
            from cdigen.mig_profiles import mig_geometry

            geometry = (geometries or {}).get(gpu.uuid) or mig_geometry(gpu.name)
        if geometry is not None:
            out.extend(placement_entries(whole, geometry, (taken or {}).get(gpu.uuid, ())))
        elif gpu.mig_enabled and mig_strategy != "none":
            out.extend(mig_entries(whole))
        elif sharing is not None and not gpu.mig_enabled:
            out.extend(share_entries(whole, sharing))
        else:
            out.append(whole)
    return tuple(out)
