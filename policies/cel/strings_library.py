"""cel-go's strings extension (version 2) and the regular expressions (RE2: the core
``matches`` and Kubernetes' regex library), as cel-python functions."""

from __future__ import annotations

from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

import cdigen.policies.cel.limits as limits
from cdigen.policies.cel.call_args import all_ints, all_strings, function_error, no_overload
from cdigen.policies.cel.errors import type_name
from cdigen.policies.cel.operators import cel_equal

# -- cel-go's strings extension (version 2), with Kubernetes' size limits


def _cel_lower_ascii(s: Any) -> Any:
    if not isinstance(s, str):
        return function_error(f"no such overload: {type(s).__name__}.lowerAscii()")
    return celtypes.StringType("".join(c.lower() if c.isascii() else c for c in s))


def _cel_split(s: Any, sep: Any, limit: Any = -1) -> Any:
    if not isinstance(s, str) or not isinstance(sep, str):
        return function_error("no such overload: split(string, string)")
    count = int(limit)
    if count == 0:
        return celtypes.ListType([])
    parts = str(s).split(str(sep), count - 1 if count > 0 else -1)
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def _cel_replace(s: Any, old: Any, new: Any, limit: Any = -1) -> Any:
    if not all(isinstance(x, str) for x in (s, old, new)):
        return function_error("no such overload: replace(string, string, string)")
    count = len(s) + 1 if not old else s.count(old)
    if int(limit) >= 0:
        count = min(count, int(limit))
    if len(s) + count * (len(new) - len(old)) > limits.MAX_VALUE_LENGTH:
        return function_error(
            f"replace() would build a string over {limits.MAX_VALUE_LENGTH} characters"
        )
    return celtypes.StringType(str(s).replace(str(old), str(new), int(limit)))


def _cel_upper_ascii(s: Any) -> Any:
    if not isinstance(s, str):
        return no_overload("upperAscii", s)
    return celtypes.StringType("".join(c.upper() if c.isascii() else c for c in s))


def _cel_char_at(s: Any, index: Any) -> Any:
    if not (all_strings(s) and all_ints(index)):
        return no_overload("charAt", s, index)
    if not 0 <= index <= len(s):
        return function_error(f"index out of range: {index}")
    return celtypes.StringType(s[index : index + 1])


def _cel_index_of(s: Any, sub: Any, start: Any = 0) -> Any:
    if isinstance(s, celtypes.ListType) and start == 0:
        for n, element in enumerate(s):
            equal = cel_equal(element, sub)
            if isinstance(equal, CELEvalError):
                return equal
            if equal:
                return celtypes.IntType(n)
        return celtypes.IntType(-1)
    if not (all_strings(s, sub) and all_ints(start)):
        return no_overload("indexOf", s, sub)
    if not 0 <= start <= len(s):
        return function_error(f"index out of range: {start}")
    return celtypes.IntType(s.find(sub, start))


def _cel_last_index_of(s: Any, sub: Any, last: Any = None) -> Any:
    if isinstance(s, celtypes.ListType) and last is None:
        for n in range(len(s) - 1, -1, -1):
            equal = cel_equal(s[n], sub)
            if isinstance(equal, CELEvalError):
                return equal
            if equal:
                return celtypes.IntType(n)
        return celtypes.IntType(-1)
    if not (all_strings(s, sub) and (last is None or all_ints(last))):
        return no_overload("lastIndexOf", s, sub)
    end = len(s) if last is None else int(last)
    if not 0 <= end <= len(s):
        return function_error(f"index out of range: {end}")
    return celtypes.IntType(s.rfind(sub, 0, end + len(sub)))


def _cel_substring(s: Any, start: Any, end: Any = None) -> Any:
    stop = len(s) if end is None and isinstance(s, str) else end
    if not (all_strings(s) and all_ints(start, stop)):
        return no_overload("substring", s, start)
    if not 0 <= start <= len(s):
        return function_error(f"index out of range: {start}")
    if not 0 <= stop <= len(s):
        return function_error(f"index out of range: {stop}")
    if start > stop:
        return function_error(f"invalid substring range. start: {start}, end: {stop}")
    return celtypes.StringType(s[start:stop])


def _cel_trim(s: Any) -> Any:
    if not isinstance(s, str):
        return no_overload("trim", s)
    return celtypes.StringType(s.strip())


def _cel_join(items: Any, separator: Any = "") -> Any:
    if not (isinstance(items, list) and all_strings(separator) and all_strings(*items)):
        return no_overload("join", items)
    return celtypes.StringType(str(separator).join(items))


def _cel_quote(s: Any) -> Any:
    if not isinstance(s, str):
        return no_overload("strings.quote", s)
    escapes = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    escapes |= {"\v": "\\v", "\\": "\\\\", '"': '\\"'}
    return celtypes.StringType('"' + "".join(escapes.get(c, c) for c in s) + '"')


def _render(value: Any) -> str:
    """A value as ``%s`` writes it (cel-go's string clause)."""
    if isinstance(value, celtypes.BoolType):
        return "true" if value else "false"
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, celtypes.ListType):
        return "[" + ", ".join(_render(v) for v in value) + "]"
    if isinstance(value, celtypes.MapType):
        return "{" + ", ".join(f"{_render(k)}: {_render(v)}" for k, v in value.items()) + "}"
    if value is None or isinstance(value, celtypes.NullType):
        return "null"
    if isinstance(value, celtypes.DoubleType):
        return repr(float(value))
    return str(value)


def _cel_format(text: Any, args: Any) -> Any:
    from cdigen.policies.cel.formatting import FormatError, apply_format

    if not (isinstance(text, str) and isinstance(args, list)):
        return no_overload("format", text, args)
    try:
        return celtypes.StringType(apply_format(str(text), list(args), type_name, _render))
    except FormatError as exc:
        return function_error(str(exc))


# -- regular expressions (RE2), the core ``matches`` and Kubernetes' regex library


def _pattern(pattern: Any) -> Any:
    from cdigen.policies.cel.regex import compiled, regex_problem

    problem = regex_problem(str(pattern))
    if problem is not None:
        return function_error(f"invalid regular expression {str(pattern)!r}: {problem}")
    return compiled(str(pattern))


def _cel_matches(s: Any, pattern: Any) -> Any:
    if not all_strings(s, pattern):
        return no_overload("matches", s, pattern)
    compiled = _pattern(pattern)
    if isinstance(compiled, CELEvalError):
        return compiled
    return celtypes.BoolType(compiled.search(str(s)) is not None)


def _cel_find(s: Any, pattern: Any) -> Any:
    if not all_strings(s, pattern):
        return no_overload("find", s, pattern)
    compiled = _pattern(pattern)
    if isinstance(compiled, CELEvalError):
        return compiled
    found = compiled.search(str(s))
    return celtypes.StringType(found.group(0) if found else "")


def _cel_find_all(s: Any, pattern: Any, limit: Any = -1) -> Any:
    if not (all_strings(s, pattern) and all_ints(limit)):
        return no_overload("findAll", s, pattern)
    compiled = _pattern(pattern)
    if isinstance(compiled, CELEvalError):
        return compiled
    found = [m.group(0) for m in compiled.finditer(str(s))]
    if limit >= 0:
        found = found[:limit]
    return celtypes.ListType([celtypes.StringType(f) for f in found])


STRING_FUNCTIONS: dict[str, Any] = {
    "lowerAscii": _cel_lower_ascii,
    "split": _cel_split,
    "replace": _cel_replace,
    "upperAscii": _cel_upper_ascii,
    "charAt": _cel_char_at,
    "indexOf": _cel_index_of,
    "lastIndexOf": _cel_last_index_of,
    "substring": _cel_substring,
    "trim": _cel_trim,
    "join": _cel_join,
    "format": _cel_format,
    "strings.quote": _cel_quote,
    "matches": _cel_matches,
    "find": _cel_find,
    "findAll": _cel_find_all,
}
