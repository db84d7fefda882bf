"""Node files: dump and load round trips, schema errors with field paths, semantic checks."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from cdigen.discover.builtin import load_builtin
from cdigen.errors import InputError, SchemaError
from cdigen.model import Link
from cdigen.nodefile import (
    dump_node,
    load_node_file,
    node_from_dict,
    node_to_dict,
    normalize_bus_id,
)


def _write(tmp_path: Path, doc: Any, name: str = "node.yaml") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc) if name.endswith(".json") else dump_yaml(doc))
    return path


def dump_yaml(doc: Any) -> str:
    import yaml

    return yaml.safe_dump(doc, sort_keys=False)


@pytest.fixture
def a100_doc() -> dict[str, Any]:
    return copy.deepcopy(dict(node_to_dict(load_builtin("dgx-a100-mig-mixed"))))


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_dump_then_load_gives_the_same_node(tmp_path: Path, fmt: str) -> None:
    node = load_builtin("dgx-a100-mig-mixed")
    path = tmp_path / f"node.{fmt}"
    path.write_text(dump_node(node, fmt))
    again = load_node_file(path)
    assert again == node
    assert again.gpus[0].mig_devices[0].cap_minors == (12, 13)
    assert dump_node(again, fmt) == dump_node(node, fmt)


def test_json_output_is_camel_case_with_design_keys() -> None:
    doc = json.loads(dump_node(load_builtin("rtx4090"), "json"))
    assert doc["apiVersion"] == "cdigen/v1alpha1" and doc["kind"] == "Node"
    gpu = doc["gpus"][0]
    assert set(gpu) >= {
        "index", "minor", "uuid", "name", "architecture", "cudaComputeCapability",
        "memoryBytes", "pciBusId", "numaNode", "migEnabled", "migDevices",
    }  # fmt: skip
    assert "healthy" not in gpu and "error" not in gpu  # defaults are left out


def test_health_and_error_survive_a_round_trip(tmp_path: Path) -> None:
    node = load_builtin("ws-4xv100")
    gpus = list(node.gpus)
    gpus[1] = dataclasses.replace(gpus[1], healthy=False)
    gpus[2] = dataclasses.replace(gpus[2], error="nvmlDeviceGetMemoryInfo failed: GPU is lost")
    node = dataclasses.replace(node, gpus=tuple(gpus))
    path = tmp_path / "n.yaml"
    path.write_text(dump_node(node))
    again = load_node_file(path)
    assert not again.gpus[1].healthy
    assert again.gpus[2].error == "nvmlDeviceGetMemoryInfo failed: GPU is lost"


def test_schema_error_names_file_and_field_path(tmp_path: Path, a100_doc: dict[str, Any]) -> None:
    a100_doc["gpus"][2]["memoryBytes"] = "80GB"
    path = _write(tmp_path, a100_doc)
    with pytest.raises(SchemaError) as err:
        load_node_file(path)
    message = str(err.value)
    assert message.startswith(f"{path}: gpus[2].memoryBytes: expected integer")
    assert "\n" not in message


def test_unknown_field_is_rejected_with_its_path(tmp_path: Path, a100_doc: dict[str, Any]) -> None:
    a100_doc["gpus"][0]["migDevices"][1]["gi"] = 3
    with pytest.raises(SchemaError, match=r"gpus\[0\]\.migDevices\[1\]: .*'gi'"):
        load_node_file(_write(tmp_path, a100_doc, "n.json"))


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["gpus"][3].update(index=1),
            r"gpus\[3\]\.index: 1 is already used by gpus\[1\]",
        ),
        (
            lambda d: d["gpus"][5].update(uuid=d["gpus"][0]["uuid"]),
            r"gpus\[5\]\.uuid: .* gpus\[0\]",
        ),
        (
            lambda d: d["gpus"][7].update(minor=0),
            r"gpus\[7\]\.minor: 0 is already used by gpus\[0\]",
        ),
        (lambda d: d["links"][0].update(b=9), r"links\[0\]\.b: no GPU has index 9"),
        (lambda d: d["links"][0].update(a=1, b=1), r"links\[0\]: .*both ends are 1"),
        (
            lambda d: d["links"].append(dict(d["links"][0])),
            r"links\[28\]: GPUs 0 and 1 are already",
        ),
        (lambda d: d["gpus"][0].update(migEnabled=False), r"gpus\[0\]\.migDevices: .*migEnabled"),
        (lambda d: d["gpus"][4].update(minor=-1), r"gpus\[4\]\.minor: unknown \(allowed only"),
    ],
)
def test_semantic_errors(
    tmp_path: Path, a100_doc: dict[str, Any], change: Any, expected: str
) -> None:
    change(a100_doc)
    path = _write(tmp_path, a100_doc)
    with pytest.raises(InputError, match=expected) as err:
        load_node_file(path)
    assert str(err.value).startswith(str(path))


def test_links_are_normalised_to_a_below_b() -> None:
    doc = dict(node_to_dict(load_builtin("ws-4xv100")))
    doc["links"] = [{"a": 3, "b": 0, "pcie": None, "nvlinks": 2}]
    node = node_from_dict(doc, where="t")
    assert node.links == (Link(a=0, b=3, pcie=None, nvlinks=2),)
    assert node.link(3, 0) is node.link(0, 3)


def test_bus_ids_are_normalised_to_the_sysfs_form() -> None:
    assert normalize_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_bus_id("0000:07:00.0") == "0000:07:00.0"
    assert normalize_bus_id("07:00.0") == "0000:07:00.0"
    assert normalize_bus_id("garbage") == "garbage"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="node file not found"):
        load_node_file(tmp_path / "nope.yaml")


def test_broken_yaml_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("apiVersion: cdigen/v1alpha1\ngpus: [\n  {index: 0,\n")
    with pytest.raises(InputError, match=r"bad\.yaml: line \d+, column \d+: invalid YAML"):
        load_node_file(path)


def test_other_documents_are_not_node_files(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices: []\n")
    with pytest.raises(InputError, match=r"not a node file \(kind: nvidia.com/gpu\)"):
        load_node_file(path)
    path.write_text("- just\n- a list\n")
    with pytest.raises(InputError, match=r"not a node file \(its top level is a list"):
        load_node_file(path)
    path.write_text("# only a comment\n")  # said "(kind: NoneType)"
    with pytest.raises(InputError, match=r"not a node file \(the file is empty\)"):
        load_node_file(path)
