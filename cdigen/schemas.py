"""Finding the JSON Schemas (shipped in the wheel as ``cdigen.schema_files``) and applying them."""

from __future__ import annotations

import datetime
import importlib.util
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from cdigen.errors import SchemaError, close_match, first_of, shortened

_SOURCE_DIR = Path(__file__).resolve().parent.parent / "schemas"


def schema_dir() -> Path:
    """The directory holding ``*.schema.json``: the installed package data, else the source tree."""
    try:
        spec = importlib.util.find_spec("cdigen.schema_files")
    except ModuleNotFoundError:
        spec = None
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location)
        if any(path.glob("*.schema.json")):
            return path
    return _SOURCE_DIR


@cache
def load_schema(name: str) -> dict[str, Any]:
    """The schema ``schemas/<name>.schema.json`` as a dict (cached)."""
    path = schema_dir() / f"{name}.schema.json"
    with path.open(encoding="utf-8") as f:
        schema: dict[str, Any] = json.load(f)
    return schema


def _whole_value(pattern: str) -> str:
    """``pattern`` for Python's ``re`` with ECMA 262's meaning of ``$``: the end of the value.

    Python's ``$`` also matches before a final newline, so jsonschema (which uses ``re.search``)
    would pass ``"rw\\n"`` for ``^[rwm]*$``; Go and JavaScript do not. Each ``$`` outside a
    character class becomes ``\\Z``.
    """
    out: list[str] = []
    escaped = in_class = False
    for ch in pattern:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "$":
            out.append("\\Z")
            continue
        out.append(ch)
    return "".join(out)


@cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(_whole_value(pattern))


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    import jsonschema

    if validator.is_type(instance, "string") and not _compiled(pattern).search(instance):
        yield jsonschema.ValidationError(f"{shortened(repr(instance))} does not match {pattern!r}")


def make_validator(schema: dict[str, Any]) -> Any:
    """A jsonschema validator for ``schema`` (its draft, with format checks) whose ``pattern``
    must match the whole value, as in ECMA 262 and Go (see :func:`_whole_value`)."""
    import jsonschema

    base = jsonschema.validators.validator_for(schema)
    cls = jsonschema.validators.extend(base, {"pattern": _pattern})
    return cls(schema, format_checker=base.FORMAT_CHECKER)


@cache
def _validator(name: str) -> Any:
    return make_validator(load_schema(name))


def field_path(parts: Iterable[str | int]) -> str:
    """Render a path as ``gpus[2].memoryBytes`` (``<root>`` when empty)."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "<root>"


@dataclass(frozen=True)
class SchemaProblem:
    """One violation of a schema: where in the document (keys and list indexes, empty for the
    document itself) and why. Rendered only where it is shown (:meth:`field`, ``str()``), so
    a caller that puts the path under a field of its own never reads a rendered path back."""

    path: tuple[str | int, ...]
    message: str

    @property
    def field(self) -> str:
        """The path as ``gpus[2].memoryBytes`` (``<root>`` for the document itself)."""
        return field_path(self.path)

    def field_under(self, base: str) -> str:
        """The path below the field ``base``: ``base.gpus[2]``, ``base[0]``, ``base`` itself."""
        return field_path((base, *self.path))

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)


def describe_value(value: Any) -> str:
    """``value`` for an error message, at most about 60 characters: JSON for JSON values, and
    the YAML type named for what JSON lacks (``a date (2001-01-01)``, ``binary data``, a set)."""
    if isinstance(value, datetime.datetime):
        return f"a timestamp ({value.isoformat()}); quote it to make it a string"
    if isinstance(value, datetime.date):
        return f"a date ({value.isoformat()}); quote it to make it a string"
    if isinstance(value, (bytes, bytearray)):
        return f"binary data ({len(value)} bytes)"
    prefix = "a set " if isinstance(value, (set, frozenset)) else ""
    try:
        text = json.dumps(value, default=_jsonable)
    except (TypeError, ValueError, RecursionError):
        text = f"a {type(value).__name__}"
    return prefix + shortened(text)


def _describe(error: Any) -> str:
    if error.validator == "type":
        expected = error.validator_value
        if isinstance(expected, list):
            expected = " or ".join(expected)
        return f"expected {expected}, got {describe_value(error.instance)}"
    if error.validator == "enum":
        choices = ", ".join("null" if c is None else str(c) for c in error.validator_value)
        return f"expected one of {choices}, got {describe_value(error.instance)}"
    if error.validator in ("maxLength", "maxItems"):
        unit = "characters" if error.validator == "maxLength" else "items"
        return (
            f"{describe_value(error.instance)} is too long: {len(error.instance):,} {unit}, "
            f"at most {error.validator_value:,}"
        )
    if error.validator == "additionalProperties":
        known = sorted(error.schema.get("properties", {}))
        unknown = [k for k in error.instance if k not in known] if known else []
        guess = close_match(str(unknown[0]), known) if unknown else None
        if guess is not None:
            return f"unknown field {unknown[0]!r}: did you mean {guess!r}?"
        return f"{error.message} (check the spelling; unknown fields are not allowed)"
    if error.validator == "not" and "description" in error.schema:
        return str(error.schema["description"])  # an if/then rule says it in its own words
    return str(error.message)


def schema_problems(document: Any, name: str) -> list[SchemaProblem]:
    """Every violation of schema ``name``, in document order."""
    errors = sorted(_validator(name).iter_errors(document), key=lambda e: list(map(str, e.path)))
    return [SchemaProblem(tuple(e.absolute_path), _describe(e)) for e in errors]


def schema_errors(document: Any, name: str) -> list[str]:
    """Every violation of schema ``name`` as the line ``path: why``, in document order: for
    callers that print them; one that needs the path takes :func:`schema_problems`."""
    return [str(p) for p in schema_problems(document, name)]


_ANNOTATIONS = frozenset(
    {"$schema", "$id", "$comment", "$defs", "title", "description", "default", "examples"}
)
_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer())
    ),
}


class _Unknown(Exception):
    """A keyword the quick check does not implement: ask jsonschema."""


def _same(a: Any, b: Any) -> bool:
    """JSON equality as jsonschema has it: ``True`` is not ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


Check = Callable[[Any], bool]


def _always(value: Any) -> bool:
    return True


def _never(value: Any) -> bool:
    return False


def _all_of(checks: list[Check]) -> Check:
    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]
    return lambda v: all(c(v) for c in checks)


def _object_check(schema: Mapping[str, Any], root: Any, refs: dict[str, Check]) -> Check | None:
    """The check for an object's properties, required, additionalProperties and propertyNames."""
    if not {"properties", "required", "additionalProperties", "propertyNames"} & schema.keys():
        return None
    props = {k: _compile(s, root, refs) for k, s in schema.get("properties", {}).items()}
    required = tuple(schema.get("required", ()))
    extra = (
        _compile(schema["additionalProperties"], root, refs)
        if "additionalProperties" in schema
        else None
    )
    names = _compile(schema["propertyNames"], root, refs) if "propertyNames" in schema else None

    def check(value: Any) -> bool:
        if not isinstance(value, dict):
            return True
        if any(k not in value for k in required):
            return False
        for k, v in value.items():
            sub = props.get(k)
            if sub is not None:
                if not sub(v):
                    return False
            elif extra is not None and not extra(v):
                return False
            if names is not None and not names(k):
                return False
        return True

    return check


def _ref(arg: Any, root: Any, refs: dict[str, Check]) -> Check:
    """The check for ``{"$ref": "#/$defs/NAME"}``, compiled once per NAME."""
    if not isinstance(arg, str) or not arg.startswith("#/$defs/"):
        raise _Unknown("$ref")
    name = arg.removeprefix("#/$defs/")
    if name not in refs:
        late: list[Check] = []
        refs[name] = lambda v: late[0](v)  # a recursive schema reaches itself through this
        late.append(_compile(root["$defs"][name], root, refs))
        refs[name] = late[0]
    return refs[name]


def _keyword_check(key: str, arg: Any, compile_sub: Callable[[Any], Check]) -> Check:
    """The check for one keyword other than ``$ref`` and the object keywords."""
    if key == "type":
        preds = tuple(_TYPES[t] for t in (arg if isinstance(arg, list) else [arg]))
        return lambda v: any(p(v) for p in preds)
    if key == "const":
        return lambda v: _same(v, arg)
    if key == "enum":
        return lambda v: any(_same(v, a) for a in arg)
    if key == "items":
        item = compile_sub(arg)
        return lambda v: not isinstance(v, list) or all(map(item, v))
    if key in ("minItems", "maxItems", "minLength", "maxLength"):
        kind = list if key.endswith("Items") else str
        if key.startswith("min"):
            return lambda v: not isinstance(v, kind) or len(v) >= arg
        return lambda v: not isinstance(v, kind) or len(v) <= arg
    if key == "pattern":
        search = _compiled(arg).search
        return lambda v: not isinstance(v, str) or search(v) is not None
    if key == "minimum":
        return lambda v: not _TYPES["number"](v) or v >= arg
    if key == "maximum":
        return lambda v: not _TYPES["number"](v) or v <= arg
    raise _Unknown(key)


def _compile(schema: Any, root: Any, refs: dict[str, Check]) -> Check:
    """``schema`` as one predicate; :class:`_Unknown` for a keyword the quick check lacks."""
    if schema is True:
        return _always
    if schema is False or not isinstance(schema, Mapping):
        return _never
    checks: list[Check] = []
    for key, arg in schema.items():
        if key in _ANNOTATIONS or key in ("required", "additionalProperties", "propertyNames"):
            continue
        if key == "$ref":
            checks.append(_ref(arg, root, refs))
        elif key == "properties":
            object_check = _object_check(schema, root, refs)
            assert object_check is not None
            checks.append(object_check)
        else:
            checks.append(_keyword_check(key, arg, lambda sub: _compile(sub, root, refs)))
    if "properties" not in schema:
        object_check = _object_check(schema, root, refs)
        if object_check is not None:
            checks.append(object_check)
    return _all_of(checks)


_QUICK: dict[int, tuple[Mapping[str, Any], Check | None]] = {}


def _quick_check(schema: Mapping[str, Any]) -> Check | None:
    """The compiled check for ``schema``, made once per schema object (None: not supported)."""
    known = _QUICK.get(id(schema))
    if known is not None and known[0] is schema:
        return known[1]
    try:
        check: Check | None = _compile(schema, schema, {})
    except (_Unknown, KeyError, TypeError, re.error):
        check = None
    if len(_QUICK) < 64:  # schemas are few and long-lived; a test's throwaway ones are not kept
        _QUICK[id(schema)] = (schema, check)
    return check


def quick_valid(document: Any, schema: Mapping[str, Any]) -> bool | None:
    """Whether ``document`` is valid against ``schema``, without loading jsonschema; None when
    the schema uses a keyword this check does not know (then ask :func:`schema_errors`).

    Covers the keywords cdigen's schemas use. It only ever answers True for a document that
    jsonschema accepts too; its False is rechecked with jsonschema for the messages.
    """
    check = _quick_check(schema)
    if check is None:
        return None
    try:
        return check(document)
    except TypeError:  # e.g. a minimum compared with a value of another kind
        return None


def validate(document: Any, name: str, *, where: str) -> None:
    """Raise :class:`SchemaError` naming ``where`` and the first bad field if ``document`` fails.

    A valid document is confirmed by :func:`quick_valid`; jsonschema loads only for the rest.
    """
    if quick_valid(document, load_schema(name)):
        return
    problems = schema_problems(document, name)
    if problems:
        hint = f"see schemas/{name}.schema.json"
        first = first_of([str(p) for p in problems])
        raise SchemaError(first, where=where, hint=hint, field=problems[0].field)
