"""Reading YAML/JSON documents and writing files atomically."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from cdigen.errors import InputError, WriteError


def read_text(path: str | Path, *, what: str = "file") -> str:
    """The text of ``path``; a one-line InputError if it is missing or unreadable."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} not found", where=str(path), hint="check the path") from None
    except IsADirectoryError:
        raise InputError(f"expected a {what}, found a directory", where=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {what}: {exc}", where=str(path)) from None


def read_stdin(*, what: str = "input") -> str:
    """All of standard input as text; a one-line InputError if it is not readable text."""
    try:
        return sys.stdin.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {what}: {exc}", where="<stdin>") from None


def parse_document(text: str, *, where: str) -> Any:
    """Parse YAML (JSON is YAML too); a one-line InputError with line and column on bad syntax."""
    import yaml

    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        pos = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise InputError(
            f"{pos}invalid YAML: {exc.problem}", where=where, hint="fix the syntax"
        ) from None
    except yaml.YAMLError as exc:
        raise InputError(f"invalid YAML: {exc}", where=where) from None


def read_document(path: str | Path, *, what: str = "file") -> Any:
    """Read and parse a YAML or JSON file."""
    return parse_document(read_text(path, what=what), where=str(path))


def dump_document(document: Any, fmt: str) -> str:
    """Render a document as ``yaml`` or ``json`` text (keys in insertion order)."""
    if fmt == "json":
        return json.dumps(document, indent=2) + "\n"
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return str(yaml.dump(document, Dumper=dumper, sort_keys=False, default_flow_style=False))


def atomic_write(path: str | Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically: temp file beside it, fsync, rename, fsync the dir.

    On any failure the previous file is left as it was and the temp file is removed.
    """
    target = Path(path)
    directory = target.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise WriteError(
            f"cannot create a file in {directory}: {exc.strerror}", where=str(target)
        ) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise WriteError(
            f"write failed ({exc.strerror or exc}); the previous file is unchanged",
            where=str(target),
        ) from None
    try:  # the file is in place: a failure here only weakens durability, so it is a warning
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        logging.getLogger("cdigen").warning(
            "%s: written, but syncing %s failed (%s); a power loss now could undo the rename",
            target,
            directory,
            exc.strerror or exc,
        )
