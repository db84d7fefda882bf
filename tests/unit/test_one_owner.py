"""One owner per fact (issue 36, point 3): each fact below is written in one module and imported
everywhere else. The scan reads every product module (cdigen/, policies/, plugin/; generated
protobuf code aside) with ``ast`` and fails on a second definition: the fact's value assigned to
a module-level or class-level name, given as a parameter's default, as ``default=`` of a call
(argparse, dataclasses.field) or as the fallback of ``.get(key, fallback)``; for the tables
(list strategies, quantity units, GPU families) any literal holding two of their entries; for the
``k8s.<driver>`` vendor any f-string that starts with it."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("cdigen", "policies", "plugin")
GENERATED = ("_pb2.py", "_pb2_grpc.py")

MIB = 1 << 20
STRATEGIES = {"cdi-cri", "cdi-annotations", "envvar", "native"}
UNITS = {"Ki", "Mi", "Gi", "Ti", "Pi", "Ei"}
FILE_KINDS = {"a directory", "a character device", "a block device", "a pipe", "a FIFO", "a socket"}
FAMILIES = {
    "tesla",
    "fermi",
    "kepler",
    "maxwell",
    "pascal",
    "volta",
    "turing",
    "ampere",
    "ada lovelace",
    "ada-lovelace",
    "hopper",
    "blackwell",
}


def _constant(node: ast.AST) -> object:
    """The value of a constant expression (``1 << 20``, ``1024 * 1024``), else None."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords:
        return _constant(node.args[0])  # Path("/var/lib/kubelet")
    if isinstance(node, ast.BinOp):
        left, right = _constant(node.left), _constant(node.right)
        if isinstance(left, int) and isinstance(right, int) and 0 <= right < 1 << 16:
            if isinstance(node.op, ast.Mult):
                return left * right
            if isinstance(node.op, ast.LShift | ast.Pow) and right < 64:
                return left << right if isinstance(node.op, ast.LShift) else left**right
    return None


def _holds_two(node: ast.AST, words: set[str], fold: bool = False) -> bool:
    """A tuple, list, set or dict literal with two or more of ``words`` as constant entries."""
    if isinstance(node, ast.Dict):
        items = [k for k in node.keys if k is not None] + list(node.values)
    elif isinstance(node, ast.Tuple | ast.List | ast.Set):
        items = list(node.elts)
    else:
        return False
    # rows written as tuples or as calls (a dataclass per row) count with their entries
    for item in list(items):
        if isinstance(item, ast.Tuple | ast.List):
            items += item.elts
        elif isinstance(item, ast.Call):
            items += [*item.args, *(k.value for k in item.keywords)]
    found = {
        (v.lower() if fold else v)
        for item in items
        if isinstance(v := _constant(item), str) and (v.lower() if fold else v) in words
    }
    return len(found) >= 2


def _k8s_vendor(node: ast.AST) -> bool:
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        return isinstance(first, ast.Constant) and str(first.value).startswith("k8s.")
    return False


def _device_node_path(node: ast.AST) -> bool:
    """An f-string making a GPU's or an nvidia-caps node's path: ``f"/dev/nvidia{minor}"``,
    ``f"/dev/nvidia-caps/nvidia-cap{n}"``."""
    if not isinstance(node, ast.JoinedStr) or len(node.values) < 2:
        return False
    first, second = node.values[0], node.values[1]
    return (
        isinstance(first, ast.Constant)
        and first.value in ("/dev/nvidia", "/dev/nvidia-caps/nvidia-cap")
        and isinstance(second, ast.FormattedValue)
    )


def _escapes(node: ast.AST) -> bool:
    """Escaping text by hand: ``.encode("unicode_escape")`` (or ``backslashreplace``), or an
    f-string that writes ``\\x..``, ``\\u..`` or ``\\U..``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr in ("encode", "decode") and node.args:
            return _constant(node.args[-1]) in ("unicode_escape", "backslashreplace")
        return False
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        return isinstance(first, ast.Constant) and str(first.value)[:2] in ("\\x", "\\u", "\\U")
    return False


def _device_memory(node: ast.AST) -> bool:
    """Reading a catalogue device's memory from its parts: ``<x>.mig.memory_bytes`` or
    ``<x>.placement.profile.memory_bytes`` (CatalogueEntry.memory_bytes says it once)."""
    if not (isinstance(node, ast.Attribute) and node.attr == "memory_bytes"):
        return False
    inner = node.value
    if isinstance(inner, ast.Attribute) and inner.attr == "mig":
        return True
    return (
        isinstance(inner, ast.Attribute)
        and inner.attr == "profile"
        and isinstance(inner.value, ast.Attribute)
        and inner.value.attr == "placement"
    )


def _line_of_offset(node: ast.AST) -> bool:
    """Counting lines before an offset by hand: ``<text>.count("\\n") + 1``."""
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Add)
        and isinstance(node.left, ast.Call)
        and isinstance(node.left.func, ast.Attribute)
        and node.left.func.attr == "count"
        and len(node.left.args) == 1
        and _constant(node.left.args[0]) == "\n"
        and _constant(node.right) == 1
    )


@dataclass(frozen=True)
class Fact:
    """``owner``: the one module that may write it. ``restates``: whether a value given as a
    definition (a name's value, a default) restates the fact; ``anywhere``: whether any
    expression restates it (tables and the vendor pattern)."""

    name: str
    owner: str
    restates: Callable[[ast.AST], bool] | None = None
    anywhere: Callable[[ast.AST], bool] | None = None
    named: Callable[[str], bool] | None = None  # only names that say they are the fact


FACTS = (
    Fact("the DRA driver name", "cdigen/constants.py", lambda n: _constant(n) == "gpu.cdigen.dev"),
    Fact(
        "the kubelet dir",
        "cdigen/constants.py",
        lambda n: (
            isinstance(v := _constant(n), str)
            and (v == "/var/lib/kubelet" or v.startswith("/var/lib/kubelet/"))
        ),
    ),
    Fact(
        "`mixed` as the default MIG strategy", "cdigen/model.py", lambda n: _constant(n) == "mixed"
    ),
    Fact("nvidia.com/gpu", "cdigen/constants.py", lambda n: _constant(n) == "nvidia.com/gpu"),
    Fact(
        "MIB",
        "cdigen/constants.py",
        lambda n: _constant(n) == MIB,
        named=lambda name: "MIB" in name.upper().replace("_", ""),
    ),
    Fact("the k8s.<driver> vendor", "plugin/dra/checkpoint.py", anywhere=_k8s_vendor),
    Fact(
        "the device list strategies",
        "plugin/deviceplugin/defaults.py",
        anywhere=lambda n: _holds_two(n, STRATEGIES),
    ),
    Fact(
        "quantity formatting (binary units)",
        "cdigen/sizes.py",
        anywhere=lambda n: _holds_two(n, UNITS),
    ),
    Fact(
        "the ignored Xids",
        "plugin/agent/xid.py",
        anywhere=lambda n: (
            isinstance(n, ast.Tuple | ast.List | ast.Set)
            and {_constant(e) for e in n.elts} >= {13, 31, 43, 45, 68, 109}
        ),
    ),
    Fact(
        "the Xid recovery time",
        "plugin/agent/xid.py",
        lambda n: _constant(n) in (60, 60.0),
        named=lambda name: "RECOVER" in name.upper(),
    ),
    Fact(
        "the GPU family table",
        "cdigen/families.py",
        anywhere=lambda n: _holds_two(n, FAMILIES, fold=True),
    ),
    Fact(
        "a GPU's and a MIG device's node paths",
        "cdigen/cdi/devnodes.py",
        anywhere=_device_node_path,
    ),
    Fact("escaping a name from outside", "cdigen/errors.py", anywhere=_escapes),
    Fact("a catalogue device's memory", "cdigen/catalogue.py", anywhere=_device_memory),
    Fact("the line and column of an offset", "policies/cel/errors.py", anywhere=_line_of_offset),
    Fact(
        "the names of file kinds", "cdigen/fileio.py", anywhere=lambda n: _holds_two(n, FILE_KINDS)
    ),
)


def _definitions(tree: ast.Module) -> Iterator[tuple[str | None, ast.AST]]:
    """(name or None, value) for each place a value is defined: module- and class-level
    assignments, parameter defaults, ``default=`` keywords and ``.get(key, fallback)``."""

    def assigned(body: list[ast.stmt]) -> Iterator[tuple[str | None, ast.AST]]:
        for stmt in body:
            if isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    yield (target.id if isinstance(target, ast.Name) else None), stmt.value
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                target = stmt.target
                yield (target.id if isinstance(target, ast.Name) else None), stmt.value
            elif isinstance(stmt, ast.ClassDef):
                yield from assigned(stmt.body)

    yield from assigned(tree.body)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            for default in [*node.args.defaults, *node.args.kw_defaults]:
                if default is not None:
                    yield None, default
        elif isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "default":
                    yield None, keyword.value
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "get" and len(node.args) == 2:
                yield None, node.args[1]


def product_modules() -> list[Path]:
    return sorted(
        p
        for top in PRODUCT
        for p in (REPO / top).rglob("*.py")
        if not p.name.endswith(GENERATED) and "_import_rule_probe" not in p.name
    )


def copies(fact: Fact, modules: list[tuple[str, ast.Module]]) -> list[str]:
    """``path:line`` of each definition of ``fact`` outside its owner."""
    found = []
    for path, tree in modules:
        if path == fact.owner:
            continue
        if fact.restates is not None:
            for name, value in _definitions(tree):
                if fact.named is not None and (name is None or not fact.named(name)):
                    continue
                if fact.restates(value):
                    found.append(f"{path}:{getattr(value, 'lineno', 0)}")
        if fact.anywhere is not None:
            found += [
                f"{path}:{getattr(n, 'lineno', 0)}" for n in ast.walk(tree) if fact.anywhere(n)
            ]
    return found


@pytest.fixture(scope="module")
def modules() -> list[tuple[str, ast.Module]]:
    return [
        (p.relative_to(REPO).as_posix(), ast.parse(p.read_text(encoding="utf-8"), str(p)))
        for p in product_modules()
    ]


@pytest.mark.parametrize("fact", FACTS, ids=[f.name for f in FACTS])
def test_each_fact_has_one_owner(fact: Fact, modules: list[tuple[str, ast.Module]]) -> None:
    assert copies(fact, modules) == [], f"{fact.name} is defined again outside {fact.owner}"


@pytest.mark.parametrize("fact", FACTS, ids=[f.name for f in FACTS])
def test_the_owner_holds_the_fact(fact: Fact, modules: list[tuple[str, ast.Module]]) -> None:
    """The scan would find the fact in its owner: a rename that moves it cannot pass silently."""
    ((_, tree),) = [(p, t) for p, t in modules if p == fact.owner]
    assert copies(fact, [("elsewhere.py", tree)]) != []


# A new copy of each fact, as it would be written, is found.
NEW_COPIES = {
    "the DRA driver name": 'DRIVER = "gpu.cdigen.dev"\n',
    "the kubelet dir": 'ROOT = Path("/var/lib/kubelet")\n',
    "`mixed` as the default MIG strategy": 'p.add_argument("--mig-strategy", default="mixed")\n',
    "nvidia.com/gpu": 'class C:\n    resource: str = "nvidia.com/gpu"\n',
    "MIB": "MiB = 1024 * 1024\n",
    "the k8s.<driver> vendor": 'kind = f"k8s.{driver}/claim"\n',
    "the device list strategies": 'OK = ("cdi-cri", "envvar")\n',
    "quantity formatting (binary units)": 'UNITS = (("Gi", 30), ("Mi", 20))\n',
    "the GPU family table": 'NAMES = {8: "Ampere", 9: "Hopper"}\n',
    "the ignored Xids": "def f(xids=(13, 31, 43, 45, 68, 109)):\n    pass\n",
    "the Xid recovery time": "class C:\n    recover_after_s: float = 60.0\n",
    "a GPU's and a MIG device's node paths": 'paths = [f"/dev/nvidia-caps/nvidia-cap{n}"]\n',
    "escaping a name from outside": 'def esc(ch):\n    return f"\\\\x{ord(ch):02x}"\n',
    "a catalogue device's memory": "def mem(view):\n    return view.mig.memory_bytes\n",
    "the names of file kinds": 'KINDS = ((S_ISDIR, "a directory"), (S_ISFIFO, "a FIFO"))\n',
    "the line and column of an offset": 'line = text[:at].count("\\n") + 1\n',
}


@pytest.mark.parametrize("fact", FACTS, ids=[f.name for f in FACTS])
def test_a_new_copy_is_found(fact: Fact) -> None:
    tree = ast.parse(NEW_COPIES[fact.name])
    assert copies(fact, [("plugin/new.py", tree)]) != []


def test_a_value_used_not_defined_is_no_copy() -> None:
    """Comparing with a value, or a limit that happens to be 2**20, restates no fact."""
    tree = ast.parse(
        'if strategy != "mixed":\n    pass\n'
        "MAX_VALUE_LENGTH = 1 << 20\n"
        'x = catalogue(n, mig_strategy="mixed")\n'
    )
    assert [f.name for f in FACTS if copies(f, [("plugin/new.py", tree)])] == []


def test_each_class_name_has_one_meaning(modules: list[tuple[str, ast.Module]]) -> None:
    """No two product modules define a top-level class of the same name (``ContainerEdits``,
    ``Mount`` and ``DeviceDoc`` each meant two things: the CDI one keeps the name)."""
    where: dict[str, list[str]] = {}
    for path, tree in modules:
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(path)
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
