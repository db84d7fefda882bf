"""Importing ``nvidia-smi topo -m`` text, and the acceptance round trip through ``cdigen topo``."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdigen.cli import main
from cdigen.discover.render import render_matrix
from cdigen.discover.topo_import import (
    NodeFacts,
    import_topo,
    import_topo_warned,
    made_up_bus_id,
    made_up_uuid,
    made_up_uuids,
)
from cdigen.discover.topo_matrix import parse_topo
from cdigen.errors import InputError
from cdigen.nodefile import load_node_file
from tests.fixtures.reference import TOPOLOGIES, reference_rows
from tests.helpers.topo import big_matrix

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


# --- issue 26, rough edge 14: cells read under the header's columns; NUMA that cannot be read


A100 = NodeFacts(gpu_name="NVIDIA A100-SXM4-80GB")


def slurm_text(name: str, blank: set[int]) -> str:
    """Reference ``name`` as nvidia-smi prints it under a Slurm job holding no CPU of some
    sockets: the CPU Affinity cell of the GPUs in ``blank`` is empty (the tabs stay)."""
    lines = (TOPOLOGIES / name).read_text().splitlines()
    header = next(line for line in lines if "CPU Affinity" in line).split("\t")
    at = header.index("CPU Affinity")
    out = []
    for line in lines:
        cells = line.split("\t")
        if cells[0] in {f"GPU{i}" for i in blank}:
            cells[at] = ""
        out.append("\t".join(cells))
    return "\n".join(out) + "\n"


def aligned(text: str, width: int) -> str:
    """``text`` as a web page or ``column -t`` shows it: every cell padded to ``width``
    spaces, so the columns line up under the header but not at 8-column tab stops."""
    rows = [line.split("\t") for line in text.splitlines() if not line.startswith("#")]
    return "\n".join("".join(c.strip().ljust(width) for c in r).rstrip() for r in rows) + "\n"


@pytest.mark.parametrize("width", [16, 17, 21])  # the widest cell has 15 characters
def test_blank_cpu_cells_in_space_aligned_text_keep_each_gpus_numa_node(width: int) -> None:
    text = aligned(slurm_text("dgx-a100.txt", {0, 1, 4}), width)
    assert "\t" not in text and "48-63,176-191" not in text.splitlines()[1]
    matrix = parse_topo(text, where="pasted.txt")
    assert matrix.numa_nodes == (3, 3, 1, 1, 7, 7, 5, 5)
    assert matrix.cpu_affinity[:3] == (None, None, "16-31,144-159")
    assert matrix.warnings == ()


@pytest.mark.parametrize("tab", [2, 4])
def test_numa_that_cannot_be_read_is_a_warning_naming_the_gpu(tab: int) -> None:
    # tabs expanded at 2 or 4 columns: the rows no longer line up under the header, and a
    # split on spaces cannot tell the blank cell; those GPUs' NUMA node is unknown, said so
    text = slurm_text("dgx-a100.txt", {0, 5}).expandtabs(tab)
    node, warnings = import_topo_warned(text, where="pasted.txt", facts=A100)
    assert [g.numa_node for g in node.gpus] == [None, 3, 1, 1, 7, None, 5, 5]
    assert [w.split(" ", 1)[0] for w in warnings] == ["GPU0", "GPU5"]
    assert "its NUMA node cannot be read" in warnings[0]
    assert node.gpus[0].numa_node is None and node.gpus[1].numa_node == 3


def test_a_blank_numa_cell_is_a_warning(tmp_path: Path) -> None:
    head = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
    text = f"{head}GPU0\t X \tSYS\t0-7\t\nGPU1\tSYS\t X \t8-15\t1\n"
    node, warnings = import_topo_warned(text, where="t.txt", facts=A100)
    assert [g.numa_node for g in node.gpus] == [None, 1]
    assert warnings == (
        "GPU0 (line 2): its NUMA node cannot be read: its NUMA Affinity cell is blank",
    )


def test_the_cli_prints_the_numa_warning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "pasted.txt"
    path.write_text(slurm_text("dgx-a100.txt", {2}).expandtabs(4))
    code = main(["topo", "import", str(path), "--gpu-name", "NVIDIA A100-SXM4-80GB",
                 "-o", str(tmp_path / "node.yaml")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0
    assert (
        "cdigen: warning: GPU2 (line 16): its NUMA node cannot be read: the row has 1 cell " in err
    )


# --- issue 26, rough edge 4: a GPU name cdigen does not know


def test_an_unknown_gpu_name_warns_how_to_give_the_memory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    reference = str(TOPOLOGIES / "pcie-8x4090-2socket-allsys.txt")
    target = tmp_path / "node.yaml"
    code = main(["topo", "import", reference, "--gpu-name", "RTX 4090", "-o", str(target)])
    err = capsys.readouterr().err
    assert code == 0 and "memoryBytes: 0" in target.read_text()
    warning = next(line for line in err.splitlines() if "warning" in line)
    assert warning.startswith("cdigen: warning: cdigen does not know the GPU 'RTX 4090' "
                              "(did you mean 'NVIDIA GeForce RTX 4090'?)")  # fmt: skip
    assert "memoryBytes: 0" in warning and "--memory SIZE" in warning
    assert "NVIDIA L40S" in warning  # the known names
    code = main(["topo", "import", reference, "--gpu-name", "RTX 4090", "--memory", "24GiB",
                 "-o", str(target)])  # fmt: skip
    assert code == 0 and "warning" not in capsys.readouterr().err
    assert f"memoryBytes: {24 * 2**30}" in target.read_text()
    code = main(["topo", "import", reference, "--gpu-name", "NVIDIA GeForce RTX 4090",
                 "-o", str(target)])  # fmt: skip
    assert code == 0 and "warning" not in capsys.readouterr().err


# --- issue 22: a 300-GPU matrix; made-up identifiers; which flag a schema error is about


def test_a_300_gpu_matrix_imports_and_loads(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # its bus IDs once ran past bus ff ('0000:100:00.0'), which the node schema refuses,
    # and the error blamed --name, --gpu-name and the version flags
    source = tmp_path / "big.txt"
    source.write_text(big_matrix(300))
    target = tmp_path / "big.json"
    code = main(["topo", "import", str(source), "--memory", "80GiB", "--format", "json",
                 "-o", str(target)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    node = load_node_file(target)
    buses = [g.pci_bus_id for g in node.gpus]
    assert len(set(buses)) == 300 and buses[0] == "0000:07:00.0" and buses[-1] == "0001:52:00.0"
    assert len(node.links) == 300 * 299 // 2 and len({g.uuid for g in node.gpus}) == 300


def test_bus_ids_of_up_to_224_gpus_are_as_before() -> None:
    assert [made_up_bus_id(i, 8) for i in (0, 1, 7)] == [
        "0000:07:00.0",
        "0000:23:00.0",
        "0000:cb:00.0",
    ]
    assert made_up_bus_id(223, 224) == "0000:e6:00.0"


def test_made_up_uuids_are_the_same_hashed_once() -> None:
    seed = "|".join(" ".join(r) for r in parse_topo(big_matrix(40), where="t").labels)
    assert made_up_uuids("GPU", seed, 40) == [made_up_uuid("GPU", f"{seed}/{i}") for i in range(40)]


@pytest.mark.parametrize(
    ("flag", "value", "hint"),
    [
        ("--cuda-driver-version", "zz", "check --cuda-driver-version"),
        ("--gpu-name", "x" * 300, "check --gpu-name"),
    ],
)
def test_a_bad_flag_value_is_blamed_on_that_flag(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, hint: str
) -> None:
    code = main(["topo", "import", str(TOPOLOGIES / "dgx-a100.txt"), flag, value])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "the imported node would not load" in err and err.endswith(f"; {hint}\n")


def test_why_a_gpu_of_unknown_memory_has_no_slices() -> None:
    # what `policy explain --slice-mib` and the plugin can say instead of "only 0 are available"
    from cdigen.shares import no_slices_reason, slice_count

    unknown = import_topo(
        TOPOLOGIES / "pcie-8x4090-2socket-allsys.txt", NodeFacts(gpu_name="RTX 4090")
    )
    gpu = unknown.gpus[0]
    assert slice_count(gpu, 1024) == 0
    reason = no_slices_reason(gpu, 1024)
    assert reason is not None and reason.startswith(
        "GPU 0 has memoryBytes: 0 (its memory is unknown"
    )
    known = import_topo(
        TOPOLOGIES / "pcie-8x4090-2socket-allsys.txt", NodeFacts(gpu_name="NVIDIA GeForce RTX 4090")
    )
    assert no_slices_reason(known.gpus[0], 1024) is None
    assert "less than one 32768 MiB slice" in str(no_slices_reason(known.gpus[0], 32768))


def test_explain_and_the_plugin_say_why_a_gpu_has_no_slices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: ``request for 3 devices but only 0 are available`` and nothing in the plugin log."""
    from cdigen.discover import load_node
    from cdigen.plugin.deviceplugin.sharing import Sharing, no_slices_warnings

    node_file = tmp_path / "node.yaml"
    code = main(
        ["topo", "import", str(TOPOLOGIES / "pcie-8x4090-2socket-allsys.txt"),
         "--gpu-name", "RTX 4090", "-o", str(node_file)]
    )  # fmt: skip
    assert code == 0
    capsys.readouterr()
    argv = ["policy", "explain", "--node", str(node_file), "--available", "0,1"]
    code = main([*argv, "--size", "3", "--slice-mib", "1024"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "--available 0 with --slice-mib 1024" in err and "memoryBytes: 0" in err
    warnings = no_slices_warnings(load_node(str(node_file)), Sharing(memory_slice_mib=1024), "r")
    assert len(warnings) == 8 and warnings[0].startswith("r: GPU 0 has memoryBytes: 0")
