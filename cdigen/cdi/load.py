"""Loading one spec file as runtimes do: the CDI Go library v1.1.0's ``ReadSpec``.

What loads is decided by the library's rules, not by cdigen's strict lint (``cdigen validate``):

1. The file is YAML (JSON is YAML), read as ``sigs.k8s.io/yaml.UnmarshalStrict`` reads it: the
   first document only, YAML 1.1 scalars without sexagesimal numbers, dates kept as text,
   duplicate keys refused; then decoded into the spec's Go types: unknown fields and values of
   the wrong type are refused, numbers and booleans where text is expected become text
   (``name: 0`` is the device ``0``), ``null`` is the zero value.
2. ``newSpec``'s checks: a known cdiVersion high enough for the content, a valid vendor, class
   and device names, valid edits (env ``KEY=VALUE``, node types and permissions, hook names,
   non-empty mount paths), every device with some edits, no device twice, at least one device.

Anything else (a relative ``containerPath``, a missing ``hostPath`` on a node) loads.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from cdigen.cdi import names
from cdigen.cdi.edits import ContainerEdits, DeviceNode, Hook, IntelRdt, Mount, NetDevice
from cdigen.cdi.version import KNOWN_VERSIONS, version_shortfall
from cdigen.errors import CdigenError
from cdigen.fileio import _check_graph, _loader_class, read_text

HOOK_NAMES = frozenset(
    ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
)
NODE_TYPES = frozenset(("", "b", "c", "u", "p"))
_ACCEPTED_VERSIONS = ("0.1.0", "0.2.0", *KNOWN_VERSIONS)  # 0.1.0 and 0.2.0: known, too low
_INT64 = (-(2**63), 2**63 - 1)
_UINT32 = (0, 2**32 - 1)

# Go struct shapes: field name -> decoder. Filled in below (they refer to each other).
_Decoder = Callable[[Any, str, list[str]], Any]
EDITS: dict[str, _Decoder] = {}


@dataclass(frozen=True)
class LoadedSpec:
    """A spec file that loads: its kind, spec-wide edits and devices (name -> edits, in order)."""

    path: Path
    priority: int
    kind: str
    version: str
    edits: ContainerEdits
    devices: Mapping[str, ContainerEdits] = field(repr=False)


class SpecLoadError(Exception):
    """A spec file that runtimes refuse; ``problems[0]`` is the reason a runtime gives."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(problems[0])
        self.problems = problems


# --- reading YAML as go-yaml v2 does ----------------------------------------------------------


@functools.cache
def _go_yaml_loader() -> Any:
    import yaml

    class GoYamlLoader(_loader_class()):  # type: ignore[misc]
        """The bounded safe loader, with go-yaml v2's differences from PyYAML."""

        def construct_yaml_int(self, node: Any) -> Any:
            if ":" in str(node.value):  # sexagesimal: go-yaml v2 reads "1:0" as text
                return str(node.value)
            return super().construct_yaml_int(node)

        def construct_yaml_float(self, node: Any) -> Any:
            if ":" in str(node.value):
                return str(node.value)
            return super().construct_yaml_float(node)

        def construct_yaml_timestamp(self, node: Any) -> Any:
            return str(node.value)  # go-yaml v2 keeps timestamps as text in interface{}

        def construct_yaml_binary(self, node: Any) -> Any:
            value = super().construct_yaml_binary(node)
            return value.decode("utf-8", "replace")

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[tuple[str, str]] = set()
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if (key.tag, key.value) in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"key {key.value!r} already set in map", key.start_mark
                        )
                    seen.add((key.tag, key.value))
            return super().construct_mapping(node, deep=deep)

    for tag, method in (
        ("int", GoYamlLoader.construct_yaml_int),
        ("float", GoYamlLoader.construct_yaml_float),
        ("timestamp", GoYamlLoader.construct_yaml_timestamp),
        ("binary", GoYamlLoader.construct_yaml_binary),
    ):
        GoYamlLoader.add_constructor(f"tag:yaml.org,2002:{tag}", method)
    return GoYamlLoader


def read_yaml(path: Path) -> Any:
    """The first YAML document in ``path``; SpecLoadError with a one-line reason."""
    import yaml

    from cdigen.cdi.validate import refuse_dangling_link

    try:
        refuse_dangling_link(path)
        text = read_text(path, what="CDI spec")
    except CdigenError as exc:
        raise SpecLoadError([exc.message]) from None
    loader = _go_yaml_loader()(text)
    try:
        node = loader.get_node() if loader.check_node() else None
        if node is None:
            raise SpecLoadError(["no spec data: the file is empty"])
        _check_graph(node)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        pos = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise SpecLoadError([f"{pos}invalid YAML: {exc.problem}"]) from None
    except (yaml.YAMLError, RecursionError, ValueError, OverflowError) as exc:
        raise SpecLoadError([f"invalid YAML: {' '.join(str(exc).split())[:200]}"]) from None
    finally:
        loader.dispose()


# --- decoding into the Go types (sigs.k8s.io/yaml, then encoding/json strict) ------------------


def _go_float(value: float) -> str:
    """``strconv.FormatFloat(value, 'g', -1, 64)``."""
    sign, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    text = "".join(map(str, digits)) or "0"
    if value == 0:
        return "-0" if sign else "0"
    point = len(text) + int(exponent)
    if point - 1 < -4 or point - 1 >= 6:  # Go: %e when the exponent is < -4 or >= 6
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        exp = point - 1
        out = f"{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    elif point <= 0:
        out = "0." + "0" * -point + text
    elif point >= len(text):
        out = text + "0" * (point - len(text))
    else:
        out = text[:point] + "." + text[point:]
    return ("-" if sign else "") + out


def _str(value: Any, where: str, problems: list[str]) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value)
    problems.append(f"{where}: expected a string, got {_what(value)}")
    return ""


def _int(bounds: tuple[int, int]) -> _Decoder:
    def decode(value: Any, where: str, problems: list[str]) -> int | None:
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{where}: expected an integer, got {_what(value)}")
            return None
        if not bounds[0] <= value <= bounds[1]:
            problems.append(f"{where}: {value} is out of range")
            return None
        return value

    return decode


def _bool(value: Any, where: str, problems: list[str]) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    problems.append(f"{where}: expected true or false, got {_what(value)}")
    return None


def _list(item: _Decoder) -> _Decoder:
    def decode(value: Any, where: str, problems: list[str]) -> list[Any] | None:
        if value is None:
            return None
        if not isinstance(value, list):
            problems.append(f"{where}: expected a list, got {_what(value)}")
            return None
        return [item(v, f"{where}[{i}]", problems) for i, v in enumerate(value)]

    return decode


def _str_map(value: Any, where: str, problems: list[str]) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        problems.append(f"{where}: expected a mapping, got {_what(value)}")
        return None
    return {_key(k): _str(v, f"{where}.{_key(k)}", problems) for k, v in value.items()}


def _struct(fields: Mapping[str, _Decoder]) -> _Decoder:
    folded = {k.lower(): k for k in fields}

    def decode(value: Any, where: str, problems: list[str]) -> dict[str, Any] | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            problems.append(f"{where or 'the spec'}: expected a mapping, got {_what(value)}")
            return None
        out: dict[str, Any] = {}
        for raw_key, raw in value.items():
            key = _key(raw_key)
            name = key if key in fields else folded.get(key.lower())  # encoding/json folds case
            path = f"{where}.{key}" if where else key
            if name is None:
                problems.append(
                    f"{path}: unknown field {key!r}: runtimes reject the whole file for it"
                )
                continue
            decoded = fields[name](raw, path, problems)
            if decoded is not None:
                out[name] = decoded
        return out

    return decode


def _key(key: Any) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    return _go_float(key) if isinstance(key, float) else str(key)


def _what(value: Any) -> str:
    kinds = {dict: "a mapping", list: "a list", str: "text", bool: "a boolean", float: "a number"}
    return next((v for t, v in kinds.items() if isinstance(value, t)), type(value).__name__)


_strings = _list(_str)
NODE = _struct(
    {
        "path": _str,
        "hostPath": _str,
        "type": _str,
        "major": _int(_INT64),
        "minor": _int(_INT64),
        "fileMode": _int(_UINT32),
        "permissions": _str,
        "uid": _int(_UINT32),
        "gid": _int(_UINT32),
    }
)
MOUNT = _struct({"hostPath": _str, "containerPath": _str, "options": _strings, "type": _str})
HOOK = _struct(
    {"hookName": _str, "path": _str, "args": _strings, "env": _strings, "timeout": _int(_INT64)}
)
RDT = _struct(
    {
        "closID": _str,
        "l3CacheSchema": _str,
        "memBwSchema": _str,
        "schemata": _strings,
        "enableMonitoring": _bool,
    }
)
NET = _struct({"hostInterfaceName": _str, "name": _str})
EDITS.update(
    env=_strings,
    deviceNodes=_list(NODE),
    netDevices=_list(NET),
    hooks=_list(HOOK),
    mounts=_list(MOUNT),
    intelRdt=RDT,
    additionalGids=_list(_int(_UINT32)),
)
DEVICE = _struct({"name": _str, "annotations": _str_map, "containerEdits": _struct(EDITS)})
SPEC = _struct(
    {
        "cdiVersion": _str,
        "kind": _str,
        "annotations": _str_map,
        "devices": _list(DEVICE),
        "containerEdits": _struct(EDITS),
    }
)


# --- typed edits and newSpec's checks -----------------------------------------------------------


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
