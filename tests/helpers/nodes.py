"""Reference nodes for the policy tests, transcribed from ../shared/reference/topologies.

Independent of the discovery part on purpose: these are the fixtures the engine is checked
against. ``tests/unit/test_policy_nodes.py`` checks the shipped samples carry the same links.
"""

from __future__ import annotations

from cdigen.model import Gpu, Link, Node

DGX1_V100 = """
X   NV1 NV1 NV2 NV2 SYS SYS SYS
NV1 X   NV2 NV1 SYS NV2 SYS SYS
NV1 NV2 X   NV2 SYS SYS NV1 SYS
NV2 NV1 NV2 X   SYS SYS SYS NV1
NV2 SYS SYS SYS X   NV1 NV1 NV2
SYS NV2 SYS SYS NV1 X   NV2 NV1
SYS SYS NV1 SYS NV1 NV2 X   NV2
SYS SYS SYS NV1 NV2 NV1 NV2 X
"""
DGX1_P100 = """
X   NV1 NV1 NV1 NV1 SYS SYS SYS
NV1 X   NV1 NV1 SYS NV1 SYS SYS
NV1 NV1 X   NV1 SYS SYS NV1 SYS
NV1 NV1 NV1 X   SYS SYS SYS NV1
NV1 SYS SYS SYS X   NV1 NV1 NV1
SYS NV1 SYS SYS NV1 X   NV1 NV1
SYS SYS NV1 SYS NV1 NV1 X   NV1
SYS SYS SYS NV1 NV1 NV1 NV1 X
"""
PCIE_NODE_PHB = """
X    NODE NODE NODE NODE NODE SYS SYS
NODE X    PHB  NODE NODE NODE SYS SYS
NODE PHB  X    NODE NODE NODE SYS SYS
NODE NODE NODE X    PHB  NODE SYS SYS
NODE NODE NODE PHB  X    NODE SYS SYS
NODE NODE NODE NODE NODE X    SYS SYS
SYS  SYS  SYS  SYS  SYS  SYS  X   PHB
SYS  SYS  SYS  SYS  SYS  SYS  PHB X
"""
WS_4XV100 = """
X   NV1 NV1 NV2
NV1 X   NV2 NV1
NV1 NV2 X   NV2
NV2 NV1 NV2 X
"""


def _uniform(count: int, cell: str) -> str:
    rows = []
    for i in range(count):
        rows.append(" ".join("X" if j == i else cell for j in range(count)))
    return "\n".join(rows)


def node_from_matrix(
    name: str,
    matrix: str,
    numa: list[int | None],
    *,
    product: str = "NVIDIA A100-SXM4-80GB",
    memory_gib: int = 80,
    hidden_pcie: dict[tuple[int, int], str] | None = None,
) -> Node:
    """A Node from a topo -m GPU matrix (NV# hides the PCIe level unless ``hidden_pcie`` says)."""
    rows = [r.split() for r in matrix.strip().splitlines()]
    gpus = tuple(
        Gpu(
            index=i,
            minor=i,
            uuid=f"GPU-{name}-{i:02d}",
            name=product,
            architecture="Ampere",
            cuda_compute_capability="8.0",
            memory_bytes=memory_gib * 2**30,
            pci_bus_id=f"0000:{i + 16:02x}:00.0",
            numa_node=numa[i],
        )
        for i in range(len(rows))
    )
    links = []
    for i, row in enumerate(rows):
        for j in range(i + 1, len(row)):
            cell = row[j]
            if cell.startswith("NV"):
                pcie = (hidden_pcie or {}).get((i, j))
                links.append(Link(i, j, pcie=pcie, nvlinks=int(cell[2:])))  # type: ignore[arg-type]
            else:
                links.append(Link(i, j, pcie=cell, nvlinks=0))  # type: ignore[arg-type]
    return Node(gpus=gpus, links=tuple(links), driver_version="550.54.15", name=name)


def dgx1_v100() -> Node:
    return node_from_matrix(
        "dgx1-v100",
        DGX1_V100,
        [0, 0, 0, 0, 1, 1, 1, 1],
        product="Tesla V100-SXM2-16GB",
        memory_gib=16,
    )


def dgx1_p100() -> Node:
    return node_from_matrix(
        "dgx1-p100",
        DGX1_P100,
        [0, 0, 0, 0, 1, 1, 1, 1],
        product="Tesla P100-SXM2-16GB",
        memory_gib=16,
    )


def dgx_a100() -> Node:
    hidden = {(0, 1): "PXB", (2, 3): "PXB", (4, 5): "PXB", (6, 7): "PXB"}
    hidden.update(
        {(i, j): "SYS" for i in range(8) for j in range(i + 1, 8) if (i, j) not in hidden}
    )
    return node_from_matrix(
        "dgx-a100", _uniform(8, "NV12"), [3, 3, 1, 1, 7, 7, 5, 5], hidden_pcie=hidden
    )


def dgx_a100_nvlink_only() -> Node:
    return node_from_matrix("dgx-a100-hidden", _uniform(8, "NV12"), [3, 3, 1, 1, 7, 7, 5, 5])


def dgx_h100() -> Node:
    return node_from_matrix(
        "dgx-h100", _uniform(8, "NV18"), [0, 0, 0, 0, 1, 1, 1, 1], product="NVIDIA H100 80GB HBM3"
    )


def pcie_8x4090() -> Node:
    return node_from_matrix(
        "pcie-8x4090",
        _uniform(8, "SYS"),
        [0, 0, 0, 0, 1, 1, 1, 1],
        product="NVIDIA GeForce RTX 4090",
        memory_gib=24,
    )


def pcie_node_phb() -> Node:
    return node_from_matrix("pcie-node-phb", PCIE_NODE_PHB, [0, 0, 0, 0, 0, 0, 1, 1])


def ws_4xv100() -> Node:
    return node_from_matrix(
        "ws-4xv100", WS_4XV100, [0, 0, 0, 0], product="Tesla V100-DGXS-32GB", memory_gib=32
    )


def dgx2_v100() -> Node:
    return node_from_matrix(
        "dgx2-v100",
        _uniform(16, "NV6"),
        [0] * 8 + [1] * 8,
        product="Tesla V100-SXM3-32GB",
        memory_gib=32,
    )


EIGHT_GPU_NODES = {
    "dgx1-v100": dgx1_v100,
    "dgx1-p100": dgx1_p100,
    "dgx-a100": dgx_a100,
    "dgx-h100": dgx_h100,
    "pcie-8x4090": pcie_8x4090,
    "pcie-node-phb": pcie_node_phb,
}
