"""Typed CDI container edits, and how a runtime merges them (the CDI Go library v1.1.0 rules).

``cache.InjectDevices`` appends the edits of every spec (once, on its first device) and of every
device in request order, then applies them to the OCI spec in one go:

- ``env``: a later ``KEY=...`` replaces an earlier one in place;
- ``deviceNodes``: a later node at the same path replaces the earlier one and moves to the end;
- ``mounts``: likewise by container path; then all mounts are sorted (stably) by how many path
  separators their cleaned container path has, so a parent is mounted before its children;
- ``hooks`` are kept in order; ``additionalGids`` once each, 0 dropped; a later ``intelRdt`` wins;
  ``netDevices`` by host interface name, a later one winning.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceNode:
    """A device node to create in the container (a CDI ``deviceNodes`` entry)."""

    path: str
    host_path: str = ""  # empty: the same as ``path``
    type: str = ""  # "", b, c, u or p; runtimes stat the host node when it is missing
    major: int = 0
    minor: int = 0
    file_mode: int | None = None
    permissions: str = ""  # empty: rwm
    uid: int | None = None
    gid: int | None = None

    @property
    def host(self) -> str:
        """The node's path on the host."""
        return self.host_path or self.path


@dataclass(frozen=True)
class Mount:
    """A bind mount from the host into the container (a CDI ``mounts`` entry)."""

    host_path: str
    container_path: str
    options: tuple[str, ...] = ()
    type: str = ""

    @property
    def read_only(self) -> bool:
        """Whether the mount options make it read-only."""
        return "ro" in self.options


@dataclass(frozen=True)
class Hook:
    """An OCI hook the runtime runs (a CDI ``hooks`` entry)."""

    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None


@dataclass(frozen=True)
class NetDevice:
    """A host network interface moved into the container (CDI 1.1.0 ``netDevices``)."""

    host_interface_name: str
    name: str


@dataclass(frozen=True)
class IntelRdt:
    """Intel RDT settings for the container (CDI 0.7.0 ``intelRdt``)."""

    clos_id: str = ""
    l3_cache_schema: str = ""
    mem_bw_schema: str = ""
    schemata: tuple[str, ...] | None = None
    enable_monitoring: bool = False


@dataclass(frozen=True)
class ContainerEdits:
    """Edits to a container's OCI spec: one spec's or device's, or a merged set."""

    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()
    net_devices: tuple[NetDevice, ...] = ()
    intel_rdt: IntelRdt | None = None
    additional_gids: tuple[int, ...] = ()

    def is_empty(self) -> bool:
        """Whether these edits change nothing (invalid for a device, fine for a spec)."""
        return not (
            self.env
            or self.device_nodes
            or self.hooks
            or self.mounts
            or self.additional_gids
            or self.intel_rdt is not None
            or self.net_devices
        )


def clean_path(path: str) -> str:
    """``path`` cleaned as Go's ``filepath.Clean`` does it (``//x`` -> ``/x``, ``""`` -> ``.``)."""
    cleaned = posixpath.normpath(path)
    return "/" + cleaned.lstrip("/") if cleaned.startswith("//") else cleaned


def mount_depth(mount: Mount) -> int:
    """The sort key runtimes use for mounts: path separators in the cleaned container path."""
    return clean_path(mount.container_path).count("/")


def merge_edits(parts: Iterable[ContainerEdits]) -> ContainerEdits:
    """``parts`` applied in order, as ``InjectDevices`` applies them (see the module doc)."""
    env: dict[str, str] = {}
    nodes: dict[str, DeviceNode] = {}
    mounts: dict[str, Mount] = {}
    hooks: list[Hook] = []
    net: dict[str, NetDevice] = {}
    rdt: IntelRdt | None = None
    gids: dict[int, None] = {}
    for part in parts:
        for entry in part.env:
            env[entry.partition("=")[0]] = entry
        for node in part.device_nodes:
            nodes.pop(node.path, None)
            nodes[node.path] = node
        for mount in part.mounts:
            mounts.pop(mount.container_path, None)
            mounts[mount.container_path] = mount
        hooks.extend(part.hooks)
        for dev in part.net_devices:
            net[dev.host_interface_name] = dev
        if part.intel_rdt is not None:
            rdt = part.intel_rdt
        gids.update((g, None) for g in part.additional_gids if g != 0)
    return ContainerEdits(
        env=tuple(env.values()),
        device_nodes=tuple(nodes.values()),
        mounts=tuple(sorted(mounts.values(), key=mount_depth)),
        hooks=tuple(hooks),
        net_devices=tuple(net.values()),
        intel_rdt=rdt,
        additional_gids=tuple(gids),
    )
