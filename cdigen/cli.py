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
import io
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO, cast

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

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._words = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(self._words, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        # A misspelt option makes argparse take its value for something else ("invalid choice:
        # 'dot'" for --fromat dot), and a misspelt command makes it blame the first option after
        # it: the first word no (sub)command knows is the mistake to name.
        parser: argparse.ArgumentParser = self
        mistake = _first_mistake(self, getattr(self, "_words", []))
        if mistake is not None:
            parser, message = mistake
        parser.exit(
            EXIT_BAD_INPUT, f"{parser.prog}: error: {message} (see '{parser.prog} --help')\n"
        )

    def add_subparsers(self, **kwargs: Any) -> argparse._SubParsersAction[Any]:
        # One placeholder scheme at every level: COMMAND after cdigen, SUBCOMMAND below it.
        kwargs["metavar"] = "COMMAND" if self.prog == "cdigen" else "SUBCOMMAND"
        return super().add_subparsers(**kwargs)


def _first_mistake(
    parser: argparse.ArgumentParser, words: Sequence[str]
) -> tuple[argparse.ArgumentParser, str] | None:
    """The first word of ``words`` that the (sub)command it follows does not know, and that
    (sub)command: an ``--option`` none of its options is or starts with (argparse takes
    abbreviations), or, where a subcommand is due, a word that names none."""
    commands = next(
        (a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None
    )
    value_next = False
    for at, word in enumerate(words):
        if value_next:
            value_next = False
            continue
        if word == "--":
            return None
        if word.startswith("-") and word != "-":
            option = word.split("=", 1)[0]
            known = [k for k in parser._option_string_actions if k.startswith(option)]
            if option.startswith("--") and len(option) > 2 and not known:
                hint = _did_you_mean(option, list(parser._option_string_actions))
                return parser, f"unknown option {option!r}{hint}"
            action = parser._option_string_actions.get(option)
            if action is None and len(known) == 1:
                action = parser._option_string_actions[known[0]]
            value_next = action is not None and action.nargs is None and "=" not in word
            continue
        if commands:
            if word in commands:
                return _first_mistake(commands[word], words[at + 1 :])
            return parser, _unknown_command(parser, word, list(commands))
    return None


def _unknown_command(parser: argparse.ArgumentParser, word: str, commands: list[str]) -> str:
    """``word`` where a (sub)command of ``parser`` is due: a did-you-mean, or, for a node source
    (``cdigen topo builtin:rtx4090``), where it goes."""
    message = f"unknown {'command' if parser.prog == 'cdigen' else 'subcommand'} {word!r}"
    hint = _did_you_mean(word, commands)
    if hint:
        return message + hint
    if "--node" in parser._option_string_actions and (
        word == "nvml" or word.startswith("builtin:") or word.endswith((".yaml", ".yml", ".json"))
    ):
        return f"{message}: a node source goes after --node: {parser.prog} --node {word}"
    return f"{message}: choose from {', '.join(commands)}"


def _did_you_mean(word: str, choices: list[str]) -> str:
    """``": did you mean 'x'?"`` for the closest of ``choices``, or nothing."""
    import difflib

    close = difflib.get_close_matches(word, choices, n=1)
    return f": did you mean {close[0]!r}?" if close else ""


def usage(parser: argparse.ArgumentParser) -> int:
    """A command given without its subcommand: its help on stderr, and the bad-usage exit."""
    parser.print_help(sys.stderr)
    return EXIT_BAD_INPUT


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
    add_log_level(parser, default=None)
    # _Parser is an ArgumentParser; the registrars are typed against the base class.
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser),
    )
    for register in _registrars(wings=wings):
        register(sub)
    _every_command_takes_log_level(parser)
    return parser


def add_log_level(parser: argparse.ArgumentParser, *, default: str | None) -> None:
    """The one ``--log-level``: before the command, or after it, at any level."""
    parser.add_argument(
        "--log-level",
        default=default,
        choices=logs.LEVELS,
        help=f"least severe log records written to stderr (default: {logs.DEFAULT_LEVEL})",
    )


def _every_command_takes_log_level(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` on every command that runs something (not on a group such as
    ``policy``); given there, it sets the same value (a command's own default would overwrite
    the one given before it: none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                runs = any(
                    not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
                    for a in command._actions
                )
                if runs and "--log-level" not in command._option_string_actions:
                    add_log_level(command, default=argparse.SUPPRESS)
                _every_command_takes_log_level(command)


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


class _Stderr(io.TextIOBase):
    """``sys.stderr`` while a command runs: a note, warning or log line that cannot be written
    (stderr closed, on a full disk, a pipe whose reader left) is dropped; the command's work
    and exit code do not depend on its messages."""

    def __init__(self, inner: TextIO | None) -> None:
        super().__init__()
        self._inner = inner

    def write(self, text: str) -> int:
        if self._inner is not None:
            try:
                self._inner.write(text)
                if "\n" in text:
                    self._inner.flush()
            except (OSError, ValueError):  # ValueError: the stream was closed
                self._inner = None
        return len(text)

    def flush(self) -> None:
        if self._inner is not None:
            try:
                self._inner.flush()
            except (OSError, ValueError):
                self._inner = None

    def isatty(self) -> bool:
        try:
            return self._inner is not None and self._inner.isatty()
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        if self._inner is None:
            raise io.UnsupportedOperation("stderr cannot be written")
        return self._inner.fileno()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code."""
    stderr, sys.stderr = sys.stderr, _Stderr(sys.stderr)
    try:
        return _main(argv)
    finally:
        sys.stderr.flush()
        sys.stderr = stderr


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, wings = _parser_for(argv)
    args = parser.parse_args(argv)
    logs.configure(args.log_level or logs.DEFAULT_LEVEL, now=wings)
    func = getattr(args, "func", None)
    if func is None:
        return usage(parser)
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
