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

from cdigen.cdi.names import qualified_name
from cdigen.errors import InputError
from cdigen.model import MIG_STRATEGIES, Gpu, Node
from plugin.cdi_names import gpu_cdi_name, mig_cdi_name
from plugin.sharing import Sharing, share_devices

MIG_RESOURCE_PREFIX = "mig-"


DEVICE_KINDS = ("gpu", "mig", "replica", "slice")


@dataclass(frozen=True)
class AdvertisedDevice:
    """One device of a layout, as the kubelet sees it and as the engine places it."""

    id: str  # a GPU UUID, a MIG UUID, or a share ID (``<uuid>::<k>``, ``<uuid>::slice-<k>``)
    numa_node: int | None
    gpu_uuids: tuple[str, ...] = ()  # the physical GPU(s) it lives on; () means (id,)
    cdi_names: tuple[str, ...] = ()  # fully-qualified names Allocate returns; () means kind=id
    kind: str = "gpu"  # one of DEVICE_KINDS
    gpu_position: int | None = None  # its GPU's place in the node's GPUs by NVML index

    @property
    def parents(self) -> tuple[str, ...]:
        """The physical GPU UUIDs whose health this device shares."""
        return self.gpu_uuids or (self.id,)

    @property
    def gpu_uuid(self) -> str:
        """The UUID of the GPU this device lives on."""
        return self.parents[0]

    def names(self, cdi_kind: str) -> tuple[str, ...]:
        """The fully-qualified CDI names Allocate hands out for this device."""
        return self.cdi_names or (qualified_name(cdi_kind, self.id),)


@dataclass(frozen=True)
class Resource:
    """One extended resource and the devices it advertises."""

    name: str
    devices: tuple[AdvertisedDevice, ...]
    mig_profile: str | None = None  # the profile of a MIG resource; None: whole GPUs
    sharing: Sharing | None = None  # how the GPUs are shared; None: whole GPUs or MIG devices
    # fully-qualified names of the capability devices every container gets after its GPUs
    capability_names: tuple[str, ...] = ()


def _sorted_gpus(node: Node) -> list[Gpu]:
    return sorted(node.gpus, key=lambda g: g.index)


def whole_gpu(gpu: Gpu, cdi_kind: str, position: int | None = None) -> AdvertisedDevice:
    """A whole GPU as an advertised device."""
    name = gpu_cdi_name(cdi_kind, gpu)
    return AdvertisedDevice(gpu.uuid, gpu.numa_node, (gpu.uuid,), (name,), "gpu", position)


def mig_devices_of(
    gpu: Gpu, cdi_kind: str, position: int | None = None
) -> list[tuple[str, AdvertisedDevice]]:
    """(profile, device) for each MIG device of ``gpu``; NUMA comes from the parent."""
    migs = sorted(gpu.mig_devices, key=lambda m: (m.gi_id, m.ci_id, m.uuid))
    return [
        (
            m.profile,
            AdvertisedDevice(
                m.uuid,
                gpu.numa_node,
                (gpu.uuid,),
                (mig_cdi_name(cdi_kind, gpu, k, m.uuid),),
                "mig",
                position,
            ),
        )
        for k, m in enumerate(migs)
    ]


def advertised_devices(
    node: Node, cdi_kind: str = "nvidia.com/gpu"
) -> tuple[AdvertisedDevice, ...]:
    """Every whole GPU of ``node`` that is not MIG-enabled, in NVML index order."""
    gpus = _sorted_gpus(node)
    return tuple(whole_gpu(g, cdi_kind, p) for p, g in enumerate(gpus) if not g.mig_enabled)


def mig_resource_name(gpu_resource: str, profile: str) -> str:
    """``nvidia.com/mig-1g.10gb`` for profile ``1g.10gb`` next to ``nvidia.com/gpu``."""
    domain = gpu_resource.partition("/")[0]
    return f"{domain}/{MIG_RESOURCE_PREFIX}{profile}"


def plan_resources(
    node: Node, strategy: str, *, gpu_resource: str, cdi_kind: str
) -> tuple[Resource, ...]:
    """The resources ``node`` advertises under ``strategy``; InputError when ``single`` cannot
    hold (mixed profiles, or some GPUs without MIG)."""
    gpus = _sorted_gpus(node)
    whole = Resource(gpu_resource, advertised_devices(node, cdi_kind))
    if strategy == "none":
        return (whole,)
    mig_gpus = [g for g in gpus if g.mig_enabled]
    if strategy == "single":
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
        devices = [d for g in mig_gpus for d in mig_devices_of(g, cdi_kind, gpus.index(g))]
        profiles = sorted({p for p, _ in devices})
        if len(profiles) > 1:
            raise InputError(
                f"migStrategy 'single' needs one MIG profile, but the node has "
                f"{', '.join(profiles)}",
                where=node.name or "node",
                hint="repartition with one profile (nvidia-smi mig), or use migStrategy 'mixed'",
            )
        if not profiles:
            raise InputError(
                "migStrategy 'single': MIG is enabled but no MIG devices exist",
                where=node.name or "node",
                hint="create MIG devices (nvidia-smi mig -cgi ... -C)",
            )
        return (Resource(gpu_resource, tuple(d for _, d in devices), profiles[0]),)
    if strategy != "mixed":
        raise InputError(
            f"unknown MIG strategy {strategy!r}",
            where="migStrategy",
            hint=f"use one of: {', '.join(MIG_STRATEGIES)}",
        )
    by_profile: dict[str, list[AdvertisedDevice]] = {}
    for gpu in mig_gpus:
        for profile, device in mig_devices_of(gpu, cdi_kind, gpus.index(gpu)):
            by_profile.setdefault(profile, []).append(device)
    out = [whole] if whole.devices else []
    out += [
        Resource(mig_resource_name(gpu_resource, p), tuple(by_profile[p]), p)
        for p in sorted(by_profile)
    ]
    return tuple(out)


def shared_resource(node: Node, name: str, sharing: Sharing, cdi_kind: str) -> Resource:
    """A sharing resource: every share of every GPU, each handed out as its GPU's CDI name."""
    gpus = _sorted_gpus(node)
    position = {g.uuid: p for p, g in enumerate(gpus)}
    names = {g.uuid: gpu_cdi_name(cdi_kind, g) for g in gpus}
    devices = tuple(
        AdvertisedDevice(
            d.id,
            d.numa_node,
            (d.gpu_uuid,),
            (names[d.gpu_uuid],),
            sharing.kind,
            position[d.gpu_uuid],
        )
        for d in share_devices(node, sharing)
    )
    return Resource(name, devices, sharing=sharing)


def device_parents(resources: Sequence[Resource]) -> dict[str, tuple[str, ...]]:
    """Per device ID: the GPU UUIDs whose health it shares."""
    return {d.id: d.parents for r in resources for d in r.devices}


def cdi_names(resources: Sequence[Resource], cdi_kind: str) -> dict[str, list[str]]:
    """Per device ID: the CDI names Allocate may return for it (its resource's capability
    devices included)."""
    return {d.id: [*d.names(cdi_kind), *r.capability_names] for r in resources for d in r.devices}
