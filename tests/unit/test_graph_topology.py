"""The topology graph and the pair-score table built from it."""

from __future__ import annotations

from cdigen.model import Gpu, Link, Node
from cdigen.policies.graph import build_topology, pair_score
from tests.helpers.nodes import dgx1_v100, dgx_a100


def test_pair_score_rules() -> None:
    weights = {"NVLINK": 100, "PIX": 50, "SYS": 10}
    assert pair_score(2, None, weights) == 200  # hidden behind NVLink: NVLink part only
    assert pair_score(0, "SYS", weights) == 10
    assert pair_score(1, "PIX", weights) == 150
    assert pair_score(0, "PHB", weights) == 0  # a level the weights leave out scores 0


def test_score_table_matches_the_links() -> None:
    topo = build_topology(dgx1_v100())
    assert topo.scores[0][3] == topo.scores[3][0] == 200  # NV2
    assert topo.scores[0][1] == 100 and topo.scores[0][5] == 10  # NV1, SYS
    assert all(topo.scores[i][i] == 0 for i in range(8))
    assert topo.set_score((0, 3)) == 200
    assert topo.set_score((0, 1, 2, 3)) == 100 + 100 + 200 + 200 + 100 + 200


def test_link_weights_change_the_table() -> None:
    topo = build_topology(dgx_a100(), {"NVLINK": 1, "PXB": 1000, "SYS": 0})
    assert topo.scores[0][1] == 12 + 1000 and topo.scores[0][2] == 12


def test_graph_has_gpus_numa_nodes_and_links() -> None:
    topo = build_topology(dgx_a100())
    graph = topo.graph
    assert graph is topo.graph  # built once
    gpus = [n for n in graph.nodes if n[0] == "gpu"]
    numa = sorted(n[1] for n in graph.nodes if n[0] == "numa")
    assert len(gpus) == 8 and numa == [1, 3, 5, 7]
    edge = graph.edges[("gpu", 0), ("gpu", 1)]
    assert edge["nvlinks"] == 12 and edge["pcie"] == "PXB" and edge["score"] == topo.scores[0][1]
    assert graph.has_edge(("gpu", 4), ("numa", 7))


def test_unknown_pairs_and_numa() -> None:
    gpus = tuple(
        Gpu(i, i, f"GPU-{i}", "X", "Ampere", "8.0", 1, f"0000:0{i}:00.0", numa_node=None)
        for i in range(3)
    )
    node = Node(gpus=gpus, links=(Link(0, 1, "PIX", 0),))
    topo = build_topology(node)
    assert topo.scores[0][2] == 0 and topo.numa_nodes((0, 1, 2)) == ()
    assert topo.min_pair_nvlinks((0, 1)) == 0 and topo.min_pair_nvlinks((0,)) == 0
