"""The ``cdigen topo`` views: matrix, Graphviz and JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cdigen.discover import load_node
from cdigen.discover.builtin import names
from cdigen.discover.render import label_matrix, pair_label, render_dot, render_json, render_matrix
from cdigen.model import Link

PICTURES = Path(__file__).resolve().parents[2] / "docs" / "pictures"


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


# -- the Graphviz picture: read back as a user reads it ---------------------------------------


def read_dot(text: str) -> tuple[dict[int, list[str]], dict[tuple[str, str], str]]:
    """The boxes around each GPU (``<subgraph name> <label>``, outermost first) and the edges
    with their labels."""
    stack: list[str] = []
    boxes: dict[int, list[str]] = {}
    edges: dict[tuple[str, str], str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("subgraph "):
            stack.append(line.split()[1])
        elif line.startswith("graph [label=") and stack:
            stack[-1] += " " + line.split('"')[1]
        elif line == "}" and stack:
            stack.pop()
        elif match := re.fullmatch(r'gpu(\d+) \[label=".*"\];', line):
            boxes[int(match[1])] = list(stack)
        elif match := re.fullmatch(r'(\w+) -- (\w+) \[label="([^"]*)".*', line):
            edges[(match[1], match[2])] = match[3]
    return boxes, edges


def level_from_boxes(a: list[str], b: list[str]) -> str:
    """The innermost box two GPUs share says their PCIe level; NUMA boxes part NODE/SYS."""
    shared = [x for x, y in zip(a, b, strict=False) if x == y]
    for box in reversed(shared):
        for level in ("PIX", "PXB", "PHB"):
            if f"({level})" in box:
                return level
    numa = shared[0].split(" ", 1)[1] if shared else ""
    return "NODE" if numa.startswith("NUMA ") and "?" not in numa else "SYS"


@pytest.mark.parametrize("name", names())
def test_the_picture_says_every_pairs_label(name: str) -> None:
    """Every pair's ``topo -m`` label is in the picture: NV# as an edge (or the NVSwitch's), a
    PCIe level as the boxes the two GPUs share, anything else as a labelled edge."""
    node = load_node(f"builtin:{name}")
    boxes, edges = read_dot(render_dot(node))
    gpus = sorted(node.gpus, key=lambda g: g.index)
    assert sorted(boxes) == [g.index for g in gpus]
    matrix = label_matrix(node)
    position = {g.index: n for n, g in enumerate(node.gpus)}
    for n, a in enumerate(gpus):
        for b in gpus[n + 1 :]:
            label = matrix[position[a.index]][position[b.index]]
            pair = (f"gpu{a.index}", f"gpu{b.index}")
            if label.startswith("NV"):
                through_switch = edges.get((pair[0], "nvswitch")) == label
                assert edges.get(pair) == label or through_switch, (name, pair, label)
            elif pair in edges:
                assert edges[pair] == label, (name, pair)
            else:
                assert level_from_boxes(boxes[a.index], boxes[b.index]) == label, (name, pair)


def test_an_nvswitch_is_one_node_not_a_mesh() -> None:
    """Was: 120 thick edges on the DGX-2."""
    dot = render_dot(load_node("builtin:dgx2-v100"))
    _, edges = read_dot(dot)
    assert len(edges) == 16 and all(b == "nvswitch" for _, b in edges)
    assert set(edges.values()) == {"NV6"}
    dgx1 = read_dot(render_dot(load_node("builtin:dgx1-v100")))[1]
    assert "nvswitch" not in {b for _, b in dgx1} and len(dgx1) == 16  # a hybrid cube mesh


def test_each_pcie_level_has_its_own_box_style_and_numa_boxes_do_not_overlap() -> None:
    dot = render_dot(load_node("builtin:dgx1-v100"))
    styles = {
        label: line.split(", ", 1)[1]
        for line in dot.splitlines()
        if line.strip().startswith("graph [label=")
        for label in [line.split('"')[1]]
    }
    assert {k.split(" ", 1)[0] for k in styles} >= {"NUMA", "host", "PCIe"}
    assert len({styles[k] for k in styles if not k.startswith("NUMA")}) == 3  # PIX, PXB, PHB
    boxes, _ = read_dot(dot)
    numa = {gpu: stack[0].split(" ", 1)[1] for gpu, stack in boxes.items()}
    assert sorted(set(numa.values())) == ["NUMA 0", "NUMA 1"]  # each GPU in exactly one


@pytest.mark.parametrize("picture", sorted(PICTURES.glob("*.dot")), ids=lambda p: p.stem)
def test_the_committed_pictures_are_what_topo_prints(picture: Path) -> None:
    """docs/pictures/*.dot are the current output (redraw with docs/pictures/make.sh); each
    has its PNG beside it."""
    assert picture.read_text() == render_dot(load_node(f"builtin:{picture.stem}"))
    assert picture.with_suffix(".png").stat().st_size > 1000


def test_the_docs_show_three_pictures_or_more() -> None:
    assert len(list(PICTURES.glob("*.dot"))) >= 3
