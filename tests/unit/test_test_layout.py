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
