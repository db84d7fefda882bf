"""``cdigen dra check``: ResourceClaims, templates and DeviceClasses checked against the
attributes and capacities cdigen's DRA driver publishes.

A misspelt attribute in a selector does not fail in the cluster: ``has()`` turns it into false
and an unguarded one into a runtime error, and the claim just never allocates. This check names
the file, the field and the CEL position of every name the driver does not publish.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies.cel import CelCompileError, compile_expression
from policies.device_view import published_attribute_names, published_capacity_names
from policies.dra.claim_docs import read_claim_documents
from policies.dra.claims import DEVICE_VARIABLES, STANDARD_DOMAIN

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


def _position(text: str, offset: int) -> tuple[int, int]:
    before = text[:offset]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1


def check_expression(
    expression: str, source: str, field: str, published: Published
) -> list[Problem]:
    """Problems of one selector: syntax, and names the driver does not publish."""
    try:
        program = compile_expression(expression, DEVICE_VARIABLES)
    except CelCompileError as exc:
        return [Problem(source, field, str(exc), exc.line, exc.column)]
    problems: list[Problem] = []
    for match in _REFERENCE.finditer(expression):
        found = _reference_problem(match, expression, published)
        if found is not None:
            message, at = found
            problems.append(Problem(source, field, message, *_position(expression, at)))
    return problems or _errs_on_a_device(program, source, field, published.driver)


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


SAMPLE_NODES = ("builtin:dgx-a100-mig-mixed", "builtin:dgx1-v100", "builtin:rtx4090")


@functools.cache
def _sample_devices(driver: str) -> tuple[tuple[str, Any], ...]:
    """``(label, CEL device)`` for every device the driver would publish on a few built-in
    nodes: whole GPUs, MIG devices, NVLink and PCIe machines."""
    from cdigen.discover import load_node
    from policies.cel.values import view_value
    from policies.device_view import device_views

    out = []
    for source in SAMPLE_NODES:
        for view in device_views(load_node(source), mig_strategy="mixed"):
            out.append((f"{view.name} of {source}", view_value(view, (driver,))))
    return tuple(out)


def _errs_on_a_device(program: Any, source: str, field: str, driver: str) -> list[Problem]:
    """A warning when the selector errs on one of the sample devices: in a cluster, a CEL error
    on any device fails the whole claim (guard attributes some devices lack with has())."""
    from policies.cel import CelEvaluationError

    for label, device in _sample_devices(driver):
        try:
            program.evaluate({"device": device})
        except CelEvaluationError as exc:
            return [
                Problem(
                    source,
                    field,
                    f"errs on device {label} ({exc}): a CEL error on any device fails the whole "
                    "claim in Kubernetes; guard attributes some devices lack with has(...)",
                    warning=True,
                )
            ]
    return []


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
    from cdigen.schemas import schema_errors

    problems: list[Problem] = []
    for n, entry in enumerate(entries if isinstance(entries, list) else ()):
        opaque = (entry or {}).get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != published.driver:
            continue
        for problem in schema_errors(opaque.get("parameters"), "dra-gpu-config"):
            path, _, why = problem.partition(": ")
            where = f"{field}[{n}].opaque.parameters"
            if path != "<root>":
                where += path if path.startswith("[") else f".{path}"
            problems.append(Problem(source, where, why))
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


def check_files(paths: Sequence[str | Path], published: Published) -> list[Problem]:
    """Problems of every claim, template and class in ``paths`` (InputError for a file that
    cannot be read or parsed)."""
    problems: list[Problem] = []
    for path in paths:
        for doc in read_claim_documents(path):
            problems += check_document(doc, str(path), published)
    return problems
