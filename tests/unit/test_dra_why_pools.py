"""`cdigen dra why POD` on a node whose devices come in more than one pool: an allocated claim
holding devices of two of its pools is one claim there, not one per pool."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdigen.cli import main
from cdigen.plugin.agent.kubeapi import api_client
from tests.fake_apiserver import FakeApiServer
from tests.helpers.why_docs import claim_doc, pod_doc, shipped_classes, slice_doc

DRIVER = "gpu.cdigen.dev"
POOLS = ("node-a-left", "node-a-right")  # one node, two pools of one GPU each


def _slice(pool: str, device: str) -> dict[str, Any]:
    devices = [{"name": device, "attributes": {"type": {"string": "gpu"}}}]
    return slice_doc(f"{pool}-slice", DRIVER, "node-a", pool, devices)


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
        for doc in shipped_classes():
            api.add_class(doc)
        api.add_claim(
            claim_doc(
                "both", DRIVER, 2, held=[(DRIVER, POOLS[0], "gpu-0"), (DRIVER, POOLS[1], "gpu-1")]
            )
        )
        api.add_pod(pod_doc("holder", "both", "node-a"))
        api.add_claim(claim_doc("wanted", DRIVER, 1))
        api.add_pod(pod_doc("waiting", "wanted", None))
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
