"""A claim's transient spec is built for the claim (cdigen.plugin.dra.claim_spec), not cut out of a
node spec: each of its devices carries what ``cdigen generate``'s spec gives the same GPU or MIG
device, its common edits are generate's, and its cdiVersion is the lowest its whole content
(MPS edits included) allows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdigen.cdi.spec import SpecOptions, generate
from cdigen.cdi.version import minimum_version
from cdigen.plugin.dra.checkpoint import claim_spec_path
from tests.cdihost import FakeHost, build_host, make_node
from tests.helpers.dra import DRIVER, Harness


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path / "host", make_node(3, mig_gpu=2))


def test_each_claim_device_is_what_generate_gives_that_device(harness: Harness) -> None:
    plugin = harness.start()
    ref = harness.claim("c", "uid-s", "gpu-0", "gpu-2-mig-8-0")
    assert harness.kubelet.prepare([ref]).claims["uid-s"].error == ""
    claim = json.loads(claim_spec_path(harness.cdi_dir, DRIVER, "uid-s").read_text())
    node_spec = generate(
        plugin.node,
        SpecOptions(
            driver_root=str(harness.host.driver_root),
            dev_root=str(harness.host.dev_root),
            sysfs_root=str(harness.host.sysfs_root),
            name_strategies=("uuid",),
            hook_path=None,
        ),
    )
    by_uuid = {d["name"]: d for d in node_spec["devices"]}
    views = {v.name: v for v in plugin.views}
    assert [d["name"] for d in claim["devices"]] == ["uid-s-gpu-0", "uid-s-gpu-2-mig-8-0"]
    for device in claim["devices"]:
        view = views[device["name"].removeprefix("uid-s-")]
        assert device["containerEdits"] == by_uuid[view.uuid]["containerEdits"], view.name
    assert claim["containerEdits"] == node_spec["containerEdits"]
    assert claim["kind"] == f"k8s.{DRIVER}/claim"
    assert claim["cdiVersion"] == minimum_version(claim)
