"""The operators of the Kubernetes CEL dialect as cel-python functions: equality and ordering
across the number types, ``in``, ``+`` within the size limits (each with type errors that name
the operator and the operand types, as cel-go types them), and the logical operators and ``?:``
as cel-go evaluates them."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError, base_functions

import cdigen.policies.cel.limits as limits
from cdigen.policies.cel.call_args import function_error, no_overload
from cdigen.policies.cel.errors import OperandTypeError
from cdigen.policies.cel.quantity import Quantity
from cdigen.policies.cel.semver import Semver


def _cel_add(a: Any, b: Any) -> Any:
    if (
        isinstance(a, (str, list))
        and isinstance(b, (str, list))
        and len(a) + len(b) > limits.MAX_VALUE_LENGTH
    ):
        return function_error(
            f"+ would build a value over {limits.MAX_VALUE_LENGTH} characters or elements"
        )
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


_OPAQUE = (Semver, Quantity)  # compared only with their own type


def cel_equal(left: Any, right: Any) -> Any:
    """``==`` as Kubernetes' CEL has it: numbers compare by value across int, uint and double
    (``index == 4.0``, ``index == 4u``); two values of other, different types are simply not
    equal (``productName == 1`` is false); a semver or quantity compared with anything but its
    own type is an error (no such overload), as their Kubernetes types answer."""
    if isinstance(left, CELEvalError):
        return left  # an error (a missing key, say) stays an error, as in CEL
    if isinstance(right, CELEvalError):
        return right
    if isinstance(left, _OPAQUE) or isinstance(right, _OPAQUE):
        if type(left) is not type(right):
            raise OperandTypeError("==", left, right)
        return celtypes.BoolType(left == right)
    if _numeric(left) and _numeric(right):
        return celtypes.BoolType(_exact(left) == _exact(right))
    if isinstance(left, celtypes.ListType) and isinstance(right, celtypes.ListType):
        if len(left) != len(right):
            return celtypes.BoolType(False)
        for a, b in zip(left, right, strict=True):
            equal = cel_equal(a, b)
            if isinstance(equal, CELEvalError) or not equal:
                return equal
        return celtypes.BoolType(True)
    if not (isinstance(left, type(right)) or isinstance(right, type(left))):
        return celtypes.BoolType(False)
    return base_functions["_==_"](left, right)


def _cel_not_equal(left: Any, right: Any) -> Any:
    result = cel_equal(left, right)
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
    """``in`` over a list with :func:`cel_equal` (``index in [4.0, 6.0]``); maps as before."""
    if isinstance(container, celtypes.ListType):
        for element in container:
            equal = cel_equal(item, element)
            if isinstance(equal, CELEvalError):
                return equal
            if equal:
                return celtypes.BoolType(True)
        return celtypes.BoolType(False)
    return base_functions["_in_"](item, container)


def _logical(name: str, wins: bool) -> Callable[[Any, Any], Any]:
    """``&&`` (``wins`` False) or ``||`` (``wins`` True) as cel-go has them: ``wins`` on either
    side wins over an error on the other (so a guard written first, or last, makes the other
    side's error harmless); two bools otherwise give ``not wins``; else the left error, else the
    right one, else no such overload."""

    def apply(left: Any, right: Any) -> Any:
        if isinstance(left, celtypes.BoolType) and bool(left) is wins:
            return celtypes.BoolType(wins)
        if isinstance(right, celtypes.BoolType) and bool(right) is wins:
            return celtypes.BoolType(wins)
        if isinstance(left, celtypes.BoolType) and isinstance(right, celtypes.BoolType):
            return celtypes.BoolType(not wins)
        if isinstance(left, CELEvalError):
            return left
        if isinstance(right, CELEvalError):
            return right
        return no_overload(name, left, right)

    return apply


def _cel_condition(condition: Any, yes: Any, no: Any) -> Any:
    """``c ? a : b``: an error in ``c`` is the result; only the chosen branch was evaluated."""
    if isinstance(condition, CELEvalError):
        return condition
    if not isinstance(condition, celtypes.BoolType):
        return no_overload("_?_:_", condition)
    return yes if condition else no


# The binary operators whose type errors name the operator and the operand types.
_ORDERING = {"<": "_<_", "<=": "_<=_", ">": "_>_", ">=": "_>=_"}
_ARITHMETIC = {"-": "_-_", "*": "_*_", "/": "_/_", "%": "_%_"}
OPERATOR_FUNCTIONS: dict[str, Any] = {
    "_+_": _typed_operator("+", _cel_add),
    "_==_": _typed_operator("==", cel_equal),
    "_!=_": _typed_operator("!=", _cel_not_equal),
    "_in_": _typed_operator("in", _cel_in),
    **{name: _typed_operator(symbol, _numeric_order(name)) for symbol, name in _ORDERING.items()},
    **{name: _typed_operator(symbol, base_functions[name]) for symbol, name in _ARITHMETIC.items()},
    "_&&_": _logical("_&&_", wins=False),
    "_||_": _logical("_||_", wins=True),
    "_?_:_": _cel_condition,
}
