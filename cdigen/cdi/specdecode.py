"""Reading a spec file's data as the CDI Go library v1.1.0 reads it, before any check.

The file is YAML (JSON is YAML), read as ``sigs.k8s.io/yaml.UnmarshalStrict`` reads it: the
first document only, YAML 1.1 scalars without sexagesimal numbers, dates kept as text, duplicate
keys refused; then decoded into the spec's Go types (:data:`SPEC`): unknown fields and values of
the wrong type are refused, numbers and booleans where text is expected become text
(``name: 0`` is the device ``0``), ``null`` is the zero value.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

from cdigen.errors import CdigenError
from cdigen.fileio import _check_graph, _loader_class, read_text

_INT64 = (-(2**63), 2**63 - 1)
_UINT32 = (0, 2**32 - 1)

# Go struct shapes: field name -> decoder. Filled in below (they refer to each other).
_Decoder = Callable[[Any, str, list[str]], Any]
EDITS: dict[str, _Decoder] = {}


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
