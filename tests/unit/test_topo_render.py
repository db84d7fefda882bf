"""The ``cdigen topo`` views: matrix, Graphviz and JSON."""

from __future__ import annotations

import json

from cdigen.discover import load_node
from cdigen.discover.render import pair_label, render_dot, render_json, render_matrix
from cdigen.model import Link


def test_pair_labels() -> None:
    assert pair_label(Link(0, 1, "PIX", 2)) == "NV2"  # NVLink hides the PCIe level, as in topo -m
    assert pair_label(Link(0, 1, "NODE", 0)) == "NODE"
    assert pair_label(Link(0, 1, None, 0)) == "?"
    assert pair_label(None) == "?"


def test_matrix_looks_like_nvidia_smi() -> None:
    lines = render_matrix(load_node("builtin:ws-4xrtx8000")).splitlines()
    assert lines[0] == "\tGPU0\tGPU1\tGPU2\tGPU3\tNUMA Affinity"
    assert lines[1] == "GPU0\t X \tNODE\tSYS\tNV2\t0"
    assert lines[4] == "GPU3\tNV2\tSYS\tNODE\t X \t1"
    assert "Legend:" in lines


def test_json_matrix_and_gpus() -> None:
    doc = json.loads(render_json(load_node("builtin:dgx-a100")))
    assert [g["numaNode"] for g in doc["gpus"]] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert doc["matrix"][0][0] == "X" and doc["matrix"][0][7] == "NV12"
    assert all(len(row) == 8 for row in doc["matrix"])


def test_dot_clusters_by_numa_and_draws_every_known_pair() -> None:
    dot = render_dot(load_node("builtin:pcie-8gpu-phb"))
    assert dot.startswith('graph "pcie-8gpu-phb" {') and dot.rstrip().endswith("}")
    assert "subgraph cluster_numa0" in dot and "subgraph cluster_numa1" in dot
    assert dot.count(" -- ") == 28
    assert 'gpu1 -- gpu2 [label="PHB"' in dot
