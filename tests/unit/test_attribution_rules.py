"""Attribution's rules where no kubelet is needed: names escaped, the limits Allocate sets are the
limits reported, Xid events counted once per GPU, the checkpoint's consumedCapacity checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdigen.discover import load_node
from cdigen.errors import InputError, printable
from cdigen.plugin.agent.attribution import XidCounter
from cdigen.plugin.agent.holdings import printable_name
from cdigen.plugin.agent.podresources import ContainerClaim, ContainerResources
from cdigen.plugin.agent.xid import xid_reason
from cdigen.plugin.deviceplugin.attribution import plugin_holdings
from cdigen.plugin.deviceplugin.resources import shared_resource
from cdigen.plugin.deviceplugin.sharing import Sharing, allocate_shares
from cdigen.plugin.dra.checkpoint import load_checkpoint

NODE = load_node("builtin:pcie-8x4090")
RESOURCE = "nvidia.com/gpu.shared"


def test_printable_escapes_control_characters_and_backslashes() -> None:
    """The one rule for names from outside (cdigen.errors.printable): errors, logs, the pods
    table and /metrics all escape this way, as repr does."""
    assert printable("pod-a") == "pod-a"
    assert printable("a\x1b[2J\nb\\c\u202ed") == "a\\x1b[2J\\nb\\\\c\\u202ed"
    assert printable("\t\r\x00\x7f\x85\u2028") == "\\t\\r\\x00\\x7f\\x85\\u2028"
    # nothing printable changes: other scripts, accents and emoji print as they are
    for name in ("nœud-é", "ノード", "gpu-😀", "a b", "'quoted'"):
        assert printable(name) == name == printable_name(name)
    for hostile in ("a\nb", "\x1b[31m", "x\\y", "\u202eabc"):
        assert printable_name(hostile) == printable(hostile) == repr(hostile)[1:-1]


def test_a_name_is_cut_to_the_kubernetes_limit_never_inside_an_escape() -> None:
    assert printable_name("x" * 253) == "x" * 253
    assert printable_name("x" * 300) == "x" * 250 + "..."
    cut = printable_name("\n" * 300)
    assert len(cut) == 253 and cut == "\\n" * 125 + "..."
    # \x00 is four characters: two fit in 13 with "...", one in 12 (no half escape)
    assert printable("ab" + "\x00" * 10, 13) == "ab\\x00\\x00..."
    assert printable("ab" + "\x00" * 10, 12) == "ab\\x00..."


@pytest.mark.parametrize(
    "sharing",
    [
        Sharing(replicas=3, mps_pipe_directory="/run/nvidia/mps"),
        Sharing(memory_slice_mib=2048),
        Sharing(replicas=4),
    ],
    ids=["replicas-mps", "slices", "replicas-time-slicing"],
)
def test_the_limit_reported_is_the_one_allocate_sets(sharing: Sharing) -> None:
    resource = shared_resource(NODE, RESOURCE, sharing, "nvidia.com/gpu")
    on_gpu_2 = [d.id for d in resource.devices if d.entry.gpu.index == 2][:2]
    given = allocate_shares(on_gpu_2, NODE, sharing, cdi_kind="nvidia.com/gpu", resource=RESOURCE)
    container = ContainerResources("ns", "pod", "main", ((RESOURCE, tuple(on_gpu_2)),))
    (row,) = plugin_holdings([container], [resource])
    assert (row.gpu_index, row.kind, row.devices) == (2, sharing.kind, tuple(on_gpu_2))
    env = given.env_dict().get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
    if env is None:  # plain time-slicing: nothing limits the memory
        assert row.memory_limit_bytes is None
    else:
        assert env == f"0={row.memory_limit_bytes // (1 << 20)}M"  # type: ignore[operator]


def test_ids_of_other_resources_and_unknown_ids_are_left_out() -> None:
    resource = shared_resource(NODE, RESOURCE, Sharing(replicas=2), "nvidia.com/gpu")
    container = ContainerResources(
        "ns", "pod", "main", (("example.com/fpga", ("f0",)), (RESOURCE, ("GPU-gone::0",)))
    )
    assert plugin_holdings([container], [resource]) == []


def test_an_xid_counts_once_per_gpu_however_many_devices_carry_it() -> None:
    counter = XidCounter()
    gpu_of = {"gpu-0::0": "GPU-0", "gpu-0::1": "GPU-0", "gpu-1": "GPU-1"}
    quiet: dict[str, tuple[str, ...]] = {d: () for d in gpu_of}
    counter.update(quiet, gpu_of)
    reason = xid_reason(79)
    counter.update({**quiet, "gpu-0::0": (reason,), "gpu-0::1": (reason,)}, gpu_of)
    counter.update({**quiet, "gpu-0::0": (reason,), "gpu-0::1": (reason,)}, gpu_of)  # same
    assert counter.counts() == ({"GPU-0": 1}, {"GPU-0": 79})
    counter.update({**quiet, "gpu-0::0": (xid_reason(48),), "gpu-0::1": (xid_reason(48),)}, gpu_of)
    counter.update(quiet, gpu_of)  # recovered
    counter.update({**quiet, "gpu-1": ("no CDI name",)}, gpu_of)  # not an Xid
    counter.update({**quiet, "gpu-0::1": (reason,)}, gpu_of)  # back again: a new event
    assert counter.counts() == ({"GPU-0": 3}, {"GPU-0": 79})


def test_the_checkpoint_refuses_a_consumed_capacity_that_is_not_quantities(
    tmp_path: Path,
) -> None:
    device = {
        "requestNames": ["gpu"],
        "poolName": "node-a",
        "deviceName": "gpu-0",
        "cdiDeviceIds": [],
        "shareId": None,
        "consumedCapacity": {"memory": 3},
    }
    claim = {
        "namespace": "default",
        "name": "a",
        "devices": [device],
        "shareable": {"gpu-0": True},
        "specPath": "",
    }
    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps({"version": 1, "claims": {"uid-a": claim}}))
    with pytest.raises(
        InputError, match=r"devices\[0\]\.consumedCapacity\.'memory': a number, not a quantity"
    ):
        load_checkpoint(path, spec_dir=tmp_path, driver="gpu.cdigen.dev")
    device["consumedCapacity"] = {"memory": "3Gi"}
    path.write_text(json.dumps({"version": 1, "claims": {"uid-a": claim}}))
    loaded = load_checkpoint(path, spec_dir=tmp_path, driver="gpu.cdigen.dev")
    assert loaded.claims["uid-a"]["devices"][0].get("consumedCapacity") == {"memory": "3Gi"}


def test_mig_devices_on_both_wings_are_given_their_own_memory() -> None:
    from cdigen.catalogue import catalogue
    from cdigen.plugin.deviceplugin.resources import plan_resources
    from cdigen.plugin.dra.attribution import dra_holdings

    node = load_node("builtin:dgx-a100-mig-mixed")
    resources = plan_resources(
        node, "mixed", gpu_resource="nvidia.com/gpu", cdi_kind="nvidia.com/gpu"
    )
    mig = next(r for r in resources if r.mig_profile is not None)
    device = mig.devices[0]
    assert device.entry.mig is not None
    container = ContainerResources("ns", "pod", "main", ((mig.name, (device.id,)),))
    (row,) = plugin_holdings([container], resources)
    assert (row.kind, row.memory_limit_bytes) == ("mig", device.entry.mig.memory_bytes)
    assert row.gpu_uuid == device.entry.gpu.uuid and row.devices == (device.id,)
    assert row.shown == (device.entry.dra_name,)

    entries = {e.dra_name: e for e in catalogue(node, mig_strategy="mixed")}
    claim = {
        "namespace": "ns",
        "name": "c",
        "devices": [
            {
                "requestNames": ["gpu"],
                "poolName": "node-a",
                "deviceName": device.entry.dra_name,
                "cdiDeviceIds": [],
                "shareId": None,
            }
        ],
        "shareable": {},
        "specPath": "",
    }
    uses = ContainerResources("ns", "pod", "main", claims=(ContainerClaim("ns", "c"),))
    (row,) = dra_holdings([uses], {"uid-c": claim}, entries)  # type: ignore[dict-item]
    assert (row.kind, row.source, row.allocation) == ("mig", "ns/c", "uid-c")
    assert row.memory_limit_bytes == device.entry.mig.memory_bytes


def test_the_dashboard_is_one_grafana_can_import() -> None:
    """Unique panel IDs and refIds, the data source asked for, panels inside the 24-column grid
    without overlapping, and every series it reads one the plugins export."""
    path = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "cdigen-dashboard.json"
    doc = json.loads(path.read_text())
    assert doc["uid"] == "cdigen-gpus" and doc["schemaVersion"] >= 36
    names = [v["name"] for v in doc["templating"]["list"]]
    assert names == ["datasource", "instance"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in doc["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
    import re

    read = {
        m
        for p in doc["panels"]
        for t in p.get("targets", [])
        for m in re.findall(r"\b(cdigen_[a-z0-9_]+)", t["expr"])
    }
    exported = set()
    for module in (
        "plugin/deviceplugin/metrics.py",
        "plugin/dra/metrics.py",
        "plugin/agent/attribution.py",
    ):
        text = (path.parents[2] / module).read_text()
        exported |= set(re.findall(r'"(cdigen_[a-z0-9_]+)"', text))
    suffixes = ("_total", "_bucket")
    missing = {
        m
        for m in read
        if m not in exported
        and not any(m.endswith(s) and m.removesuffix(s) in exported for s in suffixes)
    }
    assert not missing, missing
