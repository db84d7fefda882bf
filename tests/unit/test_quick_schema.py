"""The jsonschema-free check on generate's hot path never accepts what jsonschema rejects."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import pytest

from cdigen.cdi.capabilities import CAPABILITIES
from cdigen.cdi.spec import SpecOptions, generate
from cdigen.cdi.validate import _validator
from cdigen.cdi.yamlout import block_yaml
from cdigen.discover.builtin import load_builtin
from cdigen.fileio import dump_document
from cdigen.nodefile import node_to_dict
from cdigen.schemas import SchemaProblem, load_schema, quick_valid, schema_errors, schema_problems
from tests.cdihost import build_host, make_node

ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 1.5, 2.0, "", "x", "rw\n", "/abs", "rel", [], [1], {}, {"k": 1},
    "0.5.0", "nvidia.com/gpu", 2**70,
]  # fmt: skip


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:3]):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(doc: Any, rng: random.Random) -> Any:
    doc = copy.deepcopy(doc)
    path = rng.choice(_paths(doc)[1:])
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    action = rng.randrange(3)
    if action == 0 and isinstance(parent, dict):
        del parent[path[-1]]
    elif action == 1 and isinstance(parent, dict):
        parent["unknownField"] = 1
    else:
        parent[path[-1]] = rng.choice(ODD_VALUES)
    return doc


def _check(docs: list[Any], schema_name: str, errors: Any) -> int:
    schema = load_schema(schema_name)
    rng = random.Random(17)
    rejected = 0
    for base in docs:
        assert quick_valid(base, schema) is True
        for _ in range(100):
            doc = _mutate(base, rng)
            quick = quick_valid(doc, schema)
            assert quick is not None
            assert quick == (not errors(doc)), doc
            rejected += not quick
    return rejected


def test_node_documents(tmp_path: Path) -> None:
    docs = [node_to_dict(load_builtin(n)) for n in ("dgx-a100-mig-mixed", "rtx4090")]
    assert _check(docs, "node", lambda d: schema_errors(d, "node")) > 50


def test_generated_specs(tmp_path: Path) -> None:
    fake = build_host(tmp_path, make_node(2, mig_gpu=1), graphics=True, hook=True)
    spec = generate(
        fake.node,
        SpecOptions(
            driver_root=str(fake.driver_root),
            dev_root=str(fake.dev_root),
            sysfs_root=str(fake.sysfs_root),
            hook_path="/usr/bin/nvidia-cdi-hook",
            capabilities=("compute", "utility", "graphics", "video"),
        ),
    )
    assert _check([dict(spec)], "cdi-spec", lambda d: list(_validator().iter_errors(d))) > 50


def test_an_unknown_keyword_defers_to_jsonschema() -> None:
    assert quick_valid({"a": 1}, {"type": "object", "oneOf": [{}]}) is None


@pytest.mark.parametrize(
    ("value", "schema", "valid"),
    [
        (True, {"type": "integer"}, False),
        (2.0, {"type": "integer"}, True),
        (1, {"const": True}, False),
        ("a\n", {"pattern": "^a$"}, False),  # $ is the end of the value, as in Go and ECMA 262
        ({"x": 1}, {"propertyNames": {"pattern": "^y"}}, False),
    ],
)
def test_edge_semantics_match_jsonschema(value: Any, schema: Any, valid: bool) -> None:

    from cdigen.schemas import make_validator

    assert quick_valid(value, schema) is valid
    assert make_validator(schema).is_valid(value) is valid


SCALARS = [
    "-", "--link", "@x", "---a", "...b", "0", "2:0", "1e3", ".inf", "yes", "on", "null", "=",
    "a=b", "x:y", "1.0", "0x1F", "+1", "-1", "2001-01-01", "a::b", "/x", "GPU-1", "07", "",
    "1_000", 0, 17, "~x", "a b", "x:", True, None,
]  # fmt: skip


@pytest.mark.parametrize("hook", [None, "/usr/bin/nvidia-cdi-hook"])
def test_block_yaml_writes_what_pyyaml_writes(tmp_path: Path, hook: str | None) -> None:
    fake = build_host(tmp_path, make_node(3, mig_gpu=2), graphics=True)
    spec = generate(
        fake.node,
        SpecOptions(
            driver_root=str(fake.driver_root),
            dev_root=str(fake.dev_root),
            sysfs_root=str(fake.sysfs_root),
            hook_path=hook,
            name_strategies=("index", "uuid", "type-index"),
            capabilities=CAPABILITIES,
        ),
    )
    assert block_yaml(spec) == dump_document(spec, "yaml")
    for value in SCALARS:
        doc = {"k": value, "l": [value], "m": [{"n": value}]}
        fast = block_yaml(doc)
        assert fast is None or fast == dump_document(doc, "yaml"), value


def test_a_schema_problem_is_a_value_rendered_only_where_shown() -> None:
    """A violation carries its path as keys and indexes: a caller nesting it under a field of
    its own renders it there, never parsing ``path: why`` back."""
    doc = {"resources": [{"name": "nvidia.com/gpu", "sharing": {"replicas": "4"}}]}
    problems = schema_problems(doc, "plugin-config")
    (first,) = problems
    assert first.path == ("resources", 0, "sharing", "replicas")
    assert first.message == 'expected integer, got "4"'
    assert str(first) == 'resources[0].sharing.replicas: expected integer, got "4"'
    assert first.field_under("config[2]") == "config[2].resources[0].sharing.replicas"
    assert schema_errors(doc, "plugin-config") == [str(p) for p in problems]
    root = SchemaProblem((), "expected object, got 3")
    assert (root.field, root.field_under("params"), str(root)) == (
        "<root>",
        "params",
        "<root>: expected object, got 3",
    )
    assert SchemaProblem((0, "a"), "x").field_under("items") == "items[0].a"
