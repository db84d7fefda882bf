"""Reading API objects that may have any shape: the API server stores what a client with
the right to write sent it, and a reader running as root on a node (or a user's terminal) must
not fail on a string where an object belongs. Each accessor checks one field's shape and raises
:class:`Malformed` naming the field, never quoting more than a short escaped bit of its value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cdigen.errors import CdigenError, shortened


class Malformed(Exception):
    """A field of an API object that does not have the shape the API gives it; the message
    names the field (never more than a short, escaped quote of its value)."""


# What the objects' readers may raise on a shape they do not expect: the simulator's readers
# (cdigen.policies.dra) check what a manifest on disk may hold, not every shape a hostile API object
# may.
SHAPE_ERRORS = (Malformed, CdigenError, AttributeError, TypeError, ValueError, KeyError)


def described(exc: BaseException) -> str:
    """What is wrong, as one line, for an error a reader raised on an object."""
    if isinstance(exc, CdigenError):
        return exc.message if exc.where is None else f"{exc.where}: {exc.message}"
    if isinstance(exc, Malformed):
        return str(exc)
    return f"malformed ({type(exc).__name__}: {shortened(str(exc), 60)})"


def _kind(value: Any) -> str:
    kinds = {"str": "a string", "int": "a number", "float": "a number", "bool": "a boolean"}
    return kinds.get(type(value).__name__, "a list" if isinstance(value, list) else "an object")


def obj(value: Any, field: str) -> Mapping[str, Any]:
    """``value`` as an object (None: empty), or :class:`Malformed` naming ``field``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise Malformed(f"{field} is {_kind(value)}, not an object")
    return value


def seq(value: Any, field: str) -> Sequence[Any]:
    """``value`` as a list (None: empty), or :class:`Malformed` naming ``field``."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise Malformed(f"{field} is {_kind(value)}, not a list")
    return value


def objs(value: Any, field: str) -> list[Mapping[str, Any]]:
    """``value`` as a list of objects, or :class:`Malformed` naming the first bad entry."""
    items = seq(value, field)
    for n, item in enumerate(items):
        obj(item, f"{field}[{n}]")
    return [i for i in items if i is not None]


def integer(value: Any, field: str) -> int:
    """``value`` as an integer (None: 0), or :class:`Malformed` naming ``field``."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise Malformed(f"{field} is {_kind(value)}, not an integer")
    return value


def name_of(doc: Mapping[str, Any]) -> tuple[str, str]:
    """The object's (namespace, name), empty where missing or malformed."""
    meta = doc.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))
