"""A node that still advertises the device plugin's ``nvidia.com/gpu`` after moving to DRA
(issue 35, point 2): ``dra why`` says so for a pod asking for it, with the command that removes
it; ``dra serve`` says so at start (tests/e2e/test_dra_migration.py runs the process)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdigen.cli import main
from cdigen.discover import load_node
from cdigen.plugin.agent.kubeapi import api_client
from cdigen.plugin.dra.kube import KubeApi
from cdigen.plugin.dra.slice_publisher import SlicePublisher
from cdigen.plugin.dra.stale import removal_command, served_resources, stale_resources
from cdigen.policies.device_view import device_views
from tests.fake_apiserver import FakeApiServer
from tests.helpers.deploy import extended_resource_classes, node_advertising

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "gpu.cdigen.dev"


def seed_pod(node_name: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        ]
    }
    if node_name:
        spec["nodeName"] = node_name
    phase = "Running" if node_name else "Pending"
    return {"metadata": {"name": "seed", "namespace": "default"}, "spec": spec,
            "status": {"phase": phase}}  # fmt: skip


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    for doc in extended_resource_classes():
        server.add_class(doc)
    kube = KubeApi(api_client(str(server.kubeconfig(tmp_path / "kubeconfig"))))
    views = device_views(load_node("builtin:rtx4090"))
    for name in ("node-a", "node-b"):
        SlicePublisher(kube, driver=DRIVER, node_name=name).publish(views)
    yield server
    server.stop()


def why(capsys: pytest.CaptureFixture[str], api: FakeApiServer, tmp_path: Path) -> list[str]:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    code = main(["dra", "why", "seed", "--kubeconfig", str(kubeconfig)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out.splitlines()


def test_dra_why_names_the_stale_resource_and_the_command_that_removes_it(
    capsys: pytest.CaptureFixture[str], api: FakeApiServer, tmp_path: Path
) -> None:
    api.nodes["node-a"] = node_advertising("node-a", "1")
    api.add_pod(seed_pod("node-a"))
    lines = why(capsys, api, tmp_path)
    (line,) = [x for x in lines if "still advertises" in x]
    assert line.startswith(
        "node node-a still advertises nvidia.com/gpu: 1 (DeviceClass gpu.cdigen.dev serves it) "
        "in its status, left by a device plugin"
    )
    assert (
        "kubectl patch node node-a --subresource=status --type=json -p "
        '\'[{"op":"remove","path":"/status/capacity/nvidia.com~1gpu"},'
        '{"op":"remove","path":"/status/allocatable/nvidia.com~1gpu"}]\''
    ) in line


def test_dra_why_is_quiet_when_the_node_no_longer_advertises_it(
    capsys: pytest.CaptureFixture[str], api: FakeApiServer, tmp_path: Path
) -> None:
    for gpus in (None, "0"):  # gone, or at 0 (the kubelet's mark of a plugin it lost)
        api.nodes["node-a"] = node_advertising("node-a", gpus)
        api.add_pod(seed_pod("node-a"))
        assert not any("still advertises" in x for x in why(capsys, api, tmp_path))


def test_dra_why_looks_at_the_nodes_with_slices_for_a_pod_not_scheduled(
    capsys: pytest.CaptureFixture[str], api: FakeApiServer, tmp_path: Path
) -> None:
    api.nodes["node-a"] = node_advertising("node-a", None)
    api.nodes["node-b"] = node_advertising("node-b", "2")
    api.add_pod(seed_pod(None))
    lines = [x for x in why(capsys, api, tmp_path) if "still advertises" in x]
    assert len(lines) == 1 and lines[0].startswith("node node-b still advertises nvidia.com/gpu: 2")


def test_the_patch_removes_exactly_the_stale_resource() -> None:
    """The command's JSON pointers, applied as RFC 6902/6901 read them (``~1`` is ``/``)."""
    doc = node_advertising("node-a", "1")
    command = removal_command("node-a", ["nvidia.com/gpu"])
    patch = json.loads(command.split(" -p ", 1)[1].strip("'"))
    for op in patch:
        assert op["op"] == "remove"
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = doc
        for part in parts[:-1]:
            target = target[part]
        del target[parts[-1]]
    assert doc["status"] == {"capacity": {"cpu": "8"}, "allocatable": {"cpu": "8"}}


def test_only_classes_of_this_driver_count() -> None:
    classes = [
        *extended_resource_classes(),
        {"metadata": {"name": "other"},
         "spec": {"extendedResourceName": "example.com/fpga",
                  "selectors": [{"cel": {"expression": 'device.driver == "fpga.example.com"'}}]}},
    ]  # fmt: skip
    served = served_resources(classes, DRIVER)
    assert served["nvidia.com/gpu"] == "gpu.cdigen.dev" and "example.com/fpga" not in served
    assert served["nvidia.com/mig-1g.10gb"] == "mig-1g.10gb.gpu.cdigen.dev"
    found = stale_resources(node_advertising("n", "1"), {"example.com/fpga": "other"})
    assert found == []


def test_a_hostile_name_stays_one_escaped_line() -> None:
    from cdigen.plugin.dra.stale import stale_line

    doc = node_advertising("node-a\nFAKE: injected", "1\x1b[31m")
    (found,) = stale_resources(doc, {"nvidia.com/gpu": "gpu.cdigen.dev"})
    line = stale_line([found])
    assert "\n" not in line and "\x1b" not in line
    # escaped as every name from outside is (cdigen.errors.printable), not quoted
    assert "node node-a\\nFAKE: injected still advertises" in line
    assert "nvidia.com/gpu: 1\\x1b[31m (DeviceClass" in line


def test_a_unicode_name_prints_as_it_is_and_a_long_one_is_cut() -> None:
    from cdigen.plugin.dra.stale import stale_line

    doc = node_advertising("nœud-é", "1")
    (found,) = stale_resources(doc, {"nvidia.com/gpu": "gpu.cdigen.dev"})
    assert "node nœud-é still advertises" in stale_line([found])
    doc = node_advertising("n" * 1000 + "\x07", "1")
    (found,) = stale_resources(doc, {"nvidia.com/gpu": "gpu.cdigen.dev"})
    assert f"node {'n' * 250}... still advertises" in stale_line([found])
