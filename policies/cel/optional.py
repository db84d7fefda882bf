"""CEL's optional values as Kubernetes enables them: ``m.?key`` and ``m[?key]`` select an
optional entry; ``optional.of/none/ofNonZeroValue`` make one; ``hasValue``, ``value``,
``orValue`` and ``or`` read it. An optional selects through (``m.?a.b`` is an optional)."""

from __future__ import annotations

from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

_ABSENT: Any = object()


class Optional:
    """One optional: a value, or none."""

    __slots__ = ("value",)

    def __init__(self, value: Any = _ABSENT) -> None:
        self.value = value

    @property
    def present(self) -> bool:
        return self.value is not _ABSENT

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Optional) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.present)

    def __repr__(self) -> str:
        return f"optional.of({self.value!r})" if self.present else "optional.none()"


NONE = Optional()


def _error(message: str) -> CELEvalError:
    return CELEvalError(message, TypeError, None)


def select(container: Any, key: Any) -> Any:
    """``container.?key`` / ``container[?key]``: the entry as an optional, none when absent.
    Through an optional container: none stays none. An unknown attribute domain is an empty
    map (present), as ``device.attributes`` has it."""
    if isinstance(container, CELEvalError):
        return container
    if isinstance(container, Optional):
        if not container.present:
            return container
        container = container.value
    if isinstance(container, celtypes.MapType):
        try:
            return Optional(container[key])
        except KeyError:
            return NONE
    if isinstance(container, celtypes.ListType) and isinstance(key, celtypes.IntType):
        return Optional(container[int(key)]) if 0 <= int(key) < len(container) else NONE
    return _error(f"no such overload: optional selection on {type(container).__name__}")


def _is_zero(value: Any) -> bool:
    if isinstance(value, (str, bytes, list, dict)):
        return len(value) == 0
    if isinstance(value, (int, float)):
        return value == 0
    return value is None or isinstance(value, celtypes.NullType)


def _checked(value: Any, name: str) -> Any:
    if isinstance(value, (Optional, CELEvalError)):
        return value
    return _error(f"no such overload: {name}() needs an optional")


def _has_value(opt: Any) -> Any:
    opt = _checked(opt, "hasValue")
    return opt if isinstance(opt, CELEvalError) else celtypes.BoolType(opt.present)


def _value(opt: Any) -> Any:
    opt = _checked(opt, "value")
    if isinstance(opt, CELEvalError) or opt.present:
        return opt if isinstance(opt, CELEvalError) else opt.value
    return CELEvalError("optional.none() dereference", ValueError, None)


def _or_value(opt: Any, default: Any) -> Any:
    opt = _checked(opt, "orValue")
    if isinstance(opt, CELEvalError):
        return opt
    return opt.value if opt.present else default


def _or(opt: Any, other: Any) -> Any:
    opt = _checked(opt, "or")
    if isinstance(opt, CELEvalError) or opt.present:
        return opt
    return _checked(other, "or")


OPTIONAL_FUNCTIONS: dict[str, Any] = {
    "optional.of": lambda value: Optional(value),  # one argument, as CEL has it
    "optional.none": lambda: NONE,
    "optional.ofNonZeroValue": lambda value: NONE if _is_zero(value) else Optional(value),
    "hasValue": _has_value,
    "value": _value,
    "orValue": _or_value,
    "or": _or,
}
