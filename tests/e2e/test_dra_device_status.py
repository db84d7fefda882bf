"""The device status of prepared claims (KEP-4817): written after prepare, cleared at unprepare,
never a claim's error. The in-process plugin, the kubelet DRA simulator and the fake API server,
which applies status the way the API server's server-side apply does for one field manager."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.cdihost import FakeHost, build_host, make_node
from tests.helpers.dra import DRIVER, NODE_NAME, Harness


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path / "host", make_node(3, mig_gpu=2))


def test_a_prepared_claim_says_what_it_got_and_unprepare_clears_it(harness: Harness) -> None:
    plugin = harness.start()
    ref = harness.claim("train", "uid-1", "gpu-0", "gpu-2-mig-8-0")
    other = {"driver": "net.example.com", "pool": "p", "device": "nic-0", "data": {}}
    harness.api.claims[("default", "train")]["status"]["devices"] = [other]  # another driver's
    assert harness.kubelet.prepare([ref]).claims["uid-1"].error == ""
    assert plugin.status is not None and plugin.status.wait_idle(5)
    devices = harness.api.claims[("default", "train")]["status"]["devices"]
    ours = {d["device"]: d for d in devices if d["driver"] == DRIVER}
    assert set(ours) == {"gpu-0", "gpu-2-mig-8-0"}
    gpu0 = next(g for g in plugin.node.gpus if g.index == 0)
    entry = ours["gpu-0"]
    assert entry["pool"] == NODE_NAME
    assert entry["data"]["uuid"] == gpu0.uuid and entry["data"]["pciBusId"] == gpu0.pci_bus_id
    assert entry["data"]["cdiDeviceIds"] == [f"k8s.{DRIVER}/claim=uid-1-gpu-0"]
    assert [(c["type"], c["status"]) for c in entry["conditions"]] == [("Ready", "True")]
    assert ours["gpu-2-mig-8-0"]["data"]["uuid"].startswith("MIG-")
    assert other in devices

    assert harness.kubelet.unprepare([ref]).claims["uid-1"].error == ""
    assert plugin.status.wait_idle(5)
    assert harness.api.claims[("default", "train")]["status"]["devices"] == [other]


def test_a_server_that_refuses_status_is_one_warning_and_claims_are_prepared(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = harness.start()
    harness.api.fail["claimstatus"] = 403
    refs = [harness.claim(f"c{n}", f"uid-{n}", f"gpu-{n}") for n in range(2)]
    with caplog.at_level(logging.WARNING):
        answer = harness.kubelet.prepare(refs)
        assert all(answer.claims[f"uid-{n}"].error == "" for n in range(2))
        assert plugin.status is not None and plugin.status.wait_idle(5)
    said = [r.getMessage() for r in caplog.records if "device status" in r.getMessage()]
    assert len(said) == 1 and "403" in said[0] and "resourceclaims/status" in said[0]
