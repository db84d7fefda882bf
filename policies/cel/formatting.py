"""``"...".format([...])`` of cel-go's strings extension (version 2, as Kubernetes enables it):
the clauses ``%s %d %f %e %b %x %X %o`` (``%.3f``: a precision) and ``%%``; checked against the
argument types when the expression is created (a literal format string with a literal list),
and run against the values when evaluated. The messages are cel-go's."""

from __future__ import annotations

from collections.abc import Callable, Sequence

_STRINGABLE = frozenset(
    {"string", "bool", "bytes", "int", "uint", "double", "map", "list", "type", "null", "dyn"}
    | {"google.protobuf.Duration", "google.protobuf.Timestamp", "any"}
)
_ALLOWED = {
    "s": (
        _STRINGABLE,
        "string clause can only be used on strings, bools, bytes, ints, doubles, "
        "maps, lists, types, durations, and timestamps, was given {}",
    ),
    "d": (frozenset({"int", "uint"}), "decimal clause can only be used on integers, was given {}"),
    "f": (
        frozenset({"double", "string"}),
        "fixed-point clause can only be used on doubles, was given {}",
    ),
    "e": (
        frozenset({"double", "string"}),
        "scientific clause can only be used on doubles, was given {}",
    ),
    "b": (
        frozenset({"int", "uint", "bool"}),
        "only integers and bools can be formatted as binary, was given {}",
    ),
    "x": (
        frozenset({"int", "uint", "string", "bytes"}),
        "only integers, byte buffers, and strings can be formatted as hex, was given {}",
    ),
    "o": (frozenset({"int", "uint"}), "octal clause can only be used on integers, was given {}"),
}


class FormatError(ValueError):
    """A format string that cannot be applied to its arguments (cel-go's words)."""


def clauses(text: str) -> list[tuple[str, int | None]]:
    """The clauses of ``text`` in order, each ``(verb, precision)``; FormatError when one
    cannot be parsed."""
    out: list[tuple[str, int | None]] = []
    i = 0
    while i < len(text):
        if text[i] != "%":
            i += 1
            continue
        if text[i + 1 : i + 2] == "%":
            i += 2
            continue
        if i + 1 >= len(text):
            raise FormatError("unexpected end of string")
        j, precision = i + 1, None
        if text[j] == ".":
            k = j + 1
            while k < len(text) and text[k].isdigit():
                k += 1
            if k >= len(text):
                raise FormatError(
                    "could not parse formatting clause: error while parsing precision: could "
                    "not find end of precision specifier"
                )
            precision = int(text[j + 1 : k] or "0")
            j = k
        verb = text[j]
        if verb not in _ALLOWED and verb != "X":  # cel-go: lowercase verbs, and X
            raise FormatError(
                f'could not parse formatting clause: unrecognized formatting clause "{verb}"'
            )
        out.append((verb, precision))
        i = j + 1
    return out


def _base_name(type_name: str) -> str:
    return type_name.partition("(")[0]


def check_format(text: str, arg_types: Sequence[str]) -> None:
    """The create-time check: each clause against the type of its argument, and no argument
    left over (FormatError)."""
    found = clauses(text)
    for n, (verb, _) in enumerate(found):
        if n >= len(arg_types):
            raise FormatError(f"index {n} out of range")
        kind = _base_name(arg_types[n])
        allowed, message = _ALLOWED[verb.lower()]
        if kind not in allowed and kind not in ("dyn", "any"):
            raise FormatError("error during formatting: " + message.format(kind))
    if len(arg_types) > len(found):
        raise FormatError(
            f"too many arguments supplied to string.format (expected {len(found)}, "
            f"got {len(arg_types)})"
        )


def apply_format(
    text: str,
    args: Sequence[object],
    type_name: Callable[[object], str],
    render: Callable[[object], str],
) -> str:
    """The formatted string (FormatError as cel-go's run-time error)."""
    found = iter(clauses(text))
    out: list[str] = []
    i = n = 0
    while i < len(text):
        char = text[i]
        if char != "%":
            out.append(char)
            i += 1
            continue
        if text[i + 1 : i + 2] == "%":
            out.append("%")
            i += 2
            continue
        verb, precision = next(found)
        if n >= len(args):
            raise FormatError(f"index {n} out of range")
        value = args[n]
        kind = _base_name(type_name(value))
        allowed, message = _ALLOWED[verb.lower()]
        if kind not in allowed:
            raise FormatError("error during formatting: " + message.format(kind))
        out.append(_clause(verb, precision, value, kind, render))
        n += 1
        i = text.index(verb, i + 1) + 1
    return "".join(out)


def _clause(
    verb: str, precision: int | None, value: object, kind: str, render: Callable[[object], str]
) -> str:
    if verb == "s":
        return render(value)
    if verb in "fe":
        number = float(str(value)) if kind == "string" else float(value)  # type: ignore[arg-type]
        return f"{number:.{6 if precision is None else precision}{verb}}"
    if kind == "bool":
        return "1" if value else "0"
    if kind in ("string", "bytes"):
        raw = value.encode() if isinstance(value, str) else bytes(value)  # type: ignore[call-overload]
        hexed = raw.hex()
        return hexed.upper() if verb == "X" else hexed
    number_int = int(value)  # type: ignore[call-overload]
    spec = {"d": "d", "b": "b", "o": "o", "x": "x", "X": "X"}[verb]
    return format(number_int, spec)
