"""The CDI spec as a wire format (the JSON/YAML a runtime reads), as TypedDicts.

Field names and optionality follow the CDI Go library's ``specs-go`` package.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict


class DeviceNodeDoc(TypedDict):
    """A device node the runtime creates in the container."""

    path: str
    hostPath: NotRequired[str]
    type: NotRequired[str]
    major: NotRequired[int]
    minor: NotRequired[int]
    fileMode: NotRequired[int]
    permissions: NotRequired[str]
    uid: NotRequired[int]
    gid: NotRequired[int]


class MountDoc(TypedDict):
    """A bind mount from the host into the container."""

    hostPath: str
    containerPath: str
    options: NotRequired[list[str]]
    type: NotRequired[str]


class HookDoc(TypedDict):
    """An OCI hook the runtime runs."""

    hookName: str
    path: str
    args: NotRequired[list[str]]
    env: NotRequired[list[str]]
    timeout: NotRequired[int]


class ContainerEditsDoc(TypedDict, total=False):
    """Edits to the container's OCI spec."""

    env: list[str]
    deviceNodes: list[DeviceNodeDoc]
    mounts: list[MountDoc]
    hooks: list[HookDoc]
    additionalGids: list[int]


class DeviceDoc(TypedDict):
    """One named device and its edits."""

    name: str
    containerEdits: ContainerEditsDoc


class SpecDoc(TypedDict):
    """A whole CDI spec file."""

    cdiVersion: str
    kind: str
    devices: list[DeviceDoc]
    containerEdits: NotRequired[ContainerEditsDoc]
