"""The extension functions of the Kubernetes CEL dialect, as cel-python functions."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError, base_functions

import policies.cel.limits as limits
from policies.cel.errors import OperandTypeError, type_name
from policies.cel.named_formats import FORMAT_FUNCTIONS
from policies.cel.network import NETWORK_FUNCTIONS
from policies.cel.quantity import INT64_MAX, INT64_MIN, Quantity, parse_quantity
from policies.cel.semver import Semver, parse_semver
from policies.cel.urls import URL_FUNCTIONS


def _err(message: str) -> CELEvalError:
    """The error value a CEL function returns (cel-python propagates it as the result)."""
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
    if q.value.denominator != 1 or not INT64_MIN <= q.value.numerator <= INT64_MAX:
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
    if len(s) + count * (len(new) - len(old)) > limits.MAX_VALUE_LENGTH:
        return _err(f"replace() would build a string over {limits.MAX_VALUE_LENGTH} characters")
    return celtypes.StringType(str(s).replace(str(old), str(new), int(limit)))


def _cel_add(a: Any, b: Any) -> Any:
    if (
        isinstance(a, (str, list))
        and isinstance(b, (str, list))
        and len(a) + len(b) > limits.MAX_VALUE_LENGTH
    ):
        return _err(f"+ would build a value over {limits.MAX_VALUE_LENGTH} characters or elements")
    return a + b


def _typed_operator(symbol: str, apply: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``apply``, raising OperandTypeError (the operator and operand types, as data) where it
    raises TypeError; cel-python keeps it as the ``__cause__`` of its CELEvalError."""

    def typed(left: Any, right: Any) -> Any:
        try:
            return apply(left, right)
        except OperandTypeError:
            raise
        except TypeError:
            raise OperandTypeError(symbol, left, right) from None

    return typed


_NUMBERS = (celtypes.IntType, celtypes.UintType, celtypes.DoubleType)


def _numeric(value: Any) -> bool:
    """An int, uint or double (a bool is none, though Python counts it an int)."""
    return isinstance(value, _NUMBERS) and not isinstance(value, celtypes.BoolType)


def _cel_equal(left: Any, right: Any) -> Any:
    """``==`` as Kubernetes' CEL has it: numbers compare by value across int, uint and double
    (``index == 4.0``, ``index == 4u``); two values of other, different types are simply not
    equal (``productName == 1`` is false); a semver or quantity compared with anything but its
    own type is an error (no such overload), as their Kubernetes types answer."""
    if isinstance(left, CELEvalError):
        return left  # an error (a missing key, say) stays an error, as in CEL
    if isinstance(right, CELEvalError):
        return right
    opaque = (Semver, Quantity)
    if isinstance(left, opaque) or isinstance(right, opaque):
        if type(left) is not type(right):
            raise OperandTypeError("==", left, right)
        return celtypes.BoolType(left == right)
    if _numeric(left) and _numeric(right):
        return celtypes.BoolType(_exact(left) == _exact(right))
    if isinstance(left, celtypes.ListType) and isinstance(right, celtypes.ListType):
        if len(left) != len(right):
            return celtypes.BoolType(False)
        for a, b in zip(left, right, strict=True):
            equal = _cel_equal(a, b)
            if isinstance(equal, CELEvalError) or not equal:
                return equal
        return celtypes.BoolType(True)
    if not (isinstance(left, type(right)) or isinstance(right, type(left))):
        return celtypes.BoolType(False)
    return base_functions["_==_"](left, right)


def _cel_not_equal(left: Any, right: Any) -> Any:
    result = _cel_equal(left, right)
    return result if isinstance(result, CELEvalError) else celtypes.BoolType(not result)


def _numeric_order(name: str) -> Callable[[Any, Any], Any]:
    """An ordering operator that compares numbers by value across int, uint and double
    (``index > 2.5``, ``2 < 2.5``); other operands as cel-python does (mixed types: an error)."""
    base = base_functions[name]
    compare: Callable[[Any, Any], bool] = {
        "_<_": operator.lt,
        "_<=_": operator.le,
        "_>_": operator.gt,
        "_>=_": operator.ge,
    }[name]

    def order(left: Any, right: Any) -> Any:
        if _numeric(left) and _numeric(right) and type(left) is not type(right):
            return celtypes.BoolType(compare(_exact(left), _exact(right)))
        return base(left, right)

    return order


def _exact(value: Any) -> Any:
    """A number as Python compares it exactly: int for int/uint, float for double."""
    return float(value) if isinstance(value, celtypes.DoubleType) else int(value)


def _cel_in(item: Any, container: Any) -> Any:
    """``in`` over a list with :func:`_cel_equal` (``index in [4.0, 6.0]``); maps as before."""
    if isinstance(container, celtypes.ListType):
        for element in container:
            equal = _cel_equal(item, element)
            if isinstance(equal, CELEvalError):
                return equal
            if equal:
                return celtypes.BoolType(True)
        return celtypes.BoolType(False)
    return base_functions["_in_"](item, container)


# The binary operators whose type errors name the operator and the operand types.
_ORDERING = {"<": "_<_", "<=": "_<=_", ">": "_>_", ">=": "_>=_"}
_ARITHMETIC = {"-": "_-_", "*": "_*_", "/": "_/_", "%": "_%_"}

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
    "_+_": _typed_operator("+", _cel_add),
    "_==_": _typed_operator("==", _cel_equal),
    "_!=_": _typed_operator("!=", _cel_not_equal),
    "_in_": _typed_operator("in", _cel_in),
    **{name: _typed_operator(symbol, _numeric_order(name)) for symbol, name in _ORDERING.items()},
    **{name: _typed_operator(symbol, base_functions[name]) for symbol, name in _ARITHMETIC.items()},
}


# -- the logical operators, as cel-go evaluates them


def _no_overload(name: str, *values: Any) -> CELEvalError:
    shown = ", ".join(type_name(v) for v in values)
    return _err(f"no such overload: {name} applied to ({shown})")


def _cel_and(left: Any, right: Any) -> Any:
    """``&&`` as cel-go has it: false on either side wins over an error on the other (so a
    guard written first, or last, makes the other side's error harmless); both true is true;
    otherwise the left error, else the right one, else no such overload."""
    if isinstance(left, celtypes.BoolType) and not left:
        return celtypes.BoolType(False)
    if isinstance(right, celtypes.BoolType) and not right:
        return celtypes.BoolType(False)
    if isinstance(left, celtypes.BoolType) and isinstance(right, celtypes.BoolType):
        return celtypes.BoolType(True)
    if isinstance(left, CELEvalError):
        return left
    if isinstance(right, CELEvalError):
        return right
    return _no_overload("_&&_", left, right)


def _cel_or(left: Any, right: Any) -> Any:
    """``||``: true on either side wins over an error on the other; see :func:`_cel_and`."""
    if isinstance(left, celtypes.BoolType) and left:
        return celtypes.BoolType(True)
    if isinstance(right, celtypes.BoolType) and right:
        return celtypes.BoolType(True)
    if isinstance(left, celtypes.BoolType) and isinstance(right, celtypes.BoolType):
        return celtypes.BoolType(False)
    if isinstance(left, CELEvalError):
        return left
    if isinstance(right, CELEvalError):
        return right
    return _no_overload("_||_", left, right)


def _cel_condition(condition: Any, yes: Any, no: Any) -> Any:
    """``c ? a : b``: an error in ``c`` is the result; only the chosen branch was evaluated."""
    if isinstance(condition, CELEvalError):
        return condition
    if not isinstance(condition, celtypes.BoolType):
        return _no_overload("_?_:_", condition)
    return yes if condition else no


# -- cel-go's strings extension (version 2)


def _strings(*values: Any) -> bool:
    return all(isinstance(v, str) for v in values)


def _ints(*values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _cel_upper_ascii(s: Any) -> Any:
    if not isinstance(s, str):
        return _no_overload("upperAscii", s)
    return celtypes.StringType("".join(c.upper() if c.isascii() else c for c in s))


def _cel_char_at(s: Any, index: Any) -> Any:
    if not (_strings(s) and _ints(index)):
        return _no_overload("charAt", s, index)
    if not 0 <= index <= len(s):
        return _err(f"index out of range: {index}")
    return celtypes.StringType(s[index : index + 1])


def _cel_index_of(s: Any, sub: Any, start: Any = 0) -> Any:
    if isinstance(s, celtypes.ListType) and start == 0:
        for n, element in enumerate(s):
            equal = _cel_equal(element, sub)
            if isinstance(equal, CELEvalError):
                return equal
            if equal:
                return celtypes.IntType(n)
        return celtypes.IntType(-1)
    if not (_strings(s, sub) and _ints(start)):
        return _no_overload("indexOf", s, sub)
    if not 0 <= start <= len(s):
        return _err(f"index out of range: {start}")
    return celtypes.IntType(s.find(sub, start))


def _cel_last_index_of(s: Any, sub: Any, last: Any = None) -> Any:
    if isinstance(s, celtypes.ListType) and last is None:
        for n in range(len(s) - 1, -1, -1):
            equal = _cel_equal(s[n], sub)
            if isinstance(equal, CELEvalError):
                return equal
            if equal:
                return celtypes.IntType(n)
        return celtypes.IntType(-1)
    if not (_strings(s, sub) and (last is None or _ints(last))):
        return _no_overload("lastIndexOf", s, sub)
    end = len(s) if last is None else int(last)
    if not 0 <= end <= len(s):
        return _err(f"index out of range: {end}")
    return celtypes.IntType(s.rfind(sub, 0, end + len(sub)))


def _cel_substring(s: Any, start: Any, end: Any = None) -> Any:
    stop = len(s) if end is None and isinstance(s, str) else end
    if not (_strings(s) and _ints(start, stop)):
        return _no_overload("substring", s, start)
    if not 0 <= start <= len(s):
        return _err(f"index out of range: {start}")
    if not 0 <= stop <= len(s):
        return _err(f"index out of range: {stop}")
    if start > stop:
        return _err(f"invalid substring range. start: {start}, end: {stop}")
    return celtypes.StringType(s[start:stop])


def _cel_trim(s: Any) -> Any:
    if not isinstance(s, str):
        return _no_overload("trim", s)
    return celtypes.StringType(s.strip())


def _cel_join(items: Any, separator: Any = "") -> Any:
    if not (isinstance(items, list) and _strings(separator) and _strings(*items)):
        return _no_overload("join", items)
    return celtypes.StringType(str(separator).join(items))


def _cel_quote(s: Any) -> Any:
    if not isinstance(s, str):
        return _no_overload("strings.quote", s)
    escapes = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    escapes |= {"\v": "\\v", "\\": "\\\\", '"': '\\"'}
    return celtypes.StringType('"' + "".join(escapes.get(c, c) for c in s) + '"')


def _render(value: Any) -> str:
    """A value as ``%s`` writes it (cel-go's string clause)."""
    if isinstance(value, celtypes.BoolType):
        return "true" if value else "false"
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, celtypes.ListType):
        return "[" + ", ".join(_render(v) for v in value) + "]"
    if isinstance(value, celtypes.MapType):
        return "{" + ", ".join(f"{_render(k)}: {_render(v)}" for k, v in value.items()) + "}"
    if value is None or isinstance(value, celtypes.NullType):
        return "null"
    if isinstance(value, celtypes.DoubleType):
        return repr(float(value))
    return str(value)


def _cel_format(text: Any, args: Any) -> Any:
    from policies.cel.formatting import FormatError, apply_format

    if not (isinstance(text, str) and isinstance(args, list)):
        return _no_overload("format", text, args)
    try:
        return celtypes.StringType(apply_format(str(text), list(args), type_name, _render))
    except FormatError as exc:
        return _err(str(exc))


# -- regular expressions (RE2), the core ``matches`` and Kubernetes' regex library


def _pattern(pattern: Any) -> Any:
    from policies.cel.regex import compiled, regex_problem

    problem = regex_problem(str(pattern))
    if problem is not None:
        return _err(f"invalid regular expression {str(pattern)!r}: {problem}")
    return compiled(str(pattern))


def _cel_matches(s: Any, pattern: Any) -> Any:
    if not _strings(s, pattern):
        return _no_overload("matches", s, pattern)
    compiled = _pattern(pattern)
    if isinstance(compiled, CELEvalError):
        return compiled
    return celtypes.BoolType(compiled.search(str(s)) is not None)


def _cel_find(s: Any, pattern: Any) -> Any:
    if not _strings(s, pattern):
        return _no_overload("find", s, pattern)
    compiled = _pattern(pattern)
    if isinstance(compiled, CELEvalError):
        return compiled
    found = compiled.search(str(s))
    return celtypes.StringType(found.group(0) if found else "")


def _cel_find_all(s: Any, pattern: Any, limit: Any = -1) -> Any:
    if not (_strings(s, pattern) and _ints(limit)):
        return _no_overload("findAll", s, pattern)
    compiled = _pattern(pattern)
    if isinstance(compiled, CELEvalError):
        return compiled
    found = [m.group(0) for m in compiled.finditer(str(s))]
    if limit >= 0:
        found = found[:limit]
    return celtypes.ListType([celtypes.StringType(f) for f in found])


# -- Kubernetes' lists library and cel-go's sets extension


def _comparable_list(items: Any, name: str) -> Any:
    if not isinstance(items, celtypes.ListType):
        return _no_overload(name, items)
    return None


def _cel_is_sorted(items: Any) -> Any:
    bad = _comparable_list(items, "isSorted")
    if bad is not None:
        return bad
    try:
        return celtypes.BoolType(all(a <= b for a, b in itertools.pairwise(items)))
    except TypeError:
        return _no_overload("isSorted", items)


def _cel_sum(items: Any) -> Any:
    bad = _comparable_list(items, "sum")
    if bad is not None:
        return bad
    if not items:
        return celtypes.IntType(0)
    total = items[0]
    for item in items[1:]:
        if type(item) is not type(total):
            return _no_overload("sum", items)
        total = type(total)(total + item)
    return total


def _extreme(name: str, pick: Callable[..., Any]) -> Callable[[Any], Any]:
    def apply(items: Any) -> Any:
        bad = _comparable_list(items, name)
        if bad is not None:
            return bad
        if not items:
            return _err(f"{name}(list) called on an empty list")
        try:
            return pick(items)
        except TypeError:
            return _no_overload(name, items)

    return apply


def _set_function(name: str, test: Callable[[list[Any], list[Any]], bool]) -> Any:
    def apply(left: Any, right: Any) -> Any:
        if not (isinstance(left, celtypes.ListType) and isinstance(right, celtypes.ListType)):
            return _no_overload(f"sets.{name}", left, right)
        return celtypes.BoolType(test(list(left), list(right)))

    return apply


def _same(a: Any, b: Any) -> bool:
    equal = _cel_equal(a, b)
    return not isinstance(equal, CELEvalError) and bool(equal)


def _contains_all(left: list[Any], right: list[Any]) -> bool:
    """Every element of ``right`` is in ``left`` (by CEL equality)."""
    return all(any(_same(a, b) for a in left) for b in right)


# -- Kubernetes' quantity library, the rest of it


def _cel_is_integer(q: Any) -> Any:
    if not isinstance(q, Quantity):
        return _no_overload("isInteger", q)
    integral = q.value.denominator == 1 and INT64_MIN <= q.value.numerator <= INT64_MAX
    return celtypes.BoolType(integral)


def _cel_sign(q: Any) -> Any:
    if not isinstance(q, Quantity):
        return _no_overload("sign", q)
    return celtypes.IntType((q.value > 0) - (q.value < 0))


FUNCTIONS.update(
    {
        "_&&_": _cel_and,
        "_||_": _cel_or,
        "_?_:_": _cel_condition,
        "upperAscii": _cel_upper_ascii,
        "charAt": _cel_char_at,
        "indexOf": _cel_index_of,
        "lastIndexOf": _cel_last_index_of,
        "substring": _cel_substring,
        "trim": _cel_trim,
        "join": _cel_join,
        "format": _cel_format,
        "strings.quote": _cel_quote,
        "matches": _cel_matches,
        "find": _cel_find,
        "findAll": _cel_find_all,
        "isSorted": _cel_is_sorted,
        "sum": _cel_sum,
        "min": _extreme("min", min),
        "max": _extreme("max", max),
        "sets.contains": _set_function("contains", _contains_all),
        "sets.equivalent": _set_function(
            "equivalent", lambda a, b: _contains_all(a, b) and _contains_all(b, a)
        ),
        "sets.intersects": _set_function(
            "intersects", lambda a, b: any(_contains_all(a, [x]) for x in b)
        ),
        "isInteger": _cel_is_integer,
        "sign": _cel_sign,
        **URL_FUNCTIONS,
        **NETWORK_FUNCTIONS,
        **FORMAT_FUNCTIONS,
    }
)
