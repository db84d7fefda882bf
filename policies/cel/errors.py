"""Errors of compiling and evaluating CEL, and the translation of cel-python's run-time errors
into them.

The translation reads what cel-python gives as data, never its message texts: the exception
class it records (``CELEvalError.args[1]``), the parse-tree node or token it failed at
(``.tree``, ``.token``), and the exception an operator function raised (``__cause__``, an
:class:`OperandTypeError` from our operator functions). Those are cel-python 0.5 internals,
pinned in pyproject.toml and by tests/unit/test_cel_errors.py.
"""

from __future__ import annotations

from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError
from lark import Token, Tree

from cdigen.policies.cel.quantity import Quantity
from cdigen.policies.cel.semver import Semver

MAX_MESSAGE = 200  # characters of a message passed on from cel-python


def line_column(text: str, offset: int) -> tuple[int, int]:
    """The 1-based line and column of character ``offset`` of an expression's ``text``, as a
    :class:`CelCompileError` (and cel-go) report a place."""
    before = text[:offset]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1


class CelCompileError(Exception):
    """A CEL expression that does not compile; ``line``/``column`` are 1-based within it."""

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


class OperandTypeError(TypeError):
    """An operator (``>``, ``+``, ...) applied to operand types it has no overload for.

    Our operator functions raise it; cel-python turns the TypeError into a CELEvalError whose
    ``__cause__`` it is, which carries the operator and operands to :func:`runtime_error`.
    """

    def __init__(self, operator: str, left: Any, right: Any) -> None:
        self.operator = operator
        self.left_type = type_name(left)
        self.right_type = type_name(right)
        super().__init__(self.describe())

    def describe(self) -> str:
        """``no operator > between quantity and int (compare quantities with compareTo)``."""
        types = (self.left_type, self.right_type)
        hint = " (compare quantities with compareTo)" if "quantity" in types else ""
        return f"no operator {self.operator} between {types[0]} and {types[1]}{hint}"


_TYPE_NAMES: tuple[tuple[type, str], ...] = (
    (celtypes.BoolType, "bool"),
    (celtypes.StringType, "string"),
    (celtypes.IntType, "int"),
    (celtypes.UintType, "uint"),
    (celtypes.DoubleType, "double"),
    (celtypes.ListType, "list"),
    (celtypes.MapType, "map"),
    (Quantity, "quantity"),
    (Semver, "semver"),
)


def type_name(value: Any) -> str:
    """The CEL name of a value's type (``int``, ``quantity``), else its Python class name."""
    for cls, name in _TYPE_NAMES:
        if isinstance(value, cls):
            return name
    # a library's own value type says its CEL name (urls.Url: kubernetes.URL), so that this
    # module, which every library imports, imports none of them
    named = getattr(type(value), "cel_type_name", None)
    return named if isinstance(named, str) else type(value).__name__


def runtime_error(exc: CELEvalError) -> CelEvaluationError:
    """A CelEvaluationError for one of cel-python's run-time errors, pointing where it can."""
    line, column = exc.line, exc.column
    cause = exc.__cause__
    if isinstance(cause, OperandTypeError):
        return CelEvaluationError(cause.describe(), line, column)
    raised = exc.args[1] if len(exc.args) > 1 else None
    node = exc.tree
    if raised is KeyError and isinstance(node, Tree) and node.data == "member_dot":
        # ``m.name`` where the map ``m`` has no key ``name``: point at the name itself
        name = node.children[1]
        message = f"no attribute {str(name)!r} in that domain (guard with has(...))"
        if isinstance(name, Token):
            return CelEvaluationError(message, name.line, name.column)
        return CelEvaluationError(message, line, column)
    undeclared = _undeclared_name(exc, raised)
    if undeclared is not None:
        return CelEvaluationError(f"undeclared reference to {undeclared!r}", line, column)
    message = str(exc.args[0]) if exc.args else type(exc).__name__
    return CelEvaluationError(message[:MAX_MESSAGE], line, column)


def _undeclared_name(exc: CELEvalError, raised: Any) -> str | None:
    """The name of an unknown function (cel-python records its token) or of a variable the
    activation lacks (a ``primary`` node holding an ``ident``), when ``exc`` is either."""
    if raised is not KeyError:
        return None
    if exc.token is not None:
        return str(exc.token)
    node = exc.tree
    if isinstance(node, Tree) and node.data == "primary" and node.children:
        ident = node.children[0]
        if isinstance(ident, Tree) and ident.data == "ident" and ident.children:
            return str(ident.children[0])
    return None
