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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import total_ordering
from typing import Any

import celpy
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from cdigen.model import Gpu, Node

DRIVER = "gpu.nvidia.com"
KUBERNETES_DOMAIN = "resource.kubernetes.io"
CDIGEN_DOMAIN = "cdigen.dev"
MAX_EXPRESSION_BYTES = 10 * 1024

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
    """The exact value of a Kubernetes quantity string (``"40Gi"``, ``"1.5"``, ``"100m"``).

    Raises ValueError on anything Kubernetes' ``resource.ParseQuantity`` would reject.
    """
    match = _QUANTITY_RE.match(text.strip()) if text.strip() == text else None
    if match is None:
        raise ValueError(f"invalid quantity {text!r}")
    number, suffix = Fraction(match.group(1)), match.group(2)
    if suffix in _BINARY_SUFFIXES:
        return number * Fraction(1024) ** _BINARY_SUFFIXES[suffix]
    if suffix in _DECIMAL_SUFFIXES:
        return number * Fraction(10) ** _DECIMAL_SUFFIXES[suffix]
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return number * Fraction(10) ** int(suffix[1:])
    raise ValueError(f"invalid quantity {text!r}: unknown suffix {suffix!r}")


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
    return celtypes.StringType(str(s).replace(str(old), str(new), int(limit)))


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
}

# --------------------------------------------------------------------------- compiling


class CelCompileError(Exception):
    """A CEL expression that does not parse; ``line``/``column`` are 1-based within it."""

    def __init__(self, message: str, line: int | None, column: int | None) -> None:
        super().__init__(message)
        self.line = line
        self.column = column


class CelEvaluationError(Exception):
    """A CEL expression failed at run time, or did not return a bool."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.line = line
        self.column = column


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


@dataclass(frozen=True)
class CelProgram:
    """One compiled expression; ``evaluate`` returns its bool or raises CelEvaluationError."""

    text: str
    program: Any

    def evaluate(self, activation: Mapping[str, Any]) -> bool:
        """Evaluate against ``activation`` (e.g. ``{"device": device_value(...)}``)."""
        try:
            result = self.program.evaluate(dict(activation))
        except CELEvalError as exc:
            raise _runtime_error(self.text, exc) from None
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise CelEvaluationError(str(exc)) from None
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


def compile_expression(
    text: str, variables: frozenset[str] = frozenset({"device", "allocation"})
) -> CelProgram:
    """Parse and bind ``text`` once; CelCompileError with the position of a syntax error or of
    an identifier outside ``variables``."""
    if len(text.encode()) > MAX_EXPRESSION_BYTES:
        raise CelCompileError(f"expression longer than {MAX_EXPRESSION_BYTES} bytes", 1, 1)
    env = _environment()
    try:
        ast = env.compile(text)
    except CELParseError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "syntax error"
        raise CelCompileError(f"syntax error near {first!r}", exc.line, exc.column) from None
    _check_identifiers(ast, variables)
    _rewrite_bind(ast)
    return CelProgram(text=text, program=env.program(ast, functions=FUNCTIONS))


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
