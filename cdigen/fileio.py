"""Reading YAML/JSON documents and writing files atomically."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import logging

from cdigen import logs
from cdigen.errors import InputError, WriteError

MAX_INPUT_BYTES_ENV = "CDIGEN_MAX_INPUT_BYTES"
DEFAULT_MAX_INPUT_BYTES = 4 * 1024 * 1024
MAX_ALIAS_NODES = 100_000  # nodes that aliases may add to a document, in all
MAX_DEPTH = 200  # nesting levels of one document
MAX_INT_CHARS = 40  # an integer literal's length: int64 and uint64 need 20 at most


def max_input_bytes() -> int:
    """The largest file cdigen reads: ``$CDIGEN_MAX_INPUT_BYTES``, else 4 MiB."""
    raw = os.environ.get(MAX_INPUT_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_INPUT_BYTES
    if not raw.isascii() or not raw.isdecimal() or len(raw) > 15 or int(raw) < 1:
        raise InputError(
            f"{MAX_INPUT_BYTES_ENV}={raw[:40]!r} is not a positive number of bytes",
            hint=f"unset it (default {DEFAULT_MAX_INPUT_BYTES}) or give a byte count",
        )
    return int(raw)


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, by its ``st_mode``, as an error says it
    ("found a directory", "it is a pipe"); a pipe covers a named one (a FIFO) and an anonymous
    one (``/dev/stdin`` of a pipeline) alike."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a pipe"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _too_big(what: str, limit: int, where: str) -> InputError:
    return InputError(
        f"{what} is larger than {limit} bytes",
        where=where,
        hint=f"is it the right file? raise the limit with {MAX_INPUT_BYTES_ENV}=BYTES",
    )


def read_text(path: str | Path, *, what: str = "file") -> str:
    """The text of the regular file ``path``, at most :func:`max_input_bytes` long; a one-line
    InputError if it is missing, unreadable, too big or not a regular file (``/dev/zero``)."""
    where = str(path)
    if not where:
        raise InputError(f"no {what} named: the path is empty", hint="give the path of a file")
    limit = max_input_bytes()
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if os.path.islink(path):
            raise InputError(
                f"{what} is a dangling symlink (to {os.readlink(path)})", where=where
            ) from None
        raise InputError(f"{what} not found", where=where, hint="check the path") from None
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror or exc}", where=where) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise InputError(f"expected a {what}, found a directory", where=where)
        if not stat.S_ISREG(mode):
            raise InputError(
                f"expected a {what}, found {file_kind(mode)}",
                where=where,
                hint="give the path of a regular file",
            )
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror or exc}", where=where) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise _too_big(what, limit, where)
    return _decode(data, what=what, where=where)


def _decode(data: bytes, *, what: str, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"cannot read {what}: not UTF-8 text (byte {exc.start})", where=where
        ) from None


def read_stdin(*, what: str = "input") -> str:
    """All of standard input as text, at most :func:`max_input_bytes` long; a one-line
    InputError if it is not readable text or too big."""
    limit = max_input_bytes()
    buffer = getattr(sys.stdin, "buffer", None)
    try:
        if buffer is None:  # a text stream without bytes beneath it (tests replace stdin)
            text = sys.stdin.read(limit + 1)
            if len(text) > limit:
                raise _too_big(what, limit, "<stdin>")
            return text
        data = buffer.read(limit + 1)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {what}: {exc}", where="<stdin>") from None
    if len(data) > limit:
        raise _too_big(what, limit, "<stdin>")
    return _decode(data, what=what, where="<stdin>")


def _refusal(problem: str, mark: Any) -> Exception:
    """A YAML error for input that parses but is refused (too big, too deep, self-referring)."""
    import yaml

    error = yaml.MarkedYAMLError(None, None, problem, mark)
    error.refused = True  # type: ignore[attr-defined]
    return error


@functools.cache
def _loader_class() -> Any:
    """The safe YAML loader, with numbers bounded (see :data:`MAX_INT_CHARS`) and finite."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class BoundedLoader(base):  # type: ignore[misc, valid-type]
        """``SafeLoader`` that refuses integers longer than ``MAX_INT_CHARS``, NaN and infinity."""

        def construct_yaml_int(self, node: Any) -> int:
            value = str(node.value)
            if len(value) > MAX_INT_CHARS:
                raise _refusal(
                    f"an integer of {len(value)} characters is too large (at most {MAX_INT_CHARS})",
                    node.start_mark,
                )
            return int(base.construct_yaml_int(self, node))

        def construct_yaml_float(self, node: Any) -> float:
            value = float(base.construct_yaml_float(self, node))
            if not math.isfinite(value):
                raise _refusal(f"{node.value[:40]} is not a finite number", node.start_mark)
            return value

    BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
    BoundedLoader.add_constructor("tag:yaml.org,2002:float", BoundedLoader.construct_yaml_float)
    return BoundedLoader


def _check_graph(root: Any) -> None:
    """Refuse a composed YAML graph that aliases would blow up, that refers to itself, or that
    is nested too deeply. Sizes are counted once per node, so this is linear in the text."""
    import yaml

    size: dict[int, int] = {}
    height: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    distinct = 0
    while stack:
        node, done = stack.pop()
        key = id(node)
        children: list[Any]
        if isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            children = []
        if done:
            open_nodes.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            height[key] = 1 + max((height[id(c)] for c in children), default=0)
            if height[key] > MAX_DEPTH:
                raise _graph_error(node, f"nested more than {MAX_DEPTH} levels deep")
            if size[key] - distinct > MAX_ALIAS_NODES:
                raise _graph_error(
                    node, f"aliases expand it by more than {MAX_ALIAS_NODES} nodes (an alias bomb?)"
                )
            continue
        if key in size:
            continue
        if key in open_nodes:
            raise _graph_error(node, "an alias refers to a node that contains it")
        open_nodes.add(key)
        distinct += 1
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(children) if id(c) not in size)


def _graph_error(node: Any, problem: str) -> Exception:
    return _refusal(problem, node.start_mark)


def parse_document(text: str, *, where: str) -> Any:
    """Parse YAML (JSON is YAML too) safely: no alias bombs, no self-referring aliases, at most
    :data:`MAX_DEPTH` levels, integers of at most :data:`MAX_INT_CHARS` characters. A one-line
    InputError with line and column on bad syntax or any of those."""
    import yaml

    loader = _loader_class()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_graph(node)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        pos = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        if getattr(exc, "refused", False):
            raise InputError(f"{pos}{exc.problem}", where=where) from None
        raise InputError(
            f"{pos}invalid YAML: {exc.problem}", where=where, hint="fix the syntax"
        ) from None
    except yaml.YAMLError as exc:
        raise InputError(f"invalid YAML: {' '.join(str(exc).split())}", where=where) from None
    except (RecursionError, ValueError, OverflowError) as exc:  # the pure-Python loader
        raise InputError(f"invalid YAML: {' '.join(str(exc).split())[:200]}", where=where) from None
    finally:
        loader.dispose()


def not_a_mapping(document: Any) -> str:
    """Why a parsed ``document`` that should be a mapping is not: ``the file is empty`` or
    ``its top level is a list, not a mapping`` (for an error naming the file)."""
    if document is None:
        return "the file is empty"
    kinds = {"str": "string", "int": "number", "float": "number", "bool": "boolean"}
    name = type(document).__name__
    return f"its top level is a {kinds.get(name, name)}, not a mapping"


def read_document(path: str | Path, *, what: str = "file") -> Any:
    """Read and parse a YAML or JSON file (see :func:`read_text` and :func:`parse_document`)."""
    return parse_document(read_text(path, what=what), where=str(path))


def dump_document(document: Any, fmt: str) -> str:
    """Render a document as ``yaml`` or ``json`` text (keys in insertion order)."""
    if fmt == "json":
        return json.dumps(document, indent=2) + "\n"
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return str(yaml.dump(document, Dumper=dumper, sort_keys=False, default_flow_style=False))


def same_dir(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` are one directory, symlinks resolved (two stat calls; a path
    not there yet is resolved by name)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def atomic_write(
    path: str | Path, data: bytes, *, mode: int = 0o644, within: str | Path | None = None
) -> None:
    """Write ``data`` to ``path`` atomically: temp file beside it, fsync, rename, fsync the dir.

    The file gets ``mode`` and missing directories 0755, whatever the umask; no directory is
    created through a ``..``. With ``within``, ``path`` must be a file directly in that
    directory (symlinks resolved) or nothing is written. On any failure the previous file is
    left as it was and the temp file is removed.
    """
    import tempfile  # with shutil, ~5 ms that commands which write nothing need not pay

    target = Path(path)
    directory = target.parent
    if within is not None and (target.name in ("", ".", "..") or not same_dir(directory, within)):
        raise WriteError(f"will not write outside {within}", where=str(target))
    if not directory.is_dir():
        if ".." in directory.parts:
            raise WriteError(
                f"will not create directories through '..' ({directory})", where=str(target)
            )
        make_dirs(directory)
    try:
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
        logs.logger().warning(
            "%s: written, but syncing %s failed (%s); a power loss now could undo the rename",
            target,
            directory,
            exc.strerror or exc,
        )


_DIR_MODE = 0o755


def make_dirs(directory: Path) -> None:
    """Create ``directory`` and its missing parents with mode 0755, whatever the umask."""
    missing: list[Path] = []
    d = directory
    while not os.path.lexists(d) and d != d.parent:
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, _DIR_MODE)
        except FileExistsError:
            continue  # a concurrent run made it: its mode is that run's business
        except OSError as exc:
            raise WriteError(
                f"cannot create directory {d}: {exc.strerror}", where=str(directory)
            ) from None
        os.chmod(d, _DIR_MODE)


# atomic_write's temp files: mkstemp(prefix=".<name>.", suffix=".tmp") adds 8 of [a-z0-9_]
TEMP_FILE = re.compile(r"\.[^/]+\.(?:yaml|json)\.[a-z0-9_]{8}\.tmp")


def remove_temp_files(
    directory: Path, logger: Callable[[], logging.Logger], prefix: str = "."
) -> list[Path]:
    """Remove from ``directory`` the temp files of :func:`atomic_write` whose names start with
    ``prefix`` (a killed run left them; call under the directory's lock); links, directories and
    every other file are left alone. ``logger`` gives the logger to say so, only when there is
    something to say (setting up logging costs the boot path). What was removed."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    removed: list[Path] = []
    for name in sorted(names):
        path = directory / name
        if not name.startswith(prefix) or not TEMP_FILE.fullmatch(name):
            continue
        if path.is_symlink() or not path.is_file():
            continue
        try:
            path.unlink()
        except OSError as exc:
            logger().warning(
                "cannot remove %s, left by an interrupted cdigen run: %s", path, exc.strerror
            )
            continue
        logger().info("removed %s, left by an interrupted cdigen run", path)
        removed.append(path)
    return removed
