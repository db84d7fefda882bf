"""The topology graph of one node and its pair-score table, built once per (node, link weights).

Nothing on the request path walks the graph: the allocator reads the precomputed ``scores``
matrix (by GPU position) and the NUMA node of each GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from cdigen.model import Gpu, Node

NVLINK_WEIGHT_KEY = "NVLINK"
DEFAULT_LINK_WEIGHTS: Mapping[str, int] = {
    "NVLINK": 100,
    "PIX": 50,
    "PXB": 40,
    "PHB": 30,
    "NODE": 20,
    "SYS": 10,
}


@dataclass(frozen=True)
class Topology:
    """One node's GPUs by position (sorted by index), the pair scores and NUMA nodes.

    ``scores[i][j]`` is ``NVLINK weight × nvlinks + pcie weight`` for the GPUs at positions
    ``i`` and ``j`` (0 on the diagonal and where nothing is known about the pair).
    """

    node: Node
    gpus: tuple[Gpu, ...]
    scores: tuple[tuple[int, ...], ...]
    nvlinks: tuple[tuple[int, ...], ...]
    numa: tuple[int | None, ...]
    position_by_index: Mapping[int, int]
    position_by_uuid: Mapping[str, int]
    weights: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_LINK_WEIGHTS))

    @cached_property
    def graph(self) -> Any:
        """The networkx graph of the node (see :func:`build_graph`), built on first use."""
        return build_graph(self.node, self.weights)

    @property
    def size(self) -> int:
        """The number of GPUs."""
        return len(self.gpus)

    def set_score(self, positions: tuple[int, ...]) -> int:
        """The link score of a set of GPU positions: the sum over its unordered pairs."""
        total = 0
        for n, i in enumerate(positions):
            row = self.scores[i]
            for j in positions[n + 1 :]:
                total += row[j]
        return total

    def numa_nodes(self, positions: tuple[int, ...]) -> tuple[int, ...]:
        """The known NUMA nodes a set of GPU positions spans, sorted."""
        return tuple(sorted({n for p in positions if (n := self.numa[p]) is not None}))

    def min_pair_nvlinks(self, positions: tuple[int, ...]) -> int:
        """The fewest NVLinks between any two GPUs of the set (0 for fewer than two GPUs)."""
        if len(positions) < 2:
            return 0
        return min(self.nvlinks[i][j] for n, i in enumerate(positions) for j in positions[n + 1 :])


def pair_score(nvlinks: int, pcie: str | None, weights: Mapping[str, int]) -> int:
    """The score of one GPU pair: NVLink weight per NVLink plus the weight of the PCIe level."""
    nvlink_weight = weights.get(NVLINK_WEIGHT_KEY, DEFAULT_LINK_WEIGHTS[NVLINK_WEIGHT_KEY])
    pcie_weight = weights.get(pcie, 0) if pcie is not None else 0
    return nvlink_weight * nvlinks + pcie_weight


def build_topology(node: Node, weights: Mapping[str, int] | None = None) -> Topology:
    """The score table of ``node`` under ``weights`` (the policy's ``linkWeights``)."""
    weights = DEFAULT_LINK_WEIGHTS if weights is None else weights
    gpus = tuple(sorted(node.gpus, key=lambda g: g.index))
    count = len(gpus)
    scores = [[0] * count for _ in range(count)]
    nvlinks = [[0] * count for _ in range(count)]
    for i, a in enumerate(gpus):
        for j in range(i + 1, count):
            link = node.link(a.index, gpus[j].index)
            if link is None:
                continue
            score = pair_score(link.nvlinks, link.pcie, weights)
            scores[i][j] = scores[j][i] = score
            nvlinks[i][j] = nvlinks[j][i] = link.nvlinks
    return Topology(
        node=node,
        gpus=gpus,
        scores=tuple(tuple(row) for row in scores),
        nvlinks=tuple(tuple(row) for row in nvlinks),
        numa=tuple(g.numa_node for g in gpus),
        position_by_index={g.index: p for p, g in enumerate(gpus)},
        position_by_uuid={g.uuid: p for p, g in enumerate(gpus)},
        weights=dict(weights),
    )


def build_graph(node: Node, weights: Mapping[str, int] | None = None) -> Any:
    """A networkx graph of the node: GPU nodes ``("gpu", index)``, NUMA nodes ``("numa", n)``.

    GPU–GPU edges carry ``nvlinks``, ``pcie`` and ``score``; GPU–NUMA edges tie a GPU to its
    NUMA node. Used for reports and ``explain``; the request path uses :class:`Topology`.
    """
    import networkx as nx

    weights = DEFAULT_LINK_WEIGHTS if weights is None else weights
    graph = nx.Graph(name=node.name)
    for gpu in node.gpus:
        graph.add_node(("gpu", gpu.index), uuid=gpu.uuid, name=gpu.name, numa=gpu.numa_node)
        if gpu.numa_node is not None:
            graph.add_node(("numa", gpu.numa_node))
            graph.add_edge(("gpu", gpu.index), ("numa", gpu.numa_node), kind="numa")
    for link in node.links:
        graph.add_edge(
            ("gpu", link.a),
            ("gpu", link.b),
            kind="link",
            nvlinks=link.nvlinks,
            pcie=link.pcie,
            score=pair_score(link.nvlinks, link.pcie, weights),
        )
    return graph


@dataclass(frozen=True)
class NvlinkGroups:
    """NVLink facts per GPU index, derived from the graph.

    ``domain``: the connected component of the NVLink graph (GPUs that can reach each other over
    NVLink, possibly through others); ``clique``: a partition of each domain into cliques of
    GPUs that are all directly linked to each other, biggest first. Both are small integers,
    numbered by their lowest GPU index, so that ``matchAttribute`` can compare them.
    """

    domain: Mapping[int, int]
    clique: Mapping[int, int]


def nvlink_groups(node: Node) -> NvlinkGroups:
    """The NVLink domains and cliques of ``node``; GPUs without NVLinks are in neither."""
    import networkx as nx

    graph = build_graph(node)
    links = nx.Graph()
    links.add_edges_from(
        (a, b) for a, b, data in graph.edges(data=True) if data.get("nvlinks", 0) > 0
    )
    domain: dict[int, int] = {}
    clique: dict[int, int] = {}
    for component in sorted(nx.connected_components(links), key=lambda c: min(c)):
        indexes = sorted(i for _, i in component)
        for i in indexes:
            domain[i] = indexes[0]
        left = links.subgraph(component).copy()
        while left.number_of_nodes():
            # the biggest clique, ties broken by the lowest indexes: a stable partition
            best = max(nx.find_cliques(left), key=lambda c: (len(c), [-i for _, i in sorted(c)]))
            members = sorted(i for _, i in best)
            for i in members:
                clique[i] = members[0]
            left.remove_nodes_from(best)
    return NvlinkGroups(domain=domain, clique=clique)
