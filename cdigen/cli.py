"""The ``cdigen`` command line: argument parsing only; the work happens in the library.

Core subcommands come from the modules in ``CORE_COMMAND_MODULES``; the wings (``policies``,
``plugin``) add theirs through the entry-point group ``cdigen.commands``, so the core never
imports them. A command module exposes ``register(subparsers)``, which adds parsers whose
``func`` default is a handler ``(args) -> int``. Registration must stay cheap: handlers import
heavy modules (NVML, gRPC, CEL, networkx) only when they run.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, cast

from cdigen import __version__, logs
from cdigen.errors import EXIT_BAD_INPUT, CdigenError, CheckFailed

CORE_COMMAND_MODULES = ("cdigen.discover.cli", "cdigen.cdi.cli", "cdigen.labels_cli")
ENTRY_POINT_GROUP = "cdigen.commands"

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def help_width() -> int:
    """Columns for help text, as ``shutil.get_terminal_size`` finds them, less argparse's 2."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 80
    return max(columns, 12) - 2


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, told its width.

    argparse makes a formatter at every ``add_argument``, and one without a width imports shutil
    (with bz2 and lzma) to ask the terminal: ~5 ms of every start, ``generate`` at boot included.
    """

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=help_width())


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors and exit code 2 (which argparse already uses)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _registrars(*, wings: bool) -> list[Register]:
    found: list[Register] = [importlib.import_module(n).register for n in CORE_COMMAND_MODULES]
    if not wings:
        return found
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            found.append(ep.load())
        except ImportError as exc:  # a broken install: say so every time, keep the rest usable
            print(
                f"cdigen: error: the '{ep.name}' commands cannot be loaded ({ep.value}: {exc}); "
                "reinstall cdigen with its dependencies",
                file=sys.stderr,
            )
    return found


def build_parser(*, wings: bool = True) -> argparse.ArgumentParser:
    """The argument parser: core subcommands, and those of the wings unless ``wings`` is False."""
    parser = _Parser(
        prog="cdigen",
        description=(
            "Discover NVIDIA GPUs, write CDI specs for them, choose the best GPUs for a request "
            "with topology-aware CEL policies, and serve them to the kubelet as a device plugin."
        ),
        epilog="Node sources (SRC): 'nvml' (the default), a node file (YAML/JSON), or "
        "'builtin:NAME' (a simulated node, e.g. builtin:rtx4090). Exit codes: 0 ok, "
        "1 a check failed, 2 bad usage or bad input.",
    )
    parser.add_argument("--version", action="version", version=f"cdigen {__version__}")
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="log verbosity on stderr (default: warning)",
    )
    # _Parser is an ArgumentParser; the registrars are typed against the base class.
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser),
    )
    for register in _registrars(wings=wings):
        register(sub)
    return parser


def _parser_for(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, bool]:
    """The core-only parser when ``argv`` names a core subcommand, else the full one; and
    whether the wings were loaded.

    Scanning installed entry points costs tens of milliseconds at every start; a node runs
    ``cdigen generate`` at boot, so core commands skip it.
    """
    words = [w for w in argv if not w.startswith("-")]
    core = build_parser(wings=False)
    sub = next(a for a in core._actions if isinstance(a, argparse._SubParsersAction))
    if words and words[0] in sub.choices:
        return core, False
    return build_parser(), True


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, wings = _parser_for(argv)
    args = parser.parse_args(argv)
    logs.configure(args.log_level, now=wings)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return int(func(args))
    except CheckFailed as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        print(f"cdigen: {exc}", file=sys.stderr)
        return exc.exit_code
    except CdigenError as exc:
        print(f"cdigen: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()
