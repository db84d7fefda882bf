"""ResourceClaims, ResourceClaimTemplates and DeviceClasses read from YAML manifests
(resource.k8s.io/v1), as the scheduler sees them: requests, selectors, tolerations, constraints.

Part of the offline scheduler simulator (:mod:`cdigen.policies.dra.claims`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cdigen.errors import EXIT_CHECK_FAILED, CdigenError, InputError
from cdigen.fileio import read_text
from cdigen.policies.dra.slice_devices import Taint, quantity


@dataclass(frozen=True)
class Selector:
    """One CEL selector and where it was written (file and field)."""

    expression: str
    source: str
    field: str


@dataclass(frozen=True)
class Toleration:
    """A request's toleration of device taints (``Exists`` or ``Equal``)."""

    key: str | None
    operator: str
    value: str
    effect: str | None

    def tolerates(self, taint: Taint) -> bool:
        """True when this toleration covers ``taint``."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key is None:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True)
class Request:
    """One ``exactly`` request of a claim, or one subrequest of a ``firstAvailable`` request
    (named ``request/subrequest``, as the scheduler names its results)."""

    name: str
    class_name: str
    selectors: tuple[Selector, ...]
    mode: str = "ExactCount"
    count: int = 1
    capacity: Mapping[str, int] = field(default_factory=dict)  # plain or qualified names
    tolerations: tuple[Toleration, ...] = ()
    alternatives: tuple[Request, ...] = ()  # firstAvailable: the subrequests, in order


@dataclass(frozen=True)
class Constraint:
    """A claim constraint: ``matchAttribute`` or ``distinctAttribute`` over some requests."""

    requests: tuple[str, ...]  # empty: all requests
    attribute: str
    distinct: bool = False

    def covers(self, request: str) -> bool:
        """True when the constraint applies to ``request`` (a subrequest ``main/sub`` is
        covered by its main request's name)."""
        return (
            not self.requests
            or request in self.requests
            or request.partition("/")[0] in self.requests
        )


@dataclass(frozen=True)
class Claim:
    """A ResourceClaim (or the claim of a ResourceClaimTemplate)."""

    name: str
    source: str
    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...]


@dataclass(frozen=True)
class DeviceClass:
    """A DeviceClass: its name and selectors."""

    name: str
    source: str
    selectors: tuple[Selector, ...]


def read_documents(path: str | Path) -> list[Mapping[str, Any]]:
    """The YAML documents of a file (``---`` separated); one-line InputError on bad YAML."""
    import yaml

    text = read_text(path, what="manifest")
    try:
        docs = list(yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        pos = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise InputError(f"{pos}invalid YAML: {exc.problem}", where=str(path)) from None
    except yaml.YAMLError as exc:
        raise InputError(f"invalid YAML: {exc}", where=str(path)) from None
    out = [d for d in docs if d is not None]
    for n, doc in enumerate(out):
        if not isinstance(doc, Mapping) or "kind" not in doc:
            raise InputError(
                f"document {n + 1} is not a Kubernetes object (no kind)", where=str(path)
            )
    return out


def _selectors(items: Any, source: str, prefix: str) -> tuple[Selector, ...]:
    out = []
    for n, item in enumerate(items or ()):
        expression = ((item or {}).get("cel") or {}).get("expression")
        if not isinstance(expression, str):
            raise InputError(
                "a selector needs cel.expression (a string)",
                where=f"{source}: {prefix}[{n}]",
            )
        out.append(Selector(expression, source, f"{prefix}[{n}].cel.expression"))
    return tuple(out)


def _exact_request(name: str, exactly: Mapping[str, Any], source: str, where: str) -> Request:
    """One request's device part (``exactly``, or one ``firstAvailable`` subrequest)."""
    mode = str(exactly.get("allocationMode", "ExactCount"))
    if mode not in ("ExactCount", "All"):
        raise InputError(f"unknown allocationMode {mode!r}", where=f"{source}: {where}")
    count = exactly.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise InputError(
            f"count must be a positive integer, got {count!r}", where=f"{source}: {where}.count"
        )
    caps = ((exactly.get("capacity") or {}).get("requests")) or {}
    return Request(
        name=name,
        class_name=str(exactly.get("deviceClassName", "")),
        selectors=_selectors(exactly.get("selectors"), source, f"{where}.selectors"),
        mode=mode,
        count=count,
        capacity={
            str(k): quantity(v, f"{source}: {where}.capacity.requests.{k}") for k, v in caps.items()
        },
        tolerations=tuple(
            Toleration(
                t.get("key"),
                str(t.get("operator", "Equal")),
                str(t.get("value", "")),
                t.get("effect"),
            )
            for t in exactly.get("tolerations") or ()
        ),
    )


def device_class(doc: Mapping[str, Any], source: str) -> DeviceClass:
    """A DeviceClass from its manifest."""
    name = str((doc.get("metadata") or {}).get("name", ""))
    spec = doc.get("spec") or {}
    return DeviceClass(name, source, _selectors(spec.get("selectors"), source, "spec.selectors"))


def claim_from_doc(doc: Mapping[str, Any], source: str) -> Claim:
    """A Claim from a ResourceClaim or ResourceClaimTemplate manifest (resource.k8s.io/v1)."""
    kind = doc.get("kind")
    name = str((doc.get("metadata") or {}).get("name", ""))
    spec = doc.get("spec") or {}
    base = "spec"
    if kind == "ResourceClaimTemplate":
        spec, base = spec.get("spec") or {}, "spec.spec"
    elif kind != "ResourceClaim":
        raise InputError(
            f"kind {kind!r} is not a ResourceClaim or ResourceClaimTemplate", where=source
        )
    devices = spec.get("devices") or {}
    requests: list[Request] = []
    for n, req in enumerate(devices.get("requests") or ()):
        where = f"{base}.devices.requests[{n}]"
        req_name = str((req or {}).get("name", ""))
        exactly = (req or {}).get("exactly")
        first_available = (req or {}).get("firstAvailable")
        if isinstance(exactly, Mapping):
            requests.append(_exact_request(req_name, exactly, source, f"{where}.exactly"))
        elif isinstance(first_available, list) and first_available:
            subs = tuple(
                _exact_request(
                    f"{req_name}/{(sub or {}).get('name', '')}",
                    sub or {},
                    source,
                    f"{where}.firstAvailable[{k}]",
                )
                for k, sub in enumerate(first_available)
            )
            requests.append(replace(subs[0], name=req_name, alternatives=subs))
        else:
            raise InputError(
                "a request needs exactly or firstAvailable (a non-empty list)",
                where=f"{source}: {where}",
                hint="write the request as exactly: {deviceClassName: ..., ...}",
            )
    constraints: list[Constraint] = []
    for c in devices.get("constraints") or ():
        names = tuple(str(r) for r in c.get("requests") or ())
        if c.get("matchAttribute"):
            constraints.append(Constraint(names, str(c["matchAttribute"])))
        if c.get("distinctAttribute"):
            constraints.append(Constraint(names, str(c["distinctAttribute"]), distinct=True))
    return Claim(name, source, tuple(requests), tuple(constraints))


CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate", "DeviceClass")


class UncheckedField(CdigenError):
    """A claim or class holds a field the offline tools do not simulate: checking the rest
    and saying OK (or picking devices) would be a claim about something never checked."""

    exit_code = EXIT_CHECK_FAILED


# The resource.k8s.io/v1 fields `dra check` and `dra explain` simulate, nested as they are
# written (a dict: its known keys; a one-item list: a list of that; None: any value).
_SELECTOR = {"cel": {"expression": None}}
_TOLERATION = dict.fromkeys(("key", "operator", "value", "effect", "tolerationSeconds"))
_DEVICE_PART: dict[str, Any] = {
    "deviceClassName": None,
    "selectors": [_SELECTOR],
    "allocationMode": None,
    "count": None,
    "capacity": {"requests": None},
    "tolerations": [_TOLERATION],
}
_CLAIM_SPEC = {
    "devices": {
        "requests": [
            {
                "name": None,
                "exactly": {**_DEVICE_PART, "adminAccess": None},
                "firstAvailable": [{"name": None, **_DEVICE_PART}],
            }
        ],
        "constraints": [dict.fromkeys(("requests", "matchAttribute", "distinctAttribute"))],
        "config": [{"requests": None, "opaque": {"driver": None, "parameters": None}}],
    }
}
_SPECS: dict[str, Any] = {
    "ResourceClaim": _CLAIM_SPEC,
    "ResourceClaimTemplate": {"metadata": None, "spec": _CLAIM_SPEC},
    "DeviceClass": {
        "selectors": [_SELECTOR],
        "config": [{"opaque": {"driver": None, "parameters": None}}],
        "extendedResourceName": None,
    },
}


def _unchecked(value: Any, shape: Any, where: str) -> tuple[str, str] | None:
    """``(field, why)`` of the first field of ``value`` outside ``shape``, or None."""
    import difflib

    if isinstance(shape, list) and isinstance(value, list):
        for n, item in enumerate(value):
            found = _unchecked(item, shape[0], f"{where}[{n}]")
            if found:
                return found
    elif isinstance(shape, dict) and isinstance(value, Mapping):
        for key, item in value.items():
            field = f"{where}.{key}"
            if key not in shape:
                if where.endswith("]") and ".requests[" in where and key in _DEVICE_PART:
                    return field, (
                        "the v1beta1 request shape (device fields on the request itself) is "
                        "not checked; write it as resource.k8s.io/v1 does, under exactly: "
                        "{deviceClassName: ..., selectors: ...}"
                    )
                close = difflib.get_close_matches(str(key), list(shape), n=1)
                hint = f"did you mean {close[0]!r}?" if close else "leave it out to check the rest"
                return field, f"unknown field {key!r}, not checked; {hint}"
            if key == "adminAccess" and item:
                return field, (
                    "adminAccess is not simulated (an admin claim may get devices in use); "
                    "leave it out to check the rest"
                )
            found = _unchecked(item, shape[key], field)
            if found:
                return found
    return None


def _empty_request(doc: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(field, why)`` of the first request with neither ``exactly`` nor ``firstAvailable``:
    it would be passed with nothing in it checked."""
    spec, base = doc.get("spec") or {}, "spec"
    if doc.get("kind") == "ResourceClaimTemplate":
        spec, base = (spec.get("spec") if isinstance(spec, Mapping) else None) or {}, "spec.spec"
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    for n, request in enumerate(requests if isinstance(requests, list) else ()):
        if not isinstance(request, Mapping) or not (
            request.get("exactly") or request.get("firstAvailable")
        ):
            return f"{base}.devices.requests[{n}]", (
                "a request with neither exactly nor firstAvailable is not checked; write it as "
                "resource.k8s.io/v1 does, e.g. exactly: {deviceClassName: gpu.cdigen.dev}"
            )
    return None


def refuse_unchecked(doc: Mapping[str, Any], source: str) -> None:
    """:class:`UncheckedField` (exit 1, naming the file and the field) when ``doc``, a claim,
    template or class, has a field the offline tools do not check; other kinds pass."""
    shape = _SPECS.get(str(doc.get("kind")))
    if shape is None:
        return
    found = _unchecked(doc.get("spec") or {}, shape, "spec") or _empty_request(doc)
    if found:
        field, why = found
        raise UncheckedField(why, where=f"{source}: {field}")


def read_claim_documents(path: str | Path) -> list[Mapping[str, Any]]:
    """:func:`read_documents`, a one-line InputError when none of them is a ResourceClaim,
    ResourceClaimTemplate or DeviceClass (an empty file, a node file): nothing would be used,
    and :class:`UncheckedField` for a field the offline tools do not check."""
    docs = read_documents(path)
    for doc in docs:
        refuse_unchecked(doc, str(path))
    if not any(doc["kind"] in CLAIM_KINDS for doc in docs):
        kinds = ", ".join(sorted({str(doc["kind"]) for doc in docs})) or "no documents"
        raise InputError(
            f"no ResourceClaim, ResourceClaimTemplate or DeviceClass in it (found {kinds})",
            where=str(path),
            hint="give the claim or DeviceClass manifests",
        )
    return docs


def load_manifests(paths: Sequence[str | Path]) -> tuple[list[Claim], dict[str, DeviceClass]]:
    """The claims (and templates) and device classes in ``paths``; other kinds are ignored,
    but each file must hold at least one of them."""
    claims: list[Claim] = []
    classes: dict[str, DeviceClass] = {}
    for path in paths:
        for doc in read_claim_documents(path):
            if doc["kind"] == "DeviceClass":
                cls = device_class(doc, str(path))
                classes[cls.name] = cls
            elif doc["kind"] in ("ResourceClaim", "ResourceClaimTemplate"):
                claims.append(claim_from_doc(doc, str(path)))
    return claims, classes
