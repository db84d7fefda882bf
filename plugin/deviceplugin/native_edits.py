"""The ``native`` strategy: a CDI spec's edits for some devices, for runtimes without CDI, and
the AllocateResponse's envs, device nodes and mounts filled from them.

The edits come from the same :class:`cdigen.cdi.cache.SpecCache` that ``cdigen list`` and the
spec-dir watcher use, merged as a CDI runtime merges them (spec-wide edits once per spec, then
each device's; later edits win; mounts sorted parents first). Hooks cannot be expressed in an
AllocateResponse; they are logged once and skipped (the spec's SONAME symlink mounts are what make
the libraries usable without them).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from cdigen.cdi import edits as cdi
from cdigen.cdi.cache import SpecCache, UnresolvedDevices
from cdigen.plugin.deviceplugin.kubelet_requests import AllocateRefused
from cdigen.plugin.deviceplugin.sharing import BindMount

if TYPE_CHECKING:
    from cdigen.plugin.deviceplugin.api import deviceplugin_pb2 as pb

log = logging.getLogger("cdigen.plugin")


@dataclass(frozen=True)
class DeviceNodeEdit:
    """A device node to create in the container (a CDI ``deviceNodes`` entry)."""

    path: str
    host_path: str
    permissions: str = "rwm"


MountEdit = BindMount  # a CDI ``mounts`` entry: the same bind mount a share hands out


@dataclass(frozen=True)
class AllocateEdits:
    """The CDI container edits for a set of devices, merged in spec order."""

    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNodeEdit, ...] = ()
    mounts: tuple[MountEdit, ...] = ()
    hooks: tuple[str, ...] = field(default=(), compare=False)  # hook names: not expressible


class EditsLookup(Protocol):
    """Resolves fully-qualified CDI names to their merged container edits (``native``)."""

    def __call__(self, names: Sequence[str]) -> AllocateEdits:
        """The merged edits of ``names``; raises AllocateRefused naming a name the specs lack."""
        ...


def response_edits(edits: cdi.ContainerEdits) -> AllocateEdits:
    """The part of merged CDI edits an AllocateResponse can carry."""
    return AllocateEdits(
        env=edits.env,
        device_nodes=tuple(
            DeviceNodeEdit(path=n.path, host_path=n.host, permissions=n.permissions or "rwm")
            for n in edits.device_nodes
        ),
        mounts=tuple(
            MountEdit(host_path=m.host_path, container_path=m.container_path, read_only=m.read_only)
            for m in edits.mounts
        ),
        hooks=tuple(h.hook_name for h in edits.hooks),
    )


class SpecEdits:
    """Looks up CDI names in a :class:`SpecCache` and returns their merged edits (an
    ``EditsLookup``). The response form is kept per cache state, so a repeated request costs a
    signature check and a dict lookup."""

    def __init__(self, cache: SpecCache) -> None:
        self.cache = cache
        self._state: object = None
        self._memo: dict[tuple[str, ...], AllocateEdits] = {}
        self._warned_hooks = False

    def __call__(self, names: Sequence[str]) -> AllocateEdits:
        """The merged edits of ``names``; AllocateRefused naming the names no spec defines."""
        state = self.cache.state()
        key = tuple(names)
        if state is not self._state:
            self._state, self._memo = state, {}
        found = self._memo.get(key)
        if found is not None:
            return found
        try:
            merged = state.edits_for(key)
        except UnresolvedDevices as exc:
            dirs = ", ".join(map(str, self.cache.spec_dirs))
            raise AllocateRefused(f"{exc.message} (not defined in {dirs})") from None
        edits = response_edits(merged)
        if edits.hooks and not self._warned_hooks:
            self._warned_hooks = True
            log.warning(
                "native strategy: the spec's hooks (%s) cannot be passed in an AllocateResponse "
                "and are skipped",
                ", ".join(sorted(set(edits.hooks))),
            )
        if len(self._memo) < 4096:
            self._memo[key] = edits
        return edits


def fill_native(response: pb.ContainerAllocateResponse, edits: AllocateEdits) -> None:
    """Translate CDI container edits into the AllocateResponse's envs, devices and mounts."""
    for entry in edits.env:
        key, sep, value = entry.partition("=")
        if sep:
            response.envs[key] = value
    for node in edits.device_nodes:
        response.devices.add(
            container_path=node.path,
            host_path=node.host_path or node.path,
            permissions=node.permissions or "rwm",
        )
    add_mounts(response, edits.mounts)


def add_mounts(response: pb.ContainerAllocateResponse, mounts: Sequence[BindMount]) -> None:
    """Append ``mounts`` to the response's bind mounts."""
    for mount in mounts:
        response.mounts.add(
            container_path=mount.container_path,
            host_path=mount.host_path,
            read_only=mount.read_only,
        )
