"""The DRA view of a node's devices: names, typed attributes and capacities, built in one place.

ResourceSlices publish it, and it names what ``policy check`` may expect a DRA claim to read.
Attribute names follow NVIDIA's DRA driver where they exist (``type``, ``uuid``, ``productName``,
``brand``, ``architecture``, ``cudaComputeCapability``, ``driverVersion``, ``cudaDriverVersion``,
``index``, ``minor``, and for MIG ``parentUUID`` and ``profile``); the standard
``resource.kubernetes.io/`` ones (``pciBusID``, ``pcieRoot``, ``numaNode``) come from the node
and sysfs; ``nvlinkDomain`` and ``nvlinkClique`` come from the topology graph, so that a claim's
``matchAttribute`` can keep a set of GPUs on one NVLink clique.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cdigen.mig_profiles import MigGeometry, MigPlacement, mig_geometry
from cdigen.model import DRA_MIG_STRATEGIES, Gpu, MigDevice, Node
from policies.graph import nvlink_groups

STANDARD_DOMAIN = "resource.kubernetes.io"
# The DRA driver's default name (plugin.dra.serve.DEFAULT_DRIVER): its plain attribute names
# live in this domain; CEL policies also read them under NVIDIA's ``gpu.nvidia.com``.
DRA_DRIVER = "gpu.cdigen.dev"
# What the DRA API allows per device: attributes and capacities together.
MAX_ATTRIBUTES_AND_CAPACITIES = 32

AttributeKind = Literal["string", "int", "bool", "version"]


@dataclass(frozen=True)
class Attribute:
    """One typed attribute value, as a ResourceSlice carries it (``{kind: value}``)."""

    kind: AttributeKind
    value: str | int | bool


@dataclass(frozen=True)
class DeviceView:
    """One device as DRA sees it: a DNS-label name, the GPU it lives on, its MIG device (if any),
    attributes by qualified-or-plain name (plain names are in the driver's domain) and capacities
    in bytes."""

    name: str
    gpu: Gpu
    mig: MigDevice | None
    attributes: Mapping[str, Attribute]
    capacity: Mapping[str, int]
    # --mig-strategy dynamic: the MIG device this one becomes at prepare (mig is None till then)
    placement: MigPlacement | None = None

    @property
    def uuid(self) -> str:
        """The UUID of the device itself (the MIG device's, else the GPU's)."""
        return self.mig.uuid if self.mig else self.gpu.uuid


def semver(text: str) -> str | None:
    """``"8.0"`` -> ``"8.0.0"``, ``"550.54.15"`` unchanged; None when it is no version at all."""
    parts = text.strip().split(".")
    if not parts or len(parts) > 3 or not all(p.isdecimal() for p in parts):
        return None
    parts += ["0"] * (3 - len(parts))
    return ".".join(str(int(p)) for p in parts)


def pcie_root(sysfs_root: str | Path, pci_bus_id: str) -> str | None:
    """The PCIe root complex (``pci<domain>:<bus>``) of a PCI device from sysfs, or None."""
    link = Path(sysfs_root) / "bus" / "pci" / "devices" / pci_bus_id.lower()
    try:
        target = os.path.realpath(link, strict=True)
    except OSError:
        return None
    for part in Path(target).parts:
        if re.fullmatch(r"pci[0-9a-f]{4}:[0-9a-f]{2}", part):
            return part
    return None


def _version_attributes(node: Node, gpu: Gpu) -> dict[str, Attribute]:
    attrs: dict[str, Attribute] = {}
    for name, text in (
        ("cudaComputeCapability", gpu.cuda_compute_capability),
        ("driverVersion", node.driver_version),
        ("cudaDriverVersion", node.cuda_driver_version),
    ):
        version = semver(text) if text else None
        if version:
            attrs[name] = Attribute("version", version)
    return attrs


def _gpu_attributes(
    node: Node, gpu: Gpu, sysfs_root: str | Path | None, groups: Mapping[str, Mapping[int, int]]
) -> dict[str, Attribute]:
    attrs: dict[str, Attribute] = {
        "type": Attribute("string", "gpu"),
        "uuid": Attribute("string", gpu.uuid),
        "productName": Attribute("string", gpu.name),
        "architecture": Attribute("string", gpu.architecture),
        "index": Attribute("int", gpu.index),
        "minor": Attribute("int", gpu.minor),
    }
    if gpu.brand:
        attrs["brand"] = Attribute("string", gpu.brand)
    attrs.update(_version_attributes(node, gpu))
    attrs[f"{STANDARD_DOMAIN}/pciBusID"] = Attribute("string", gpu.pci_bus_id)
    root = pcie_root(sysfs_root, gpu.pci_bus_id) if sysfs_root is not None else None
    if root:
        attrs[f"{STANDARD_DOMAIN}/pcieRoot"] = Attribute("string", root)
    if gpu.numa_node is not None:
        attrs[f"{STANDARD_DOMAIN}/numaNode"] = Attribute("int", gpu.numa_node)
    for name, by_index in groups.items():
        if gpu.index in by_index:
            attrs[name] = Attribute("int", by_index[gpu.index])
    return attrs


def mig_device_name(gpu: Gpu, mig: MigDevice) -> str:
    """The DNS-label name of a MIG device: ``gpu-<index>-mig-<gi>-<ci>``."""
    return f"gpu-{gpu.index}-mig-{mig.gi_id}-{mig.ci_id}"


def gpu_device_name(gpu: Gpu) -> str:
    """The DNS-label name of a whole GPU: ``gpu-<index>``."""
    return f"gpu-{gpu.index}"


def placement_name(gpu: Gpu, placement: MigPlacement) -> str:
    """The DNS-label name of an on-demand MIG placement: ``gpu-<index>-<profile>-at-<start>``
    (``gpu-0-1g-10gb-at-3``)."""
    slug = re.sub(r"[^a-z0-9]+", "-", placement.profile.name.lower()).strip("-")
    return f"gpu-{gpu.index}-{slug}-at-{placement.start}"


def placement_views(whole: DeviceView, geometry: MigGeometry) -> list[DeviceView]:
    """Every MIG placement of ``whole``'s GPU, partitioned as ``geometry`` says, as a device
    (no UUID: it has none until made)."""
    base = {k: v for k, v in whole.attributes.items() if k != "uuid"}
    base["type"] = Attribute("string", "mig")
    base["parentUUID"] = Attribute("string", whole.gpu.uuid)
    views = []
    for placement in geometry.placements():
        attrs = {**base, "profile": Attribute("string", placement.profile.name)}
        capacity = {"memory": placement.profile.memory_bytes}
        name = placement_name(whole.gpu, placement)
        views.append(DeviceView(name, whole.gpu, None, attrs, capacity, placement))
    return views


def gpu_view(
    node: Node,
    gpu: Gpu,
    *,
    sysfs_root: str | Path | None = None,
    groups: Mapping[str, Mapping[int, int]] | None = None,
) -> DeviceView:
    """The DRA view of one whole GPU (its MIG devices aside). ``groups`` maps a group attribute
    (``nvlinkDomain``, ``nvlinkClique``) to its value by GPU index; none are published without."""
    attrs = _gpu_attributes(node, gpu, sysfs_root, groups or {})
    return DeviceView(gpu_device_name(gpu), gpu, None, attrs, {"memory": gpu.memory_bytes})


def device_views(
    node: Node,
    *,
    mig_strategy: str = "mixed",
    sysfs_root: str | Path | None = None,
    geometries: Mapping[str, MigGeometry] | None = None,
    taken: Mapping[str, Sequence[range]] | None = None,
) -> tuple[DeviceView, ...]:
    """Every device of ``node`` in DRA terms, GPUs by index, each GPU's MIG devices after it.

    With ``mig_strategy`` ``none`` every GPU is one whole device; ``dynamic`` offers every MIG
    placement of a MIG-enabled GPU (its MIG devices of the moment are not offered); otherwise a
    MIG-enabled GPU offers its MIG devices instead of itself. ``sysfs_root`` (when given)
    supplies ``pcieRoot``; ``geometries`` (by GPU UUID, as NVML tells them) how GPUs partition,
    cdigen's table (:mod:`cdigen.mig_profiles`) for those it leaves out; ``taken`` (by GPU
    UUID) the memory slices no placement may cover.
    """
    if mig_strategy not in DRA_MIG_STRATEGIES:
        raise ValueError(f"unknown MIG strategy {mig_strategy!r}")
    nvlink = nvlink_groups(node)
    groups = {"nvlinkDomain": nvlink.domain, "nvlinkClique": nvlink.clique}
    views: list[DeviceView] = []
    for gpu in sorted(node.gpus, key=lambda g: g.index):
        whole = gpu_view(node, gpu, sysfs_root=sysfs_root, groups=groups)
        geometry = (geometries or {}).get(gpu.uuid) or mig_geometry(gpu.name)
        if gpu.mig_enabled and mig_strategy == "dynamic" and geometry is not None:
            held = [set(r) for r in (taken or {}).get(gpu.uuid, ())]
            views.extend(
                v
                for v in placement_views(whole, geometry)
                if v.placement is None or not any(h & set(v.placement.memory_slices) for h in held)
            )
            continue
        if gpu.mig_enabled and mig_strategy != "none":
            for mig in gpu.mig_devices:
                attrs = dict(whole.attributes)
                attrs["type"] = Attribute("string", "mig")
                attrs["uuid"] = Attribute("string", mig.uuid)
                attrs["parentUUID"] = Attribute("string", gpu.uuid)
                attrs["profile"] = Attribute("string", mig.profile)
                views.append(
                    DeviceView(
                        mig_device_name(gpu, mig), gpu, mig, attrs, {"memory": mig.memory_bytes}
                    )
                )
            continue
        views.append(whole)
    for view in views:
        count = len(view.attributes) + len(view.capacity)
        if count > MAX_ATTRIBUTES_AND_CAPACITIES:  # a programming error, not bad input
            raise AssertionError(f"{view.name}: {count} attributes and capacities")
    return tuple(views)


def attribute_names(views: Sequence[DeviceView]) -> frozenset[str]:
    """Every attribute name the views publish (plain names are in the driver's domain)."""
    return frozenset(name for view in views for name in view.attributes)


# Every attribute name device_views can publish (plain names are in the driver's domain).
PUBLISHED_ATTRIBUTES = frozenset(
    {
        "type",
        "uuid",
        "productName",
        "brand",
        "architecture",
        "cudaComputeCapability",
        "driverVersion",
        "cudaDriverVersion",
        "index",
        "minor",
        "parentUUID",
        "profile",
        "nvlinkDomain",
        "nvlinkClique",
        f"{STANDARD_DOMAIN}/pciBusID",
        f"{STANDARD_DOMAIN}/pcieRoot",
        f"{STANDARD_DOMAIN}/numaNode",
    }
)
PUBLISHED_CAPACITIES = frozenset({"memory"})


def published_attribute_names() -> frozenset[str]:
    """Every attribute name any node's views may carry (what ``cdigen dra check`` accepts)."""
    return PUBLISHED_ATTRIBUTES


def published_capacity_names() -> frozenset[str]:
    """Every capacity name the views may carry."""
    return PUBLISHED_CAPACITIES
