"""Finding the JSON Schemas (shipped in the wheel as ``cdigen.schema_files``) and applying them."""

from __future__ import annotations

import importlib.util
import json
from functools import cache
from pathlib import Path
from typing import Any

from cdigen.errors import SchemaError, first_of

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


@cache
def _validator(name: str) -> Any:
    import jsonschema

    schema = load_schema(name)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def field_path(parts: Any) -> str:
    """Render a jsonschema path deque as ``gpus[2].memoryBytes`` (``<root>`` when empty)."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "<root>"


def _describe(error: Any) -> str:
    if error.validator == "type":
        expected = error.validator_value
        if isinstance(expected, list):
            expected = " or ".join(expected)
        return f"expected {expected}, got {json.dumps(error.instance)[:60]}"
    if error.validator == "additionalProperties":
        return f"{error.message} (check the spelling; unknown fields are not allowed)"
    return str(error.message)


def schema_errors(document: Any, name: str) -> list[str]:
    """Every violation of schema ``name`` as ``path: why``, in document order."""
    errors = sorted(_validator(name).iter_errors(document), key=lambda e: list(map(str, e.path)))
    return [f"{field_path(e.absolute_path)}: {_describe(e)}" for e in errors]


def validate(document: Any, name: str, *, where: str) -> None:
    """Raise :class:`SchemaError` naming ``where`` and the first bad field if ``document`` fails."""
    problems = schema_errors(document, name)
    if problems:
        hint = f"see schemas/{name}.schema.json"
        raise SchemaError(first_of(problems), where=where, hint=hint)
