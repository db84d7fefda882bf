"""The built-in samples: present, loadable, and faithful to the reference topologies."""

from __future__ import annotations

import re

import pytest

from cdigen.discover import load_node
from cdigen.discover.builtin import names
from cdigen.discover.render import label_matrix
from cdigen.errors import InputError
from tests.fixtures.make_samples import SAMPLES, all_samples, mig_cap_minors
from tests.fixtures.reference import TOPOLOGIES, reference_rows

REQUIRED = {
    "rtx4090", "dgx1-v100", "dgx1-p100", "dgx-a100", "dgx-h100", "dgx2-v100", "pcie-8x4090",
    "pcie-8x4090-allsys", "pcie-8gpu-phb", "ws-4xv100", "ws-4xrtx8000", "dgx-a100-mig-mixed",
    "h100-mig-single",
}  # fmt: skip
UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def test_every_required_sample_ships() -> None:
    assert set(names()) >= REQUIRED


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_sample_matches_its_reference_topology(name: str) -> None:
    node = load_node(f"builtin:{name}")
    labels, numa = reference_rows(TOPOLOGIES / str(SAMPLES[name]["file"]))
    same_numa = SAMPLES[name].get("same_numa")
    if same_numa:  # the reference's PCIe pairs on one NUMA node, at the sample's level
        labels = [
            [same_numa if k == "SYS" and numa[i] == numa[j] else k for j, k in enumerate(row)]
            for i, row in enumerate(labels)
        ]
    assert label_matrix(node) == labels
    for index, value in numa.items():
        assert node.gpus[index].numa_node == int(value)


def test_dgx_a100_acceptance() -> None:
    node = load_node("builtin:dgx-a100")
    assert [g.numa_node for g in node.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert len(node.links) == 28
    assert all(k.nvlinks == 12 for k in node.links)
    assert {g.name for g in node.gpus} == {"NVIDIA A100-SXM4-80GB"}


def test_hidden_pcie_levels_from_the_reference_notes() -> None:
    v100 = load_node("builtin:dgx1-v100")
    assert (v100.link(0, 1).pcie, v100.link(0, 1).nvlinks) == ("PIX", 1)  # type: ignore[union-attr]
    assert (v100.link(0, 3).pcie, v100.link(0, 3).nvlinks) == ("PHB", 2)  # type: ignore[union-attr]
    assert (v100.link(0, 4).pcie, v100.link(0, 4).nvlinks) == ("SYS", 2)  # type: ignore[union-attr]
    assert load_node("builtin:dgx1-p100").link(0, 2).pcie == "PIX"  # type: ignore[union-attr]
    assert load_node("builtin:dgx-h100").link(0, 1).pcie is None  # type: ignore[union-attr]


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_samples_are_well_formed(name: str) -> None:
    node = load_node(f"builtin:{name}")
    assert node.name == name
    assert all(UUID.match(g.uuid) for g in node.gpus)
    assert [g.index for g in node.gpus] == list(range(len(node.gpus)))
    assert node.driver_version and node.cuda_driver_version
    assert all(g.memory_bytes > 10 * 2**30 and g.architecture for g in node.gpus)


def test_rtx4090_is_one_24gb_card() -> None:
    (gpu,) = load_node("builtin:rtx4090").gpus
    assert gpu.name == "NVIDIA GeForce RTX 4090"
    assert 23 * 2**30 < gpu.memory_bytes <= 24 * 2**30


def test_mig_samples() -> None:
    mixed = load_node("builtin:dgx-a100-mig-mixed")
    assert [g.mig_enabled for g in mixed.gpus] == [True] * 4 + [False] * 4
    assert [m.profile for m in mixed.gpus[0].mig_devices] == [
        "3g.40gb",
        "2g.20gb",
        "1g.10gb",
        "1g.10gb",
    ]
    assert len(mixed.gpus[1].mig_devices) == 7
    single = load_node("builtin:h100-mig-single")
    assert all(len(g.mig_devices) == 7 for g in single.gpus)
    assert {m.profile for g in single.gpus for m in g.mig_devices} == {"1g.10gb"}
    for gpu in single.gpus:
        for mig in gpu.mig_devices:
            assert mig.cap_minors == mig_cap_minors(gpu.minor, mig.gi_id, mig.ci_id)
    uuids = [m.uuid for g in single.gpus for m in g.mig_devices]
    assert len(set(uuids)) == len(uuids) == 56


def test_committed_samples_are_what_the_generator_makes() -> None:
    for name, node in all_samples(TOPOLOGIES).items():
        assert load_node(f"builtin:{name}") == node, name


def test_unknown_sample_lists_the_known_ones() -> None:
    with pytest.raises(InputError, match=r"builtin:dgx-9000: no built-in sample .*rtx4090"):
        load_node("builtin:dgx-9000")


def test_pcie_8x4090_pairs_on_one_socket_are_node_and_the_recorded_node_is_kept() -> None:
    # issue 26: every pair was SYS, GPUs on the same NUMA node too
    node = load_node("builtin:pcie-8x4090")
    for link in node.links:
        same = node.gpus[link.a].numa_node == node.gpus[link.b].numa_node
        assert link.pcie == ("NODE" if same else "SYS"), link
    # go-gpuallocator's answers (shared/reference/go-gpuallocator/pcie-8x4090.jsonl) were
    # recorded on the node as captured, every pair SYS: it stays, under its own name
    recorded = load_node("builtin:pcie-8x4090-allsys")
    assert {k.pcie for k in recorded.links} == {"SYS"} and len(recorded.links) == 28
    assert [g.numa_node for g in recorded.gpus] == [g.numa_node for g in node.gpus]
