"""Issue 35's rough edges of the command line (a, b, c, g, h) and ``validate DIR``'s conflicts
(point 3), each as a user meets it: argv in, exit code and output out."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cdigen.cli import build_parser
from tests.helpers.cli import run_main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "dra" / "examples"
BAD_YAML = "spec: [unclosed\n"


# -- a: a misspelt subcommand gets a did-you-mean, as a misspelt option does ----------------------


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        # once "cdigen: error: unknown option '--node'"
        (
            ["genrate", "--node", "builtin:rtx4090"],
            "cdigen: error: unknown command 'genrate': did you mean 'generate'? "
            "(see 'cdigen --help')",
        ),
        (
            ["--log-level", "debug", "genrate"],
            "cdigen: error: unknown command 'genrate': did you mean 'generate'? "
            "(see 'cdigen --help')",
        ),
        (
            ["plugin", "srve", "--node", "builtin:rtx4090"],
            "cdigen plugin: error: unknown subcommand 'srve': did you mean 'serve'? "
            "(see 'cdigen plugin --help')",
        ),
        (
            ["dra", "explian", "--node", "builtin:rtx4090"],
            "cdigen dra: error: unknown subcommand 'explian': did you mean 'explain'? "
            "(see 'cdigen dra --help')",
        ),
        (
            ["policy", "chek", "x.yaml"],
            "cdigen policy: error: unknown subcommand 'chek': did you mean 'check'? "
            "(see 'cdigen policy --help')",
        ),
        (
            ["plugin", "config", "convrt", "x.yaml"],
            "cdigen plugin config: error: unknown subcommand 'convrt': did you mean 'convert'? "
            "(see 'cdigen plugin config --help')",
        ),
        (
            ["zzz"],
            "cdigen: error: unknown command 'zzz': choose from "
            + ", ".join(
                next(
                    a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
                ).choices
            )
            + " (see 'cdigen --help')",
        ),
    ],
)
def test_a_misspelt_command_is_named_with_the_right_one(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(argv, capsys)
    assert (code, out, err) == (2, "", line + "\n")


# -- b: a node source where topo's subcommand goes ----------------------------------------------


@pytest.mark.parametrize("source", ["builtin:rtx4090", "node.yaml", "nvml"])
def test_topo_with_a_bare_node_source_says_where_it_goes(
    source: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(["topo", source], capsys)
    assert (code, out) == (2, "")
    # once "argument import: invalid choice: 'builtin:rtx4090' (choose from 'import')"
    assert err == (
        f"cdigen topo: error: unknown subcommand '{source}': a node source goes after --node: "
        f"cdigen topo --node {source} (see 'cdigen topo --help')\n"
    )


def test_topo_import_still_works_and_a_near_miss_gets_a_did_you_mean(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run_main(["topo", "imprt", "t.txt"], capsys)
    assert code == 2 and "did you mean 'import'?" in err
    topo = tmp_path / "topo.txt"
    topo.write_text("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\t X \n")
    code, out, err = run_main(["topo", "import", str(topo), "--memory", "24GiB"], capsys)
    assert code == 0, err
    assert len(yaml.safe_load(out)["gpus"]) == 2


# -- c: -o - is stdout for every command that writes a file ------------------------------------


def test_generate_takes_o_dash_for_stdout_as_discover_and_topo_do(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run_main(["generate", "--node", "builtin:rtx4090", "-o", "-"], capsys)
    assert code == 0, err
    spec = yaml.safe_load(out)
    assert spec["kind"] == "nvidia.com/gpu"
    assert {d["name"] for d in spec["devices"]} >= {"0", "all"}
    for argv in (
        ["discover", "--node", "builtin:rtx4090", "-o", "-"],
        ["topo", "--node", "builtin:rtx4090", "-o", "-"],
    ):
        code, out, err = run_main(argv, capsys)
        assert code == 0 and out, (argv, err)
    target = tmp_path / "spec.yaml"
    code, out, err = run_main(["generate", "--node", "builtin:rtx4090", "-o", str(target)], capsys)
    assert code == 0, err
    assert yaml.safe_load(target.read_text())["devices"] == spec["devices"]


# -- g: input that is not YAML is exit 2 everywhere --------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["policy", "check", "{bad}"],
        ["policy", "check", "{good_policy}", "{bad}"],
        ["validate", "{bad}"],
        ["validate", "{dir}"],
        ["dra", "check", "{bad}"],
        ["dra", "explain", "--node", "builtin:rtx4090", "--claim", "{bad}"],
        ["plugin", "config", "convert", "{bad}"],
    ],
    ids=lambda argv: " ".join(argv),
)
def test_input_that_is_not_yaml_is_exit_2_with_its_line_and_column(
    argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "in" / "bad.yaml"
    bad.parent.mkdir()
    bad.write_text(BAD_YAML)
    values = {
        "{bad}": str(bad),
        "{dir}": str(bad.parent),
        "{good_policy}": str(REPO / "docs" / "policies" / "well-connected.yaml"),
    }
    code, _, err = run_main([values.get(a, a) for a in argv], capsys)
    assert code == 2, err
    assert f"{bad}: line 2, column 1: invalid YAML" in err
    assert "Traceback" not in err


# -- 3b: validate DIR reports device names two files define, as list does -----------------------


def test_validate_dir_reports_the_names_list_marks_as_conflicts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    specs = tmp_path / "cdi"
    specs.mkdir()
    code, _, err = run_main(
        ["generate", "--node", "builtin:rtx4090", "-o", str(specs / "a.yaml")], capsys
    )
    assert code == 0, err
    shutil.copy(specs / "a.yaml", specs / "b.yaml")

    code, out, _ = run_main(["list", "--spec-dir", str(specs)], capsys)
    assert code == 1
    listed = sorted(line.split("\t")[0] for line in out.splitlines() if "CONFLICT" in line)
    assert listed

    code, out, err = run_main(["validate", str(specs)], capsys)
    assert code == 1
    assert out == ""  # neither file is "ok": runtimes drop their devices
    conflict = next(line for line in err.splitlines() if "CONFLICT" in line)
    assert conflict.startswith(f"{specs / 'a.yaml'}, {specs / 'b.yaml'}: CONFLICT: each defines ")
    assert all(name in conflict for name in listed)
    assert "runtimes drop them" in conflict
    assert err.splitlines()[-1] == "cdigen: 2 file(s) checked: 1 problem(s)"

    # the same files checked one by one are each fine: a conflict is a matter of a directory
    code, out, _ = run_main(["validate", str(specs / "a.yaml"), str(specs / "b.yaml")], capsys)
    assert code == 0 and out.count(": ok") == 2

    (specs / "b.yaml").unlink()
    code, out, _ = run_main(["validate", str(specs)], capsys)
    assert (code, out) == (0, f"{specs / 'a.yaml'}: ok\n")


def test_validate_dir_reports_a_conflict_between_other_vendors_specs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "vendor.com/device",
        "devices": [{"name": "dev0", "containerEdits": {"env": ["A=1"]}}],
        "containerEdits": {},
    }
    for name in ("one.yaml", "two.json"):
        (tmp_path / name).write_text(yaml.safe_dump(spec))
    code, out, err = run_main(["validate", str(tmp_path)], capsys)
    assert code == 1 and out == ""
    assert (
        f"{tmp_path / 'one.yaml'}, {tmp_path / 'two.json'}: CONFLICT: each defines "
        "vendor.com/device=dev0; runtimes drop it from every file" in err
    )


# -- h: --help ----------------------------------------------------------------------------------


def help_text(*words: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "cdigen.cli", *words, "--help"],
        capture_output=True,
        text=True,
        env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"},
        check=True,
    )
    return " ".join(result.stdout.split())


@pytest.mark.parametrize(
    ("words", "codes"),
    [
        (("generate",), ("Exit 0 when the spec was written or is unchanged", "2 for bad usage")),
        (("list",), ("Exit 0 when every name resolves", "1 for a conflict", "2 when no")),
        (("dra", "explain"), ("Exit 0 when every claim fits", "1 when one does not", "2 for")),
    ],
)
def test_help_gives_the_exit_codes(words: tuple[str, ...], codes: tuple[str, ...]) -> None:
    text = help_text(*words)
    for code in codes:
        assert code in text


@pytest.mark.parametrize(
    "words",
    [("generate",), ("list",), ("plugin", "serve"), ("dra", "serve"), ("dra", "explain")],
    ids=" ".join,
)
def test_help_gives_an_example(words: tuple[str, ...]) -> None:
    example = re.search(r"examples?(?: \([^)]*\))?: (cdigen [^;(]*)", help_text(*words))
    assert example, words
    assert example.group(1).split()[1 : 1 + len(words)] == list(words)


def test_the_help_examples_that_need_no_node_run(tmp_path: Path) -> None:
    """The examples of generate and dra explain, run where the doc runs them."""
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    for words in (("generate",), ("dra", "explain")):
        text = help_text(*words)
        for example in re.findall(r"(cdigen [^;()]*--node builtin:[^;()]*)", text):
            result = subprocess.run(
                [sys.executable, "-m", "cdigen.cli", *example.split()[1:]],
                capture_output=True,
                text=True,
                cwd=tmp_path / "examples",
            )
            assert result.returncode in (0, 1), (example, result.stderr)
            assert "error" not in result.stderr, (example, result.stderr)


def groups(
    parser: argparse.ArgumentParser, prog: str = "cdigen"
) -> list[tuple[str, argparse._SubParsersAction[argparse.ArgumentParser]]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            out.append((prog, action))
            for name, child in action.choices.items():
                out += groups(child, f"{prog} {name}")
    return out


def test_one_placeholder_scheme_command_then_subcommand() -> None:
    found = {prog: action.metavar for prog, action in groups(build_parser())}
    assert found.pop("cdigen") == "COMMAND"
    assert {"cdigen policy", "cdigen plugin", "cdigen dra", "cdigen topo"} <= set(found)
    assert set(found.values()) == {"SUBCOMMAND"}
    assert "SUBCOMMAND ..." in help_text("policy")  # once ACTION


def test_one_log_level_with_one_default_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    helps = {
        words: re.search(r"--log-level \{[^}]*\} (.*?\(default: \w+\))", help_text(*words))
        for words in [(), ("labels",), ("generate",), ("plugin", "serve"), ("dra", "serve")]
    }
    described = {words: m.group(1) if m else None for words, m in helps.items()}
    assert None not in described.values(), described
    assert len(set(described.values())) == 1, described
    assert "(default: info)" in described[()]
    # once "unknown option '--log-level'" after labels
    for argv in (
        ["labels", "--node", "builtin:rtx4090", "--log-level", "debug"],
        ["--log-level", "debug", "labels", "--node", "builtin:rtx4090"],
    ):
        code, out, err = run_main(argv, capsys)
        assert code == 0 and "nvidia.com/gpu.product=" in out, err
    code, _, err = run_main(["labels", "--log-level", "loud"], capsys)
    assert code == 2 and "invalid choice: 'loud'" in err


@pytest.mark.parametrize(
    ("words", "shown"),
    [
        (("policy", "explain"), "(default: builtin:default)"),
        (("policy", "replay"), "(default: builtin:default)"),
        (("dra", "why"), "the pod's namespace (default: default)"),
    ],
)
def test_help_shows_the_defaults(words: tuple[str, ...], shown: str) -> None:
    assert shown in help_text(*words)
