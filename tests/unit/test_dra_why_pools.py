"""`cdigen dra why POD` on a node whose devices come in more than one pool: an allocated claim
holding devices of two of its pools is one claim there, not one per pool."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdigen.cli import main
from cdigen.plugin.agent.kubeapi import api_client
from tests.fake_apiserver import FakeApiServer

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "gpu.cdigen.dev"
POOLS = ("node-a-left", "node-a-right")  # one node, two pools of one GPU each


def _slice(pool: str, device: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{pool}-slice"},
        "spec": {
            "driver": DRIVER,
            "nodeName": "node-a",
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": device, "attributes": {"type": {"string": "gpu"}}}],
        },
    }


def _claim(name: str, count: int, held: dict[str, str] | None = None) -> dict[str, Any]:
    """A claim asking ``count`` whole GPUs; allocated (device -> pool) when ``held`` is given."""
    exactly = {"deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": count}
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"{name}-uid"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}},
    }
    if held is not None:
        results = [
            {"request": "gpus", "driver": DRIVER, "pool": pool, "device": device}
            for device, pool in held.items()
        ]
        claim["status"] = {"allocation": {"devices": {"results": results}}}
    return claim


def _pod(name: str, claim: str, node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
        "containers": [{"name": "main", "image": "cuda"}],
    }
    if node:
        spec["nodeName"] = node
    status = {"phase": "Running" if node else "Pending"}
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec, "status": status}


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    """node-a's GPUs in two pools; a running pod's claim holds both, a pending pod wants one."""
    from kubernetes import client

    api = FakeApiServer().start()
    try:
        path = api.kubeconfig(tmp_path / "kubeconfig")
        resource = client.ResourceV1Api(api_client(str(path)))
        for pool, device in zip(POOLS, ("gpu-0", "gpu-1"), strict=True):
            resource.create_resource_slice(_slice(pool, device))
        for doc in yaml.safe_load_all((ROOT / "deploy/dra/deviceclasses.yaml").read_text()):
            api.add_class(doc)
        api.add_claim(_claim("both", 2, {"gpu-0": POOLS[0], "gpu-1": POOLS[1]}))
        api.add_pod(_pod("holder", "both", "node-a"))
        api.add_claim(_claim("wanted", 1))
        api.add_pod(_pod("waiting", "wanted", None))
        yield path
    finally:
        api.stop()


def test_a_claim_holding_devices_of_two_pools_of_a_node_is_counted_once(
    kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["dra", "why", "--kubeconfig", str(kubeconfig), "waiting"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "on node-a (2 device(s), after 1 allocated claim(s) there):\n" in out
    assert "wanted: would get" not in out
    assert "  request gpus: 2 device(s) match its class and selectors, 0 of them" in out
