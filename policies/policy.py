"""Policy files -> compiled :class:`Policy` objects (CEL compiled once, at load).

A policy file is YAML or JSON (``schemas/policy.schema.json``). ``check_policy_file`` reports
every problem (schema, CEL syntax and limits, trial evaluations on every GPU and on sets of
GPUs of every built-in sample node: :mod:`cdigen.policies.policy_trial`) with the file, the field
(``spec.selector``, ``spec.constraints[1]``) and the position in the expression;
``load_policy`` raises the first one as an InputError.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from cdigen.constants import GPU_RESOURCE
from cdigen.errors import CheckFailed, InputError, first_of
from cdigen.fileio import parse_document, read_text
from cdigen.model import Gpu, Node
from cdigen.policies.expression import Expression
from cdigen.policies.graph import DEFAULT_LINK_WEIGHTS
from cdigen.policies.policy_trial import excerpt, trial_problems, where_in
from cdigen.schemas import schema_errors

log = logging.getLogger("cdigen.policy")

BUILTIN_NAMES = ("default", "single-numa", "pack", "spread")
ReplicaPlacement = Literal["spread", "pack"]


@dataclass(frozen=True, eq=False)
class Policy:
    """A loaded policy. Per-device selector results are cached per device state."""

    name: str
    source: str
    resource: str = GPU_RESOURCE
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
        from cdigen.policies.cel import CelEvaluationError, device_value

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
        if not self.constraints:
            return True, None, True
        from cdigen.policies.cel import CelEvaluationError

        for expression in self.constraints:
            try:
                if not expression.program.evaluate({"allocation": allocation}, deadline):
                    return False, f"{expression.field} is false", True
            except CelEvaluationError as exc:
                log.warning("policy %s: %s failed: %s", self.name, expression.field, exc)
                return False, f"{expression.field} error: {exc}", not exc.over_limit
        return True, None, True


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
        # the CEL engine is imported for a policy with expressions only (start-up time)
        from cdigen.policies.cel import CelCompileError, compile_expression

        variables = frozenset({"device"} if field_name == "spec.selector" else {"allocation"})
        try:
            program = compile_expression(text, variables)
        except CelCompileError as exc:
            problems.append(
                f"{where_in(source, field_name, exc.line, exc.column)}: {exc}: "
                f"{excerpt(text, exc.line, exc.column)}"
            )
            continue
        expression = Expression(field_name, program)
        if field_name == "spec.selector":
            selector = expression
        else:
            constraints.append(expression)
    return problems, selector, constraints


def _parse(text: str, source: str, *, schema: bool = True) -> tuple[list[str], Policy | None]:
    try:
        doc = parse_document(text, where=source)
    except InputError as exc:
        return [str(exc)], None
    problems = [f"{source}: {p}" for p in schema_errors(doc, "policy")] if schema else []
    if problems:
        return problems, None
    compile_problems, selector, constraints = _compile_problems(doc, source)
    problems.extend(compile_problems)
    spec = doc.get("spec") or {}
    weights = dict(DEFAULT_LINK_WEIGHTS)
    weights.update(spec.get("linkWeights") or {})
    problems.extend(trial_problems(source, selector, constraints, weights))
    if problems:
        return problems, None
    policy = Policy(
        name=doc["metadata"]["name"],
        source=source,
        resource=spec.get("resource", GPU_RESOURCE),
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
    # this module's package by its import name, whatever the wheel installs it as
    package = __name__.rpartition(".")[0]
    text = resources.files(package).joinpath("builtin", f"{name}.yaml").read_text("utf-8")
    # Not checked against the schema here: jsonschema's import is a fifth of the plugin's
    # start-up, and the shipped files are checked by the tests (test_startup_imports).
    problems, policy = _parse(text, f"builtin:{name}", schema=False)
    if policy is None:  # a packaging bug, not user input
        raise CheckFailed(problems, summary=f"built-in policy {name} is broken")
    return policy
