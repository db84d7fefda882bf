"""The ``generate``, ``validate`` and ``list`` subcommands (CDI specs); ``generate``'s own
options and handler are in :mod:`cdigen.cdi.generate_cli`.

Registration is cheap: the handlers import the CDI modules only when they run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from cdigen.cdi.generate_cli import register_generate
from cdigen.errors import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK, CheckFailed, InputError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``generate``, ``validate`` and ``list`` to ``sub``."""
    register_generate(sub)
    _register_validate(sub)
    _register_list(sub)


def _register_validate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``validate`` and its arguments."""
    val = sub.add_parser(
        "validate",
        help="check CDI spec files",
        description="Check CDI spec files against cdigen's strict schema and the CDI library's "
        "rules; print 'ok' for each good file and every problem of the others; in a directory, "
        "device names two files both define (runtimes drop them, as 'cdigen list' shows). Exit "
        "1 if any; exit 2 for a file that cannot be read or parsed. "
        "A directory means the *.yaml and *.json files in it, as runtimes read it; with no "
        "argument the runtimes' spec dirs (/etc/cdi, /var/run/cdi; missing ones are skipped). "
        "A pattern the shell left unexpanded (no file matched it) is reported and skipped.",
        epilog="examples: cdigen validate; cdigen validate /etc/cdi/nvidia.com-gpu.yaml",
    )
    val.add_argument(
        "files",
        nargs="*",
        metavar="FILE|DIR",
        help="spec files, or directories of them (default: /etc/cdi /var/run/cdi)",
    )
    val.set_defaults(func=run_validate)


def _register_list(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``list`` and its options."""
    lst = sub.add_parser(
        "list",
        help="list CDI device names across spec directories",
        description="List every fully-qualified CDI device name as a runtime resolves it, "
        "marking conflicts and files that fail to load. Exit 0 when every name resolves, 1 "
        "for a conflict or a file that fails to load, 2 when no --spec-dir given exists.",
        epilog="examples: cdigen list; cdigen list --spec-dir /etc/cdi --spec-dir /tmp/cdi",
    )
    lst.add_argument(
        "--spec-dir",
        action="append",
        metavar="DIR",
        help="spec directory, repeatable; later wins (default: /etc/cdi /var/run/cdi)",
    )
    lst.set_defaults(func=run_list)


def run_validate(args: argparse.Namespace) -> int:
    """Handle ``cdigen validate [FILE|DIR...]``: ok per good file, every problem, exit 1 if any
    (2 if a file is not YAML or JSON at all)."""
    from cdigen.cdi.specdir import DEFAULT_SPEC_DIRS
    from cdigen.cdi.validate import document_problems, read_spec_document

    files = _validate_files(args.files)
    spec_dirs = [d for d in args.files if Path(d).is_dir()] if args.files else DEFAULT_SPEC_DIRS
    clashes = _conflicts(spec_dirs)
    problems: list[str] = []
    unparsed = 0
    for f in files:
        try:
            doc = read_spec_document(f)
        except InputError as exc:  # not YAML/JSON at all: bad input (exit 2) once all are read
            problems.append(str(exc))
            unparsed += 1
            continue
        of_file = document_problems(f, doc)
        if of_file:
            problems += of_file
        elif not any(Path(f) in paths for paths in clashes):
            print(f"{f}: ok")
    problems += [_conflict_line(paths, names) for paths, names in clashes.items()]
    sys.stdout.flush()
    if problems:
        raise CheckFailed(
            problems,
            summary=f"{len(files)} file(s) checked",
            exit_code=EXIT_BAD_INPUT if unparsed else EXIT_CHECK_FAILED,
        )
    return EXIT_OK


def _validate_files(args: Sequence[str]) -> list[str]:
    """The spec files ``validate`` checks: those named, those in the directories named, or
    those of the runtimes' spec dirs; a note on stderr for a directory or pattern with none."""
    from cdigen.cdi.specdir import DEFAULT_SPEC_DIRS
    from cdigen.cdi.specdir import spec_files as spec_paths
    from cdigen.cdi.validate import refuse_dangling_link
    from cdigen.fileio import read_text

    files: list[str] = []
    if not args:
        for d in DEFAULT_SPEC_DIRS:
            files += map(str, spec_paths(d))
        if not files:
            dirs = ", ".join(map(str, DEFAULT_SPEC_DIRS))
            raise InputError(
                f"no CDI spec files (*.yaml, *.json) in {dirs}",
                hint="write one with 'cdigen generate', or name the files or dirs to check",
            )
    notes: list[str] = []
    for arg in args:
        if Path(arg).is_dir():
            in_dir = spec_paths(arg)
            if not in_dir:
                notes.append(f"no CDI spec files (*.yaml, *.json) in {arg}")
            files += map(str, in_dir)
        elif not Path(arg).exists() and any(c in arg for c in "*?["):
            notes.append(f"no files match {arg}")
        else:
            refuse_dangling_link(arg)  # one that cannot be read is bad input: exit 2
            read_text(arg, what="CDI spec")
            files.append(arg)
    if not files:  # one line that says why, not a note per argument and then an error
        raise InputError(
            "; ".join(notes) or "no CDI spec files to check",
            hint="name CDI spec files, or directories that hold *.yaml or *.json specs",
        )
    for note in notes:
        print(f"cdigen: note: {note}", file=sys.stderr)
    return files


def _conflicts(dirs: Sequence[str | Path]) -> dict[tuple[Path, ...], list[str]]:
    """The device names that files of one directory both define, by those files, as ``list``
    finds them (runtimes drop such a name from every file)."""
    from cdigen.cdi.cache import load_state

    by_files: dict[tuple[Path, ...], list[str]] = {}
    if dirs:
        for name, paths in load_state([Path(d) for d in dirs]).conflicts.items():
            by_files.setdefault(paths, []).append(name)
    return by_files


def _conflict_line(paths: tuple[Path, ...], names: list[str]) -> str:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (
        f"{', '.join(map(str, paths))}: CONFLICT: each defines {shown}; runtimes drop "
        f"{'it' if len(names) == 1 else 'them'} from every file (remove one of the files, or "
        "rename its devices)"
    )


def run_list(args: argparse.Namespace) -> int:
    """Handle ``cdigen list``: resolvable names, conflicts and broken files; exit 1 if any.

    The dirs are loaded as runtimes load them (:class:`cdigen.cdi.cache.SpecCache`); the strict
    lint is ``cdigen validate``'s. A ``--spec-dir`` given that does not exist is said on stderr
    (exit 2 when none of them exists); the default dirs may be missing, as for runtimes.
    """
    from cdigen.cdi.cache import SpecCache
    from cdigen.cdi.specdir import DEFAULT_SPEC_DIRS

    spec_dirs = args.spec_dir or DEFAULT_SPEC_DIRS
    if args.spec_dir:
        if "" in args.spec_dir:  # Path("") is the current directory
            raise InputError(
                "the path is empty", where="--spec-dir", hint="give a spec directory, e.g. /etc/cdi"
            )
        missing = [d for d in args.spec_dir if not Path(d).is_dir()]
        if len(missing) == len(args.spec_dir):
            raise InputError(
                f"no such directory: {', '.join(missing)}",
                where="--spec-dir",
                hint="check the path; runtimes read /etc/cdi and /var/run/cdi by default",
            )
        for d in missing:
            print(f"cdigen: warning: --spec-dir {d}: no such directory", file=sys.stderr)
    state = SpecCache(spec_dirs).state()
    if not state.files:
        dirs = ", ".join(
            f"{d}{'' if Path(d).is_dir() else ' (missing)'}" for d in map(str, spec_dirs)
        )
        print(f"cdigen: no CDI spec files (*.yaml, *.json) in {dirs}", file=sys.stderr)
    for name in sorted(state.devices):
        print(f"{name}\t{state.devices[name].spec_path}")
    for name, paths in state.conflicts.items():
        print(f"{name}\tCONFLICT: defined in {', '.join(map(str, paths))}; runtimes drop it")
    for spec in state.files:
        if spec.problems:
            more = len(spec.problems) - 1
            extra = f" (and {more} more: cdigen validate {spec.path})" if more else ""
            print(f"{spec.path}\tFAILED TO LOAD: {spec.problems[0]}{extra}")
    return EXIT_CHECK_FAILED if state.conflicts or state.errors else EXIT_OK
