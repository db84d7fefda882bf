"""The device status of prepared claims (KEP-4817): written after prepare, cleared at unprepare,
never a claim's error. The in-process plugin, the kubelet DRA simulator and the fake API server,
which applies status the way the API server's server-side apply does for one field manager."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.cdihost import FakeHost, build_host, make_node
from tests.helpers.dra import (
    DRIVER,
    NODE_NAME,
    PLUGIN_TOKEN,
    Harness,
    plugin_identity,
    shipped_rbac,
)


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


def test_the_shipped_role_is_enough_for_the_status_on_a_1_36_server(harness: Harness) -> None:
    """The harness's plugin talks with its pod's node-bound ServiceAccount token, authorized by
    deploy/dra/rbac.yaml, and the fake applies 1.36's resourceclaims/driver check."""
    plugin = harness.start()
    ref = harness.claim("ok", "uid-ok", "gpu-1")
    assert harness.kubelet.prepare([ref]).claims["uid-ok"].error == ""
    assert plugin.status is not None and plugin.status.wait_idle(5)
    (entry,) = harness.api.claims[("default", "ok")]["status"]["devices"]
    assert (entry["driver"], entry["device"]) == (DRIVER, "gpu-1")


def _without_driver_grant(harness: Harness) -> None:
    rbac = shipped_rbac()
    for obj in rbac:
        if obj["kind"] == "ClusterRole":
            obj["rules"] = [
                r for r in obj["rules"] if "resourceclaims/driver" not in r["resources"]
            ]
    harness.api.authorize(rbac)


def test_without_the_driver_grant_the_server_refuses_and_the_warning_names_it(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    _without_driver_grant(harness)
    plugin = harness.start()
    ref = harness.claim("no", "uid-no", "gpu-1")
    with caplog.at_level(logging.WARNING):
        assert harness.kubelet.prepare([ref]).claims["uid-no"].error == ""
        assert plugin.status is not None and plugin.status.wait_idle(5)
    assert "devices" not in harness.api.claims[("default", "no")]["status"]
    (said,) = [r.getMessage() for r in caplog.records if "device status" in r.getMessage()]
    assert "422" in said and "associated-node:patch on resourceclaims/driver" in said
    assert f"[{DRIVER}]" in said


def test_a_token_outside_a_pod_needs_the_arbitrary_node_verb(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """A process with a token not bound to a node (a kubeconfig outside a pod) is asked for
    ``arbitrary-node:patch``, as a real 1.36 server answered."""
    harness.api.identify(PLUGIN_TOKEN, plugin_identity(shipped_rbac(), node=None))
    plugin = harness.start()
    ref = harness.claim("out", "uid-out", "gpu-1")
    with caplog.at_level(logging.WARNING):
        assert harness.kubelet.prepare([ref]).claims["uid-out"].error == ""
        assert plugin.status is not None and plugin.status.wait_idle(5)
    assert "devices" not in harness.api.claims[("default", "out")]["status"]
    (said,) = [r.getMessage() for r in caplog.records if "device status" in r.getMessage()]
    assert 'verb="[arbitrary-node:patch]"' in said


def test_a_claim_re_created_before_the_status_write_is_left_alone(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = harness.start()
    ref = harness.claim("again", "uid-old", "gpu-0")
    harness.api.hang.add("claimstatus")  # the write waits until the claim was replaced
    with caplog.at_level(logging.DEBUG, logger="cdigen.plugin.dra.status"):
        assert harness.kubelet.prepare([ref]).claims["uid-old"].error == ""
        harness.claim("again", "uid-new", "gpu-1")  # deleted and re-created under the name
        harness.api.release.set()
        assert plugin.status is not None and plugin.status.wait_idle(5)
    new = harness.api.claims[("default", "again")]
    assert new["metadata"]["uid"] == "uid-new" and "devices" not in new["status"]
    said = [r for r in caplog.records if "device status" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.DEBUG]
    assert "uid-old" in said[0].getMessage() and "replaced" in said[0].getMessage()


def test_a_claim_gone_before_the_status_write_is_one_debug_line(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = harness.start()
    ref = harness.claim("gone", "uid-gone", "gpu-0")
    harness.api.hang.add("claimstatus")
    with caplog.at_level(logging.DEBUG, logger="cdigen.plugin.dra.status"):
        assert harness.kubelet.prepare([ref]).claims["uid-gone"].error == ""
        del harness.api.claims[("default", "gone")]
        harness.api.release.set()
        assert plugin.status is not None and plugin.status.wait_idle(5)
    said = [r for r in caplog.records if "device status" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.DEBUG] and "gone" in said[0].getMessage()
