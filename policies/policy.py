"""Policy files -> compiled :class:`Policy` objects (CEL compiled once, at load).

A policy file is YAML or JSON (``schemas/policy.schema.json``). ``check_policy_file`` reports
every problem (schema, CEL syntax and limits, trial evaluations on every GPU and on sets of
GPUs of every built-in sample node) with
the file, the field (``spec.selector``, ``spec.constraints[1]``) and the position in the
expression; ``load_policy`` raises the first one as an InputError.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from cdigen.errors import CheckFailed, InputError, first_of, shortened
from cdigen.fileio import parse_document, read_text
from cdigen.model import Gpu, Link, Node
from cdigen.schemas import schema_errors
from policies.cel import (
    FUNCTIONS,
    CelCompileError,
    CelEvaluationError,
    CelProgram,
    allocation_value,
    compile_expression,
    device_value,
)
from policies.graph import DEFAULT_LINK_WEIGHTS

log = logging.getLogger("cdigen.policy")

BUILTIN_NAMES = ("default", "single-numa", "pack", "spread")
# CPU time all trial evaluations of one policy file may take (a check, a plugin start, a reload)
TRIAL_BUDGET_S = 3.0
ReplicaPlacement = Literal["spread", "pack"]


@dataclass(frozen=True)
class Expression:
    """A compiled CEL expression and where it came from (``spec.selector``, ...)."""

    field: str
    program: CelProgram

    @property
    def text(self) -> str:
        """The CEL source."""
        return self.program.text


@dataclass(frozen=True, eq=False)
class Policy:
    """A loaded policy. Per-device selector results are cached per device state."""

    name: str
    source: str
    resource: str = "nvidia.com/gpu"
    selector: Expression | None = None
    constraints: tuple[Expression, ...] = ()
    link_weights: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_LINK_WEIGHTS))
    replicas: ReplicaPlacement = "spread"
    _selector_cache: dict[tuple[Gpu, str, str], tuple[bool, str | None]] = field(
        default_factory=dict, repr=False
    )

    def selector_result(self, gpu: Gpu, node: Node) -> tuple[bool, str | None]:
        """Whether ``gpu`` passes the selector, and why not (an error counts as not passing)."""
        if self.selector is None:
            return True, None
        key = (gpu, node.driver_version, node.cuda_driver_version)
        cached = self._selector_cache.get(key)
        if cached is not None:
            return cached
        try:
            passed = self.selector.program.evaluate({"device": device_value(gpu, node)})
            result = (passed, None if passed else "selector is false")
        except CelEvaluationError as exc:
            reason = f"selector error: {exc}"
            log.warning("policy %s: GPU %d treated as not matching: %s", self.name, gpu.index, exc)
            result = (False, reason)
        self._selector_cache[key] = result
        return result

    def constraint_facts(self) -> tuple[str, ...] | None:
        """The ``allocation`` facts the constraints read, sorted, when they read nothing else
        (their results then depend on those facts alone), else None."""
        fields: set[str] = set()
        for expression in self.constraints:
            used = expression.program.allocation_fields
            if used is None:
                return None
            fields |= used
        return tuple(sorted(fields))

    def constraints_result(self, allocation: Any) -> tuple[bool, str | None]:
        """Whether a candidate set (its CEL ``allocation`` value) satisfies every constraint."""
        ok, reason, _ = self.constraints_outcome(allocation)
        return ok, reason

    def constraints_outcome(
        self, allocation: Any, deadline: float | None = None
    ) -> tuple[bool, str | None, bool]:
        """:meth:`constraints_result` by ``deadline`` (``time.thread_time()``), and whether
        the result may be cached (not when an evaluation ran past a time limit)."""
        for expression in self.constraints:
            try:
                if not expression.program.evaluate({"allocation": allocation}, deadline):
                    return False, f"{expression.field} is false", True
            except CelEvaluationError as exc:
                log.warning("policy %s: %s failed: %s", self.name, expression.field, exc)
                return False, f"{expression.field} error: {exc}", not exc.over_limit
        return True, None, True


def _sample_node() -> Node:
    """Two A100s on one NUMA node with NV12 between them: what trial evaluations run on."""
    gpus = tuple(
        Gpu(
            index=i,
            minor=i,
            uuid=f"GPU-00000000-0000-0000-0000-00000000000{i}",
            name="NVIDIA A100-SXM4-80GB",
            architecture="Ampere",
            cuda_compute_capability="8.0",
            memory_bytes=80 * 2**30,
            pci_bus_id=f"0000:0{i + 7}:00.0",
            numa_node=0,
            brand="Nvidia",
        )
        for i in range(2)
    )
    return Node(
        gpus=gpus,
        links=(Link(0, 1, pcie=None, nvlinks=12),),
        driver_version="550.54.15",
        cuda_driver_version="12.4",
        name="sample",
    )


def _where(source: str, field_name: str, line: int | None, column: int | None) -> str:
    pos = f" (line {line}, column {column})" if line is not None and column is not None else ""
    return f"{source}: {field_name}{pos}"


def _excerpt(text: str, line: int | None, column: int | None) -> str:
    lines = text.splitlines() or [""]
    if line is None or column is None or not 1 <= line <= len(lines):
        snippet = " ".join(text.split())
        return shortened(snippet, 80)
    row = lines[line - 1]
    start = max(0, column - 1 - 30)
    return f"{row[start : column - 1]}>>>{row[column - 1 : column - 1 + 40]}"


def _compile_problems(
    doc: Mapping[str, Any], source: str
) -> tuple[list[str], Expression | None, list[Expression]]:
    spec = doc.get("spec") or {}
    problems: list[str] = []
    selector: Expression | None = None
    constraints: list[Expression] = []
    fields: list[tuple[str, str]] = []
    if "selector" in spec:
        fields.append(("spec.selector", spec["selector"]))
    fields.extend((f"spec.constraints[{i}]", t) for i, t in enumerate(spec.get("constraints", [])))
    for field_name, text in fields:
        variables = frozenset({"device"} if field_name == "spec.selector" else {"allocation"})
        try:
            program = compile_expression(text, variables)
        except CelCompileError as exc:
            problems.append(
                f"{_where(source, field_name, exc.line, exc.column)}: {exc}: "
                f"{_excerpt(text, exc.line, exc.column)}"
            )
            continue
        expression = Expression(field_name, program)
        if field_name == "spec.selector":
            selector = expression
        else:
            constraints.append(expression)
    return problems, selector, constraints


@lru_cache(maxsize=1)
def _trial_nodes() -> tuple[tuple[str, Node], ...]:
    """What trial evaluations run on: a sample A100 pair, then every built-in sample node."""
    from cdigen.discover.builtin import load_builtin, names

    builtins = ((f"builtin:{name} GPU {{gpu}}", load_builtin(name)) for name in names())
    return (("a sample A100", _sample_node()), *builtins)


def _trial_sets(size: int) -> list[tuple[int, ...]]:
    """Positions of the sets a constraint is tried on: every pair with GPU 0 (sizes and link
    kinds), then every larger prefix up to all the GPUs (every device, NUMA spans)."""
    sets: list[tuple[int, ...]] = [(0,)]
    sets.extend((0, j) for j in range(1, size))
    sets.extend(tuple(range(k)) for k in range(3, size + 1))
    return sets


def _trial_problems(
    source: str,
    selector: Expression | None,
    constraints: Sequence[Expression],
    link_weights: Mapping[str, int],
) -> list[str]:
    """Evaluate each expression on every GPU (selector) and on sets of GPUs (constraints) of
    every sample node, as a type check: a type error hidden behind ``&&`` on one node shows on
    another. The first error of each expression is a problem."""
    from policies.graph import build_topology

    deadline = time.thread_time() + TRIAL_BUDGET_S  # a check, a start, a reload: all bounded
    failed: dict[str, str] = {}
    tried: set[tuple[str, ...]] = set()
    for label, node in _trial_nodes():
        gpus = [g for g in node.gpus if not g.error]
        devices = [device_value(g, node) for g in gpus]
        if selector is not None and selector.field not in failed:
            for gpu, device in zip(gpus, devices, strict=True):
                problem = _trial(source, selector, {"device": device}, label, gpu.index, deadline)
                if problem:
                    failed[selector.field] = problem
                    break
        pending = [c for c in constraints if c.field not in failed]
        if not pending or not gpus:
            continue
        topology = build_topology(node, link_weights)
        position = {g.index: topology.position_by_index[g.index] for g in gpus}
        for chosen in _trial_sets(len(gpus)):
            positions = tuple(position[gpus[i].index] for i in chosen)
            numa = topology.numa_nodes(positions)
            score = topology.set_score(positions)
            min_pair = topology.min_pair_nvlinks(positions)
            facts = {"numaNodes": numa, "size": len(chosen), "linkScore": score}
            facts["minPairNVLinks"] = min_pair
            allocation = allocation_value([devices[i] for i in chosen], numa, score, min_pair)
            for expression in pending:
                if expression.field in failed:
                    continue
                fields = expression.program.allocation_fields
                if fields is None and 3 <= len(chosen) < len(gpus) and len(chosen) % 4:
                    continue  # reads the devices: sets of 3, 4, 8, 12, ... and all suffice
                if fields is not None:  # its result depends on these facts alone
                    key = (expression.field, *(repr(facts[f]) for f in sorted(fields)))
                    if key in tried:
                        continue
                    tried.add(key)
                where = ",".join(str(gpus[i].index) for i in chosen)
                activation = {"allocation": allocation}
                problem = _trial(source, expression, activation, label, where, deadline)
                if problem:
                    failed[expression.field] = problem
    order = [e.field for e in ([selector] if selector else []) + list(constraints)]
    return [failed[f] for f in order if f in failed]


_NO_KEY = re.compile(r"^no attribute '([^']*)' in that domain \(guard with has\(\.\.\.\)\)$")
_UNDECLARED = re.compile(r"^undeclared reference to '([^']*)'$")
_ALLOCATION_FIELD = re.compile(r"\ballocation\s*\.\s*$")
_DOMAIN_FIELD = re.compile(r'\.\s*(attributes|capacity)\s*\[\s*"([^"]*)"\s*\]\s*\.\s*$')


def _function_names() -> frozenset[str]:
    """The functions and macros a policy may call (for did-you-mean)."""
    from celpy.evaluation import base_functions

    names = {*FUNCTIONS, *base_functions, "has", "all", "exists", "exists_one", "map", "filter"}
    return frozenset(n for n in names if n.isidentifier())


def _plain_message(exc: CelEvaluationError, text: str, activation: Mapping[str, Any]) -> str:
    """The evaluation error as ``dra check`` says it: a missing name with the names there are
    and a did-you-mean, where cel-python only says ``no attribute 'x' in that domain``."""
    from policies.dra.check import did_you_mean

    message = str(exc)
    lines = text.splitlines()
    before = ""
    if exc.line is not None and exc.column is not None and 1 <= exc.line <= len(lines):
        before = lines[exc.line - 1][: exc.column - 1]
    missing = _NO_KEY.match(message)
    if missing is not None:
        name = missing.group(1)
        if _ALLOCATION_FIELD.search(before) and "allocation" in activation:
            fields = sorted(str(k) for k in activation["allocation"])
            return (
                f"allocation has no field {name!r}{did_you_mean(name, fields)}; its fields: "
                f"{', '.join(fields)}"
            )
        domain_field = _DOMAIN_FIELD.search(before)
        if domain_field is None:
            return message
        what, domain = domain_field.groups()
        try:  # the device in the activation (a constraint's: the first of the set)
            device = activation.get("device") or activation["allocation"]["devices"][0]
            names = sorted(str(k) for k in device[what][domain])
        except (AttributeError, IndexError, KeyError, TypeError):  # not a device's name
            return message
        kind = "attribute" if what == "attributes" else "capacity"
        hint = did_you_mean(name, names) or " (guard with has(...) where a device may lack it)"
        return f"no {kind} {name!r} in {domain}{hint}"
    undeclared = _UNDECLARED.match(message)
    if undeclared is not None:
        hint = did_you_mean(undeclared.group(1), _function_names())
        return message + hint if hint else message
    return message


def _trial(
    source: str,
    expression: Expression,
    activation: dict[str, Any],
    label: str,
    gpus: object,
    deadline: float,
) -> str | None:
    try:
        expression.program.evaluate(activation, deadline)
    except CelEvaluationError as exc:
        on = label.format(gpu=gpus) if "{gpu}" in label else label
        if "{gpu}" in label and expression.field != "spec.selector":
            on = on.replace(" GPU ", " GPUs ")
        if exc.over_limit and time.thread_time() >= deadline:
            return (
                f"{_where(source, expression.field, 1, 1)}: its trial evaluations on the sample "
                f"nodes took over {TRIAL_BUDGET_S:.0f} s of CPU (stopped on {on}); simplify it: "
                f"{_excerpt(expression.text, None, None)}"
            )
        return (
            f"{_where(source, expression.field, exc.line, exc.column)}: "
            f"{_plain_message(exc, expression.text, activation)} "
            f"(trial evaluation on {on}): {_excerpt(expression.text, exc.line, exc.column)}"
        )
    return None


def _parse(text: str, source: str) -> tuple[list[str], Policy | None]:
    try:
        doc = parse_document(text, where=source)
    except InputError as exc:
        return [str(exc)], None
    problems = [f"{source}: {p}" for p in schema_errors(doc, "policy")]
    if problems:
        return problems, None
    compile_problems, selector, constraints = _compile_problems(doc, source)
    problems.extend(compile_problems)
    spec = doc.get("spec") or {}
    weights = dict(DEFAULT_LINK_WEIGHTS)
    weights.update(spec.get("linkWeights") or {})
    problems.extend(_trial_problems(source, selector, constraints, weights))
    if problems:
        return problems, None
    policy = Policy(
        name=doc["metadata"]["name"],
        source=source,
        resource=spec.get("resource", "nvidia.com/gpu"),
        selector=selector,
        constraints=tuple(constraints),
        link_weights=weights,
        replicas=spec.get("replicas", "spread"),
    )
    return [], policy


def check_policy_file(path: str | Path) -> list[str]:
    """Every problem of the policy file at ``path`` (empty when it is good)."""
    try:
        text = read_text(path, what="policy file")
    except InputError as exc:
        return [str(exc)]
    return _parse(text, str(path))[0]


def builtin_policy_name(name: str) -> str | None:
    """The built-in policy ``name`` refers to, written ``builtin:NAME`` or bare; else None."""
    bare = name.removeprefix("builtin:")
    return bare if bare in BUILTIN_NAMES else None


def load_policy(path: str | Path) -> Policy:
    """Load and compile a policy file, or a built-in (``builtin:NAME``, or a bare built-in name
    when no such file exists); InputError (exit 2) naming the first problem."""
    source = str(path)
    if source.startswith("builtin:"):
        return builtin_policy(source.removeprefix("builtin:"))
    builtin = builtin_policy_name(source)
    if builtin is not None and not Path(source).exists():
        return builtin_policy(builtin)
    problems, policy = _parse(read_text(path, what="policy file"), source)
    if policy is None:
        raise InputError(
            first_of(problems), hint=f"run 'cdigen policy check {source}' for all problems"
        )
    return policy


@cache
def builtin_policy(name: str) -> Policy:
    """One of the shipped policies: default, single-numa, pack, spread (parsed and checked once
    per process: they are package data, and every new layout asks for them)."""
    if name not in BUILTIN_NAMES:
        raise InputError(
            f"unknown built-in policy {name!r}", hint=f"choose one of {', '.join(BUILTIN_NAMES)}"
        )
    text = resources.files("policies").joinpath("builtin", f"{name}.yaml").read_text("utf-8")
    problems, policy = _parse(text, f"builtin:{name}")
    if policy is None:  # a packaging bug, not user input
        raise CheckFailed(problems, summary=f"built-in policy {name} is broken")
    return policy
