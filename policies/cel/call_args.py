"""What the CEL library functions share: the error value they return and their argument checks."""

from __future__ import annotations

from typing import Any

from celpy.evaluation import CELEvalError

from cdigen.policies.cel.errors import type_name


def function_error(message: str) -> CELEvalError:
    """The error value a CEL function returns (cel-python propagates it as the result)."""
    return CELEvalError(message, TypeError, None)


def no_overload(name: str, *values: Any) -> CELEvalError:
    shown = ", ".join(type_name(v) for v in values)
    return function_error(f"no such overload: {name} applied to ({shown})")


def all_strings(*values: Any) -> bool:
    return all(isinstance(v, str) for v in values)


def all_ints(*values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)
