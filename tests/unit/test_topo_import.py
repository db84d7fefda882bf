"""Importing ``nvidia-smi topo -m`` text, and the acceptance round trip through ``cdigen topo``."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdigen.discover.render import render_matrix
from cdigen.discover.topo_import import NodeFacts, import_topo, parse_topo
from cdigen.errors import InputError
from tests.fixtures.reference import TOPOLOGIES, reference_rows

COMPLETE = sorted(p.name for p in TOPOLOGIES.glob("*.txt") if not p.name.startswith("truncated"))


@pytest.mark.parametrize("name", COMPLETE)
def test_import_then_topo_reproduces_labels_and_numa(name: str) -> None:
    node = import_topo(TOPOLOGIES / name)
    labels, numa = reference_rows(TOPOLOGIES / name)
    shown = parse_topo(render_matrix(node), where="rendered")
    assert [list(row) for row in shown.labels] == labels
    if numa:
        assert [str(n) for n in shown.numa_nodes] == [numa[i] for i in range(len(labels))]


def test_numa_none_where_the_file_gives_none() -> None:
    for name in ("dgx1-p100.txt", "ws-4xrtx8000-nvlink-pairs.txt"):
        node = import_topo(TOPOLOGIES / name)
        assert {g.numa_node for g in node.gpus} == {None}
        assert "N/A" in render_matrix(node)


def test_numa_inferred_from_cpu_affinity_with_a_note() -> None:
    node = import_topo(TOPOLOGIES / "dgx1-v100.txt")
    assert [g.numa_node for g in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert any("inferred from distinct CPU affinity" in n for n in node.notes)
    assert not import_topo(TOPOLOGIES / "dgx-a100.txt").notes


def test_nv_pairs_have_links_and_unknown_pcie() -> None:
    node = import_topo(TOPOLOGIES / "ws-4xrtx8000-nvlink-pairs.txt")
    nv = node.link(0, 3)
    assert nv is not None and (nv.nvlinks, nv.pcie) == (2, None)
    pcie = node.link(0, 1)
    assert pcie is not None and (pcie.nvlinks, pcie.pcie) == (0, "NODE")


def test_truncated_paste_is_rejected_saying_rows_are_missing() -> None:
    path = TOPOLOGIES / "truncated-dgx2-paste.txt"
    with pytest.raises(InputError, match=r"rows missing: .*16 GPUs .*5 GPU rows.*GPU5\.\.GPU15"):
        import_topo(path)


def test_gpu_name_and_memory_options() -> None:
    node = import_topo(TOPOLOGIES / "dgx-h100.txt", NodeFacts(gpu_name="NVIDIA H100 80GB HBM3"))
    assert node.gpus[0].architecture == "Hopper" and node.gpus[0].memory_bytes == 81559 * 2**20
    node = import_topo(
        TOPOLOGIES / "dgx-h100.txt", NodeFacts(gpu_name="Mystery GPU", memory_bytes=123)
    )
    assert node.gpus[0].name == "Mystery GPU" and node.gpus[0].memory_bytes == 123


def test_import_is_deterministic() -> None:
    a = import_topo(TOPOLOGIES / "dgx-a100.txt")
    assert a == import_topo(TOPOLOGIES / "dgx-a100.txt")
    assert len({g.uuid for g in a.gpus}) == 8


SPACES = """\
        GPU0    GPU1    NIC0    CPU Affinity    NUMA Affinity
GPU0     X      SOC     PIX     0-7     0
GPU1    SOC      X      SYS     8-15    1
NIC0    PIX     SYS      X
"""


def test_spaces_legacy_labels_and_nic_rows() -> None:
    matrix = parse_topo(SPACES, where="t")
    assert matrix.labels == (("X", "SYS"), ("SYS", "X"))
    assert matrix.numa_nodes == (0, 1) and not matrix.numa_inferred


def test_single_gpu() -> None:
    matrix = parse_topo("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-15\t0\n", where="t")
    assert matrix.labels == (("X",),) and matrix.numa_nodes == (0,)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "no GPU columns found"),
        ("# only a comment\nhello world\n", "no GPU columns found"),
        ("\tGPU0\tGPU1\n", "no GPU rows found"),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV2\nGPU1\tSYS\t X \n", "not symmetric: GPU0/GPU1 is NV2"),
        (
            "\tGPU0\tGPU1\nGPU0\t X \tFOO\nGPU1\tFOO\t X \n",
            "line 2: column GPU1: unknown link label",
        ),
        ("\tGPU0\tGPU1\nGPU0\t X \nGPU1\tSYS\t X \n", "line 2: the row has 1 cells"),
        ("\tGPU0\tGPU1\nGPU0\tSYS\tSYS\nGPU1\tSYS\t X \n", "GPU0 against itself should be X"),
        ("\tGPU0\tGPU1\nGPU0\t X \t X \nGPU1\t X \t X \n", "line 2: GPU0/GPU1 is X"),  # a traceback
        ("\tGPU1\tGPU0\nGPU0\t X \tSYS\nGPU1\tSYS\t X \n", "GPU columns must come first"),
        ("\tGPU0\tGPU1\nGPU0\t X \tSYS\nGPU0\tSYS\t X \n", "a second row for GPU0"),
    ],
)
def test_bad_text_is_one_clear_line(text: str, expected: str) -> None:
    with pytest.raises(InputError, match=expected) as err:
        parse_topo(text, where="topo.txt")
    assert str(err.value).startswith("topo.txt") and "\n" not in str(err.value)


def test_comment_lines_are_skipped(tmp_path: Path) -> None:
    text = "# a note\n\tGPU0\tGPU1\n# between\nGPU0\t X \tNV4\nGPU1\tNV4\t X \n"
    assert parse_topo(text, where="t").labels == (("X", "NV4"), ("NV4", "X"))
