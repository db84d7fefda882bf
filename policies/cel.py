"""The CEL environment of policies, in the Kubernetes DRA dialect, on top of cel-python.

- ``device``: ``driver``, ``attributes[domain][name]``, ``capacity[domain][name]`` (a Quantity).
  An unknown domain is an empty map; an unknown name inside a domain is an evaluation error.
- ``allocation`` (set constraints only): ``devices`` (device maps), ``numaNodes``, ``size``,
  ``linkScore``, ``minPairNVLinks``.
- Extensions as in Kubernetes: ``quantity()``, ``isQuantity()``, ``semver()``, ``isSemver()``,
  ``compareTo``/``isGreaterThan``/``isLessThan``, ``asInteger``/``asApproximateFloat``/``add``/
  ``sub``, ``major``/``minor``/``patch``, ``lowerAscii``/``split``/``replace``, ``cel.bind``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import total_ordering
from typing import Any

import celpy
from celpy import InterpretedRunner, celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, Evaluator

from cdigen.model import Gpu, Node

DRIVER = "gpu.nvidia.com"
KUBERNETES_DOMAIN = "resource.kubernetes.io"
CDIGEN_DOMAIN = "cdigen.dev"
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

# --------------------------------------------------------------------------- quantities

_BINARY_SUFFIXES = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL_SUFFIXES = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_QUANTITY_RE = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([a-zA-Z]*|[eE][+-]?[0-9]+)$")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def parse_quantity(text: str) -> Fraction:
    """The value of a Kubernetes quantity string (``"40Gi"``, ``"1.5"``, ``"100m"``).

    Raises ValueError on anything Kubernetes' ``resource.ParseQuantity`` would reject, and on
    more than 64 digits.
    Bounded as Kubernetes bounds it: the exponent of ``1e<n>`` must fit an int32; a non-zero
    value is rounded up (away from zero) to a multiple of 1n; a magnitude above 2^63-1 is capped
    there (Kubernetes caps binary quantities so; it also keeps ``1e99999999`` from costing
    a 330-million-bit number here).
    """
    shown = text if len(text) <= 40 else text[:37] + "..."
    match = _QUANTITY_RE.match(text.strip()) if text.strip() == text else None
    if match is None:
        raise ValueError(f"invalid quantity {shown!r}")
    digits, suffix = match.group(1), match.group(2)
    if len(digits) > 64:
        raise ValueError(f"invalid quantity {shown!r}: more than 64 digits")
    number = Fraction(digits)
    if suffix in _BINARY_SUFFIXES:
        return _bounded(number * Fraction(1024) ** _BINARY_SUFFIXES[suffix])
    if suffix in _DECIMAL_SUFFIXES:
        return _bounded(number * Fraction(10) ** _DECIMAL_SUFFIXES[suffix])
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        exponent_text = suffix[1:].lstrip("+-").lstrip("0") or "0"
        if len(exponent_text) > 10 or int(exponent_text) > 2**31 - 1:
            raise ValueError(f"invalid quantity {shown!r}: the exponent does not fit an int32")
        exponent = -int(exponent_text) if suffix[1] == "-" else int(exponent_text)
        if number == 0:
            return Fraction(0)
        sign = 1 if number > 0 else -1
        if exponent > 100:  # |number| >= 10^-64: the value is far above the cap
            return sign * Fraction(_INT64_MAX)
        if exponent < -100:  # |number| < 10^65: the value is far below 1n
            return sign * _NANO
        return _bounded(number * Fraction(10) ** exponent)
    raise ValueError(f"invalid quantity {shown!r}: unknown suffix {suffix!r}")


_NANO = Fraction(1, 10**9)


def _bounded(value: Fraction) -> Fraction:
    """Round a non-zero value up to a multiple of 1n (away from zero); cap it at 2^63-1."""
    if value == 0:
        return value
    sign = 1 if value > 0 else -1
    magnitude = abs(value)
    nanos = -((-magnitude.numerator * 10**9) // magnitude.denominator)  # ceil
    rounded = Fraction(nanos, 10**9)
    return sign * min(rounded, Fraction(_INT64_MAX))


class Quantity:
    """A Kubernetes resource.Quantity: exact; ``==`` compares values; ``<`` is not defined."""

    __slots__ = ("text", "value")

    def __init__(self, value: Fraction, text: str | None = None) -> None:
        self.value = value
        self.text = text if text is not None else _format_fraction(value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Quantity):
            return self.value == other.value
        raise TypeError(f"no such overload: quantity == {type(other).__name__}")

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"


def _format_fraction(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else str(float(value))


# --------------------------------------------------------------------------- semver

_SEMVER_RE = re.compile(
    r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z.-]+)?$"
)


@total_ordering
@dataclass(frozen=True)
class Semver:
    """A semantic version; comparisons follow semver precedence (build metadata ignored)."""

    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()

    def _key(self) -> tuple[Any, ...]:
        pre_key: tuple[Any, ...] = (
            (1,)
            if not self.pre
            else (0, *((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.pre))
        )
        return (self.major, self.minor, self.patch, pre_key)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            return NotImplemented
        return self._key() < other._key()

    def __str__(self) -> str:
        pre = f"-{'.'.join(self.pre)}" if self.pre else ""
        return f"{self.major}.{self.minor}.{self.patch}{pre}"


def parse_semver(text: str, normalize: bool = False) -> Semver:
    """Parse a strict semver; with ``normalize``, accept ``v1.2``, ``8.0`` and leading zeros."""
    candidate = text
    if normalize:
        candidate = candidate.strip().removeprefix("v")
        core, sep, rest = candidate.partition("-")
        if "+" in core:
            core, plus, build = core.partition("+")
            rest = rest or ""
            sep_build = plus + build
        else:
            sep_build = ""
        parts = core.split(".")
        if 1 <= len(parts) <= 3 and all(p.isdigit() for p in parts):
            parts = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
            candidate = ".".join(parts) + (sep + rest if sep else "") + sep_build
    match = _SEMVER_RE.match(candidate)
    if match is None:
        raise ValueError(f"invalid semver {text!r}")
    pre = tuple(match.group(4).split(".")) if match.group(4) else ()
    return Semver(int(match.group(1)), int(match.group(2)), int(match.group(3)), pre)


# --------------------------------------------------------------------------- CEL functions


def _err(message: str) -> CELEvalError:
    return CELEvalError(message, TypeError, None)


def _cel_quantity(text: Any) -> Any:
    if not isinstance(text, str):
        return _err(f"quantity() needs a string, got {type(text).__name__}")
    try:
        return Quantity(parse_quantity(str(text)), str(text))
    except ValueError as exc:
        return _err(str(exc))


def _cel_is_quantity(text: Any) -> Any:
    try:
        parse_quantity(str(text))
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(isinstance(text, str))


def _cel_semver(text: Any, normalize: Any = False) -> Any:
    if not isinstance(text, str):
        return _err(f"semver() needs a string, got {type(text).__name__}")
    try:
        return parse_semver(str(text), bool(normalize))
    except ValueError as exc:
        return _err(str(exc))


def _cel_is_semver(text: Any, normalize: Any = False) -> Any:
    try:
        parse_semver(str(text), bool(normalize))
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(isinstance(text, str))


def _compare(a: Any, b: Any) -> int | CELEvalError:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return (a.value > b.value) - (a.value < b.value)
    if isinstance(a, Semver) and isinstance(b, Semver):
        return (a > b) - (a < b)
    return _err(f"no such overload: {type(a).__name__}.compareTo({type(b).__name__})")


def _cel_compare_to(a: Any, b: Any) -> Any:
    result = _compare(a, b)
    return result if isinstance(result, CELEvalError) else celtypes.IntType(result)


def _cel_greater(a: Any, b: Any) -> Any:
    result = _compare(a, b)
    return result if isinstance(result, CELEvalError) else celtypes.BoolType(result > 0)


def _cel_less(a: Any, b: Any) -> Any:
    result = _compare(a, b)
    return result if isinstance(result, CELEvalError) else celtypes.BoolType(result < 0)


def _cel_as_integer(q: Any) -> Any:
    if not isinstance(q, Quantity):
        return _err(f"no such overload: {type(q).__name__}.asInteger()")
    if q.value.denominator != 1 or not _INT64_MIN <= q.value.numerator <= _INT64_MAX:
        return _err(f"quantity {q.text} is not an int64")
    return celtypes.IntType(q.value.numerator)


def _cel_as_float(q: Any) -> Any:
    if not isinstance(q, Quantity):
        return _err(f"no such overload: {type(q).__name__}.asApproximateFloat()")
    return celtypes.DoubleType(float(q.value))


def _arith(sign: int) -> Callable[[Any, Any], Any]:
    def apply(q: Any, other: Any) -> Any:
        if not isinstance(q, Quantity):
            return _err(f"no such overload: {type(q).__name__} arithmetic")
        if isinstance(other, Quantity):
            return Quantity(q.value + sign * other.value)
        if isinstance(other, int) and not isinstance(other, bool):
            return Quantity(q.value + sign * other)
        return _err(f"no such overload: quantity arithmetic with {type(other).__name__}")

    return apply


def _semver_part(name: str) -> Callable[[Any], Any]:
    def part(v: Any) -> Any:
        if not isinstance(v, Semver):
            return _err(f"no such overload: {type(v).__name__}.{name}()")
        return celtypes.IntType(getattr(v, name))

    return part


def _cel_lower_ascii(s: Any) -> Any:
    if not isinstance(s, str):
        return _err(f"no such overload: {type(s).__name__}.lowerAscii()")
    return celtypes.StringType("".join(c.lower() if c.isascii() else c for c in s))


def _cel_split(s: Any, sep: Any, limit: Any = -1) -> Any:
    if not isinstance(s, str) or not isinstance(sep, str):
        return _err("no such overload: split(string, string)")
    count = int(limit)
    if count == 0:
        return celtypes.ListType([])
    parts = str(s).split(str(sep), count - 1 if count > 0 else -1)
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def _cel_replace(s: Any, old: Any, new: Any, limit: Any = -1) -> Any:
    if not all(isinstance(x, str) for x in (s, old, new)):
        return _err("no such overload: replace(string, string, string)")
    count = len(s) + 1 if not old else s.count(old)
    if int(limit) >= 0:
        count = min(count, int(limit))
    if len(s) + count * (len(new) - len(old)) > MAX_VALUE_LENGTH:
        return _err(f"replace() would build a string over {MAX_VALUE_LENGTH} characters")
    return celtypes.StringType(str(s).replace(str(old), str(new), int(limit)))


def _cel_add(a: Any, b: Any) -> Any:
    if (
        isinstance(a, (str, list))
        and isinstance(b, (str, list))
        and len(a) + len(b) > MAX_VALUE_LENGTH
    ):
        return _err(f"+ would build a value over {MAX_VALUE_LENGTH} characters or elements")
    return a + b


FUNCTIONS: dict[str, Any] = {
    "quantity": _cel_quantity,
    "isQuantity": _cel_is_quantity,
    "semver": _cel_semver,
    "isSemver": _cel_is_semver,
    "compareTo": _cel_compare_to,
    "isGreaterThan": _cel_greater,
    "isLessThan": _cel_less,
    "asInteger": _cel_as_integer,
    "asApproximateFloat": _cel_as_float,
    "add": _arith(1),
    "sub": _arith(-1),
    "major": _semver_part("major"),
    "minor": _semver_part("minor"),
    "patch": _semver_part("patch"),
    "lowerAscii": _cel_lower_ascii,
    "split": _cel_split,
    "replace": _cel_replace,
    "_+_": _cel_add,
}

# --------------------------------------------------------------------------- compiling


class CelCompileError(Exception):
    """A CEL expression that does not parse; ``line``/``column`` are 1-based within it."""

    def __init__(self, message: str, line: int | None, column: int | None) -> None:
        super().__init__(message)
        self.line = line
        self.column = column


class CelEvaluationError(Exception):
    """A CEL expression failed at run time, or did not return a bool; ``over_limit``: it ran
    past the cost or time limit (the time limit depends on the machine: not worth caching)."""

    def __init__(
        self,
        message: str,
        line: int | None = None,
        column: int | None = None,
        over_limit: bool = False,
    ) -> None:
        super().__init__(message)
        self.line = line
        self.column = column
        self.over_limit = over_limit


_ENVIRONMENT: Any = None
_LITERAL_ZERO: Any = None


def _environment() -> Any:
    global _ENVIRONMENT, _LITERAL_ZERO
    if _ENVIRONMENT is None:
        _ENVIRONMENT = celpy.Environment()
        _LITERAL_ZERO = _ENVIRONMENT.compile("0")
    return _ENVIRONMENT


def _rewrite_bind(tree: Any) -> None:
    """Rewrite ``cel.bind(x, v, body)`` in place as ``[v].map(x, body)[0]`` (same semantics)."""
    from lark import Token, Tree

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


class _LimitExceeded(Exception):
    """An evaluation ran past the cost or time limit (not a CEL error: nothing may catch it)."""


class _Meter:
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
                raise _LimitExceeded(f"the evaluation exceeds the cost limit ({COST_LIMIT})")
            if time.thread_time() > self.deadline:
                raise _LimitExceeded(
                    "the evaluation took longer than the time limit "
                    f"({EVAL_TIME_LIMIT_S * 1000:.0f} ms of CPU, or the caller's deadline)"
                )


class _BoundedEvaluator(Evaluator):
    """celpy's evaluator, counting each step against a :class:`_Meter` (macros included)."""

    def __init__(self, ast: Any, activation: Any, meter: _Meter) -> None:
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


class _BoundedRunner(InterpretedRunner):
    """Each evaluation gets a fresh meter: the cost limit and ``EVAL_TIME_LIMIT_S``, or an
    earlier ``deadline`` (``time.thread_time()``) of the caller."""

    def evaluate(self, context: Any, deadline: float | None = None) -> Any:
        own = time.thread_time() + EVAL_TIME_LIMIT_S
        meter = _Meter(own if deadline is None else min(own, deadline))
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
            raise _runtime_error(self.text, exc) from None
        except _LimitExceeded as exc:
            raise CelEvaluationError(str(exc), 1, 1, over_limit=True) from None
        except RecursionError:
            raise CelEvaluationError("the expression is nested too deeply", 1, 1) from None
        except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError) as exc:
            raise CelEvaluationError(str(exc)[:200]) from None
        if isinstance(result, CELEvalError):
            raise _runtime_error(self.text, result)
        if not isinstance(result, celtypes.BoolType):
            raise CelEvaluationError(
                f"the expression must return a bool, it returned {_type_name(result)}", 1, 1
            )
        return bool(result)


def _type_name(value: Any) -> str:
    names = {
        celtypes.StringType: "string",
        celtypes.IntType: "int",
        celtypes.DoubleType: "double",
        celtypes.ListType: "list",
        celtypes.MapType: "map",
        Quantity: "quantity",
        Semver: "semver",
    }
    for cls, name in names.items():
        if isinstance(value, cls):
            return name
    return type(value).__name__


_NO_MEMBER_RE = re.compile(r"no such member in mapping: '([^']+)'")


def _runtime_error(text: str, exc: CELEvalError) -> CelEvaluationError:
    raw = exc.args[0] if exc.args else str(exc)
    message = str(raw)
    line, column = exc.line, exc.column
    missing = _NO_MEMBER_RE.search(message)
    if missing:
        name = missing.group(1)
        message = f"no attribute {name!r} in that domain (guard with has(...))"
        line, column = _position_of(text, "." + name)
        column = column + 1 if column is not None else None
    elif "no matching overload" in message:
        message = _overload_message(message)
    elif message.startswith("undeclared reference to"):
        message = message.split(" (in activation")[0]
    elif "no such overload" not in message and len(message) > 200:
        message = message[:200]
    return CelEvaluationError(message, line, column)


_OPERATORS = {
    "relation_gt": ">",
    "relation_ge": ">=",
    "relation_lt": "<",
    "relation_le": "<=",
    "relation_eq": "==",
    "relation_ne": "!=",
    "addition_add": "+",
    "addition_sub": "-",
    "multiplication_mul": "*",
    "multiplication_div": "/",
}
_CLASS_RE = re.compile(r"<class '[\w.]*\.(\w+)'>")
_TYPE_NAMES = {
    "Quantity": "quantity",
    "Semver": "semver",
    "IntType": "int",
    "UintType": "uint",
    "DoubleType": "double",
    "StringType": "string",
    "BoolType": "bool",
    "ListType": "list",
    "MapType": "map",
}


def _overload_message(message: str) -> str:
    operator = next((op for rule, op in _OPERATORS.items() if f"'{rule}'" in message), None)
    types = [_TYPE_NAMES.get(t, t) for t in _CLASS_RE.findall(message)]
    if operator and len(types) == 2:
        hint = " (compare quantities with compareTo)" if "quantity" in types else ""
        return f"no operator {operator} between {types[0]} and {types[1]}{hint}"
    return message if len(message) <= 200 else message[:200]


def _position_of(text: str, needle: str) -> tuple[int | None, int | None]:
    offset = text.find(needle)
    if offset < 0:
        return None, None
    before = text[:offset]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1


_MACROS = {"map", "filter", "all", "exists", "exists_one", "bind"}


def _check_identifiers(tree: Any, variables: frozenset[str]) -> None:
    """Reject identifiers that are neither ``variables`` nor bound by a macro (``all(d, ...)``)."""
    from lark import Tree

    bound = {"cel"}
    for node in tree.iter_subtrees():
        if node.data == "member_dot_arg" and str(node.children[1]) in _MACROS:
            args = node.children[2].children if len(node.children) > 2 else []
            if args:
                idents = [t for t in args[0].iter_subtrees() if t.data == "ident"]
                if idents:
                    bound.add(str(idents[0].children[0]))
    for node in tree.iter_subtrees_topdown():
        if isinstance(node, Tree) and node.data == "ident":
            token = node.children[0]
            name = str(token)
            if name not in variables and name not in bound:
                known = " or ".join(f"'{v}'" for v in sorted(variables))
                raise CelCompileError(
                    f"undeclared reference to {name!r} (this field can use {known})",
                    getattr(token, "line", None),
                    getattr(token, "column", None),
                )


def _position(node: Any) -> tuple[int | None, int | None]:
    meta = getattr(node, "meta", None)
    if meta is None or meta.empty:
        return None, None
    return meta.line, meta.column


def _nesting_problem(text: str) -> CelCompileError | None:
    """Brackets nested deeper than MAX_NESTING (outside string literals), before parsing."""
    depth, quote, index = 0, "", 0
    while index < len(text):
        char = text[index]
        if quote:
            if char == "\\":
                index += 1
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char in "([{":
            depth += 1
            if depth > MAX_NESTING:
                line, column = _offset_position(text, index)
                return CelCompileError(
                    f"the expression is nested too deeply (more than {MAX_NESTING} levels "
                    "of brackets)",
                    line,
                    column,
                )
        elif char in ")]}":
            depth -= 1
        index += 1
    return None


def _offset_position(text: str, offset: int) -> tuple[int, int]:
    before = text[:offset]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1


def _check_depth(tree: Any) -> None:
    """CelCompileError if the parse tree is deeper than MAX_TREE_DEPTH (walked without
    recursion): long chains of operators or calls nest as deeply as brackets do."""
    from lark import Tree

    stack: list[tuple[Any, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_TREE_DEPTH:
            line, column = _position(node)
            raise CelCompileError(
                "the expression is nested too deeply (a chain of operators, calls or "
                f"brackets over {MAX_TREE_DEPTH} parse levels); split it or use cel.bind",
                line,
                column,
            )
        stack.extend((c, depth + 1) for c in node.children if isinstance(c, Tree))


_COMPREHENSIONS = {"map", "filter", "all", "exists", "exists_one"}
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
    give). Recursion is safe: :func:`_check_depth` ran first."""

    def __init__(self, variables: frozenset[str]) -> None:
        self.variables = variables
        self.costly: list[tuple[int, Any]] = []  # (cost, node), to point at the culprit

    def estimate(self, node: Any, scope: Mapping[str, int]) -> _Estimate:
        from lark import Token, Tree

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
    from lark import Tree

    return {c.data for c in node.children if isinstance(c, Tree)}


def _estimate_cost(tree: Any, variables: frozenset[str]) -> int:
    """The estimated worst-case cost; CelCompileError at the costliest innermost node when it
    exceeds COST_LIMIT."""
    estimator = _CostEstimator(variables)
    cost = estimator.estimate(tree, {}).cost
    if cost > COST_LIMIT:
        # the innermost positioned node over the limit (the first recorded, post-order)
        line, column = next(
            (_position(n) for _, n in estimator.costly if _position(n)[0] is not None),
            (None, None),
        )
        raise CelCompileError(
            f"the expression exceeds the cost limit (estimated cost {cost:,} > "
            f"{COST_LIMIT:,}, over worst-case sizes: strings and lists of "
            f"{VALUE_SIZE_BOUND}); simplify it or bound its comprehensions",
            line,
            column,
        )
    return cost


ALLOCATION_FACTS = frozenset({"numaNodes", "size", "linkScore", "minPairNVLinks"})


def _allocation_fields(tree: Any) -> frozenset[str] | None:
    """The facts read as ``allocation.<fact>``, or None when ``allocation`` is used otherwise
    (its devices, indexing, a macro variable of that name)."""
    from lark import Tree

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


def compile_expression(
    text: str, variables: frozenset[str] = frozenset({"device", "allocation"})
) -> CelProgram:
    """Parse and bind ``text`` once; CelCompileError with the position of a syntax error, of
    an identifier outside ``variables``, or of what breaks a limit: size (MAX_EXPRESSION_BYTES),
    nesting (MAX_NESTING, MAX_TREE_DEPTH) or estimated cost (COST_LIMIT)."""
    if len(text.encode()) > MAX_EXPRESSION_BYTES:
        raise CelCompileError(f"expression longer than {MAX_EXPRESSION_BYTES} bytes", 1, 1)
    nesting = _nesting_problem(text)
    if nesting is not None:
        raise nesting
    env = _environment()
    try:
        ast = env.compile(text)
    except CELParseError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "syntax error"
        raise CelCompileError(f"syntax error near {first[:80]!r}", exc.line, exc.column) from None
    except RecursionError:
        raise CelCompileError("the expression is nested too deeply", 1, 1) from None
    except (ValueError, OverflowError) as exc:  # e.g. an int literal of 5,000 digits
        raise CelCompileError(f"bad literal: {str(exc)[:120]}", 1, 1) from None
    _check_depth(ast)
    _check_identifiers(ast, variables)
    _rewrite_bind(ast)
    _check_depth(ast)
    cost = _estimate_cost(ast, variables)
    return CelProgram(
        text=text,
        program=_BoundedRunner(env, ast, FUNCTIONS),
        cost=cost,
        allocation_fields=_allocation_fields(ast) if "allocation" in variables else None,
    )


# --------------------------------------------------------------------------- values


class DomainMap(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain is an empty map."""

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str) and not dict.__contains__(self, key):
            return celtypes.MapType({})
        return super().__getitem__(key)


def _cel(value: Any) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    return value


def _domain(values: Mapping[str, Any]) -> Any:
    return celtypes.MapType(
        {celtypes.StringType(k): _cel(v) for k, v in values.items() if v is not None}
    )


def _version(text: str) -> Semver | str:
    try:
        return parse_semver(text, normalize=True)
    except ValueError:
        return text


def device_value(gpu: Gpu, node: Node) -> Any:
    """The CEL ``device`` map of one full GPU, with DRA names and cdigen's topology domain."""
    attrs: dict[str, Any] = {
        "type": "gpu",
        "uuid": gpu.uuid,
        "productName": gpu.name,
        "brand": gpu.brand,
        "architecture": gpu.architecture,
        "cudaComputeCapability": _version(gpu.cuda_compute_capability),
    }
    if node.driver_version:
        attrs["driverVersion"] = _version(node.driver_version)
    if node.cuda_driver_version:
        attrs["cudaDriverVersion"] = _version(node.cuda_driver_version)
    ours: dict[str, Any] = {
        "index": gpu.index,
        "minor": gpu.minor,
        "numaNode": gpu.numa_node,
        "pciBusId": gpu.pci_bus_id,
        "migEnabled": gpu.mig_enabled,
    }
    return celtypes.MapType(
        {
            celtypes.StringType("driver"): celtypes.StringType(DRIVER),
            celtypes.StringType("attributes"): DomainMap(
                {
                    celtypes.StringType(DRIVER): _domain(attrs),
                    celtypes.StringType(KUBERNETES_DOMAIN): _domain({"pciBusID": gpu.pci_bus_id}),
                    celtypes.StringType(CDIGEN_DOMAIN): _domain(ours),
                }
            ),
            celtypes.StringType("capacity"): DomainMap(
                {
                    celtypes.StringType(DRIVER): celtypes.MapType(
                        {celtypes.StringType("memory"): Quantity(Fraction(gpu.memory_bytes))}
                    )
                }
            ),
        }
    )


def allocation_value(
    devices: Sequence[Any],
    numa_nodes: Sequence[int],
    link_score: int,
    min_pair_nvlinks: int,
) -> Any:
    """The CEL ``allocation`` map of one candidate set."""
    return celtypes.MapType(
        {
            celtypes.StringType("devices"): celtypes.ListType(list(devices)),
            celtypes.StringType("numaNodes"): celtypes.ListType(
                [celtypes.IntType(n) for n in numa_nodes]
            ),
            celtypes.StringType("size"): celtypes.IntType(len(devices)),
            celtypes.StringType("linkScore"): celtypes.IntType(link_score),
            celtypes.StringType("minPairNVLinks"): celtypes.IntType(min_pair_nvlinks),
        }
    )
