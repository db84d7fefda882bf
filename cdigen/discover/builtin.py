"""Built-in sample nodes (``builtin:NAME``), shipped as YAML package data in ``data/``.

The samples are generated from ``../shared/reference/topologies`` by
``tests/fixtures/make_samples.py`` and checked against those files by the tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from cdigen.errors import InputError

if TYPE_CHECKING:
    from cdigen.model import Node

PREFIX = "builtin:"


# Beside this module, as schemas.schema_dir() finds the schemas: importlib.resources would cost
# ~10 ms at every start, since each command's --help lists these names.
_DATA = Path(__file__).resolve().parent / "data"


def names() -> list[str]:
    """The names of the shipped samples, sorted."""
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in _DATA.iterdir()
        if entry.name.endswith(".yaml")
    )


def sample_text(name: str) -> str:
    """The YAML text of sample ``name``; InputError listing the known names if there is none."""
    entry = _DATA / f"{name}.yaml"
    if not entry.is_file():
        raise InputError(
            f"no built-in sample called {name!r}",
            where=f"{PREFIX}{name}",
            hint=f"choose one of: {', '.join(names())}",
        )
    return entry.read_text(encoding="utf-8")


def suggest_builtin(source: str) -> None:
    """InputError suggesting ``builtin:NAME`` when ``source`` is a bare sample name and no file."""
    if "/" in source or Path(source).exists() or source not in names():
        return
    raise InputError(
        "no such node file",
        where=source,
        hint=f"for the built-in sample write --node {PREFIX}{source}",
    )


def load_builtin(name: str) -> Node:
    """The sample node ``name`` (without the ``builtin:`` prefix)."""
    from cdigen.fileio import parse_document
    from cdigen.nodefile import node_from_dict

    where = f"{PREFIX}{name}"
    return node_from_dict(parse_document(sample_text(name), where=where), where=where)
