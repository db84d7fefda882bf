"""Loading one spec file as runtimes do: the CDI Go library v1.1.0's ``ReadSpec``.

What loads is decided by the library's rules, not by cdigen's strict lint (``cdigen validate``):

1. The file is read and decoded into the spec's Go types as the library does
   (:mod:`cdigen.cdi.specdecode`).
2. ``newSpec``'s checks: a known cdiVersion high enough for the content, a valid vendor, class
   and device names, valid edits (env ``KEY=VALUE``, node types and permissions, hook names,
   non-empty mount paths), every device with some edits, no device twice, at least one device.

Anything else (a relative ``containerPath``, a missing ``hostPath`` on a node) loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdigen.cdi import names
from cdigen.cdi.edits import ContainerEdits, DeviceNode, Hook, IntelRdt, Mount, NetDevice
from cdigen.cdi.specdecode import SPEC, SpecLoadError, read_yaml
from cdigen.cdi.version import KNOWN_VERSIONS, version_shortfall

HOOK_NAMES = frozenset(
    ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
)
NODE_TYPES = frozenset(("", "b", "c", "u", "p"))
_ACCEPTED_VERSIONS = ("0.1.0", "0.2.0", *KNOWN_VERSIONS)  # 0.1.0 and 0.2.0: known, too low


@dataclass(frozen=True)
class LoadedSpec:
    """A spec file that loads: its kind, spec-wide edits and devices (name -> edits, in order)."""

    path: Path
    priority: int
    kind: str
    version: str
    edits: ContainerEdits
    devices: Mapping[str, ContainerEdits] = field(repr=False)


def _edits(doc: Mapping[str, Any] | None) -> ContainerEdits:
    doc = doc or {}
    rdt = doc.get("intelRdt")
    return ContainerEdits(
        env=tuple(doc.get("env") or ()),
        device_nodes=tuple(
            DeviceNode(
                path=n.get("path", ""),
                host_path=n.get("hostPath", ""),
                type=n.get("type", ""),
                major=n.get("major") or 0,
                minor=n.get("minor") or 0,
                file_mode=n.get("fileMode"),
                permissions=n.get("permissions", ""),
                uid=n.get("uid"),
                gid=n.get("gid"),
            )
            for n in (x or {} for x in doc.get("deviceNodes") or ())
        ),
        mounts=tuple(
            Mount(
                m.get("hostPath", ""),
                m.get("containerPath", ""),
                tuple(m.get("options") or ()),
                m.get("type", ""),
            )
            for m in (x or {} for x in doc.get("mounts") or ())
        ),
        hooks=tuple(
            Hook(
                h.get("hookName", ""),
                h.get("path", ""),
                tuple(h.get("args") or ()),
                tuple(h.get("env") or ()),
                h.get("timeout"),
            )
            for h in (x or {} for x in doc.get("hooks") or ())
        ),
        net_devices=tuple(
            NetDevice(d.get("hostInterfaceName", ""), d.get("name", ""))
            for d in (x or {} for x in doc.get("netDevices") or ())
        ),
        intel_rdt=None
        if rdt is None
        else IntelRdt(
            rdt.get("closID", ""),
            rdt.get("l3CacheSchema", ""),
            rdt.get("memBwSchema", ""),
            tuple(rdt["schemata"]) if rdt.get("schemata") is not None else None,
            bool(rdt.get("enableMonitoring")),
        ),
        additional_gids=tuple(g for g in doc.get("additionalGids") or () if g is not None),
    )


def _env_problems(env: tuple[str, ...], where: str) -> list[str]:
    return [
        f"{where}[{i}]: invalid environment variable {v!r}: expected KEY=VALUE"
        for i, v in enumerate(env)
        if v.find("=") <= 0
    ]


def edits_problems(edits: ContainerEdits, where: str) -> list[str]:
    """Why the library's ``ContainerEdits.Validate`` refuses ``edits`` (empty if it does not)."""
    problems = _env_problems(edits.env, f"{where}.env")
    for i, node in enumerate(edits.device_nodes):
        at = f"{where}.deviceNodes[{i}]"
        if not node.path:
            problems.append(f"{at}: the device path is empty")
        if node.type not in NODE_TYPES:
            problems.append(f"{at}: invalid type {node.type!r}: use b, c, u or p")
        if set(node.permissions) - set("rwm"):
            problems.append(f"{at}: invalid permissions {node.permissions!r}: use r, w and m")
    for i, hook in enumerate(edits.hooks):
        at = f"{where}.hooks[{i}]"
        if hook.hook_name not in HOOK_NAMES:
            problems.append(f"{at}: unknown hook name {hook.hook_name!r}")
        if not hook.path:
            problems.append(f"{at}: the hook path is empty")
        problems += _env_problems(hook.env, f"{at}.env")
    for i, mount in enumerate(edits.mounts):
        at = f"{where}.mounts[{i}]"
        if not mount.host_path:
            problems.append(f"{at}: hostPath is empty")
        if not mount.container_path:
            problems.append(f"{at}: containerPath is empty")
    rdt = edits.intel_rdt
    if rdt is not None and rdt.clos_id != "/":
        c = rdt.clos_id
        if len(c) >= 4096 or c in (".", "..") or "/" in c or "\n" in c:
            problems.append(f"{where}.intelRdt.closID: invalid ClosID {c[:40]!r}")
    hosts: set[str] = set()
    seen: set[str] = set()
    for i, dev in enumerate(edits.net_devices):
        at = f"{where}.netDevices[{i}]"
        if not dev.host_interface_name or not dev.name:
            problems.append(f"{at}: hostInterfaceName and name must not be empty")
        if dev.host_interface_name in hosts or dev.name in seen:
            problems.append(f"{at}: a duplicate network device")
        hosts.add(dev.host_interface_name)
        seen.add(dev.name)
    return problems


def _version_problem(doc: Mapping[str, Any]) -> str | None:
    version = doc.get("cdiVersion", "")
    bare = version.removeprefix("v")
    if bare not in _ACCEPTED_VERSIONS:
        return f"cdiVersion: unknown cdiVersion {version!r}; known: {', '.join(KNOWN_VERSIONS)}"
    if bare not in KNOWN_VERSIONS:
        return f"cdiVersion: {version} is too old; runtimes need at least {KNOWN_VERSIONS[0]}"
    shortfall = version_shortfall(doc, bare)
    return f"cdiVersion: {shortfall}" if shortfall else None


def check_spec_doc(
    doc: Mapping[str, Any],
) -> tuple[ContainerEdits, dict[str, ContainerEdits], list[str]]:
    """The typed edits of a decoded spec and ``newSpec``'s problems with it, in its order."""
    problems: list[str] = []
    version = _version_problem(doc)
    if version:
        problems.append(version)
    kind_problem = names.kind_problem(doc.get("kind", ""))
    if kind_problem:
        problems.append(f"kind: {kind_problem}")
    spec_edits = _edits(doc.get("containerEdits"))
    problems += edits_problems(spec_edits, "containerEdits")
    devices: dict[str, ContainerEdits] = {}
    for device in (d or {} for d in doc.get("devices") or ()):
        name = device.get("name", "")
        where = f"device {name!r}"
        problem = names.device_name_problem(name)
        edits = _edits(device.get("containerEdits"))
        if problem:
            problems.append(f"{where}: {problem}")
        elif edits.is_empty():
            problems.append(f"{where}: containerEdits: empty; a device must change the container")
        else:
            problems += edits_problems(edits, f"{where}: containerEdits")
        if name in devices:
            problems.append(f"{where}: defined more than once; runtimes reject the whole file")
        devices[name] = edits
    if not devices:
        problems.append("devices: the spec defines no device")
    return spec_edits, devices, problems


def load_spec(path: Path, priority: int) -> LoadedSpec:
    """Read ``path`` as ``ReadSpec`` does; SpecLoadError with every problem, the library's first."""
    raw = read_yaml(path)
    if raw is None:
        raise SpecLoadError(["no spec data: the document is null"])
    problems: list[str] = []
    doc = SPEC(raw, "", problems)
    if doc is None:
        raise SpecLoadError(problems)
    spec_edits, devices, semantic = check_spec_doc(doc)
    problems += semantic
    if problems:
        raise SpecLoadError(problems)
    return LoadedSpec(
        path=path,
        priority=priority,
        kind=doc["kind"],
        version=doc["cdiVersion"],
        edits=spec_edits,
        devices=devices,
    )
