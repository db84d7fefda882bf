"""Kubernetes' lists library and cel-go's sets extension, as cel-python functions."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

from cdigen.policies.cel.call_args import function_error, no_overload
from cdigen.policies.cel.operators import cel_equal

# -- Kubernetes' lists library and cel-go's sets extension


def _comparable_list(items: Any, name: str) -> Any:
    if not isinstance(items, celtypes.ListType):
        return no_overload(name, items)
    return None


def _cel_is_sorted(items: Any) -> Any:
    bad = _comparable_list(items, "isSorted")
    if bad is not None:
        return bad
    try:
        return celtypes.BoolType(all(a <= b for a, b in itertools.pairwise(items)))
    except TypeError:
        return no_overload("isSorted", items)


def _cel_sum(items: Any) -> Any:
    bad = _comparable_list(items, "sum")
    if bad is not None:
        return bad
    if not items:
        return celtypes.IntType(0)
    total = items[0]
    for item in items[1:]:
        if type(item) is not type(total):
            return no_overload("sum", items)
        total = type(total)(total + item)
    return total


def _extreme(name: str, pick: Callable[..., Any]) -> Callable[[Any], Any]:
    def apply(items: Any) -> Any:
        bad = _comparable_list(items, name)
        if bad is not None:
            return bad
        if not items:
            return function_error(f"{name}(list) called on an empty list")
        try:
            return pick(items)
        except TypeError:
            return no_overload(name, items)

    return apply


def _set_function(name: str, test: Callable[[list[Any], list[Any]], bool]) -> Any:
    def apply(left: Any, right: Any) -> Any:
        if not (isinstance(left, celtypes.ListType) and isinstance(right, celtypes.ListType)):
            return no_overload(f"sets.{name}", left, right)
        return celtypes.BoolType(test(list(left), list(right)))

    return apply


def _same(a: Any, b: Any) -> bool:
    equal = cel_equal(a, b)
    return not isinstance(equal, CELEvalError) and bool(equal)


def _contains_all(left: list[Any], right: list[Any]) -> bool:
    """Every element of ``right`` is in ``left`` (by CEL equality)."""
    return all(any(_same(a, b) for a in left) for b in right)


LIST_FUNCTIONS: dict[str, Any] = {
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
}
