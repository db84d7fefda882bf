"""Mutation run: how much of a module's behaviour its tests pin.

    python -m tests.mutation policies/objective.py [--tests 'PYTEST ARGS'] [--only N,M] [--list]

For one module, each mutant changes one thing: a comparison (``<``/``<=``, ``>``/``>=``,
``==``/``!=``, ``in``/``not in``, ``is``/``is not``), an operator (``+``/``-``, ``*``/``//``,
``|``/``&``, ``<<``/``>>``), ``and``/``or``, a ``not`` or unary minus dropped, ``True``/``False``,
a small integer constant (0 -> 1, 1 -> 0, n -> n + 1), or the value a ``-> bool`` function returns
(``return x`` -> ``return not x``). Docstrings, strings, f-strings, annotations and the arguments
of logging calls, decorators and the keywords ``strict=``, ``repr=`` and ``compare=`` are left
alone: they change no answer a test could check.

The tracked and untracked (not ignored) files are copied once into a temporary directory; each
mutant is written there in place of the module, and the module's test selection (``MODULES``, or
``--tests``) runs on the copy with ``pytest -x -q -p no:cacheprovider`` and a timeout of three
times the unmutated run. A failing run kills the mutant, a timeout too. ``EQUIVALENT`` lists the
survivors judged equivalent (no test could tell them from the original), with why; the share
printed last is killed / (mutants - equivalent). One pytest at a time: the run is CPU-light but
takes minutes.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# module -> the tests that run against each of its mutants (small and fast)
MODULES: dict[str, tuple[str, ...]] = {
    "policies/objective.py": (
        "tests/unit/test_objective.py",
        "tests/unit/test_allocator_simulation.py",
        "tests/unit/test_allocator_large.py",
    ),
    "policies/allocator.py": (
        "tests/unit/test_allocator_engine.py",
        "tests/unit/test_allocator_positions.py",
        "tests/unit/test_allocator_topologies.py",
        "tests/unit/test_allocator_health.py",
        "tests/unit/test_allocator_large.py",
        "tests/unit/test_sharing_allocator.py",
    ),
    "policies/fast_path.py": (
        "tests/unit/test_allocator_fast_path.py",
        "tests/unit/test_allocator_engine.py",
        "tests/unit/test_allocator_positions.py",
        "tests/unit/test_allocator_topologies.py",
        "tests/unit/test_allocator_health.py",
        "tests/unit/test_allocator_large.py",
        "tests/unit/test_sharing_allocator.py",
    ),
    "cdigen/cdi/write.py": (
        "tests/unit/test_cdi_write_guards.py",
        "tests/unit/test_cdi_write.py",
        "tests/unit/test_spec_dir_safety.py",
        "tests/unit/test_dra_files.py",
    ),
    "plugin/deviceplugin/kubelet_requests.py": (
        "tests/unit/test_plugin_requests.py",
        "tests/unit/test_plugin_service.py",
        "tests/unit/test_plugin_layout_engine.py",
    ),
    "plugin/deviceplugin/call_records.py": ("tests/unit/test_plugin_service.py",),
    "cdigen/cdi/spec_service.py": (
        "tests/unit/test_spec_service.py",
        "tests/unit/test_cdi_capability_devices.py",
    ),
    "cdigen/catalogue.py": (
        "tests/unit/test_catalogue.py",
        "tests/unit/test_mig_resources.py",
        "tests/unit/test_cdi_spec.py",
    ),
    "policies/dra/claims.py": (
        "tests/unit/test_dra_first_fit.py",
        "tests/unit/test_dra_claims.py",
        "tests/unit/test_cel_scheduler_cases.py",
        "tests/unit/test_dra_topology.py",
    ),
    "plugin/dra/prepare.py": (
        "tests/unit/test_dra_prepare_errors.py",
        "tests/e2e/test_dra_dynamic_mig.py",
        "tests/e2e/test_dra_restart.py",
        "tests/e2e/test_dra_sharing.py",
        "tests/e2e/test_dra_capabilities.py",
        # the kills at every step of a prepare, for one placement (the rest take minutes)
        "tests/e2e/test_dra_crash.py::test_a_kill_at_every_step_of_prepare_leaves_nothing_"
        "stranded[one-placement]",
        "tests/e2e/test_dra.py",
    ),
    "plugin/dra/checkpoint.py": (
        "tests/unit/test_dra_checkpoint.py",
        "tests/unit/test_dra_files.py",
        "tests/e2e/test_dra_hostile.py::test_a_checkpoint_entry_of_the_wrong_shape_is_one_line_at_load",
        "tests/e2e/test_dra_hostile.py::test_a_good_checkpoint_loads",
        "tests/e2e/test_dra_hostile.py::test_a_checkpoint_entry_naming_a_file_outside_the_cdi_dir_"
        "is_refused_at_load",
        "tests/e2e/test_dra_restart.py",
        "tests/e2e/test_dra_dynamic_mig.py",
    ),
    "plugin/deviceplugin/layout.py": (
        "tests/unit/test_plugin_layout_engine.py",
        "tests/unit/test_plugin_layout.py",
        "tests/unit/test_plugin_policy_reload.py",
    ),
}

# (module, the mutated line as written, the mutation) -> why no test can tell it apart
EQUIVALENT: dict[tuple[str, str, str], str] = {
    (
        "plugin/dra/prepare.py",
        "self._unsaved = False  # the last save failed",
        "False -> True",
    ): "speed only: an unprepare of an unknown claim then writes the checkpoint once more, with"
    " what memory holds, which is what the file holds",
    (
        "plugin/dra/prepare.py",
        "self._unsaved = False",
        "False -> True",
    ): "speed only, as above: the next unprepare of an unknown claim writes the same content",
    (
        "plugin/dra/prepare.py",
        'shown = ", ".join(d["deviceName"] for d in devices) or "no devices of ours"',
        "or -> and",
    ): "only the text of the INFO line 'prepared claim ...' (log arguments are left alone by the"
    " run; this one is made on the line before)",
    (
        "plugin/dra/checkpoint.py",
        "raw = f.read(100)",
        "100 -> 101",
    ): "a boot ID longer than 64 characters is refused, so reading 100 or 101 bytes of a longer"
    " file gives None alike (the kernel writes 37)",
    (
        "plugin/dra/checkpoint.py",
        'return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)',
        "True -> False",
    ): "two mutants share this key: sort_keys (killed: a file with its keys reordered must load)"
    " and ensure_ascii, equivalent: the checksum is computed the same way on both sides from the"
    " parsed object, and json gives the same object for an escape and the raw character",
    (
        "policies/dra/claims.py",
        "if n > 0 and slots[n - 1] is request:",
        "0 -> 1",
    ): "speed only: the second device of a request then searches from the first device, not"
    " after the last pick; a device picked already is refused ('already picked') and the"
    " constraints hold or fail for a set whatever its order, so the first set found is the"
    " same (its sorted order is the first of its orders tried)",
    (
        "policies/dra/claims.py",
        "start = self._position[picks[-1].key] + 1",
        "1 -> 0",
    ): "two mutants share this key, both speed only, as above: picks[-0] starts the search after"
    " the request's first pick instead of its last (it tries orders of sets it would skip and"
    " finds the same first set), and + 0 starts it at the last pick itself, which is refused as"
    " already picked",
    (
        "policies/fast_path.py",
        "if avail.bit_count() != len(bits) or not 0 < size <= len(bits):",
        "< -> <=",
    ): "a size of 0 then reaches the search, whose empty set is the answer the general path"
    " gives (no devices, score 0, no NUMA nodes)",
    (
        "policies/fast_path.py",
        "if avail.bit_count() != len(bits) or not 0 < size <= len(bits) or len(must) > size:",
        "< -> <=",
    ): "as for IDs: a size of 0 gets the empty set either way",
    (
        "policies/fast_path.py",
        "if must < 0 or not 0 < size <= len(request.available):",
        "< -> <=",
    ): "as for IDs read one by one: a size of 0 gets the empty set either way",
    (
        "policies/fast_path.py",
        "NAMED_LIMIT = 8",
        "8 -> 9",
    ): "speed only: a request looked up whole and one read ID by ID get the same answer, and"
    " only a node of 9 usable GPUs would change path (it answers alike)",
    (
        "policies/fast_path.py",
        "if best < 0:",
        "< -> <=",
    ): "best is 0 only for the empty set (size 0), which the general path answers alike",
    (
        "policies/fast_path.py",
        "if best < 0:",
        "0 -> 1",
    ): "best is 0 only for the empty set (size 0), which the general path answers alike",
    (
        "cdigen/cdi/write.py",
        'return HEADER + (block_yaml(spec) or dump_document(spec, "yaml"))',
        "or -> and",
    ): "block_yaml gives PyYAML's own text for every spec cdigen builds (tests/unit/"
    "test_quick_schema.py), so 'and' returns the same text; it declines (None) no spec we write",
    (
        "policies/objective.py",
        "free_shares: int = 0  # free shares on the set's GPUs (spread over replicas only)",
        "0 -> 1",
    ): "no caller sets Candidate.free_shares: every candidate gets the same value, and keys"
    " are only compared",
    (
        "policies/objective.py",
        'return bool(getattr(self._request, "exhausted", False))',
        "False -> True",
    ): "the default is for a thread that never started a request; only searches read it, and"
    " they run inside a request (Allocator._budgeted), which sets it",
    (
        "policies/objective.py",
        "ok, reason = self.constraints_ok(positions) if self.constrained else (True, None)",
        "True -> False",
    ): "without constraints every candidate gets the same value: the ranking, why_lost and"
    " explain's output do not change",
    (
        "policies/objective.py",
        "left_set = left_pairs = 0",
        "0 -> 1",
    ): "without a table every candidate gets the same value (with one, both are overwritten)",
}


@dataclass(frozen=True)
class Site:
    """One mutant: where, what, and how to apply it to a freshly parsed tree."""

    line: int
    what: str
    apply: Callable[[], None]


_COMPARE_FLIP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_BINOP_FLIP: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.BitOr: ast.BitAnd,
    ast.BitAnd: ast.BitOr,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
}
_SYMBOL = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.FloorDiv: "//",
    ast.BitOr: "|",
    ast.BitAnd: "&",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.And: "and",
    ast.Or: "or",
}


def _set(node: ast.AST, name: str, value: object) -> Callable[[], None]:
    return lambda: setattr(node, name, value)


def _replace_op(ops: list[ast.cmpop], k: int, new: ast.cmpop) -> Callable[[], None]:
    return lambda: ops.__setitem__(k, new)


def _is_log_call(node: ast.Call) -> bool:
    f = node.func
    return isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "log"


def sites(tree: ast.Module) -> list[Site]:
    """Every mutant of ``tree``, in a fixed order (the same for every parse of one source)."""
    found: list[Site] = []
    _visit(tree, found, lambda new: None, returns_bool=False)
    return found


def _children(node: ast.AST) -> Iterator[tuple[ast.AST, Callable[[ast.AST], None]]]:
    """The children worth mutating, each with how to replace it in ``node``: no annotations,
    docstrings or logging arguments."""
    if isinstance(node, ast.Call) and _is_log_call(node):
        return
    if isinstance(node, ast.JoinedStr):
        return
    for name, value in ast.iter_fields(node):
        if name in ("annotation", "returns", "type_comment", "decorator_list"):
            continue
        if isinstance(node, ast.keyword) and node.arg in ("strict", "repr", "compare"):
            continue  # zip's length check, a dataclass field's repr and equality: no answer
        items = value if isinstance(value, list) else [value]
        for n, item in enumerate(items):
            if not isinstance(item, ast.AST):
                continue
            if (
                name == "body"
                and n == 0
                and isinstance(item, ast.Expr)
                and isinstance(item.value, ast.Constant)
            ):
                continue  # docstring
            if isinstance(value, list):
                yield item, lambda new, items=value, n=n: items.__setitem__(n, new)
            else:
                yield item, lambda new, name=name: setattr(node, name, new)


def _visit(
    node: ast.AST, found: list[Site], replace: Callable[[ast.AST], None], returns_bool: bool
) -> None:
    if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
        return
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        # annotations are strings under ``from __future__ import annotations``, or names
        returns_bool = node.returns is not None and ast.unparse(node.returns) in ("bool", "'bool'")
    if isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
    ):
        return
    line = getattr(node, "lineno", 0)
    if isinstance(node, ast.Compare):
        for k, op in enumerate(node.ops):
            new = _COMPARE_FLIP[type(op)]
            what = f"{_SYMBOL[type(op)]} -> {_SYMBOL[new]}"
            found.append(Site(line, what, _replace_op(node.ops, k, new())))
    elif isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in _BINOP_FLIP:
        new_op = _BINOP_FLIP[type(node.op)]
        what = f"{_SYMBOL[type(node.op)]} -> {_SYMBOL[new_op]}"
        found.append(Site(line, what, _set(node, "op", new_op())))
    elif isinstance(node, ast.BoolOp):
        new_bool: type[ast.boolop] = ast.Or if isinstance(node.op, ast.And) else ast.And
        what = f"{_SYMBOL[type(node.op)]} -> {_SYMBOL[new_bool]}"
        found.append(Site(line, what, _set(node, "op", new_bool())))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not | ast.USub):
        what = "drop not" if isinstance(node.op, ast.Not) else "drop unary -"
        operand = node.operand
        found.append(Site(line, what, lambda: replace(operand)))
    elif isinstance(node, ast.Constant) and type(node.value) in (bool, int):
        value = node.value
        if isinstance(value, bool):
            found.append(Site(line, f"{value} -> {not value}", _set(node, "value", not value)))
        elif isinstance(value, int) and abs(value) <= 1 << 20:
            new_int = {0: 1, 1: 0}.get(value, value + 1)
            found.append(Site(line, f"{value} -> {new_int}", _set(node, "value", new_int)))
    elif (
        isinstance(node, ast.Return)
        and returns_bool
        and node.value is not None
        and not isinstance(node.value, ast.Constant)
    ):
        value_node = node.value
        negated = ast.UnaryOp(op=ast.Not(), operand=value_node)
        found.append(Site(line, "return not ...", _set(node, "value", negated)))
    for child, replace_child in _children(node):
        _visit(child, found, replace_child, returns_bool)


def mutant_source(source: str, index: int) -> str:
    """``source`` with mutant ``index`` applied."""
    tree = ast.parse(source)
    sites(tree)[index].apply()
    ast.fix_missing_locations(tree)
    return ast.unparse(tree) + "\n"


def copy_tree(dest: Path) -> None:
    """The tracked and untracked-but-not-ignored files of the repository, copied to ``dest``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        rel = Path(os.fsdecode(raw))
        src = REPO / rel
        if src.is_symlink():  # cdigen/plugin -> ../plugin: the wings' import names
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(src), dest / rel)
            continue
        if not src.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)


def run_tests(root: Path, tests: list[str], timeout: float) -> tuple[str, float]:
    """``killed``, ``survived`` or ``timeout`` for the tree at ``root``, and the seconds taken."""
    env = dict(os.environ, PYTHONPATH=str(root))
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    start = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - start
    return ("survived" if done.returncode == 0 else "killed"), time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("module", help=f"path from the repository root: {', '.join(MODULES)}")
    parser.add_argument("--tests", help="pytest selection (default: the module's own, MODULES)")
    parser.add_argument("--only", help="comma-separated mutant numbers to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still removes the copy
    module = args.module
    if args.tests is None and module not in MODULES:
        print(f"mutation: no test selection for {module}: pass --tests", file=sys.stderr)
        return 2
    tests = args.tests.split() if args.tests else list(MODULES[module])
    source = (REPO / module).read_text(encoding="utf-8")
    lines = source.splitlines()
    mutants = sites(ast.parse(source))
    chosen = range(len(mutants))
    if args.only:
        chosen = [int(n) for n in args.only.split(",")]  # type: ignore[assignment]
    if args.list:
        for n in chosen:
            m = mutants[n]
            print(f"{n:3}  line {m.line:4}  {m.what:16}  {lines[m.line - 1].strip()}")
        return 0
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        root = Path(tmp)
        copy_tree(root)
        target = root / module
        verdict, base_s = run_tests(root, tests, timeout=600)
        if verdict != "survived":
            print(f"mutation: the tests fail on the unmutated tree: {' '.join(tests)}")
            return 1
        timeout = max(10.0, 3 * base_s)
        print(f"{module}: {len(mutants)} mutants; tests {' '.join(tests)} ({base_s:.1f} s)")
        mtime = target.stat().st_mtime
        counts = {"killed": 0, "survived": 0, "timeout": 0, "equivalent": 0}
        survivors = []
        for n in chosen:
            m = mutants[n]
            text = lines[m.line - 1].strip()
            target.write_text(mutant_source(source, n), encoding="utf-8")
            os.utime(target, (mtime + n + 1, mtime + n + 1))  # no stale .pyc
            verdict, took = run_tests(root, tests, timeout)
            why = EQUIVALENT.get((module, text, m.what))
            if verdict == "survived" and why:
                verdict = "equivalent"
            counts[verdict] += 1
            print(f"{n:3}  line {m.line:4}  {m.what:16}  {verdict:10} {took:5.1f} s  {text}")
            if verdict == "survived":
                survivors.append(f"  line {m.line}: {m.what}: {text}")
        target.write_text(source, encoding="utf-8")
    total = sum(counts.values())
    killed = counts["killed"] + counts["timeout"]
    relevant = total - counts["equivalent"]
    share = 100 * killed / relevant if relevant else 100.0
    print(
        f"{module}: {total} mutants, {killed} killed ({counts['timeout']} by timeout), "
        f"{counts['survived']} survived, {counts['equivalent']} equivalent: "
        f"{share:.0f}% of the non-equivalent killed"
    )
    if survivors:
        print("survivors:\n" + "\n".join(survivors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
