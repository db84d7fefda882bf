"""The plugin's resource model: which extended resources a node's layout advertises.

A resource is a name and its devices; each device carries its ID (what the kubelet sees), the
physical GPU UUID(s) it lives on (health and topology), its NUMA node and the CDI names Allocate
returns. The MIG strategy decides how MIG devices become resources:

- ``none``: whole GPUs only; MIG-enabled GPUs are not advertised.
- ``single``: every GPU is MIG-enabled with one profile; the MIG devices go under the GPU
  resource name. A node without any MIG-enabled GPU advertises whole GPUs, as NVIDIA's plugin does.
- ``mixed``: one resource per profile, ``nvidia.com/mig-<profile>``; GPUs without MIG stay under
  the GPU resource name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cdigen.catalogue import CatalogueEntry, DeviceKind, catalogue
from cdigen.errors import InputError
from cdigen.model import MIG_STRATEGIES, Node
from cdigen.plugin.deviceplugin.cdi_names import entry_cdi_name
from cdigen.plugin.deviceplugin.defaults import DEFAULT_CDI_KIND
from cdigen.plugin.deviceplugin.sharing import Sharing, share_devices

MIG_RESOURCE_PREFIX = "mig-"


@dataclass(frozen=True)
class AdvertisedDevice:
    """One catalogue device as the kubelet sees it and the engine places it, with the
    fully-qualified CDI names Allocate hands out for it."""

    entry: CatalogueEntry
    cdi_names: tuple[str, ...]

    @property
    def id(self) -> str:
        """The ID the kubelet sees: a GPU or MIG UUID, or a share ID."""
        return self.entry.id

    @property
    def numa_node(self) -> int | None:
        """The NUMA node of the device's GPU."""
        return self.entry.numa_node

    @property
    def kind(self) -> DeviceKind:
        """``gpu``, ``mig``, ``replica`` or ``slice``."""
        return self.entry.kind

    @property
    def gpu_position(self) -> int:
        """Its GPU's place among the node's GPUs by NVML index."""
        return self.entry.position

    @property
    def gpu_uuid(self) -> str:
        """The UUID of the GPU this device lives on."""
        return self.entry.gpu_uuid

    @property
    def parents(self) -> tuple[str, ...]:
        """The physical GPU UUIDs whose health this device shares."""
        return (self.entry.gpu_uuid,)


@dataclass(frozen=True)
class Resource:
    """One extended resource and the devices it advertises."""

    name: str
    devices: tuple[AdvertisedDevice, ...]
    mig_profile: str | None = None  # the profile of a MIG resource; None: whole GPUs
    sharing: Sharing | None = None  # how the GPUs are shared; None: whole GPUs or MIG devices
    # fully-qualified names of the capability devices every container gets after its GPUs
    capability_names: tuple[str, ...] = ()


def advertised(entry: CatalogueEntry, cdi_kind: str) -> AdvertisedDevice:
    """A catalogue device as the plugin advertises it (a share is handed out as its GPU)."""
    return AdvertisedDevice(entry, (entry_cdi_name(cdi_kind, entry),))


def advertised_devices(
    node: Node, cdi_kind: str = DEFAULT_CDI_KIND
) -> tuple[AdvertisedDevice, ...]:
    """Every whole GPU of ``node`` that is not MIG-enabled, in NVML index order."""
    return _whole_gpus(catalogue(node, mig_strategy="mixed"), cdi_kind)


def _whole_gpus(entries: Sequence[CatalogueEntry], cdi_kind: str) -> tuple[AdvertisedDevice, ...]:
    return tuple(advertised(e, cdi_kind) for e in entries if e.kind == "gpu")


def mig_resource_name(gpu_resource: str, profile: str) -> str:
    """``nvidia.com/mig-1g.10gb`` for profile ``1g.10gb`` next to ``nvidia.com/gpu``."""
    domain = gpu_resource.partition("/")[0]
    return f"{domain}/{MIG_RESOURCE_PREFIX}{profile}"


def plan_resources(
    node: Node, strategy: str, *, gpu_resource: str, cdi_kind: str
) -> tuple[Resource, ...]:
    """The resources ``node`` advertises under ``strategy``; InputError when ``single`` cannot
    hold (mixed profiles, or some GPUs without MIG)."""
    entries = catalogue(node, mig_strategy="mixed")
    whole = Resource(gpu_resource, _whole_gpus(entries, cdi_kind))
    if strategy == "none":
        return (whole,)
    migs = [e for e in entries if e.mig is not None]
    if strategy == "single":
        return _single(node, whole, migs, cdi_kind)
    if strategy != "mixed":
        raise InputError(
            f"unknown MIG strategy {strategy!r}",
            where="migStrategy",
            hint=f"use one of: {', '.join(MIG_STRATEGIES)}",
        )
    by_profile: dict[str, list[AdvertisedDevice]] = {}
    for entry in migs:
        assert entry.mig is not None
        by_profile.setdefault(entry.mig.profile, []).append(advertised(entry, cdi_kind))
    out = [whole] if whole.devices else []
    out += [
        Resource(mig_resource_name(gpu_resource, p), tuple(by_profile[p]), p)
        for p in sorted(by_profile)
    ]
    return tuple(out)


def _single(
    node: Node, whole: Resource, migs: Sequence[CatalogueEntry], cdi_kind: str
) -> tuple[Resource, ...]:
    """The resources of migStrategy ``single``: every GPU MIG-enabled with one profile, its MIG
    devices under the GPU resource name; InputError when that cannot hold."""
    gpus = sorted(node.gpus, key=lambda g: g.index)
    mig_gpus = [g for g in gpus if g.mig_enabled]
    if not mig_gpus:
        return (whole,)
    plain = [g for g in gpus if not g.mig_enabled]
    if plain:
        raise InputError(
            f"migStrategy 'single' needs every GPU MIG-enabled, but GPU {plain[0].index} "
            f"({plain[0].uuid}) is not ({len(mig_gpus)} of {len(gpus)} are)",
            where=node.name or "node",
            hint="enable MIG on every GPU, or use migStrategy 'mixed'",
        )
    profiles = sorted({e.mig.profile for e in migs if e.mig is not None})
    if len(profiles) > 1:
        raise InputError(
            f"migStrategy 'single' needs one MIG profile, but the node has {', '.join(profiles)}",
            where=node.name or "node",
            hint="repartition with one profile (nvidia-smi mig), or use migStrategy 'mixed'",
        )
    if not profiles:
        raise InputError(
            "migStrategy 'single': MIG is enabled but no MIG devices exist",
            where=node.name or "node",
            hint="create MIG devices (nvidia-smi mig -cgi ... -C)",
        )
    devices = tuple(advertised(e, cdi_kind) for e in migs)
    return (Resource(whole.name, devices, profiles[0]),)


def shared_resource(node: Node, name: str, sharing: Sharing, cdi_kind: str) -> Resource:
    """A sharing resource: every share of every GPU, each handed out as its GPU's CDI name."""
    devices = tuple(advertised(e, cdi_kind) for e in share_devices(node, sharing))
    return Resource(name, devices, sharing=sharing)


def device_parents(resources: Sequence[Resource]) -> dict[str, tuple[str, ...]]:
    """Per device ID: the GPU UUIDs whose health it shares."""
    return {d.id: d.parents for r in resources for d in r.devices}


def cdi_names(resources: Sequence[Resource]) -> dict[str, list[str]]:
    """Per device ID: the CDI names Allocate may return for it (its resource's capability
    devices included)."""
    return {d.id: [*d.cdi_names, *r.capability_names] for r in resources for d in r.devices}
