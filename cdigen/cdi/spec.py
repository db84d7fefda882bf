"""Node + host -> CDI spec: one entry per GPU (or MIG device) per naming strategy, plus ``all``.

The spec works without hooks: every library is also mounted at its SONAME path, so the loader
finds ``libcuda.so.1`` without ``ldconfig`` in the container. Hooks are added only when a hook
program is given or found.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cdigen.cdi import host as hostmod
from cdigen.cdi.host import DeviceNodeInfo, DriverFiles, HostFS
from cdigen.cdi.names import DEFAULT_CLASS, DEFAULT_VENDOR, make_kind
from cdigen.cdi.types import ContainerEditsDoc, DeviceDoc, DeviceNodeDoc, HookDoc, MountDoc, SpecDoc
from cdigen.cdi.version import minimum_version, version_key, version_shortfall
from cdigen.errors import InputError
from cdigen.model import Gpu, Node

NAME_STRATEGIES = ("index", "uuid", "type-index")
MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
IPC_MOUNT_OPTIONS = ["nosuid", "nodev", "rbind", "rprivate", "noexec"]
# As nvidia-ctk does: keeps a legacy nvidia-container-runtime hook from injecting devices again.
SPEC_ENV = ["NVIDIA_VISIBLE_DEVICES=void"]


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


def _gpu_names(gpu: Gpu, strategies: Iterable[str]) -> list[str]:
    by = {"index": str(gpu.index), "uuid": gpu.uuid, "type-index": f"gpu{gpu.index}"}
    return [by[s] for s in strategies]


def _mig_names(gpu: Gpu, position: int, uuid: str, strategies: Iterable[str]) -> list[str]:
    by = {
        "index": f"{gpu.index}:{position}",
        "uuid": uuid,
        "type-index": f"mig{gpu.index}:{position}",
    }
    return [by[s] for s in strategies]


def _device_entries(
    node: Node, options: SpecOptions, fs: HostFS
) -> list[tuple[list[str], list[DeviceNodeDoc]]]:
    """``(names, device nodes)`` per GPU or MIG device, in index order."""
    entries = []
    for gpu in sorted(node.gpus, key=lambda g: g.index):
        parent = node_doc(hostmod.device_node(options.dev_root, f"/dev/nvidia{gpu.minor}", fs))
        if not gpu.mig_enabled:
            # DRM nodes only where they exist: they are extras, and a missing one would make
            # the runtime refuse the whole device
            drm = [
                node_doc(hostmod.device_node(options.dev_root, p, fs))
                for p in hostmod.drm_nodes(options.sysfs_root, gpu.pci_bus_id, fs)
                if hostmod.node_exists(options.dev_root, p, fs)
            ]
            entries.append((_gpu_names(gpu, options.name_strategies), [parent, *drm]))
            continue
        # by GI and CI ID: the names must not depend on the order discovery listed them in
        migs = sorted(gpu.mig_devices, key=lambda m: (m.gi_id, m.ci_id, m.uuid))
        for position, mig in enumerate(migs):
            caps = [
                node_doc(
                    hostmod.device_node(options.dev_root, f"/dev/nvidia-caps/nvidia-cap{n}", fs)
                )
                for n in mig.cap_minors
            ]
            names = _mig_names(gpu, position, mig.uuid, options.name_strategies)
            entries.append((names, [parent, *caps]))
    return entries


def _mounts(driver: DriverFiles) -> list[MountDoc]:
    mounts: list[MountDoc] = []
    for lib in driver.libraries:
        mounts.append(_mount(lib.host_path, lib.path, MOUNT_OPTIONS))
        directory = lib.path.rpartition("/")[0]
        for soname in lib.sonames:
            mounts.append(_mount(lib.host_path, f"{directory}/{soname}", MOUNT_OPTIONS))
    for f in (*driver.binaries, *driver.firmware):
        mounts.append(_mount(f.host_path, f.path, MOUNT_OPTIONS))
    for f in driver.ipc:
        mounts.append(_mount(f.host_path, f.path, IPC_MOUNT_OPTIONS))
    return mounts


def _mount(host: str, container: str, options: list[str]) -> MountDoc:
    return {"hostPath": host, "containerPath": container, "options": list(options)}


def _hooks(driver: DriverFiles, hook_path: str) -> list[HookDoc]:
    hooks: list[HookDoc] = []
    links = [
        f"{soname}::{lib.path.rpartition('/')[0]}/libcuda.so"
        for lib in driver.libraries
        if lib.path.rpartition("/")[2].startswith("libcuda.so.")
        for soname in lib.sonames[:1]
    ]
    if links:
        args = ["nvidia-cdi-hook", "create-symlinks"]
        for link in links:
            args += ["--link", link]
        hooks.append({"hookName": "createContainer", "path": hook_path, "args": args})
    if driver.library_dirs:
        args = ["nvidia-cdi-hook", "update-ldcache"]
        for d in driver.library_dirs:
            args += ["--folder", d]
        hooks.append({"hookName": "createContainer", "path": hook_path, "args": args})
    return hooks


def _copies(nodes: Iterable[DeviceNodeDoc]) -> list[DeviceNodeDoc]:
    return [n.copy() for n in nodes]


def build_spec(node: Node, options: SpecOptions, driver: DriverFiles, fs: HostFS) -> SpecDoc:
    """The spec for ``node`` on a host (seen through ``fs``) whose driver files are ``driver``;
    InputError if empty or if a pinned ``cdi_version`` is too low for the content."""
    kind = make_kind(options.vendor, options.cls)
    devices: list[DeviceDoc] = []
    all_nodes: dict[str, DeviceNodeDoc] = {}
    for names, nodes in _device_entries(node, options, fs):
        for n in nodes:
            all_nodes.setdefault(n["path"], n)
        for name in names:
            # copies, not shared dicts: shared ones would come out as YAML anchors and aliases
            devices.append({"name": name, "containerEdits": {"deviceNodes": _copies(nodes)}})
    if not devices:
        raise InputError(
            "the node has no GPUs to expose (none found, or MIG enabled without MIG devices)",
            where=node.name or "node",
            hint="check discovery with 'cdigen discover'",
        )
    devices.append({"name": "all", "containerEdits": {"deviceNodes": _copies(all_nodes.values())}})

    edits: ContainerEditsDoc = {"env": list(SPEC_ENV)}
    control = [node_doc(n) for n in hostmod.control_nodes(options.dev_root, fs)]
    if control:
        edits["deviceNodes"] = control
    mounts = _mounts(driver)
    if mounts:
        edits["mounts"] = mounts
    hooks = _hooks(driver, options.hook_path) if options.hook_path else []
    if hooks:
        edits["hooks"] = hooks

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
    driver = hostmod.scan_driver(options.driver_root, node.driver_version, fs)
    return build_spec(node, options, driver, fs)
