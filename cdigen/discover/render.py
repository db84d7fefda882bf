"""The ``cdigen topo`` views of a Node: an ``nvidia-smi topo -m`` style matrix, Graphviz, JSON."""

from __future__ import annotations

import json
from typing import TypedDict

from cdigen.model import Gpu, Link, Node

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


def render_dot(node: Node) -> str:
    """A Graphviz graph: GPUs clustered by NUMA node, one edge per known pair, NVLink bold."""
    out = [f"graph {json.dumps(node.name or 'node')} {{", "  node [shape=box];"]
    by_numa: dict[int | None, list[Gpu]] = {}
    for gpu in node.gpus:
        by_numa.setdefault(gpu.numa_node, []).append(gpu)
    for numa, gpus in sorted(by_numa.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        indent = "  "
        if numa is not None:
            out.append(f"  subgraph cluster_numa{numa} {{")
            out.append(f'    label="NUMA {numa}";')
            indent = "    "
        for gpu in gpus:
            out.append(f'{indent}gpu{gpu.index} [label="GPU{gpu.index}\\n{gpu.name}"];')
        if numa is not None:
            out.append("  }")
    for link in sorted(node.links, key=lambda k: (k.a, k.b)):
        label = pair_label(link)
        style = (
            f", penwidth={1 + min(link.nvlinks, 18) / 3:.1f}" if link.nvlinks else ", style=dashed"
        )
        out.append(f'  gpu{link.a} -- gpu{link.b} [label="{label}"{style}];')
    out.append("}")
    return "\n".join(out) + "\n"
