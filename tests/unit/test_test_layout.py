"""Test modules and benchmarks share code through helpers, never by importing each other."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    """Every module an ``import``/``from ... import`` in ``path`` names (at any depth)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def is_test_or_bench_module(name: str) -> bool:
    """``tests.unit.test_x``, ``tests.e2e.test_y``, ``benchmarks.bench_z`` (or ``bench_z``)."""
    last = name.rsplit(".", 1)[-1]
    return last.startswith(("test_", "bench_"))


def test_no_test_module_or_benchmark_imports_another() -> None:
    files = sorted((REPO / "tests").rglob("*.py")) + sorted((REPO / "benchmarks").glob("*.py"))
    offenders = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in files
        for name in sorted(imported_modules(path))
        if is_test_or_bench_module(name)
    ]
    assert offenders == [], "move the shared code to tests/helpers/ or benchmarks/common.py"


def test_the_check_sees_an_import_of_a_test_module(tmp_path: Path) -> None:
    bad = tmp_path / "test_bad.py"
    bad.write_text("def f():\n    from tests.unit.test_plugin_service import x\n")
    assert [n for n in imported_modules(bad) if is_test_or_bench_module(n)] == [
        "tests.unit.test_plugin_service"
    ]


def needs_shared(path: Path) -> bool:
    """Whether the test module reaches ``../shared``: it imports from ``tests.helpers.shared``,
    or the upstream CDI schema helpers of ``tests.helpers.specs``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.module == "tests.helpers.shared":
            return True
        if node.module == "tests.helpers.specs" and any(
            alias.name.startswith("upstream") for alias in node.names
        ):
            return True
    return False


def test_the_readme_lists_every_test_module_that_needs_shared() -> None:
    # README.md, "Tests that need ../shared": a clone without ../shared skips these, so the
    # table must name every one (two were missing once).
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Tests that need ../shared")
    assert len(section) == 2, "README.md lost its 'Tests that need ../shared' section"
    table = section[1].split("\n## ", 1)[0]
    modules = sorted((REPO / "tests").glob("*/test_*.py"))
    missing = [
        str(p.relative_to(REPO))
        for p in modules
        if needs_shared(p) and f"`{p.relative_to(REPO)}`" not in table
    ]
    assert not missing, f"README.md's 'Tests that need ../shared' table lacks {missing}"
