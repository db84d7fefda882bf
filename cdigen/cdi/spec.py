"""Node + host -> CDI spec: one entry per GPU (or MIG device) per naming strategy, plus ``all``,
and a ``capability-<name>`` device per capability asked for as a device.

The edits every device shares come from :mod:`cdigen.cdi.driveredits`; what goes in follows
the driver capabilities asked for (:mod:`cdigen.cdi.capabilities`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cdigen.catalogue import catalogue
from cdigen.cdi import devnodes
from cdigen.cdi.capabilities import DEFAULT_CAPABILITIES
from cdigen.cdi.devnodes import DeviceNodeInfo
from cdigen.cdi.driveredits import copy_nodes, driver_edits, edits_beyond
from cdigen.cdi.driverfiles import DriverFiles, scan_driver
from cdigen.cdi.hostfs import HostFS
from cdigen.cdi.names import (
    DEFAULT_CLASS,
    DEFAULT_VENDOR,
    capability_device_name,
    make_kind,
)
from cdigen.cdi.types import ContainerEditsDoc, DeviceDoc, DeviceNodeDoc, SpecDoc
from cdigen.cdi.version import minimum_version, version_key, version_shortfall
from cdigen.errors import InputError
from cdigen.model import Gpu, MigDevice, Node

NAME_STRATEGIES = ("index", "uuid", "type-index")


@dataclass(frozen=True)
class SpecOptions:
    """What ``cdigen generate`` was asked for, beside the node itself."""

    vendor: str = DEFAULT_VENDOR
    cls: str = DEFAULT_CLASS
    name_strategies: tuple[str, ...] = ("index", "uuid")
    driver_root: str = "/"
    dev_root: str = "/"
    sysfs_root: str = "/sys"
    host_root: str = "/"  # where the host's / is: the roots above are host paths under it
    hook_path: str | None = None  # None: no hooks
    capabilities: tuple[str, ...] = DEFAULT_CAPABILITIES
    # each of these not in ``capabilities`` gets a device ``capability-<name>`` with its files
    capability_devices: tuple[str, ...] = ()
    cdi_version: str | None = None  # None: the minimum the content needs


def parse_name_strategies(text: str) -> tuple[str, ...]:
    """``"index,uuid"`` -> ``("index", "uuid")``; InputError on an unknown or empty strategy."""
    strategies = tuple(dict.fromkeys(s.strip() for s in text.split(",")))
    for s in strategies:
        if s not in NAME_STRATEGIES:
            raise InputError(
                f"unknown device name strategy {s!r}",
                where="--device-name-strategy",
                hint=f"use a comma-separated list of {', '.join(NAME_STRATEGIES)}",
            )
    return strategies


def node_doc(info: DeviceNodeInfo) -> DeviceNodeDoc:
    """A device node entry; ``hostPath`` only when it differs, stat fields only when known."""
    doc: DeviceNodeDoc = {"path": info.path}
    if info.host_path != info.path:
        doc["hostPath"] = info.host_path
    if info.type is not None and info.major is not None and info.minor is not None:
        doc["type"] = info.type
        doc["major"] = info.major
        doc["minor"] = info.minor
    if info.file_mode is not None:
        doc["fileMode"] = info.file_mode
    if info.permissions:
        doc["permissions"] = info.permissions
    return doc


def gpu_device_nodes(
    gpu: Gpu, mig: MigDevice | None, options: SpecOptions, fs: HostFS
) -> list[DeviceNodeDoc]:
    """The device nodes of one GPU or MIG device (``mig`` of ``gpu``), host paths under
    ``options.dev_root``: the GPU's ``/dev/nvidia<minor>``, then for a whole GPU its DRM nodes
    that exist, for a MIG device its nvidia-caps nodes. The generated spec and DRA's per-claim
    specs both take a device's nodes from here."""
    paths = [devnodes.gpu_node(gpu.minor)]
    if mig is None:
        # DRM nodes only where they exist: they are extras, and a missing one would make the
        # runtime refuse the whole device
        paths += [
            p
            for p in devnodes.drm_nodes(options.sysfs_root, gpu.pci_bus_id, fs)
            if devnodes.node_exists(options.dev_root, p, fs)
        ]
    else:
        paths += [devnodes.caps_node(n) for n in mig.cap_minors]
    return [node_doc(devnodes.device_node(options.dev_root, p, fs)) for p in paths]


def _device_entries(
    node: Node, options: SpecOptions, fs: HostFS
) -> list[tuple[list[str], list[DeviceNodeDoc]]]:
    """``(names, device nodes)`` per GPU or MIG device of the node's catalogue, in index order."""
    return [
        (
            [entry.cdi_name(s) for s in options.name_strategies],
            gpu_device_nodes(entry.gpu, entry.mig, options, fs),
        )
        for entry in catalogue(node, mig_strategy="mixed")
    ]


def extra_capabilities(options: SpecOptions) -> tuple[str, ...]:
    """The capabilities asked for as devices that the common edits do not already have."""
    return tuple(c for c in options.capability_devices if c not in options.capabilities)


def missing_capability_devices(spec: SpecDoc, options: SpecOptions) -> tuple[str, ...]:
    """The capabilities asked for as devices that got none: the driver root has no files
    for them (say so: a container asking for one would not start)."""
    names = {d["name"] for d in spec["devices"]}
    return tuple(c for c in extra_capabilities(options) if capability_device_name(c) not in names)


def capability_edits(
    driver: DriverFiles,
    options: SpecOptions,
    control: Iterable[DeviceNodeInfo],
    extra: Iterable[str],
) -> tuple[ContainerEditsDoc, dict[str, ContainerEditsDoc]]:
    """The edits every device shares (``options``' capabilities and hook, the ``control``
    nodes), and what each capability of ``extra`` adds to them, for those the driver root has
    files for (a capability adding nothing gets no device)."""
    docs = [node_doc(n) for n in control]
    edits = driver_edits(driver, options.capabilities, options.hook_path, docs)
    beyond: dict[str, ContainerEditsDoc] = {}
    for cap in extra:
        full = driver_edits(driver, (*options.capabilities, cap), options.hook_path, docs)
        added = edits_beyond(full, edits)
        if added.get("mounts") or added.get("hooks") or added.get("deviceNodes"):
            beyond[cap] = added
    return edits, beyond


def build_spec(node: Node, options: SpecOptions, driver: DriverFiles, fs: HostFS) -> SpecDoc:
    """The spec for ``node`` on a host (seen through ``fs``) whose driver files are ``driver``;
    InputError if empty or if a pinned ``cdi_version`` is too low for the content.

    Beside the GPU devices and ``all``, each capability of ``options.capability_devices`` not
    in ``options.capabilities`` gets a device (``capability-<name>``) holding what that
    capability adds to the common edits; one whose files the driver root lacks gets none
    (see :func:`missing_capability_devices`)."""
    kind = make_kind(options.vendor, options.cls)
    devices: list[DeviceDoc] = []
    all_nodes: dict[str, DeviceNodeDoc] = {}
    for names, nodes in _device_entries(node, options, fs):
        for n in nodes:
            all_nodes.setdefault(n["path"], n)
        for name in names:
            # copies, not shared dicts: shared ones would come out as YAML anchors and aliases
            devices.append({"name": name, "containerEdits": {"deviceNodes": copy_nodes(nodes)}})
    if not devices:
        raise InputError(
            "the node has no GPUs to expose (none found, or MIG enabled without MIG devices)",
            where=node.name or "node",
            hint="check discovery with 'cdigen discover'",
        )
    devices.append(
        {"name": "all", "containerEdits": {"deviceNodes": copy_nodes(all_nodes.values())}}
    )

    control = devnodes.control_nodes(options.dev_root, fs)
    edits, beyond = capability_edits(driver, options, control, extra_capabilities(options))
    for cap, extra in beyond.items():
        devices.append({"name": capability_device_name(cap), "containerEdits": extra})

    spec: SpecDoc = {"cdiVersion": "", "kind": kind, "devices": devices, "containerEdits": edits}
    spec["cdiVersion"] = pin_version(spec, options.cdi_version)
    return spec


def pin_version(spec: SpecDoc, requested: str | None) -> str:
    """The version to write: ``requested`` if the content allows it, else the content's minimum."""
    if requested is None:
        return minimum_version(spec)
    version_key(requested)  # unknown versions fail here
    problem = version_shortfall(spec, requested)
    if problem:
        raise InputError(
            problem, where="--cdi-version", hint=f"use {minimum_version(spec)} or later"
        )
    return requested.removeprefix("v")


def generate(node: Node, options: SpecOptions, fs: HostFS | None = None) -> SpecDoc:
    """Scan the host under the roots in ``options`` and build the spec for ``node``.

    ``fs`` is the view of the host at ``options.host_root`` (one per scan: it remembers
    resolved directories); made here when not given.
    """
    fs = fs or HostFS(options.host_root)
    driver = scan_driver(options.driver_root, node.driver_version, fs)
    return build_spec(node, options, driver, fs)
