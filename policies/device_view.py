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

from cdigen.catalogue import CatalogueEntry, catalogue, whole_entry
from cdigen.discover.numa import NumaForm, numa_neighbours
from cdigen.mig_profiles import MigGeometry, MigPlacement
from cdigen.model import DRA_MIG_STRATEGY, Gpu, MigDevice, Node
from cdigen.policies.graph import nvlink_groups

STANDARD_DOMAIN = "resource.kubernetes.io"
# What the DRA API allows per device: attributes and capacities together.
MAX_ATTRIBUTES_AND_CAPACITIES = 32

AttributeKind = Literal["string", "int", "bool", "version", "ints"]


@dataclass(frozen=True)
class Attribute:
    """One typed attribute value, as a ResourceSlice carries it (``{kind: value}``)."""

    kind: AttributeKind
    value: str | int | bool | tuple[int, ...]


@dataclass(frozen=True)
class DeviceView:
    """One device of the node's catalogue as DRA sees it: its entry (name, GPU, MIG device or
    placement), attributes by qualified-or-plain name (plain names are in the driver's domain)
    and capacities in bytes."""

    entry: CatalogueEntry
    attributes: Mapping[str, Attribute]
    capacity: Mapping[str, int]

    @property
    def name(self) -> str:
        """The DNS-label device name (:attr:`CatalogueEntry.dra_name`)."""
        return self.entry.dra_name

    @property
    def gpu(self) -> Gpu:
        """The GPU the device lives on."""
        return self.entry.gpu

    @property
    def mig(self) -> MigDevice | None:
        """The MIG device, if the device is one."""
        return self.entry.mig

    @property
    def placement(self) -> MigPlacement | None:
        """``--mig-strategy dynamic``: the MIG device this one becomes at prepare (no ``mig``
        till then)."""
        return self.entry.placement

    @property
    def uuid(self) -> str:
        """The UUID of the device itself (the MIG device's, else the GPU's)."""
        return self.entry.uuid


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
    node: Node,
    gpu: Gpu,
    sysfs_root: str | Path | None,
    groups: Mapping[str, Mapping[int, int]],
    numa_form: NumaForm = "scalar",
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
    if gpu.numa_node is not None and numa_form == "list":
        near = (
            numa_neighbours(sysfs_root, gpu.numa_node)
            if sysfs_root is not None
            else (gpu.numa_node,)
        )
        attrs[f"{STANDARD_DOMAIN}/numaNode"] = Attribute("ints", near)
    elif gpu.numa_node is not None:
        attrs[f"{STANDARD_DOMAIN}/numaNode"] = Attribute("int", gpu.numa_node)
    for name, by_index in groups.items():
        if gpu.index in by_index:
            attrs[name] = Attribute("int", by_index[gpu.index])
    return attrs


def gpu_view(
    node: Node,
    gpu: Gpu,
    *,
    sysfs_root: str | Path | None = None,
    groups: Mapping[str, Mapping[int, int]] | None = None,
) -> DeviceView:
    """The DRA view of one whole GPU (its MIG devices aside). ``groups`` maps a group attribute
    (``nvlinkDomain``, ``nvlinkClique``) to its value by GPU index; none are published without."""
    return _whole_view(whole_entry(node, gpu), _gpu_attributes(node, gpu, sysfs_root, groups or {}))


def _whole_view(entry: CatalogueEntry, attributes: Mapping[str, Attribute]) -> DeviceView:
    return DeviceView(entry, attributes, {"memory": entry.memory_bytes})


def _mig_view(entry: CatalogueEntry, gpu_attributes: Mapping[str, Attribute]) -> DeviceView:
    """A MIG device, made or to be made (a placement): its GPU's attributes, MIG-typed."""
    attrs = dict(gpu_attributes)
    attrs["type"] = Attribute("string", "mig")
    if entry.mig is not None:
        attrs["uuid"] = Attribute("string", entry.mig.uuid)
    else:
        del attrs["uuid"]  # a placement has none until made
    attrs["parentUUID"] = Attribute("string", entry.gpu.uuid)
    if entry.mig is not None:
        attrs["profile"] = Attribute("string", entry.mig.profile)
    else:
        assert entry.placement is not None
        attrs["profile"] = Attribute("string", entry.placement.profile.name)
    return DeviceView(entry, attrs, {"memory": entry.memory_bytes})


def device_views(
    node: Node,
    *,
    mig_strategy: str = DRA_MIG_STRATEGY,
    sysfs_root: str | Path | None = None,
    geometries: Mapping[str, MigGeometry] | None = None,
    taken: Mapping[str, Sequence[range]] | None = None,
    numa_form: NumaForm = "scalar",
) -> tuple[DeviceView, ...]:
    """Every device of ``node`` in DRA terms, GPUs by index, each GPU's MIG devices after it.

    With ``mig_strategy`` ``none`` every GPU is one whole device; ``dynamic`` offers every MIG
    placement of a MIG-enabled GPU (its MIG devices of the moment are not offered); otherwise a
    MIG-enabled GPU offers its MIG devices instead of itself. ``sysfs_root`` (when given)
    supplies ``pcieRoot``; ``geometries`` (by GPU UUID, as NVML tells them) how GPUs partition,
    cdigen's table (:mod:`cdigen.mig_profiles`) for those it leaves out; ``taken`` (by GPU
    UUID) the memory slices no placement may cover; ``numa_form`` the form of
    ``resource.kubernetes.io/numaNode`` (the list's neighbours read under ``sysfs_root``).
    """
    entries = catalogue(node, mig_strategy=mig_strategy, geometries=geometries, taken=taken)
    nvlink = nvlink_groups(node)
    groups = {"nvlinkDomain": nvlink.domain, "nvlinkClique": nvlink.clique}
    attributes: dict[str, Mapping[str, Attribute]] = {}  # by GPU UUID
    views: list[DeviceView] = []
    for entry in entries:
        gpu = entry.gpu
        if gpu.uuid not in attributes:
            attributes[gpu.uuid] = _gpu_attributes(node, gpu, sysfs_root, groups, numa_form)
        if entry.kind == "gpu":
            views.append(_whole_view(entry, attributes[gpu.uuid]))
        else:
            views.append(_mig_view(entry, attributes[gpu.uuid]))
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
