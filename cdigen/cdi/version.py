"""The lowest ``cdiVersion`` a spec's content needs (the rules of CDI's ``specs-go/version.go``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from cdigen.errors import InputError

# Every version the CDI Go library knows, oldest first; 0.3.0 is the earliest it still accepts.
KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
EARLIEST = "0.3.0"


def version_key(version: str) -> tuple[int, ...]:
    """``"0.5.0"`` -> ``(0, 5, 0)`` for comparisons; InputError if it is not a known version."""
    if version.removeprefix("v") not in KNOWN_VERSIONS:
        raise InputError(
            f"unknown cdiVersion {version!r}", hint=f"use one of {', '.join(KNOWN_VERSIONS)}"
        )
    return tuple(int(p) for p in version.removeprefix("v").split("."))


def _items(value: Any) -> list[Any]:
    """``value`` if it is a list, else [] (so malformed documents cannot crash the check)."""
    return value if isinstance(value, list) else []


def _all_edits(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    edits = spec.get("containerEdits")
    if isinstance(edits, Mapping):
        yield edits
    for device in _items(spec.get("devices")):
        if isinstance(device, Mapping) and isinstance(device.get("containerEdits"), Mapping):
            yield device["containerEdits"]


def _has_annotations(spec: Mapping[str, Any]) -> bool:
    if spec.get("annotations"):
        return True
    return any(isinstance(d, Mapping) and d.get("annotations") for d in _items(spec.get("devices")))


def required_features(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every ``(version, reason)`` the content of ``spec`` implies, in version order."""
    found: list[tuple[str, str]] = []
    edits = list(_all_edits(spec))
    if any(
        isinstance(m, Mapping) and m.get("type") for e in edits for m in _items(e.get("mounts"))
    ):
        found.append(("0.4.0", "a mount has a 'type'"))
    names = [d.get("name") for d in _items(spec.get("devices")) if isinstance(d, Mapping)]
    if any(isinstance(n, str) and n and not n[0].isalpha() for n in names):
        found.append(("0.5.0", "a device name starts with a digit"))
    nodes = [n for e in edits for n in _items(e.get("deviceNodes")) if isinstance(n, Mapping)]
    if any(n.get("hostPath") for n in nodes):
        found.append(("0.5.0", "a device node has a 'hostPath'"))
    if _has_annotations(spec):
        found.append(("0.6.0", "the spec has annotations"))
    kind = spec.get("kind")
    if isinstance(kind, str) and "/" in kind and "." in kind.partition("/")[2]:
        found.append(("0.6.0", "the class contains a dot"))
    if any(e.get("additionalGids") for e in edits):
        found.append(("0.7.0", "edits have 'additionalGids'"))
    rdts = [e["intelRdt"] for e in edits if e.get("intelRdt") is not None]
    if rdts:
        found.append(("0.7.0", "edits have 'intelRdt'"))
    if any(
        isinstance(r, Mapping) and (r.get("schemata") is not None or r.get("enableMonitoring"))
        for r in rdts
    ):
        found.append(("1.1.0", "'intelRdt' has 'schemata' or 'enableMonitoring'"))
    if any(e.get("netDevices") for e in edits):
        found.append(("1.1.0", "edits have 'netDevices'"))
    return sorted(found, key=lambda item: version_key(item[0]))


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The lowest cdiVersion that can express ``spec`` (never below 0.3.0)."""
    features = required_features(spec)
    return features[-1][0] if features else EARLIEST


def version_shortfall(spec: Mapping[str, Any], version: str) -> str | None:
    """Why ``version`` is too low for ``spec``'s content, or None if it is high enough."""
    have = version_key(version)
    for needed, reason in reversed(required_features(spec)):
        if version_key(needed) > have:
            return f"cdiVersion {version} is too low: {reason}, which needs {needed}"
    return None
