"""Compiling a CEL expression once: parse, check, rewrite ``cel.bind``, estimate its cost, and
bind it to a runner that meters every evaluation."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import celpy
from celpy import InterpretedRunner, celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, Evaluator
from lark import Token, Tree

import cdigen.policies.cel.limits as limits
from cdigen.policies.cel import comprehensions
from cdigen.policies.cel.cel_types import DEVICE, DYN, TYPE_NAMES, CelType
from cdigen.policies.cel.errors import (
    CelCompileError,
    CelEvaluationError,
    line_column,
    runtime_error,
    type_name,
)
from cdigen.policies.cel.library import FUNCTIONS
from cdigen.policies.cel.optional import OPTIONAL_FUNCTIONS, select
from cdigen.policies.cel.parser import parse
from cdigen.policies.cel.typecheck import check_types

_ENVIRONMENT: Any = None
_LITERAL_ZERO: Any = None


def _environment() -> Any:
    global _ENVIRONMENT, _LITERAL_ZERO
    if _ENVIRONMENT is None:
        _LITERAL_ZERO = parse("0")  # first: celpy.Environment then takes our parser
        _ENVIRONMENT = celpy.Environment()
    return _ENVIRONMENT


def _rewrite_bind(tree: Any) -> None:
    """Rewrite ``cel.bind(x, v, body)`` in place as ``[v].map(x, body)[0]`` (same semantics)."""
    for node in list(tree.iter_subtrees()):
        if node.data != "member":
            continue
        for index, child in enumerate(node.children):
            if not (isinstance(child, Tree) and child.data == "member_dot_arg"):
                continue
            target, name = child.children[0], child.children[1]
            if str(name) != "bind" or len(child.children) < 3:
                continue
            receiver = target.children[0] if target.children else None
            if not (
                isinstance(receiver, Tree)
                and receiver.data == "primary"
                and isinstance(receiver.children[0], Tree)
                and receiver.children[0].data == "ident"
                and str(receiver.children[0].children[0]) == "cel"
            ):
                continue
            args = child.children[2].children
            if len(args) != 3:
                raise CelCompileError(
                    "cel.bind needs 3 arguments: name, value, body",
                    child.meta.line if not child.meta.empty else None,
                    child.meta.column if not child.meta.empty else None,
                )
            var, value, body = args
            listed = Tree(
                "member", [Tree("primary", [Tree("list_lit", [Tree("exprlist", [value])])])]
            )
            mapped = Tree(
                "member_dot_arg",
                [listed, Token("IDENT", "map"), Tree("exprlist", [var, body])],
                meta=child.meta,
            )
            node.children[index] = Tree(
                "member_index", [Tree("member", [mapped]), _LITERAL_ZERO], meta=child.meta
            )


class _BoundedEvaluator(Evaluator):
    """celpy's evaluator, counting each step against a ``limits.Meter`` (macros included),
    with CEL's optional selection (``m.?name``, ``m[?key]``; the parser makes a selection
    through an optional one of these)."""

    def __init__(self, ast: Any, activation: Any, meter: limits.Meter) -> None:
        super().__init__(ast, activation)
        self.meter = meter

    def sub_evaluator(self, ast: Any) -> Evaluator:
        return _BoundedEvaluator(ast, self.activation, self.meter)

    def visit(self, tree: Any) -> Any:
        self.meter.tick()
        return super().visit(tree)

    def visit_children(self, tree: Any) -> Any:
        self.meter.tick()
        return super().visit_children(tree)

    def member_dot_arg(self, tree: Any) -> Any:
        """Comprehensions as cel-go runs them (:mod:`cdigen.policies.cel.comprehensions`); other
        methods as cel-python does."""
        name = str(tree.children[1])
        args = list(tree.children[2].children) if len(tree.children) > 2 else []
        names = comprehensions.variables(name, args) if name in comprehensions.NAMES else None
        if names is None:
            return super().member_dot_arg(tree)
        target = self.visit(tree.children[0])
        bodies = [self._body(arg) for arg in args[len(names) :]]
        return comprehensions.run(name, target, names, bodies)

    def _body(self, tree: Any) -> Any:
        """A comprehension's body: its value (an error as a value) with its variables bound."""
        nested = self.sub_evaluator(tree)

        def evaluate(scope: dict[str, Any]) -> Any:
            nested.set_activation(scope)
            return nested.visit(nested.ast)

        return evaluate

    def member_dot_opt(self, tree: Any) -> Any:
        target, name = tree.children
        return select(self.visit(target), celtypes.StringType(name))

    def member_index_opt(self, tree: Any) -> Any:
        target, key = self.visit_children(tree)
        return select(target, key)


class _BoundedRunner(InterpretedRunner):
    """Each evaluation gets a fresh meter: the cost limit and ``EVAL_TIME_LIMIT_S``, or an
    earlier ``deadline`` (``time.thread_time()``) of the caller."""

    def evaluate(self, context: Any, deadline: float | None = None) -> Any:
        own = time.thread_time() + limits.EVAL_TIME_LIMIT_S
        meter = limits.Meter(own if deadline is None else min(own, deadline))
        return _BoundedEvaluator(self.ast, self.new_activation(), meter).evaluate(context)


@dataclass(frozen=True)
class CelProgram:
    """One compiled expression; ``evaluate`` returns its bool or raises CelEvaluationError.

    ``allocation_fields``: the ``allocation.<name>`` facts the expression reads, when it reads
    ``allocation`` only that way (then its result depends on those facts alone), else None.
    """

    text: str
    program: Any
    cost: int = 0
    allocation_fields: frozenset[str] | None = None

    def evaluate(self, activation: Mapping[str, Any], deadline: float | None = None) -> bool:
        """Evaluate against ``activation`` (e.g. ``{"device": device_value(...)}``), within
        the cost and time limits, and by ``deadline`` (``time.thread_time()``) if given."""
        try:
            result = self.program.evaluate(dict(activation), deadline)
        except CELEvalError as exc:
            raise runtime_error(exc) from None
        except limits.LimitExceeded as exc:
            raise CelEvaluationError(str(exc), 1, 1, over_limit=True) from None
        except RecursionError:
            raise CelEvaluationError("the expression is nested too deeply", 1, 1) from None
        except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError) as exc:
            raise CelEvaluationError(str(exc)[:200]) from None
        if isinstance(result, CELEvalError):
            raise runtime_error(result)
        if not isinstance(result, celtypes.BoolType):
            raise CelEvaluationError(
                f"the expression must return a bool, it returned {type_name(result)}", 1, 1
            )
        return bool(result)


_MACROS = {*comprehensions.NAMES, "bind"}


def _check_identifiers(tree: Any, variables: frozenset[str]) -> None:
    """Reject identifiers that are neither ``variables`` nor bound by a macro (``all(d, ...)``)."""
    bound = {"cel", *TYPE_NAMES}
    for node in tree.iter_subtrees():
        if node.data == "member_dot_arg" and str(node.children[1]) in _MACROS:
            args = node.children[2].children if len(node.children) > 2 else []
            # the variable, and a second one of a two-variable comprehension (all(k, v, p))
            for arg in args[: 2 if len(args) > 2 else 1]:
                idents = [t for t in arg.iter_subtrees() if t.data == "ident"]
                if idents:
                    bound.add(str(idents[0].children[0]))
    for node in tree.iter_subtrees_topdown():
        if isinstance(node, Tree) and node.data == "ident":
            token = node.children[0]
            name = str(token)
            if name not in variables and name not in bound:
                known = " or ".join(f"'{v}'" for v in sorted(variables))
                raise CelCompileError(
                    f"undeclared reference to {name!r} (in container ''); this field can use "
                    f"{known}",
                    getattr(token, "line", None),
                    getattr(token, "column", None),
                )


ALLOCATION_FACTS = frozenset({"numaNodes", "size", "linkScore", "minPairNVLinks"})


def _allocation_fields(tree: Any) -> frozenset[str] | None:
    """The facts read as ``allocation.<fact>``, or None when ``allocation`` is used otherwise
    (its devices, indexing, a macro variable of that name)."""
    fields: set[str] = set()
    plain = 0
    for node in tree.iter_subtrees():
        if node.data == "ident" and str(node.children[0]) == "allocation":
            plain += 1
        if node.data == "member_dot" and len(node.children) == 2:
            inner = node.children[0]
            if (
                isinstance(inner, Tree)
                and inner.data == "member"
                and isinstance(inner.children[0], Tree)
                and inner.children[0].data == "primary"
                and isinstance(inner.children[0].children[0], Tree)
                and inner.children[0].children[0].data == "ident"
                and str(inner.children[0].children[0].children[0]) == "allocation"
            ):
                fields.add(str(node.children[1]))
                plain -= 1
        if node.data == "member_dot_arg" and str(node.children[1]) in _MACROS:
            args = node.children[2].children if len(node.children) > 2 else []
            if args and any(
                t.data == "ident" and str(t.children[0]) == "allocation"
                for t in args[0].iter_subtrees()
            ):
                return None
    if plain != 0 or not fields <= ALLOCATION_FACTS:
        return None
    return frozenset(fields)


_CLOSER = {"(": ")", "[": "]", "{": "}"}


def bracket_problem(text: str) -> CelCompileError | None:
    """The first unbalanced bracket outside string literals, said plainly (the parser only says
    where it gave up, often the end of the text); None when they balance."""
    opened: list[tuple[str, int]] = []
    for index, char in limits.brackets(text):
        if char in _CLOSER:
            opened.append((char, index))
            continue
        line, column = line_column(text, index)
        if not opened:
            return CelCompileError(f"syntax error: {char!r} closes nothing", line, column)
        opener, at = opened.pop()
        if _CLOSER[opener] != char:
            where = line_column(text, at)
            return CelCompileError(
                f"syntax error: {char!r} where {_CLOSER[opener]!r} should close the "
                f"{opener!r} at line {where[0]}, column {where[1]}",
                line,
                column,
            )
    if opened:
        opener, at = opened[-1]
        line, column = line_column(text, at)
        return CelCompileError(
            f"syntax error: missing {_CLOSER[opener]!r} to close this {opener!r}", line, column
        )
    return None


def _declared(variables: frozenset[str]) -> dict[str, CelType]:
    """The declared type of each variable: ``device`` as Kubernetes declares it for DRA
    selectors; the others (``allocation``) of unknown type, checked when evaluated."""
    return {name: DEVICE if name == "device" else DYN for name in variables}


def compile_expression(
    text: str, variables: frozenset[str] = frozenset({"device", "allocation"})
) -> CelProgram:
    """Parse, check and bind ``text`` once; CelCompileError with the position of a syntax
    error, of an identifier outside ``variables``, of what the API server's type check refuses
    (:mod:`cdigen.policies.cel.typecheck`: overloads, fields, literals, RE2 patterns, format calls,
    a result that is not a bool), or of what breaks a limit: size (MAX_EXPRESSION_BYTES),
    nesting (MAX_NESTING, MAX_TREE_DEPTH) or estimated cost (COST_LIMIT)."""
    if len(text.encode()) > limits.MAX_EXPRESSION_BYTES:
        raise CelCompileError(  # the API server's words
            f"Too long: may not be more than {limits.MAX_EXPRESSION_BYTES} bytes", 1, 1
        )
    nesting = limits.nesting_problem(text)
    if nesting is not None:
        raise nesting
    env = _environment()
    try:
        ast = parse(text)
    except CELParseError as exc:
        unbalanced = bracket_problem(text)
        if unbalanced is not None:
            raise unbalanced from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "syntax error"
        raise CelCompileError(f"syntax error near {first[:80]!r}", exc.line, exc.column) from None
    except RecursionError:
        raise CelCompileError("the expression is nested too deeply", 1, 1) from None
    except (ValueError, OverflowError) as exc:  # e.g. an int literal of 5,000 digits
        raise CelCompileError(f"bad literal: {str(exc)[:120]}", 1, 1) from None
    limits.check_depth(ast)
    _check_identifiers(ast, variables)
    _rewrite_bind(ast)
    limits.check_depth(ast)
    check_types(ast, text, _declared(variables))
    cost = limits.estimate_cost(ast, variables)
    return CelProgram(
        text=text,
        program=_BoundedRunner(env, ast, {**FUNCTIONS, **OPTIONAL_FUNCTIONS}),
        cost=cost,
        allocation_fields=_allocation_fields(ast) if "allocation" in variables else None,
    )
