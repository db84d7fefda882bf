"""Rules every subcommand keeps, found by walking the argparse tree of ``cdigen.cli`` (so a new
subcommand is covered the day it is added): a missing input file is exit 2 and one line with no
traceback, and every subcommand and option says what it is for in ``--help``."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdigen.cli import build_parser
from tests.helpers.cli import error_lines, run_main

REPO = Path(__file__).resolve().parents[2]
CLAIM = str(REPO / "deploy" / "dra" / "examples" / "two-gpus-one-numa-node.yaml")

A100 = "builtin:dgx-a100"
# Values for required arguments that are not files; a new required one must be added here.
REQUIRED_VALUES = {
    "--available": "0,1",
    "--size": "1",
    "--node": A100,
    "--claim": CLAIM,
    "--requests": "{empty}",
    "pod": "trainer-0",  # dra why POD (a positional: keyed by its dest)
    "files": CLAIM,  # dra check FILE... when another of its files is the missing one
}
# What makes a server fail before it serves (they exit 2 for a bad node name otherwise first).
SERVE_EXTRAS = {
    ("dra", "serve"): ["--node-name", "n", "--kubelet-dir", "{T}", "--cdi-dir", "{T}"],
    ("plugin", "serve"): ["--plugin-dir", "{T}"],
}
# Subcommands whose inputs are directories only: the missing one goes here.
DIR_INPUTS = {("list",): "--spec-dir"}


def leaves(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every subcommand that runs something (not a group such as ``policy``), with its words."""
    for path, child in every_parser(parser):
        if path and not _is_group(child):
            yield path, child


def _is_group(parser: argparse.ArgumentParser) -> bool:
    """``policy``, ``plugin``, ``dra``: subcommands and nothing else (it prints its usage)."""
    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    return bool(actions) and all(isinstance(a, argparse._SubParsersAction) for a in actions)


def every_parser(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """The top parser and every subcommand's, with its words."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from every_parser(child, (*path, name))


def file_arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments that name an input file: FILE or SRC in their metavar (a node source)."""
    return [
        a
        for a in parser._actions
        if a.metavar and any(word in str(a.metavar) for word in ("FILE", "SRC"))
    ]


def missing_file_cases() -> Iterator[tuple[str, list[str]]]:
    """One argv per (subcommand, file argument): that argument given a missing file, the
    required others given good values."""
    for path, parser in leaves(build_parser()):
        if path in DIR_INPUTS:
            yield " ".join(path), [*path, DIR_INPUTS[path], "{missing}"]
            continue
        files = file_arguments(parser)
        assert files, f"'{' '.join(path)}' reads no file: add it to DIR_INPUTS or mark it"
        for chosen in files:
            argv: list[str] = [*path, *SERVE_EXTRAS.get(path, [])]
            positionals: list[str] = []
            for action in parser._actions:
                if action is chosen:
                    value = "{missing}"
                elif action.required or "--node" in action.option_strings:  # not NVML
                    key = action.option_strings[0] if action.option_strings else action.dest
                    assert key in REQUIRED_VALUES, f"{path}: add a value for {key}"
                    value = REQUIRED_VALUES[key]
                else:
                    continue
                if action.option_strings:
                    argv += [action.option_strings[0], value]
                else:
                    positionals.append(value)
            label = chosen.option_strings[0] if chosen.option_strings else chosen.dest
            yield f"{' '.join(path)} {label}", argv + positionals


CASES = list(missing_file_cases())


def test_the_walk_finds_every_subcommand() -> None:
    labels = {label.rsplit(" ", 1)[0] for label, _ in CASES}
    assert {"validate", "policy check", "policy replay", "dra check", "topo import"} <= labels


@pytest.mark.parametrize("argv", [argv for _, argv in CASES], ids=[label for label, _ in CASES])
def test_a_missing_input_file_is_exit_2_and_one_line(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: ``policy check nope.yaml`` and ``validate /nonexistent.yaml`` exit 1."""
    missing = str(tmp_path / "nope" / "missing.yaml")
    (tmp_path / "empty.jsonl").write_text("")
    paths = {"missing": missing, "T": str(tmp_path), "empty": str(tmp_path / "empty.jsonl")}
    argv = [a.format(**paths) for a in argv]
    code, _, err = run_main(argv, capsys)
    lines = error_lines(err)
    assert "Traceback" not in err, err
    assert (code, len(lines)) == (2, 1), err
    assert lines[0].startswith("cdigen: error: ") and missing in lines[0], err


def test_every_subcommand_and_option_has_help() -> None:
    """Was: policy check/explain/replay/simulate without a description; --size, --format,
    --seed, --driver-name, --alternatives without help; ``topo --help`` listing import twice."""
    missing: list[str] = []
    for path, parser in every_parser(build_parser()):
        name = " ".join(("cdigen", *path))
        if not parser.description:
            missing.append(f"{name}: no description")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    if not choice.help:
                        missing.append(f"{name} {choice.dest}: no help")
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}: no help")
        help_text = parser.format_help().split("\n\n", 1)[-1]  # less the usage block
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for word in action.choices:
                    listed = [ln for ln in help_text.splitlines() if ln.split()[:1] == [word]]
                    if len(listed) > 1:
                        missing.append(f"{name}: '{word}' listed {len(listed)} times")
    assert missing == [], "\n".join(missing)
