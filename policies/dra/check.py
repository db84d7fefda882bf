"""``cdigen dra check``: ResourceClaims, templates and DeviceClasses checked as the API server
and the scheduler would take them, on the devices cdigen's DRA driver publishes.

The verdict is the scheduler's: a claim fails the check (exit 1) exactly when it could never be
allocated on the given nodes' devices: the API server refuses it at create (the CEL type check,
:mod:`cdigen.policies.cel.typecheck`), it names a DeviceClass that does not exist, a selector errs
on a device the scheduler evaluates, no device matches, no device has the capacity it asks, or it
asks more devices than the node has. Its one line says which.

Besides, every name a selector, constraint or capacity request uses that the driver does not
publish is named with the file, the field and the CEL position (a misspelt attribute does not
fail in the cluster: ``has()`` turns it into false, an unguarded one into a runtime error): an
error when the claim cannot be allocated, a warning when it still can.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cdigen.errors import InputError
from cdigen.policies.cel import CelCompileError, CelProgram, compile_expression
from cdigen.policies.cel.errors import line_column
from cdigen.policies.device_view import published_attribute_names, published_capacity_names
from cdigen.policies.dra.claim_docs import (
    Claim,
    DeviceClass,
    claim_from_doc,
    device_class,
    read_claim_documents,
)
from cdigen.policies.dra.claims import DEVICE_VARIABLES, STANDARD_DOMAIN, FirstFit, NodeState
from cdigen.policies.dra.slice_devices import SliceDevice

NVIDIA_DOMAIN = "gpu.nvidia.com"

_REFERENCE = re.compile(
    r'device\s*\.\s*(attributes|capacity)\s*\[\s*"([^"]*)"\s*\]'
    r'\s*(?:\.\s*([A-Za-z_][A-Za-z0-9_]*)|\[\s*"([^"]*)"\s*\])?'
)


@dataclass(frozen=True)
class Problem:
    """One finding: file, field, CEL position (when in an expression) and what is wrong."""

    source: str
    field: str
    message: str
    line: int | None = None
    column: int | None = None
    warning: bool = False  # said, but the check passes
    kind: str = "name"  # "create": the API server refuses it; "verdict": never allocated

    def __str__(self) -> str:
        pos = f"CEL line {self.line}, column {self.column}: " if self.line is not None else ""
        return f"{self.source}: {self.field}: {pos}{self.message}"


@dataclass(frozen=True)
class Published:
    """The names one driver publishes: attributes by domain, and capacities."""

    driver: str
    attributes: Mapping[str, frozenset[str]]
    capacity: frozenset[str]

    @classmethod
    def of(cls, driver: str) -> Published:
        """What cdigen's device view publishes under ``driver``."""
        plain: set[str] = set()
        standard: set[str] = set()
        for name in published_attribute_names():
            domain, _, short = name.rpartition("/")
            (standard if domain == STANDARD_DOMAIN else plain).add(short)
        return cls(
            driver,
            {driver: frozenset(plain), STANDARD_DOMAIN: frozenset(standard)},
            frozenset(published_capacity_names()),
        )

    def qualified(self) -> frozenset[str]:
        """Every attribute as ``<domain>/<name>``."""
        return frozenset(f"{d}/{n}" for d, names in self.attributes.items() for n in names)


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``names``, or "" when none is close."""
    close = difflib.get_close_matches(name, sorted(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_expression(
    expression: str, source: str, field: str, published: Published
) -> list[Problem]:
    """Problems of one selector: syntax, and names the driver does not publish."""
    try:
        compile_expression(expression, DEVICE_VARIABLES)
    except CelCompileError as exc:
        message = f"{exc} (the API server refuses it at create)"
        return [Problem(source, field, message, exc.line, exc.column, kind="create")]
    problems: list[Problem] = []
    for match in _REFERENCE.finditer(expression):
        found = _reference_problem(match, expression, published)
        if found is not None:
            message, at = found
            problems.append(Problem(source, field, message, *line_column(expression, at)))
    return problems


def _reference_problem(
    match: re.Match[str], expression: str, published: Published
) -> tuple[str, int] | None:
    """What is wrong with one ``device.attributes/capacity[domain].name`` reference, and the
    offset it points at (the domain, or the name), or None."""
    what, domain = match.group(1), match.group(2)
    name = match.group(3) or match.group(4)
    name_at = match.start(3) if match.group(3) else match.start(4)
    if what == "capacity":
        if domain != published.driver:
            message = f"capacity domain {domain!r} is not published; use {published.driver!r}"
            return message, match.start(2) - 1
        if name is not None and name not in published.capacity:
            return f"no capacity {name!r} in {domain}" + did_you_mean(
                name, published.capacity
            ), name_at
        return None
    names = published.attributes.get(domain)
    if names is None:
        hint = (
            f"; this driver publishes NVIDIA's names under {published.driver!r}"
            if domain == NVIDIA_DOMAIN
            else ""
        )
        message = f"attribute domain {domain!r} is not published by {published.driver}{hint}"
        return message, match.start(2) - 1
    if name is not None and name not in names:
        return f"no attribute {name!r} in {domain}" + did_you_mean(name, names), name_at
    return None


def _check_selectors(items: Any, source: str, prefix: str, published: Published) -> list[Problem]:
    problems: list[Problem] = []
    for n, item in enumerate(items or ()):
        expression = ((item or {}).get("cel") or {}).get("expression")
        field = f"{prefix}[{n}].cel.expression"
        if not isinstance(expression, str):
            problems.append(Problem(source, field, "a selector needs cel.expression (a string)"))
            continue
        problems += check_expression(expression, source, field, published)
    return problems


def _check_attribute(name: Any, source: str, field: str, published: Published) -> list[Problem]:
    qualified = published.qualified()
    text = str(name)
    if "/" not in text:
        return [
            Problem(
                source,
                field,
                f"{text!r} is not a qualified attribute name",
                None,
                None,
            )
        ]
    if text in qualified:
        return []
    return [Problem(source, field, f"no attribute {text!r}" + did_you_mean(text, qualified))]


def _check_config(entries: Any, source: str, field: str, published: Published) -> list[Problem]:
    """Problems of the opaque config entries for the driver: their parameters against the
    GpuConfig schema (schemas/dra-gpu-config.schema.json), as NodePrepareResources reads them."""
    from cdigen.schemas import schema_problems

    problems: list[Problem] = []
    for n, entry in enumerate(entries if isinstance(entries, list) else ()):
        opaque = (entry or {}).get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != published.driver:
            continue
        for problem in schema_problems(opaque.get("parameters"), "dra-gpu-config"):
            where = problem.field_under(f"{field}[{n}].opaque.parameters")
            problems.append(Problem(source, where, problem.message, kind="config"))
    return problems


def check_document(doc: Mapping[str, Any], source: str, published: Published) -> list[Problem]:
    """Problems of one ResourceClaim, ResourceClaimTemplate or DeviceClass (others: none)."""
    kind = doc.get("kind")
    spec = doc.get("spec") or {}
    if kind == "DeviceClass":
        return _check_selectors(
            spec.get("selectors"), source, "spec.selectors", published
        ) + _check_config(spec.get("config"), source, "spec.config", published)
    base = "spec"
    if kind == "ResourceClaimTemplate":
        spec, base = spec.get("spec") or {}, "spec.spec"
    elif kind != "ResourceClaim":
        return []
    devices = spec.get("devices") or {}
    problems: list[Problem] = []
    for n, request in enumerate(devices.get("requests") or ()):
        where = f"{base}.devices.requests[{n}]"
        alternatives = [("exactly", (request or {}).get("exactly"))]
        for k, sub in enumerate((request or {}).get("firstAvailable") or ()):
            alternatives.append((f"firstAvailable[{k}]", sub))
        for label, body in alternatives:
            if not isinstance(body, Mapping):
                continue
            problems += _check_selectors(
                body.get("selectors"), source, f"{where}.{label}.selectors", published
            )
            caps = ((body.get("capacity") or {}).get("requests")) or {}
            for cap in caps:
                short = str(cap).rpartition("/")[2]
                if short not in published.capacity:
                    problems.append(
                        Problem(
                            source,
                            f"{where}.{label}.capacity.requests.{cap}",
                            f"no capacity {cap!r}" + did_you_mean(short, published.capacity),
                        )
                    )
    problems += _check_config(devices.get("config"), source, f"{base}.devices.config", published)
    for n, constraint in enumerate(devices.get("constraints") or ()):
        for key in ("matchAttribute", "distinctAttribute"):
            if (constraint or {}).get(key):
                problems += _check_attribute(
                    constraint[key], source, f"{base}.devices.constraints[{n}].{key}", published
                )
    return problems


@dataclass(frozen=True)
class NodeDevices:
    """The devices the driver publishes for one node (its ResourceSlices, as ``dra serve``
    builds them), and the node's name as given (``builtin:dgx1-v100``)."""

    label: str
    devices: tuple[SliceDevice, ...]


@dataclass(frozen=True)
class CheckResult:
    """What ``dra check`` found: problems (warnings among them) and how many claims it
    allocated on the nodes."""

    problems: list[Problem]
    claims: int
    notes: list[str] = field(default_factory=list)  # claims that fit some nodes, not all


def check_files(
    paths: Sequence[str | Path],
    published: Published,
    nodes: Sequence[NodeDevices] = (),
    classes: Mapping[str, DeviceClass] | None = None,
) -> CheckResult:
    """Problems of every claim, template and class in ``paths`` (InputError for a file that
    cannot be read or parsed), with the scheduler's verdict for each claim on ``nodes`` (the
    claim must be allocatable on one of them) given ``classes`` and the classes in ``paths``."""
    docs = [(str(path), doc) for path in paths for doc in read_claim_documents(path)]
    known = dict(classes or {})
    for source, doc in docs:
        if doc.get("kind") == "DeviceClass":
            cls = device_class(doc, source)
            known[cls.name] = cls
    problems: list[Problem] = []
    notes: list[str] = []
    claims = 0
    # One fit per node serves every claim (its devices' CEL values and each selector's
    # verdict on them kept), and each selector is compiled once for all nodes.
    programs: dict[str, CelProgram] = {}
    fits = [(node.label, FirstFit(node.devices, known, programs=programs)) for node in nodes]
    for source, doc in docs:
        found = check_document(doc, source, published)
        if fits and doc.get("kind") in ("ResourceClaim", "ResourceClaimTemplate"):
            claims += 1
            verdict = claim_verdict(doc, source, found, known, fits)
            if verdict is None or verdict.kind == "note":
                # allocatable: unpublished names are worth a word, no more
                found = [replace(p, warning=True) if p.kind == "name" else p for p in found]
                if verdict is not None:
                    notes.append(str(verdict))
            elif verdict.kind == "verdict":
                found.append(verdict)
        problems += found
    return CheckResult(problems, claims, notes)


def _what(doc: Mapping[str, Any]) -> str:
    return f"{doc.get('kind')} {(doc.get('metadata') or {}).get('name', '')}"


def claim_verdict(
    doc: Mapping[str, Any],
    source: str,
    found: Sequence[Problem],
    classes: Mapping[str, DeviceClass],
    fits: Sequence[tuple[str, FirstFit]],
) -> Problem | None:
    """None when the scheduler could allocate the claim of ``doc`` on each node of ``fits``
    (its label and the first fit over its free devices, given ``classes``); a note (kind
    "note") when on some of them, saying where not and why; else why it never could: the
    first refusal at create among ``found``, an unknown DeviceClass, or what the scheduler's
    first fit says on the first node."""
    refused = next((p for p in found if p.kind == "create"), None)
    if refused is not None:
        return refused
    try:
        claim = claim_from_doc(doc, source)
    except InputError as exc:
        return Problem(source, _what(doc), str(exc), kind="verdict")
    unknown = _unknown_class(doc, claim, source, classes)
    if unknown is not None:
        return unknown
    failures: list[tuple[str, str]] = []
    fitted: list[str] = []
    for label, fit in fits:
        try:
            allocation = fit.allocate(claim)
        except InputError as exc:
            failures.append((label, str(exc)))
            continue
        if allocation.error:
            failures.append((label, allocation.error + _shortfall(fit, claim)))
        else:
            fitted.append(label)
    if fitted and failures:  # a word on where it does not fit, not a failure
        misses = "; ".join(f"{label}: {why}" for label, why in failures)
        note = f"allocatable on {', '.join(fitted)}; not on {misses}"
        return Problem(source, _what(doc), note, kind="note")
    if fitted:
        return None
    label, why = failures[0]
    message = f"the scheduler could never allocate it on {label}: {why}"
    if len(failures) > 1:
        others = ", ".join(f for f, _ in failures[1:])
        message = f"the scheduler could never allocate it on {label} ({why}), nor on {others}"
    return Problem(source, _what(doc), message, kind="verdict")


def _unknown_class(
    doc: Mapping[str, Any], claim: Claim, source: str, classes: Mapping[str, DeviceClass]
) -> Problem | None:
    """A request naming a DeviceClass that does not exist (the scheduler waits for it)."""
    base = "spec.spec" if doc.get("kind") == "ResourceClaimTemplate" else "spec"
    for n, request in enumerate(claim.requests):
        for k, choice in enumerate(request.alternatives or (request,)):
            if choice.class_name in classes:
                continue
            step = f"firstAvailable[{k}]" if request.alternatives else "exactly"
            return Problem(
                source,
                f"{base}.devices.requests[{n}].{step}.deviceClassName",
                unknown_class_message(choice.class_name, classes),
                kind="verdict",
            )
    return None


def unknown_class_message(name: str, classes: Mapping[str, DeviceClass]) -> str:
    """The verdict on a request naming DeviceClass ``name``, which is not among ``classes``."""
    names = sorted(classes)
    shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    return (
        f"DeviceClass {name!r} does not exist{did_you_mean(name, classes)}: the scheduler could "
        f"never allocate the claim (DeviceClasses: {shown or 'none'}; --class adds more)"
    )


def _shortfall(fit: FirstFit, claim: Claim) -> str:
    """What the first fit's count leaves unsaid: that no device matches a request's selectors,
    or that those which match all lack the capacity it asks (``; gpu-0: needs memory 80Gi,
    has 16Gi``); "" otherwise."""
    for request in claim.requests:
        if request.alternatives or request.mode == "All":
            continue
        matching = [d for d in fit.devices if not fit.mismatch(request, d)]
        if not matching:
            first = fit.mismatch(request, fit.devices[0]) if fit.devices else "no devices"
            on = fit.label(fit.devices[0].key) if fit.devices else "-"
            return f"; no device matches (on {on}: {first})"
        reasons = [fit.consumption(request, d, NodeState(), [])[1] for d in matching]
        if all(reasons):
            return f"; {fit.label(matching[0].key)}: {reasons[0]}"
    return ""
