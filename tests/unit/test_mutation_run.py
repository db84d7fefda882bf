"""The mutation run's mutants (tests/mutation.py): what it changes, and what it leaves alone."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.mutation import EQUIVALENT, MODULES, REPO, mutant_source, sites

SOURCE = '''
"""A module docstring with < and 1."""
import logging

log = logging.getLogger("x")
__all__ = ["f"]


def f(a: int, b: list[int]) -> bool:
    """Docstring: a < b."""
    log.info("a < %d", a + 1)
    if a <= 0 and a not in b:
        return False
    return a * 2 - len(b) > -a or f"{a + 1}" == "2"
'''


def test_each_mutant_changes_one_thing_and_leaves_text_and_logging_alone() -> None:
    mutants = sites(ast.parse(SOURCE))
    assert [(m.line, m.what) for m in mutants] == [
        (12, "and -> or"),
        (12, "<= -> <"),
        (12, "0 -> 1"),
        (12, "not in -> in"),
        (13, "False -> True"),
        (14, "return not ..."),
        (14, "or -> and"),
        (14, "> -> >="),
        (14, "- -> +"),
        (14, "* -> //"),
        (14, "2 -> 3"),
        (14, "drop unary -"),
        (14, "== -> !="),
    ]
    changed = [mutant_source(SOURCE, n) for n in range(len(mutants))]
    original = ast.unparse(ast.parse(SOURCE)) + "\n"
    assert len(set(changed)) == len(changed) and original not in changed
    assert "if a <= 0 or a not in b:" in changed[0]
    assert "return not (a * 2 - len(b) > -a or f'{a + 1}' == '2')" in changed[5]
    assert "> a or" in changed[11]


def test_every_module_named_has_its_tests_and_every_equivalent_names_a_real_line() -> None:
    for module, tests in MODULES.items():
        # a selection may name one test (path::name): its file must be there
        assert (REPO / module).is_file() and all((REPO / t.split("::")[0]).is_file() for t in tests)
    for (module, line, what), why in EQUIVALENT.items():
        source = (REPO / module).read_text(encoding="utf-8")
        lines = source.splitlines()
        assert any(
            lines[m.line - 1].strip() == line and m.what == what for m in sites(ast.parse(source))
        ), (module, line, what)
        assert why


def test_a_module_without_a_selection_is_bad_usage() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.mutation", "cdigen/model.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr == "mutation: no test selection for cdigen/model.py: pass --tests\n"
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.mutation",
            "plugin/deviceplugin/layout.py",
            "--list",
            "--only",
            "0",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert listed.stdout.count("\n") == 1
