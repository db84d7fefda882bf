"""Limits on CEL expressions, as Kubernetes bounds CEL in the API server: size, nesting, an
estimated cost at compile time, and a cost and CPU-time meter at run time.

The limits are read at use (``limits.COST_LIMIT``), so that setting
``cdigen.policies.cel.COST_LIMIT`` (which the package forwards here) takes effect at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from lark import Token, Tree

from cdigen.policies.cel import comprehensions
from cdigen.policies.cel.errors import CelCompileError, line_column

MAX_EXPRESSION_BYTES = 10 * 1024
# Limits, as Kubernetes bounds CEL in the API server (DRA selectors: a cost of 1,000,000, 10 KiB).
COST_LIMIT = 1_000_000  # estimated at compile time over worst-case sizes, and counted at run time
MAX_NESTING = 32  # brackets, and operators, nested in one another
MAX_TREE_DEPTH = 250  # parse-tree levels: what the evaluator recurses through
EVAL_TIME_LIMIT_S = 0.25  # CPU time per evaluation: a backstop behind the cost limit
MAX_VALUE_LENGTH = 1 << 20  # characters or elements a function or + may build
# Worst-case sizes the cost estimate assumes: strings of device attributes, the devices and
# NUMA nodes of a set. Larger values are still bounded at run time by the limits above.
VALUE_SIZE_BOUND = 64


class LimitExceeded(Exception):
    """An evaluation ran past the cost or time limit (not a CEL error: nothing may catch it)."""


class Meter:
    """The cost counted and the deadline (CPU time of the evaluating thread, so that a busy
    machine preempting the thread does not count) of one evaluation."""

    __slots__ = ("cost", "deadline")

    def __init__(self, deadline: float) -> None:
        self.cost = 0
        self.deadline = deadline

    def tick(self) -> None:
        self.cost += 1
        if self.cost & 63 == 0:
            if self.cost > COST_LIMIT:
                raise LimitExceeded(f"the evaluation exceeds the cost limit ({COST_LIMIT})")
            if time.thread_time() > self.deadline:
                raise LimitExceeded(
                    "the evaluation took longer than the time limit "
                    f"({EVAL_TIME_LIMIT_S * 1000:.0f} ms of CPU, or the caller's deadline)"
                )


def position(node: Any) -> tuple[int | None, int | None]:
    meta = getattr(node, "meta", None)
    if meta is None or meta.empty:
        return None, None
    return meta.line, meta.column


def brackets(text: str) -> Iterator[tuple[int, str]]:
    """Each bracket of a CEL ``text`` outside string literals, with its offset: what the
    nesting limit counts and what the compiler's balance check reads."""
    quote, index = "", 0
    while index < len(text):
        char = text[index]
        if quote:
            if char == "\\":
                index += 1
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char in "([{)]}":
            yield index, char
        index += 1


def nesting_problem(text: str) -> CelCompileError | None:
    """Brackets nested deeper than MAX_NESTING (outside string literals), before parsing."""
    depth = 0
    for index, char in brackets(text):
        if char in "([{":
            depth += 1
            if depth > MAX_NESTING:
                line, column = line_column(text, index)
                return CelCompileError(
                    f"the expression is nested too deeply (more than {MAX_NESTING} levels "
                    "of brackets)",
                    line,
                    column,
                )
        else:
            depth -= 1
    return None


def check_depth(tree: Any) -> None:
    """CelCompileError if the parse tree is deeper than MAX_TREE_DEPTH (walked without
    recursion): long chains of operators or calls nest as deeply as brackets do."""
    stack: list[tuple[Any, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_TREE_DEPTH:
            line, column = position(node)
            raise CelCompileError(
                "the expression is nested too deeply (a chain of operators, calls or "
                f"brackets over {MAX_TREE_DEPTH} parse levels); split it or use cel.bind",
                line,
                column,
            )
        stack.extend((c, depth + 1) for c in node.children if isinstance(c, Tree))


_COMPREHENSIONS = comprehensions.NAMES
_STRING_TOKENS = {"STRING_LIT", "MLSTRING_LIT", "BYTES_LIT"}


@dataclass
class _Estimate:
    """Worst-case cost of a subtree, and a bound on the length of what it yields."""

    cost: int
    size: int


class _CostEstimator:
    """A static cost estimate in the manner of Kubernetes' CEL cost estimator: every step
    costs 1, a comprehension costs its body times the size of its range, string work costs
    a tenth per character; sizes are worst cases (VALUE_SIZE_BOUND for what the variables
    give). Recursion is safe: :func:`check_depth` ran first."""

    def __init__(self, variables: frozenset[str]) -> None:
        self.variables = variables
        self.costly: list[tuple[int, Any]] = []  # (cost, node), to point at the culprit

    def estimate(self, node: Any, scope: Mapping[str, int]) -> _Estimate:
        if isinstance(node, Token):
            size = len(node) if node.type in _STRING_TOKENS else 1
            return _Estimate(0, size)
        kind = node.data
        if kind == "ident":
            name = str(node.children[0])
            return _Estimate(1, scope.get(name, VALUE_SIZE_BOUND))
        if kind == "member_dot_arg":
            result = self._call(node, scope)
        else:
            parts = [self.estimate(c, scope) for c in node.children if isinstance(c, Tree | Token)]
            cost = 1 + sum(p.cost for p in parts)
            sizes = [p.size for p in parts] or [1]
            size = max(sizes)
            if kind == "addition" and len(parts) == 2:  # concatenation
                size = sum(sizes)
                cost += size // 10
            elif kind in ("list_lit", "map_lit", "exprlist", "mapinits"):
                size = max(size, len(parts))
                cost += len(parts)
            elif kind == "relation" and len(parts) == 2:
                cost += max(sizes) // 10 + (sizes[1] if "relation_in" in _kinds(node) else 0)
            elif kind == "member_index" or kind == "member_dot":
                size = max(sizes[0], VALUE_SIZE_BOUND) if kind == "member_dot" else sizes[0]
            result = _Estimate(cost, size)
        if result.cost > COST_LIMIT:
            self.costly.append((result.cost, node))
        return result

    def _call(self, node: Any, scope: Mapping[str, int]) -> _Estimate:
        target, name = node.children[0], str(node.children[1])
        args = list(node.children[2].children) if len(node.children) > 2 else []
        receiver = self.estimate(target, scope)
        if name in _COMPREHENSIONS and len(args) >= 2:
            idents = [t for t in args[0].iter_subtrees() if t.data == "ident"]
            inner = dict(scope)
            if idents:
                inner[str(idents[0].children[0])] = receiver.size
            body = [self.estimate(a, inner) for a in args[1:]]
            per_item = 1 + sum(b.cost for b in body)
            cost = receiver.cost + 1 + receiver.size * per_item
            size = receiver.size
            if name == "map":
                size = max(receiver.size, body[-1].size)
            elif name != "filter":
                size = 1
            return _Estimate(cost, size)
        parts = [self.estimate(a, scope) for a in args]
        cost = 1 + receiver.cost + sum(p.cost for p in parts)
        sizes = [p.size for p in parts]
        if name == "replace" and len(sizes) >= 2:
            size = receiver.size + (receiver.size + 1) * sizes[1]
            return _Estimate(cost + size // 10, size)
        if name in ("split", "lowerAscii", "upperAscii", "trim"):
            return _Estimate(cost + receiver.size // 10, receiver.size)
        if name in ("contains", "startsWith", "endsWith", "matches", "indexOf"):
            return _Estimate(cost + receiver.size * max(sizes or [1]) // 10, 1)
        return _Estimate(cost, max([receiver.size, *sizes]))


def _kinds(node: Any) -> set[str]:
    return {c.data for c in node.children if isinstance(c, Tree)}


def estimate_cost(tree: Any, variables: frozenset[str]) -> int:
    """The estimated worst-case cost; CelCompileError at the costliest innermost node when it
    exceeds COST_LIMIT."""
    estimator = _CostEstimator(variables)
    cost = estimator.estimate(tree, {}).cost
    if cost > COST_LIMIT:
        # the innermost positioned node over the limit (the first recorded, post-order)
        line, column = next(
            (position(n) for _, n in estimator.costly if position(n)[0] is not None),
            (None, None),
        )
        raise CelCompileError(
            f"too complex, exceeds cost limit (estimated cost {cost:,} > "
            f"{COST_LIMIT:,}, over worst-case sizes: strings and lists of "
            f"{VALUE_SIZE_BOUND}); simplify it or bound its comprehensions",
            line,
            column,
        )
    return cost
