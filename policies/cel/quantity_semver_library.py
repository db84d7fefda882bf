"""Kubernetes' quantity and semver libraries for CEL: ``quantity()``, ``semver()``, their
tests, accessors and arithmetic, and the ``compareTo``/``isGreaterThan``/``isLessThan`` the two
types share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

from cdigen.policies.cel.call_args import function_error, no_overload
from cdigen.policies.cel.quantity import INT64_MAX, INT64_MIN, Quantity, parse_quantity
from cdigen.policies.cel.semver import Semver, parse_semver


def _cel_quantity(text: Any) -> Any:
    if not isinstance(text, str):
        return function_error(f"quantity() needs a string, got {type(text).__name__}")
    try:
        return Quantity(parse_quantity(str(text)), str(text))
    except ValueError as exc:
        return function_error(str(exc))


def _cel_is_quantity(text: Any) -> Any:
    try:
        parse_quantity(str(text))
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(isinstance(text, str))


def _cel_semver(text: Any, normalize: Any = False) -> Any:
    if not isinstance(text, str):
        return function_error(f"semver() needs a string, got {type(text).__name__}")
    try:
        return parse_semver(str(text), bool(normalize))
    except ValueError as exc:
        return function_error(str(exc))


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
    return function_error(f"no such overload: {type(a).__name__}.compareTo({type(b).__name__})")


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
        return function_error(f"no such overload: {type(q).__name__}.asInteger()")
    if q.value.denominator != 1 or not INT64_MIN <= q.value.numerator <= INT64_MAX:
        return function_error(f"quantity {q.text} is not an int64")
    return celtypes.IntType(q.value.numerator)


def _cel_as_float(q: Any) -> Any:
    if not isinstance(q, Quantity):
        return function_error(f"no such overload: {type(q).__name__}.asApproximateFloat()")
    return celtypes.DoubleType(float(q.value))


def _arith(sign: int) -> Callable[[Any, Any], Any]:
    def apply(q: Any, other: Any) -> Any:
        if not isinstance(q, Quantity):
            return function_error(f"no such overload: {type(q).__name__} arithmetic")
        if isinstance(other, Quantity):
            return Quantity(q.value + sign * other.value)
        if isinstance(other, int) and not isinstance(other, bool):
            return Quantity(q.value + sign * other)
        return function_error(f"no such overload: quantity arithmetic with {type(other).__name__}")

    return apply


def _semver_part(name: str) -> Callable[[Any], Any]:
    def part(v: Any) -> Any:
        if not isinstance(v, Semver):
            return function_error(f"no such overload: {type(v).__name__}.{name}()")
        return celtypes.IntType(getattr(v, name))

    return part


def _cel_is_integer(q: Any) -> Any:
    if not isinstance(q, Quantity):
        return no_overload("isInteger", q)
    integral = q.value.denominator == 1 and INT64_MIN <= q.value.numerator <= INT64_MAX
    return celtypes.BoolType(integral)


def _cel_sign(q: Any) -> Any:
    if not isinstance(q, Quantity):
        return no_overload("sign", q)
    return celtypes.IntType((q.value > 0) - (q.value < 0))


QUANTITY_SEMVER_FUNCTIONS: dict[str, Any] = {
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
    "isInteger": _cel_is_integer,
    "sign": _cel_sign,
}
