"""Trial evaluations of a policy's CEL: each expression is evaluated on every GPU (selector)
and on sets of GPUs (constraints) of a sample A100 pair and every built-in node, within
``TRIAL_BUDGET_S`` of CPU, as a type check; its errors become problem lines naming the file,
the field and the position in the expression, with a did-you-mean."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from cdigen.errors import shortened
from cdigen.model import Gpu, Link, Node

if TYPE_CHECKING:
    from cdigen.policies.cel import CelEvaluationError
    from cdigen.policies.expression import Expression

# CPU time all trial evaluations of one policy file may take (a check, a plugin start, a reload)
TRIAL_BUDGET_S = 3.0


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


def where_in(source: str, field_name: str, line: int | None, column: int | None) -> str:
    pos = f" (line {line}, column {column})" if line is not None and column is not None else ""
    return f"{source}: {field_name}{pos}"


def excerpt(text: str, line: int | None, column: int | None) -> str:
    lines = text.splitlines() or [""]
    if line is None or column is None or not 1 <= line <= len(lines):
        snippet = " ".join(text.split())
        return shortened(snippet, 80)
    row = lines[line - 1]
    start = max(0, column - 1 - 30)
    return f"{row[start : column - 1]}>>>{row[column - 1 : column - 1 + 40]}"


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


def trial_problems(
    source: str,
    selector: Expression | None,
    constraints: Sequence[Expression],
    link_weights: Mapping[str, int],
) -> list[str]:
    """Evaluate each expression on every GPU (selector) and on sets of GPUs (constraints) of
    every sample node, as a type check: a type error hidden behind ``&&`` on one node shows on
    another. The first error of each expression is a problem."""
    if selector is None and not constraints:  # nothing to try (and no CEL engine to import)
        return []
    from cdigen.policies.cel import allocation_value, device_value
    from cdigen.policies.graph import build_topology

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

    from cdigen.policies.cel import FUNCTIONS

    names = {*FUNCTIONS, *base_functions, "has", "all", "exists", "exists_one", "map", "filter"}
    return frozenset(n for n in names if n.isidentifier())


def _plain_message(exc: CelEvaluationError, text: str, activation: Mapping[str, Any]) -> str:
    """The evaluation error as ``dra check`` says it: a missing name with the names there are
    and a did-you-mean, where cel-python only says ``no attribute 'x' in that domain``."""
    from cdigen.policies.dra.check import did_you_mean

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
    from cdigen.policies.cel import CelEvaluationError

    try:
        expression.program.evaluate(activation, deadline)
    except CelEvaluationError as exc:
        on = label.format(gpu=gpus) if "{gpu}" in label else label
        if "{gpu}" in label and expression.field != "spec.selector":
            on = on.replace(" GPU ", " GPUs ")
        if exc.over_limit and time.thread_time() >= deadline:
            return (
                f"{where_in(source, expression.field, 1, 1)}: its trial evaluations on the sample "
                f"nodes took over {TRIAL_BUDGET_S:.0f} s of CPU (stopped on {on}); simplify it: "
                f"{excerpt(expression.text, None, None)}"
            )
        return (
            f"{where_in(source, expression.field, exc.line, exc.column)}: "
            f"{_plain_message(exc, expression.text, activation)} "
            f"(trial evaluation on {on}): {excerpt(expression.text, exc.line, exc.column)}"
        )
    return None
