"""The arrows between the parts stay one-way: every import of every module, read with ast.

- the core (cdigen/) never imports a wing (policies/, plugin/), not even inside a function;
- the engine (policies/) never imports plugin/;
- plugin/ is three packages: the device plugin (plugin/deviceplugin/) and the DRA plugin
  (plugin/dra/) each import of plugin/ only themselves and the node-agent core (plugin/agent/),
  which imports of plugin/ only itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("_pb2.py", "_pb2_grpc.py")
RULES = (
    ("cdigen", ("cdigen.policies", "cdigen.plugin")),
    ("policies", ("cdigen.plugin",)),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] in ("plugin", "policies"):  # installed as cdigen.plugin, cdigen.policies
        parts.insert(0, "cdigen")
    return ".".join(parts)


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth, with relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = (
        module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    )
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def modules(top: str) -> list[Path]:
    return [p for p in sorted((REPO_ROOT / top).rglob("*.py")) if not p.name.endswith(GENERATED)]


def violations(top: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in modules(top):
        name = module_name(path)
        for target in sorted(imported(path)):
            for bad in forbidden:
                if name == bad or name.startswith(bad + "."):
                    continue  # a part may import itself
                if target == bad or target.startswith(bad + "."):
                    found.append(f"{path.relative_to(REPO_ROOT)} imports {target}")
    return found


# part -> the only packages under plugin/ it may import
PLUGIN_PARTS = {
    "cdigen.plugin.deviceplugin": ("cdigen.plugin.deviceplugin", "cdigen.plugin.agent"),
    "cdigen.plugin.dra": ("cdigen.plugin.dra", "cdigen.plugin.agent"),
    "cdigen.plugin.agent": ("cdigen.plugin.agent",),
}


def plugin_imports_outside(part: str, allowed: tuple[str, ...]) -> list[str]:
    found = []
    for path in modules(part.replace(".", "/")):
        for target in sorted(imported(path)):
            if target.startswith("cdigen.plugin.") and not any(
                target == a or target.startswith(a + ".") for a in allowed
            ):
                found.append(f"{path.relative_to(REPO_ROOT)} imports {target}")
    return found


def test_plugin_is_the_three_parts_and_an_empty_init() -> None:
    """Every module under plugin/ lies in one of the parts the rules name."""
    loose = [
        str(path.relative_to(REPO_ROOT))
        for path in modules("plugin")
        if not any(module_name(path).startswith(part + ".") for part in PLUGIN_PARTS)
        and module_name(path) not in PLUGIN_PARTS
    ]
    assert loose == ["plugin/__init__.py"]
    assert (REPO_ROOT / "plugin" / "__init__.py").read_text() == ""


@pytest.mark.parametrize("part", sorted(PLUGIN_PARTS))
def test_each_part_of_plugin_imports_only_itself_and_the_agent_core(part: str) -> None:
    assert plugin_imports_outside(part, PLUGIN_PARTS[part]) == []


def test_the_plugin_part_check_sees_a_device_plugin_import() -> None:
    assert (
        plugin_imports_outside("cdigen.plugin.dra", ("cdigen.plugin.dra",)) != []
    )  # it imports the agent


@pytest.mark.parametrize(("top", "forbidden"), RULES, ids=[r[0] for r in RULES])
def test_no_arrow_points_back(top: str, forbidden: tuple[str, ...]) -> None:
    assert violations(top, forbidden) == []


def test_the_checker_sees_a_forbidden_import_inside_a_function(tmp_path: Path) -> None:
    sneaky = REPO_ROOT / "cdigen" / "_import_rule_probe.py"
    sneaky.write_text(
        "def f():\n    from cdigen.policies.allocator import Allocator\n    return Allocator\n"
    )
    try:
        assert violations("cdigen", ("cdigen.policies", "cdigen.plugin")) == [
            "cdigen/_import_rule_probe.py imports cdigen.policies.allocator",
            "cdigen/_import_rule_probe.py imports cdigen.policies.allocator.Allocator",
        ]
    finally:
        sneaky.unlink()


def test_a_wing_that_fails_to_import_is_an_error_not_a_debug_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.metadata

    from cdigen import cli

    broken = importlib.metadata.EntryPoint(
        name="broken", value="cdigen_missing_wing.cli:register", group=cli.ENTRY_POINT_GROUP
    )
    real = importlib.metadata.entry_points

    def with_broken(**kwargs: str) -> list[importlib.metadata.EntryPoint]:
        return [*real(**kwargs), broken]

    monkeypatch.setattr(importlib.metadata, "entry_points", with_broken)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    err = capsys.readouterr().err
    assert "cdigen: error: the 'broken' commands cannot be loaded" in err
    assert "No module named 'cdigen_missing_wing'" in err


# -- no import circles -------------------------------------------------------------------------


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (never run)."""
    out: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        for child in ast.iter_child_nodes(node):
            if (
                isinstance(child, ast.If)
                and isinstance(child.test, ast.Name)
                and child.test.id == "TYPE_CHECKING"
            ):
                stack.extend(child.orelse)
                continue
            stack.append(child)
    return out


def module_graph(tops: tuple[str, ...] = ("cdigen", "policies", "plugin")) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports when it runs, lazy imports inside functions
    included: ``from pkg import name`` counts as importing ``pkg.name`` when that is a module
    of ours, else ``pkg`` (a package's ``__init__``)."""
    paths = {module_name(p): p for top in tops for p in modules(top)}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found: set[str] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                names = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names
                ]
            for target in names:
                parts = target.split(".")
                for n in range(len(parts), 0, -1):  # the longest prefix that is ours
                    if ".".join(parts[:n]) in paths:
                        found.add(".".join(parts[:n]))
                        break
        graph[name] = found - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: groups of modules that import each other, directly or around."""
    import networkx as nx

    g = nx.DiGraph([(a, b) for a, targets in graph.items() for b in targets])
    return sorted(sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1)


def test_no_import_circles() -> None:
    """Was: cdigen/cdi/checks.py -> cdigen.discover -> discover/nvml.py -> checks.py;
    policies/cli.py <-> policies/simulate_cli.py; cdigen/fileio.py <-> cdigen/cdi/write.py;
    policies/cel's modules through the package."""
    assert circles(module_graph()) == []


def test_the_circle_check_sees_a_lazy_circle() -> None:
    graph = module_graph()
    graph["cdigen.model"] = {*graph["cdigen.model"], "cdigen.nodefile"}  # a lazy import back
    assert ["cdigen.model", "cdigen.nodefile"] in circles(graph)


# What turns a device ID back into its parts: the advertised records already hold them.
ID_PARSERS = {"gpu_part", "share_kind", "SHARE_SEPARATOR", "SLICE_MARKER"}


def id_parsing(top: str) -> list[str]:
    """Uses in ``top`` of the share-ID parsers, and splits of a string at ``::``."""
    found = []
    for path in modules(top):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(REPO_ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and node.module == "cdigen.shares":
                found += [f"{where} imports {a.name}" for a in node.names if a.name in ID_PARSERS]
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"split", "rsplit", "partition", "rpartition"}
                and any(isinstance(a, ast.Constant) and a.value == "::" for a in node.args)
            ):
                found.append(f"{where} splits at '::'")
    return found


def test_no_device_id_is_parsed_back_into_parts_in_plugin() -> None:
    """Allocate looks a share up among the records it advertised (each holds its GPU)."""
    assert id_parsing("plugin") == []


def test_the_id_parsing_check_sees_a_parse() -> None:
    assert id_parsing("policies") != []  # the engine reads IDs it is given (allocator.py)
