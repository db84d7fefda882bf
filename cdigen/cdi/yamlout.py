"""The spec as block YAML, byte for byte what ``yaml.dump(..., sort_keys=False)`` writes, in a
fraction of its time: PyYAML's representer is pure Python even with the C emitter.

Handles the shapes a generated spec has (mappings with string keys, sequences, strings that
need no quotes or single quotes, integers); returns None for anything else, and the caller
falls back to PyYAML.
"""

from __future__ import annotations

import re
from typing import Any

# Characters that never make PyYAML leave the plain or single-quoted style in block context.
_SIMPLE = re.compile(r"[A-Za-z0-9_./=+@-][A-Za-z0-9_./:=+@-]*|")


class _Unsupported(Exception):
    pass


def _scalar(value: Any, resolve: Any) -> str:
    if isinstance(value, bool) or value is None:
        raise _Unsupported
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str) or not _SIMPLE.fullmatch(value) or value.endswith(":"):
        raise _Unsupported
    indicator = value in ("-", "") or value.startswith(("@", "---", "..."))
    if indicator or resolve(value) != "tag:yaml.org,2002:str":
        return f"'{value}'"
    return value


def _mapping(doc: dict[str, Any], indent: int, out: list[str], scalar: Any, first: str) -> None:
    if not doc:
        raise _Unsupported
    pad = " " * indent
    for i, (key, value) in enumerate(doc.items()):
        lead = first if i == 0 else pad
        name = scalar(key)
        if isinstance(value, dict):
            out.append(f"{lead}{name}:\n")
            _mapping(value, indent + 2, out, scalar, " " * (indent + 2))
        elif isinstance(value, list):
            if i == 0 and first != pad:
                raise _Unsupported  # a sequence as the first value of a sequence item
            out.append(f"{lead}{name}:\n")
            _sequence(value, indent, out, scalar)
        else:
            out.append(f"{lead}{name}: {scalar(value)}\n")


def _sequence(items: list[Any], indent: int, out: list[str], scalar: Any) -> None:
    if not items:
        raise _Unsupported
    pad = " " * indent
    for item in items:
        if isinstance(item, dict):
            _mapping(item, indent + 2, out, scalar, f"{pad}- ")
        elif isinstance(item, list):
            raise _Unsupported
        else:
            out.append(f"{pad}- {scalar(item)}\n")


def block_yaml(doc: Any) -> str | None:
    """``doc`` as PyYAML's block style would write it, or None if it has other shapes."""
    import yaml

    resolver: Any = yaml.resolver.Resolver()
    written: dict[str, str] = {}  # a spec repeats its keys and options hundreds of times

    def resolve(text: str) -> str:
        return str(resolver.resolve(yaml.ScalarNode, text, (True, False)))

    def scalar(value: Any) -> str:
        if type(value) is not str:
            return _scalar(value, resolve)
        text = written.get(value)
        if text is None:
            text = written[value] = _scalar(value, resolve)
        return text

    out: list[str] = []
    try:
        if not isinstance(doc, dict):
            return None
        _mapping(doc, 0, out, scalar, "")
    except _Unsupported:
        return None
    return "".join(out)
