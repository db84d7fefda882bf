"""The device catalogue: which devices a node offers under each MIG strategy and sharing, and
the names each consumer (spec, device plugin, DRA) takes from one entry."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest

from cdigen.catalogue import CatalogueEntry, catalogue, share_ids, whole_entry
from cdigen.discover import load_node
from cdigen.mig_profiles import mig_geometry
from cdigen.model import Node
from cdigen.plugin.deviceplugin.resources import plan_resources, shared_resource
from cdigen.plugin.deviceplugin.sharing import Sharing
from cdigen.policies.device_view import device_views
from tests.cdihost import build_host, make_node
from tests.cdihost import spec_options as options

MIXED = "builtin:dgx-a100-mig-mixed"  # GPUs 0-3 MIG-enabled with 4, 7, 2, 1 MIG devices
KIND = "nvidia.com/gpu"


def kinds(entries: tuple[CatalogueEntry, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in entries:
        out[e.kind] = out.get(e.kind, 0) + 1
    return out


@dataclass(frozen=True)
class Slices:
    replicas: int | None = None
    memory_slice_mib: int | None = None


@pytest.mark.parametrize(
    ("source", "strategy", "sharing", "expected"),
    [
        ("builtin:dgx1-v100", "mixed", None, {"gpu": 8}),
        ("builtin:dgx1-v100", "none", Slices(replicas=3), {"replica": 24}),
        # 24 GiB in 1 GiB slices; the RTX 4090 has 24564 MiB: 23 whole slices
        ("builtin:rtx4090", "mixed", Slices(memory_slice_mib=1024), {"slice": 23}),
        (MIXED, "mixed", None, {"mig": 14, "gpu": 4}),
        (MIXED, "single", None, {"mig": 14, "gpu": 4}),
        (MIXED, "none", None, {"gpu": 8}),  # MIG-enabled GPUs too: DRA publishes them whole
        (MIXED, "mixed", Slices(replicas=2), {"mig": 14, "replica": 8}),
        (MIXED, "none", Slices(replicas=2), {"gpu": 4, "replica": 8}),
        # 80 GB A100: 8 memory slices; 1g x7 + 1g.20gb x4 + 2g x3 + 3g x2 + 4g + 7g placements
        (MIXED, "dynamic", None, {"mig": 4 * 18, "gpu": 4}),
    ],
)
def test_what_a_node_offers_under_each_strategy_and_sharing(
    source: str, strategy: str, sharing: Slices | None, expected: dict[str, int]
) -> None:
    entries = catalogue(load_node(source), mig_strategy=strategy, sharing=sharing)
    assert kinds(entries) == expected
    assert [e.position for e in entries] == sorted(e.position for e in entries)
    assert len({e.id for e in entries if e.placement is None}) == sum(
        1 for e in entries if e.placement is None
    )


def test_the_a100_table_has_eighteen_placements() -> None:
    geometry = mig_geometry("NVIDIA A100-SXM4-80GB")
    assert geometry is not None and len(geometry.placements()) == 18


def test_mig_places_follow_gi_and_ci_not_discovery_order() -> None:
    node = load_node(MIXED)
    gpu = next(g for g in node.gpus if g.index == 1)
    shuffled = dataclasses.replace(gpu, mig_devices=tuple(reversed(gpu.mig_devices)))
    node = dataclasses.replace(node, gpus=tuple(shuffled if g is gpu else g for g in node.gpus))
    entries = [e for e in catalogue(node) if e.gpu.index == 1]
    assert [e.mig_position for e in entries] == list(range(7))
    keys = [(e.mig.gi_id, e.mig.ci_id) for e in entries if e.mig]
    assert keys == sorted(keys)
    assert [e.cdi_name("index") for e in entries] == [f"1:{k}" for k in range(7)]
    assert [e.cdi_name("type-index") for e in entries] == [f"mig1:{k}" for k in range(7)]
    assert [e.cdi_name("uuid") for e in entries] == [e.mig.uuid for e in entries if e.mig]


def test_one_entry_gives_every_name_and_its_parts() -> None:
    node = load_node(MIXED)
    by_name = {e.dra_name: e for e in catalogue(node)}
    whole = by_name["gpu-5"]
    assert (whole.kind, whole.position, whole.id, whole.uuid) == (
        "gpu",
        5,
        whole.gpu.uuid,
        whole.gpu.uuid,
    )
    assert [whole.cdi_name(s) for s in ("index", "uuid", "type-index")] == [
        "5",
        whole.gpu.uuid,
        "gpu5",
    ]
    assert whole.qualified_cdi_name(KIND, "index") == "nvidia.com/gpu=5"
    mig = next(e for e in by_name.values() if e.mig is not None and e.gpu.index == 2)
    assert mig.dra_name == f"gpu-2-mig-{mig.mig.gi_id}-{mig.mig.ci_id}"  # type: ignore[union-attr]
    assert (mig.kind, mig.id, mig.gpu_uuid, mig.numa_node) == (
        "mig",
        mig.uuid,
        mig.gpu.uuid,
        mig.gpu.numa_node,
    )


def test_shares_carry_kind_number_and_their_gpus_name() -> None:
    node = load_node("builtin:dgx1-v100")
    entries = catalogue(node, sharing=Slices(replicas=2))
    first, second = entries[0], entries[1]
    assert first.share is not None and second.share is not None
    assert (first.share.index, second.share.index) == (0, 1)
    assert (first.id, second.id) == share_ids(first.gpu, Slices(replicas=2))
    assert first.id == f"{first.gpu.uuid}::0" and first.uuid == first.gpu.uuid
    # a share is handed out as its GPU: the same CDI name as the whole GPU
    assert first.cdi_name("uuid") == whole_entry(node, first.gpu).cdi_name("uuid")
    sliced = catalogue(load_node("builtin:rtx4090"), sharing=Slices(memory_slice_mib=1024))
    assert sliced[22].id.endswith("::slice-22") and sliced[22].share.kind == "slice"  # type: ignore[union-attr]


@pytest.mark.parametrize("strategy", ["none", "mixed", "dynamic"])
def test_a_devices_memory_is_what_dra_publishes_and_attribution_counts(strategy: str) -> None:
    """One rule for a device's memory: the MIG device's (or, for a placement, its profile's),
    else the GPU's; DRA's memory capacity and the agent's attribution both read it."""
    node = load_node(MIXED)
    views = device_views(node, mig_strategy=strategy)
    assert views
    for view in views:
        entry = view.entry
        expected = (
            entry.mig.memory_bytes
            if entry.mig is not None
            else entry.placement.profile.memory_bytes
            if entry.placement is not None
            else entry.gpu.memory_bytes
        )
        assert view.capacity["memory"] == entry.memory_bytes == expected, view.name
    seven = (
        next(v for v in views if v.name == "gpu-0-7g-80gb-at-0") if strategy == "dynamic" else None
    )
    assert seven is None or seven.capacity["memory"] < seven.gpu.memory_bytes
    shares = catalogue(node, sharing=Slices(replicas=2))
    assert all(e.memory_bytes == e.gpu.memory_bytes for e in shares if e.share is not None)


def test_dynamic_leaves_out_placements_over_taken_slices() -> None:
    node = load_node(MIXED)
    gpu0 = next(g for g in node.gpus if g.index == 0)
    free = catalogue(node, mig_strategy="dynamic")
    held = catalogue(node, mig_strategy="dynamic", taken={gpu0.uuid: [range(0, 4)]})
    left = [e for e in held if e.gpu.index == 0]
    assert len(left) < len([e for e in free if e.gpu.index == 0])
    assert all(not set(e.placement.memory_slices) & {0, 1, 2, 3} for e in left if e.placement)
    assert {e.dra_name for e in left} >= {"gpu-0-1g-10gb-at-4", "gpu-0-3g-40gb-at-4"}
    assert "gpu-0-7g-80gb-at-0" not in {e.dra_name for e in left}


def test_positions_count_gpus_in_index_order_not_by_index() -> None:
    node = load_node("builtin:dgx1-v100")
    gaps = dataclasses.replace(
        node, gpus=tuple(dataclasses.replace(g, index=g.index * 2) for g in node.gpus)
    )
    entries = catalogue(gaps)
    assert [e.position for e in entries] == list(range(8))
    assert [e.dra_name for e in entries][:2] == ["gpu-0", "gpu-2"]
    last = max(gaps.gpus, key=lambda g: g.index)
    assert whole_entry(gaps, last).position == 7


def test_an_unknown_strategy_is_refused() -> None:
    with pytest.raises(ValueError, match="'partial'"):
        catalogue(load_node("builtin:dgx1-v100"), mig_strategy="partial")


def spec_names(node: Node, tmp_path: Path) -> list[str]:
    from cdigen.cdi.spec import generate

    host = build_host(tmp_path, node)
    spec = generate(host.node, dataclasses.replace(options(host), name_strategies=("uuid",)))
    return [f"{KIND}={d['name']}" for d in spec["devices"] if d["name"] != "all"]


def test_the_spec_names_exactly_what_the_plugin_hands_out_and_dra_publishes(
    tmp_path: Path,
) -> None:
    node = make_node(4, mig_gpu=2)
    planned = plan_resources(node, "mixed", gpu_resource=KIND, cdi_kind=KIND)
    handed_out = [n for r in planned for d in r.devices for n in d.cdi_names]
    assert sorted(handed_out) == sorted(spec_names(node, tmp_path))
    shared = shared_resource(node, "nvidia.com/gpu.shared", Sharing(replicas=2), KIND)
    assert {n for d in shared.devices for n in d.cdi_names} <= set(handed_out)
    published = [v.name for v in device_views(node)]
    assert published == [e.dra_name for e in catalogue(node)]
    assert len(published) == len(handed_out)
