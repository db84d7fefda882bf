"""The device status `cdigen dra serve` writes into prepared claims (KEP-4817, GA in 1.37), as the
fake API server stores it, validated strictly on Kubernetes 1.34-1.37: the whole ResourceClaim,
so that each entry's fields, data and conditions are what every one of those versions takes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cdihost import FakeHost, build_host, make_node
from tests.helpers.dra import DRIVER, Harness


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path / "host", make_node(3, mig_gpu=2))


def _as_sent(claim: dict[str, Any]) -> dict[str, Any]:
    """The claim without the fields the API server alone sets."""
    clean = json.loads(json.dumps(claim))
    for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields", "generation"):
        clean["metadata"].pop(key, None)
    return clean


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_the_device_status_of_a_prepared_claim_validates_strictly(
    harness: Harness, version: str
) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    plugin = harness.start()
    ref = harness.claim("train", "uid-1", "gpu-0", "gpu-2-mig-8-0")
    assert harness.kubelet.prepare([ref]).claims["uid-1"].error == ""
    assert plugin.status is not None and plugin.status.wait_idle(5)
    claim = harness.api.claims[("default", "train")]
    ours = [d for d in claim["status"]["devices"] if d["driver"] == DRIVER]
    assert len(ours) == 2 and all(d["conditions"] for d in ours)
    kubernetes_validate.validate(_as_sent(claim), version, strict=True)
