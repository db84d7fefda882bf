"""The ``cdigen topo`` views of a Node: an ``nvidia-smi topo -m`` style matrix, Graphviz, JSON."""

from __future__ import annotations

import json
from typing import TypedDict

from cdigen.model import PCIE_LEVELS, Gpu, Link, Node, PcieLevel

LEGEND = """\
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes
  NODE = Connection traversing PCIe and the interconnect between host bridges in a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
  ?    = Not known
"""


class TopoGpu(TypedDict):
    """One GPU in ``topo --format json``."""

    index: int
    uuid: str
    name: str
    pciBusId: str
    numaNode: int | None


class TopoJson(TypedDict):
    """``topo --format json``: GPUs, the label matrix (rows/columns in ``gpus`` order), links."""

    gpus: list[TopoGpu]
    matrix: list[list[str]]


def pair_label(link: Link | None) -> str:
    """The ``topo -m`` label of a pair: ``NV#`` with NVLinks, else the PCIe level, else ``?``."""
    if link is None:
        return "?"
    if link.nvlinks > 0:
        return f"NV{link.nvlinks}"
    return link.pcie or "?"


def label_matrix(node: Node) -> list[list[str]]:
    """``matrix[i][j]``: the label between ``node.gpus[i]`` and ``node.gpus[j]``; ``X`` for self."""
    return [
        ["X" if a.index == b.index else pair_label(node.link(a.index, b.index)) for b in node.gpus]
        for a in node.gpus
    ]


def render_matrix(node: Node, *, legend: bool = True) -> str:
    """A tab-separated matrix like ``nvidia-smi topo -m`` (GPU columns, then NUMA Affinity)."""
    names = [f"GPU{g.index}" for g in node.gpus]
    lines = ["\t" + "\t".join([*names, "NUMA Affinity"])]
    for gpu, name, row in zip(node.gpus, names, label_matrix(node), strict=True):
        cells = [" X " if label == "X" else label for label in row]
        numa = "N/A" if gpu.numa_node is None else str(gpu.numa_node)
        lines.append("\t".join([name, *cells, numa]))
    text = "\n".join(lines) + "\n"
    return f"{text}\n{LEGEND}" if legend else text


def render_json(node: Node) -> str:
    """The matrix and the GPUs as JSON (see :class:`TopoJson`)."""
    doc: TopoJson = {
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "pciBusId": g.pci_bus_id,
                "numaNode": g.numa_node,
            }
            for g in node.gpus
        ],
        "matrix": label_matrix(node),
    }
    return json.dumps(doc, indent=2) + "\n"


# How each PCIe level is drawn: GPUs that share a level are boxed together, innermost first;
# NODE and SYS are the boxes that part them (host bridges in one NUMA node; NUMA nodes).
CLUSTER_STYLES: dict[str, tuple[str, str]] = {
    "PIX": ("PCIe bridge (PIX)", 'style="bold", color="gray30"'),
    "PXB": ("PCIe switch (PXB)", 'style="dotted", color="gray30"'),
    "PHB": ("host bridge (PHB)", 'style="dashed", color="gray30"'),
    "NUMA": ("NUMA", 'style="rounded,filled", fillcolor="gray96", color="gray50"'),
}
NESTED_LEVELS: tuple[PcieLevel, ...] = ("PHB", "PXB", "PIX")  # outermost first, inside NUMA


def render_dot(node: Node) -> str:
    """A Graphviz graph that stays readable on large nodes.

    GPUs are boxed by NUMA node, then by host bridge (PHB), PCIe switch (PXB) and single
    bridge (PIX), so the PCIe level of a pair is where their boxes part: no edge is drawn for
    it (NODE: two host bridges of one NUMA node; SYS: two NUMA nodes). A pair whose level the
    boxes do not say (an unknown one, or data that does not nest) gets a dashed edge with its
    label. NVLinks are edges labelled ``NV#``; when every pair of GPUs has the same NVLinks
    (an NVSwitch fabric) they are drawn as one switch node with an edge per GPU.
    """
    gpus = sorted(node.gpus, key=lambda g: g.index)
    boxes = _pcie_boxes(node, gpus)
    out = [
        f"graph {json.dumps(node.name or 'node')} {{",
        "  graph [rankdir=LR, newrank=true, fontname=Helvetica];",
        "  node [shape=box, style=rounded, fontname=Helvetica];",
        "  edge [fontname=Helvetica, fontsize=10];",
    ]
    by_numa: dict[int | None, list[Gpu]] = {}
    for gpu in gpus:
        by_numa.setdefault(gpu.numa_node, []).append(gpu)
    for numa, members in sorted(by_numa.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        title, style = CLUSTER_STYLES["NUMA"]
        name = "unknown" if numa is None else str(numa)
        out.append(f"  subgraph cluster_numa_{name} {{")
        out.append(f'    graph [label="{title} {"?" if numa is None else numa}", {style}];')
        out += _nested(members, boxes, 0, "    ", f"numa_{name}")
        out.append("  }")
    fabric = _nvswitch_nvlinks(node, gpus)
    if fabric:
        out.append(
            '  nvswitch [label="NVSwitch", shape=hexagon, style=filled, fillcolor="palegreen"];'
        )
        for gpu in gpus:
            out.append(
                f'  gpu{gpu.index} -- nvswitch [label="NV{fabric}", color="forestgreen", '
                f"penwidth={_nvlink_width(fabric)}];"
            )
    for link in sorted(node.links, key=lambda k: (k.a, k.b)):
        if link.nvlinks and not fabric:
            out.append(
                f'  gpu{link.a} -- gpu{link.b} [label="NV{link.nvlinks}", color="forestgreen", '
                f"penwidth={_nvlink_width(link.nvlinks)}];"
            )
    for a, b, label in _unsaid_pairs(node, gpus, boxes):
        out.append(f'  gpu{a} -- gpu{b} [label="{label}", style=dashed, color="gray40"];')
    out.append(_legend())
    out.append("}")
    return "\n".join(out) + "\n"


def _nvlink_width(count: int) -> str:
    return f"{1 + min(count, 18) / 3:.1f}"


def _nvswitch_nvlinks(node: Node, gpus: list[Gpu]) -> int:
    """The NVLink count every pair shares when all pairs of 3+ GPUs have the same (an NVSwitch
    fabric), else 0."""
    if len(gpus) < 3:
        return 0
    counts = {
        (link.nvlinks if (link := node.link(a.index, b.index)) else 0)
        for n, a in enumerate(gpus)
        for b in gpus[n + 1 :]
    }
    return counts.pop() if len(counts) == 1 else 0


def _pcie_boxes(node: Node, gpus: list[Gpu]) -> dict[PcieLevel, dict[int, int]]:
    """For each nested level, GPU index -> its box (the smallest GPU index in it): GPUs joined
    by pairs at that level or closer. Only GPUs whose NUMA node is the same share a box."""
    boxes: dict[PcieLevel, dict[int, int]] = {}
    numa_of = {g.index: g.numa_node for g in gpus}
    for level in NESTED_LEVELS:
        rank = PCIE_LEVELS.index(level)
        parent = {g.index: g.index for g in gpus}

        def root(i: int, parent: dict[int, int] = parent) -> int:
            while parent[i] != i:
                i = parent[i]
            return i

        for link in node.links:
            if link.pcie is None or PCIE_LEVELS.index(link.pcie) > rank:
                continue
            if numa_of.get(link.a) != numa_of.get(link.b):
                continue
            ra, rb = root(link.a), root(link.b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
        boxes[level] = {g.index: root(g.index) for g in gpus}
    return boxes


def _nested(
    members: list[Gpu], boxes: dict[PcieLevel, dict[int, int]], depth: int, indent: str, path: str
) -> list[str]:
    """The boxes of ``members`` from level ``NESTED_LEVELS[depth]`` inwards, then the GPUs."""
    if depth == len(NESTED_LEVELS):
        return [f'{indent}gpu{g.index} [label="GPU{g.index}\\n{g.name}"];' for g in members]
    level = NESTED_LEVELS[depth]
    groups: dict[int, list[Gpu]] = {}
    for gpu in members:
        groups.setdefault(boxes[level][gpu.index], []).append(gpu)
    lines: list[str] = []
    for key, group in groups.items():
        if len(group) == 1:  # a box around one GPU says nothing
            lines += _nested(group, boxes, depth + 1, indent, path)
            continue
        title, style = CLUSTER_STYLES[level]
        lines.append(f"{indent}subgraph cluster_{path}_{level.lower()}{key} {{")
        lines.append(f'{indent}  graph [label="{title}", {style}];')
        lines += _nested(group, boxes, depth + 1, indent + "  ", f"{path}_{level.lower()}{key}")
        lines.append(f"{indent}}}")
    return lines


def implied_level(a: Gpu, b: Gpu, boxes: dict[PcieLevel, dict[int, int]]) -> PcieLevel:
    """The PCIe level the boxes say for a pair: the innermost box they share, else NODE (one
    NUMA node) or SYS."""
    for level in reversed(NESTED_LEVELS):  # innermost first
        if boxes[level][a.index] == boxes[level][b.index]:
            return level
    return "NODE" if a.numa_node == b.numa_node and a.numa_node is not None else "SYS"


def _unsaid_pairs(
    node: Node, gpus: list[Gpu], boxes: dict[PcieLevel, dict[int, int]]
) -> list[tuple[int, int, str]]:
    """Pairs without NVLink whose label the boxes do not say: drawn as edges."""
    out = []
    for n, a in enumerate(gpus):
        for b in gpus[n + 1 :]:
            link = node.link(a.index, b.index)
            if link is not None and link.nvlinks:
                continue
            label = pair_label(link)
            if label != implied_level(a, b, boxes):
                out.append((a.index, b.index, label))
    return out


def _legend() -> str:
    rows = [
        "NUMA node: grey box (GPUs in two are SYS)",
        "host bridge (PHB): dashed box (two in one NUMA node: NODE)",
        "PCIe switch (PXB): dotted box",
        "PCIe bridge (PIX): bold box",
        "NV#: # bonded NVLinks (green)",
        "dashed edge: a pair the boxes do not place",
    ]
    label = "\\l".join(rows) + "\\l"
    return f'  legend [shape=note, style="", fontsize=10, label="{label}"];'
