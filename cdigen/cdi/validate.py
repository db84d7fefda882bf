"""Checking CDI specs: the strict schema plus the semantic checks of the CDI Go library.

One function, :func:`spec_problems`, serves both ``cdigen generate`` (before any write) and
``cdigen validate FILE...``. Each problem reads ``device '<name>': <field>: <why>`` or
``<field>: <why>`` so a user can find it in the file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from cdigen.cdi import names
from cdigen.cdi.specdir import SPEC_SUFFIXES
from cdigen.cdi.version import KNOWN_VERSIONS, version_shortfall
from cdigen.errors import CdigenError, InputError, SchemaError, first_of
from cdigen.fileio import read_document
from cdigen.schemas import describe_value, field_path, load_schema, make_validator, quick_valid

SCHEMA_NAME = "cdi-spec"
_EDIT_KEYS = ("env", "deviceNodes", "mounts", "hooks", "netDevices", "intelRdt", "additionalGids")


def _inline_refs(node: Any, defs: Mapping[str, Any], depth: int = 0) -> Any:
    """``node`` with every ``{"$ref": "#/$defs/X"}`` replaced by X (the schema is not recursive).

    Resolving references is most of jsonschema's time on a large spec; inlined, it halves.
    """
    if depth > 32:
        raise ValueError("cdi-spec schema: $ref nesting too deep (is it recursive?)")
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/") and len(node) == 1:
            return _inline_refs(defs[ref.removeprefix("#/$defs/")], defs, depth + 1)
        return {k: _inline_refs(v, defs, depth + 1) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline_refs(v, defs, depth + 1) for v in node]
    return node


@cache
def _validator() -> Any:
    schema = load_schema(SCHEMA_NAME)
    return make_validator(_inline_refs(schema, schema.get("$defs", {})))


def _where(doc: Any, path: list[str | int]) -> str:
    """``devices[3].containerEdits.env[0]`` -> ``device 'GPU-…': containerEdits.env[0]``."""
    if len(path) >= 2 and path[0] == "devices" and isinstance(path[1], int):
        try:
            name = doc["devices"][path[1]]["name"]
        except (KeyError, IndexError, TypeError):
            name = None
        if isinstance(name, str):
            return f"device {name!r}: {field_path(path[2:])}" if path[2:] else f"device {name!r}"
    return field_path(path)


def _why(error: Any) -> str:
    field = error.path[-1] if error.path else None
    value = error.instance
    if error.validator == "additionalProperties":
        known = set(error.schema.get("properties", {}))
        extra = sorted((k for k in error.instance if k not in known), key=str)
        return (
            f"unknown field(s) {', '.join(map(repr, extra))}: runtimes reject the whole file "
            "for one unknown field; check the spelling"
        )
    if error.validator == "pattern" and isinstance(value, str):
        if field == "cdiVersion":
            return f"unknown cdiVersion {value!r}; known: {', '.join(KNOWN_VERSIONS)}"
        if field == "name":
            return names.device_name_problem(value) or str(error.message)
        if field == "kind":
            return names.kind_problem(value) or str(error.message)
        if error.schema.get("pattern") == "^[^=]+=":
            return f"invalid environment variable {value!r}: expected KEY=VALUE"
        if error.schema.get("pattern") == "^/":
            return f"path {value!r} is not absolute"
        if field == "permissions":
            return f"invalid permissions {value!r}: use only the letters r, w and m"
    if error.validator == "enum" and field == "hookName":
        return f"unknown hook name {value!r}; use one of {', '.join(error.validator_value)}"
    if error.validator == "type":
        expected = error.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        return f"expected {expected}, got {describe_value(value)}"
    if error.validator == "required":
        return str(error.message).replace("is a required property", "is required")
    return str(error.message)


def _newline_problems(doc: Mapping[str, Any], devices: list[Any]) -> list[str]:
    """jsonschema applies patterns with ``re.search``, where ``$`` also matches before a final
    newline; Go's regexps (the runtimes') do not. Catch what slips through that gap."""
    fields = [("cdiVersion", doc.get("cdiVersion")), ("kind", doc.get("kind"))]
    fields += [
        (f"device {d.get('name')!r}: name", d.get("name"))
        for d in devices
        if isinstance(d, Mapping)
    ]
    return [
        f"{where}: ends with a newline"
        for where, v in fields
        if isinstance(v, str) and v.endswith("\n")
    ]


def _semantic_problems(doc: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    seen: set[str] = set()
    raw = doc.get("devices")
    devices: list[Any] = raw if isinstance(raw, list) else []
    problems += _newline_problems(doc, devices)
    for device in devices:
        if not isinstance(device, Mapping):
            continue
        name = device.get("name")
        if isinstance(name, str):
            if name in seen:
                problems.append(
                    f"device {name!r}: defined more than once; runtimes reject the whole file"
                )
            seen.add(name)
        edits = device.get("containerEdits")
        if isinstance(edits, Mapping) and not any(edits.get(k) for k in _EDIT_KEYS):
            problems.append(
                f"device {name!r}: containerEdits: empty; a device must change the container"
            )
    version = doc.get("cdiVersion")
    if isinstance(version, str) and version.removeprefix("v") in KNOWN_VERSIONS:
        shortfall = version_shortfall(doc, version)
        if shortfall:
            problems.append(f"cdiVersion: {shortfall}")
    return problems


def spec_problems(doc: Any) -> list[str]:
    """Every problem in the spec ``doc``: schema violations first, then semantic ones."""
    errors = sorted(_validator().iter_errors(doc), key=lambda e: [str(p) for p in e.path])
    problems = [f"{_where(doc, list(e.absolute_path))}: {_why(e)}" for e in errors]
    if isinstance(doc, Mapping):
        problems += _semantic_problems(doc)
    return problems


def check_spec(doc: Any, *, where: str) -> None:
    """Raise :class:`SchemaError` (exit 2) naming the first problem if ``doc`` is not valid.

    The schema part runs without jsonschema when :func:`quick_valid` confirms the document
    (``generate``'s hot path); ``validate`` and a failing document get :func:`spec_problems`.
    """
    if quick_valid(doc, load_schema(SCHEMA_NAME)) and isinstance(doc, Mapping):
        problems = _semantic_problems(doc)
    else:
        problems = spec_problems(doc)
    if problems:
        raise SchemaError(
            first_of(problems),
            where=where,
            hint="nothing was written; check the node description ('cdigen discover') and flags",
        )


def refuse_dangling_link(path: str | Path) -> None:
    """InputError naming the link and its target if ``path`` is a symlink to nothing."""
    if os.path.islink(path) and not os.path.exists(path):
        raise InputError(
            f"dangling symbolic link to {os.readlink(path)!r}",
            where=str(path),
            hint="restore its target or remove the link",
        )


def read_spec_document(path: str | Path) -> Any:
    """Parse one spec file; a one-line InputError if it cannot be read or parsed."""
    refuse_dangling_link(path)
    try:
        return read_document(path, what="CDI spec")
    except (ValueError, RecursionError) as exc:  # the YAML library's own limits
        reason = str(exc).split(";")[0] or type(exc).__name__
        raise InputError(
            f"cannot parse CDI spec: {reason}", where=str(path), hint="fix or remove the file"
        ) from None


def file_problems(path: str | Path) -> list[str]:
    """Every problem in one spec file, each prefixed with the file name."""
    try:
        doc = read_spec_document(path)
    except CdigenError as exc:
        return [str(exc)]
    return document_problems(path, doc)


def document_problems(path: str | Path, doc: Any) -> list[str]:
    """Every problem in the spec ``doc`` read from ``path``, each prefixed with the file name."""
    where = str(path)
    problems = [f"{where}: {p}" for p in spec_problems(doc)]
    if Path(path).suffix not in SPEC_SUFFIXES:
        problems.append(f"{where}: runtimes only read *.yaml and *.json files; rename it")
    return problems


def validate_files(paths: Iterable[str | Path]) -> list[str]:
    """Problems across all ``paths`` (empty when every file is valid)."""
    return [p for path in paths for p in file_problems(path)]
