"""CEL's comprehensions as cel-go runs them, over cel-python's parse tree.

- ``all``/``exists`` fold with ``&&``/``||``: a false (true) element decides the result even
  when another element errs; otherwise the first error is the result (cel-python's own fold
  turned two errors into 'no such overload').
- ``exists_one``, ``map``, ``filter``: an error in any element is the result.
- The two-variable forms Kubernetes enables (cel-go's TwoVarComprehensions): ``all(k, v, p)``,
  ``exists(k, v, p)``, ``existsOne(k, v, p)``, ``transformList(i, v, [filter,] e)``,
  ``transformMap(k, v, [filter,] e)``, ``transformMapEntry(k, v, [filter,] e)``: over a list
  the index and the element, over a map the key and the value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError
from lark import Tree

from cdigen.policies.cel.call_args import function_error

ONE_VARIABLE = frozenset({"all", "exists", "exists_one", "map", "filter"})
TWO_VARIABLES = frozenset(
    {"all", "exists", "existsOne", "transformList", "transformMap", "transformMapEntry"}
)
NAMES = ONE_VARIABLE | TWO_VARIABLES


def variable(node: Any) -> str | None:
    """The name when ``node`` is nothing but an identifier (a comprehension's variable)."""
    while isinstance(node, Tree) and len(node.children) == 1 and node.data != "ident":
        node = node.children[0]
    if isinstance(node, Tree) and node.data == "ident":
        return str(node.children[0])
    return None


def variables(name: str, args: Sequence[Any]) -> list[str] | None:
    """The comprehension's variables (one or two), or None when this is no comprehension."""
    first = variable(args[0]) if args else None
    if first is None:
        return None
    second = variable(args[1]) if len(args) >= 3 else None
    if name in TWO_VARIABLES and second is not None and (name != "all" or len(args) == 3):
        if name in ("all", "exists", "existsOne") and len(args) != 3:
            return None
        return [first, second]
    if name in ONE_VARIABLE and len(args) in (2, 3) and (len(args) == 2 or name == "map"):
        return [first]
    return None


def _items(target: Any, two: bool) -> Iterator[tuple[Any, ...]] | CELEvalError:
    if isinstance(target, celtypes.ListType):
        if two:
            return ((celtypes.IntType(n), v) for n, v in enumerate(target))
        return ((v,) for v in target)
    if isinstance(target, celtypes.MapType):
        if two:
            return ((k, v) for k, v in target.items())
        return ((k,) for k in target)
    return function_error(
        f"expression of type '{type(target).__name__}' cannot be range of a comprehension"
    )


def run(
    name: str,
    target: Any,
    names: Sequence[str],
    bodies: Sequence[Callable[[dict[str, Any]], Any]],
) -> Any:
    """The comprehension ``name`` over ``target``, each body evaluated with its variables
    bound (``bodies``: the predicate or transform, a filter first when there are two)."""
    if isinstance(target, CELEvalError):
        return target
    items = _items(target, len(names) == 2)
    if isinstance(items, CELEvalError):
        return items
    bound = (dict(zip(names, values, strict=True)) for values in items)
    if name in ("all", "exists"):
        return _fold(name == "all", bound, bodies[0])
    if name in ("exists_one", "existsOne"):
        count = 0
        for scope in bound:
            value = bodies[0](scope)
            if isinstance(value, CELEvalError):
                return value
            if not isinstance(value, celtypes.BoolType):
                return function_error(f"no such overload: {name} predicate of a non-bool")
            count += bool(value)
        return celtypes.BoolType(count == 1)
    if name == "filter":
        kept = []
        for scope in bound:
            value = bodies[0](scope)
            if isinstance(value, CELEvalError):
                return value
            if not isinstance(value, celtypes.BoolType):
                return function_error("no such overload: filter predicate of a non-bool")
            if value:
                kept.append(scope[names[0]])
        return celtypes.ListType(kept)
    return _transform(name, bound, names, bodies)


def _fold(conjunction: bool, bound: Iterator[dict[str, Any]], body: Callable[..., Any]) -> Any:
    first_error: Any = None
    for scope in bound:
        value = body(scope)
        if isinstance(value, celtypes.BoolType):
            if bool(value) is not conjunction:
                return celtypes.BoolType(not conjunction)
            continue
        if first_error is None:
            name = "all" if conjunction else "exists"
            not_bool = function_error(f"no such overload: {name} predicate of a non-bool")
            first_error = value if isinstance(value, CELEvalError) else not_bool
    return first_error if first_error is not None else celtypes.BoolType(conjunction)


def _transform(
    name: str,
    bound: Iterator[dict[str, Any]],
    names: Sequence[str],
    bodies: Sequence[Callable[[dict[str, Any]], Any]],
) -> Any:
    """``map``, ``transformList``, ``transformMap``, ``transformMapEntry``."""
    keep, make = (bodies[0], bodies[1]) if len(bodies) == 2 else (None, bodies[0])
    listed: list[Any] = []
    mapped: dict[Any, Any] = {}
    for scope in bound:
        if keep is not None:
            wanted = keep(scope)
            if isinstance(wanted, CELEvalError):
                return wanted
            if not isinstance(wanted, celtypes.BoolType):
                return function_error(f"no such overload: {name} filter of a non-bool")
            if not wanted:
                continue
        value = make(scope)
        if isinstance(value, CELEvalError):
            return value
        if name in ("map", "transformList"):
            listed.append(value)
        elif name == "transformMap":
            mapped[scope[names[0]]] = value
        else:  # transformMapEntry: the body gives a map of one entry
            if not isinstance(value, celtypes.MapType):
                return function_error("no such overload: transformMapEntry of a non-map")
            for key, entry in value.items():
                if key in mapped:
                    return function_error(f"insert failed: key {key!s} already exists")
                mapped[key] = entry
    if name in ("map", "transformList"):
        return celtypes.ListType(listed)
    return celtypes.MapType(mapped)
