"""``--mig-strategy dynamic`` slices (KEP-4815): counters per MIG GPU, a device per placement,
in the layout each Kubernetes version takes; checked by tests/helpers/slice_rules.py."""

from __future__ import annotations

from typing import Any

import pytest

from cdigen.discover import load_node
from cdigen.mig_profiles import mig_geometry
from cdigen.plugin.dra.counters import build_counter_slices
from cdigen.policies.device_view import device_views
from cdigen.policies.dra.order import ordered_views
from tests.cdihost import make_node
from tests.helpers.slice_rules import pool_problems, validate_pool

DRIVER = "gpu.cdigen.dev"


def _slices(node_source: Any, minor: int, **extra: Any) -> list[dict[str, Any]]:
    node = load_node(node_source) if isinstance(node_source, str) else node_source
    views = ordered_views(device_views(node, mig_strategy="dynamic"), node)
    return build_counter_slices(
        views, driver=DRIVER, node_name="node-a", generation=1, server_minor=minor, **extra
    )


def _devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices") or []]


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
@pytest.mark.parametrize(
    ("node", "mig_gpus"), [("builtin:dgx-a100-mig-mixed", 4), ("builtin:h100-mig-single", 8)]
)
def test_dynamic_slices_validate_strictly_in_each_versions_layout(
    node: str, mig_gpus: int, version: str
) -> None:
    slices = _slices(node, int(version.split(".")[1]))
    validate_pool(slices, version)
    devices = _devices(slices)
    placements = [d for d in devices if d.get("consumesCounters")]
    assert len(placements) == mig_gpus * 18  # 18 placements per MIG GPU
    assert len(devices) == len(placements) + 8 - mig_gpus  # the others as whole GPUs


def test_1_34_puts_each_gpus_counters_beside_its_placements() -> None:
    slices = _slices("builtin:h100-mig-single", 34)
    assert len(slices) == 8
    for body in slices:
        ((counter_set,),) = [body["spec"]["sharedCounters"]]
        used = {c["counterSet"] for d in body["spec"]["devices"] for c in d["consumesCounters"]}
        assert used == {counter_set["name"]}
    # the same slices are refused by 1.35: counters and devices in one slice
    assert any("only one of" in p for p in pool_problems(slices, 35))


def test_1_35_puts_the_counters_in_slices_of_their_own() -> None:
    slices = _slices("builtin:h100-mig-single", 35)
    counter_slices = [s for s in slices if "sharedCounters" in s["spec"]]
    assert [len(s["spec"]["sharedCounters"]) for s in counter_slices] == [8]
    assert all("devices" not in s["spec"] for s in counter_slices)
    assert [len(s["spec"]["devices"]) for s in slices[1:]] == [64, 64, 16]  # 144 placements
    # the same slices are refused by 1.34: devices consume from a set outside their slice
    assert any("is not defined" in p for p in pool_problems(slices, 34))


def test_a_placement_consumes_its_memory_slices_and_compute() -> None:
    node = make_node(1, mig_gpu=0)
    devices = {d["name"]: d for d in _devices(_slices(node, 36))}
    three_g = devices["gpu-0-3g-40gb-at-4"]
    assert three_g["attributes"]["profile"] == {"string": "3g.40gb"}
    assert three_g["attributes"]["type"] == {"string": "mig"}
    assert "uuid" not in three_g["attributes"]  # no MIG device yet
    (consumed,) = three_g["consumesCounters"]
    assert consumed["counterSet"] == "gpu-0-mig"
    assert consumed["counters"] == {
        "memory": {"value": "40192Mi"},
        "compute-slices": {"value": "3"},
        **{f"memory-slice-{n}": {"value": "1"} for n in (4, 5, 6, 7)},
    }


def test_overlapping_placements_cannot_both_fit_the_counters() -> None:
    geometry = mig_geometry("NVIDIA A100-SXM4-80GB")
    assert geometry is not None
    by_name = {f"{p.profile.name}@{p.start}": set(p.memory_slices) for p in geometry.placements()}
    assert by_name["3g.40gb@4"] & by_name["1g.10gb@5"]
    assert not by_name["3g.40gb@0"] & by_name["3g.40gb@4"]
    assert len(by_name) == 18


def test_whole_gpus_stay_plain_devices_and_taints_keep_the_limit() -> None:
    node = make_node(3, mig_gpu=2)
    taints = {"gpu-0": [{"key": f"{DRIVER}/xid", "value": "79", "effect": "NoSchedule"}]}
    for minor in (34, 35, 36, 37):
        slices = _slices(node, minor, taints=taints)
        validate_pool(slices, f"1.{minor}")
        devices = {d["name"]: d for d in _devices(slices)}
        assert "consumesCounters" not in devices["gpu-0"]
        assert devices["gpu-0"]["taints"][0]["value"] == "79"
        assert "gpu-2" not in devices and "gpu-2-7g-80gb-at-0" in devices


def test_a_gpu_cdigen_cannot_partition_keeps_its_mig_devices() -> None:
    from dataclasses import replace

    node = make_node(1, mig_gpu=0)
    node = replace(node, gpus=(replace(node.gpus[0], name="NVIDIA A30"),))
    names = [v.name for v in device_views(node, mig_strategy="dynamic")]
    assert names == ["gpu-0-mig-7-0", "gpu-0-mig-8-0"]


def test_the_shipped_mig_classes_select_placements_and_a_first_fit_fills_from_the_top(
    tmp_path: Any,
) -> None:
    """The DeviceClasses of deploy/dra match placement devices (type and profile are there),
    and the scheduler's first fit meets each profile's highest placement first."""
    from pathlib import Path

    from cdigen.policies.dra.claim_docs import load_manifests
    from cdigen.policies.dra.claims import FirstFit, NodeState
    from cdigen.policies.dra.slice_devices import slice_devices

    claim = tmp_path / "claim.yaml"
    claim.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c}\n"
        "spec:\n  devices:\n    requests:\n    - name: mig\n      exactly:\n"
        "        deviceClassName: mig-1g.10gb.gpu.cdigen.dev\n"
    )
    classes = Path(__file__).resolve().parents[2] / "deploy" / "dra" / "deviceclasses.yaml"
    claims, shipped = load_manifests([claim, classes])
    for minor in (34, 36):
        fit = FirstFit(slice_devices(_slices(make_node(1, mig_gpu=0), minor)), shipped)
        allocation, _ = fit.explain(claims[0], NodeState())
        assert allocation.error == "" and allocation.devices == ("gpu-0-1g-10gb-at-6",)


@pytest.mark.parametrize("doc", ["docs/dra.md", "docs/mig.md"])
def test_the_docs_console_sample_for_dynamic_is_what_users_get(
    doc: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import shlex
    from pathlib import Path

    from cdigen.cli import main

    text = (Path(__file__).resolve().parents[2] / doc).read_text()
    command = (
        "$ cdigen dra serve --node builtin:dgx-a100-mig-mixed --node-name n --mig-strategy dynamic"
    )
    after = text.split(command + "\n", 1)[1]
    shown = after.split("\n```", 1)[0]
    assert main(shlex.split(command)[2:]) == 2
    assert capsys.readouterr().err.strip() == shown.strip()


def _a30() -> tuple[Any, Any]:
    """A node with one A30 in MIG mode (a model cdigen's table lacks), and its geometry."""
    from dataclasses import replace

    from cdigen.mig_profiles import MigGeometry, MigProfile

    geometry = MigGeometry(
        4,
        4,
        (
            MigProfile("1g.6gb", 0, 0, 1, 1, 5836, (0, 1, 2, 3)),
            MigProfile("2g.12gb", 1, 1, 2, 2, 11672, (0, 2)),
            MigProfile("4g.24gb", 3, 3, 4, 4, 23344, (0,)),
        ),
    )
    node = make_node(1, mig_gpu=0)
    gpu = replace(node.gpus[0], name="NVIDIA A30", memory_bytes=24 << 30, mig_devices=())
    return replace(node, gpus=(gpu,)), geometry


def test_nvml_tells_how_a_gpu_partitions_where_cdigens_table_does_not_know_it(
    tmp_path: Any,
) -> None:
    from cdigen.plugin.dra.dynamic_mig import MigMaker
    from tests.fakes.fake_mig import MigNvml

    node, a30 = _a30()
    nvml = MigNvml(node, geometries={"NVIDIA A30": a30})
    nvml.nvmlInit()
    nvml.write_mig_minors(tmp_path)
    maker = MigMaker(nvml, tmp_path)
    geometries = maker.geometries(node.gpus)
    assert geometries == {node.gpus[0].uuid: a30}
    views = device_views(node, mig_strategy="dynamic", geometries=geometries)
    assert [v.name for v in views] == [
        "gpu-0-1g-6gb-at-3", "gpu-0-1g-6gb-at-2", "gpu-0-1g-6gb-at-1", "gpu-0-1g-6gb-at-0",
        "gpu-0-2g-12gb-at-2", "gpu-0-2g-12gb-at-0", "gpu-0-4g-24gb-at-0",
    ]  # fmt: skip
    for minor in (34, 35, 36, 37):
        slices = build_counter_slices(
            views, driver=DRIVER, node_name="n", generation=1, server_minor=minor
        )
        validate_pool(slices, f"1.{minor}")
        (counters,) = [c for s in slices for c in s["spec"].get("sharedCounters") or []]
        assert set(counters["counters"]) == {
            "memory", "compute-slices", *(f"memory-slice-{n}" for n in range(4))
        }  # fmt: skip
        assert counters["counters"]["compute-slices"] == {"value": "4"}
    made = maker.create(views[4])  # 2g.12gb at 2
    assert made.mig.profile == "2g.12gb" and nvml.node.gpus[0].mig_devices == (made.mig,)
    assert maker.destroy(made.doc) == "" and nvml.instances == {}


def test_the_table_read_back_through_nvml_is_the_table(tmp_path: Any) -> None:
    from cdigen.plugin.dra.dynamic_mig import MigMaker
    from tests.fakes.fake_mig import MigNvml

    node = make_node(1, mig_gpu=0)
    nvml = MigNvml(node)
    nvml.nvmlInit()
    (read,) = MigMaker(nvml, tmp_path).geometries(node.gpus).values()
    assert read == mig_geometry(node.gpus[0].name)
