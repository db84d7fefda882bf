"""`cdigen dra why POD` where a pool publishes one device name twice. The scheduler's allocator
marks such a pool invalid ("duplicate device name NAME", over all slices of the pool's newest
generation) and allocates none of its devices: ``dra why`` names the pool and the name, never
picks one of the two devices or lets one hide the other. One name in two pools or drivers is
no duplicate (tests/unit/test_dra_why_device_keys.py)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from cdigen.cli import main
from cdigen.plugin.agent.kubeapi import api_client
from cdigen.plugin.dra.why import Cluster, explain_pod
from tests.fake_apiserver import FakeApiServer
from tests.helpers.why_docs import (
    api_with_classes,
    claim_doc,
    pod_doc,
    shipped_classes,
    slice_doc,
)

DRIVER = "gpu.cdigen.dev"
INVALID = f"pool {DRIVER}/node-a is invalid: duplicate device name gpu-0"


def _slice(
    name: str, devices: Sequence[str], *, pool: str = "node-a", node: str = "node-a",
    generation: int = 1, count: int = 1,
) -> dict[str, Any]:  # fmt: skip
    typed = [{"name": d, "attributes": {"type": {"string": "gpu"}}} for d in devices]
    return slice_doc(name, DRIVER, node, pool, typed, generation=generation, count=count)


def _all_claim(name: str) -> dict[str, Any]:
    claim = claim_doc(name, DRIVER)
    claim["spec"]["devices"]["requests"][0]["exactly"] = {
        "deviceClassName": DRIVER,
        "allocationMode": "All",
    }
    return claim


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with api_with_classes() as server:
        server.add_claim(claim_doc("wanted", DRIVER, 1))
        server.add_pod(pod_doc("waiting", "wanted", None))
        yield server


def _why(
    api: FakeApiServer, tmp_path: Path, slices: Sequence[dict[str, Any]], pod: str = "waiting"
) -> None:
    from kubernetes import client

    path = api.kubeconfig(tmp_path / "kubeconfig")
    resource = client.ResourceV1Api(api_client(str(path)))
    for body in slices:
        resource.create_resource_slice(body)
    assert main(["dra", "why", "--kubeconfig", str(path), pod]) == 0


def test_one_name_in_two_slices_of_a_pool_makes_the_node_not_fit(
    api: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slices = [
        _slice("a-0", ["gpu-0"], count=2),
        _slice("a-1", ["gpu-0", "gpu-1"], count=2),
    ]
    _why(api, tmp_path, slices)
    out = capsys.readouterr().out
    assert "on node-a (0 device(s)):\n" in out, out
    assert f"  {INVALID}; the scheduler allocates none of its 3 device(s)\n" in out, out
    assert "  not allocatable: request 'gpus': 0 device(s) match and fit, 1 needed\n" in out, out
    assert "would get" not in out, out


def test_a_slice_naming_a_device_twice_is_refused_by_the_api_server(
    api: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ApiException) as refused:
        _why(api, tmp_path, [_slice("a-0", ["gpu-0", "gpu-0"])])
    assert refused.value.status == 422
    assert 'spec.devices[1].name: Duplicate value: \\"gpu-0\\"' in str(refused.value.body)


def test_one_name_twice_in_one_slice_read_from_elsewhere_is_the_same_verdict() -> None:
    """What the command runs on the objects it read: a list holding such a slice (from a
    server that let it in) gets the scheduler's verdict, not a device picked twice."""
    claims = {("default", "wanted"): claim_doc("wanted", DRIVER, 1)}
    classes = shipped_classes()
    slices = [_slice("a-0", ["gpu-0", "gpu-\x1b[2J", "gpu-\x1b[2J"])]
    cluster = Cluster(pod_doc("waiting", "wanted", None), claims, slices, classes)
    lines = explain_pod(cluster, driver=DRIVER)
    assert (
        f"  pool {DRIVER}/node-a is invalid: duplicate device name gpu-\\x1b[2J; the scheduler "
        "allocates none of its 3 device(s)" in lines
    ), lines
    assert not any("\x1b" in line or "would get" in line for line in lines), lines


def test_the_other_pools_of_the_node_still_serve_the_claim(
    api: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """From Kubernetes 1.35 the allocator skips an invalid pool and allocates from the others."""
    slices = [
        _slice("a-0", ["gpu-0"], count=2),
        _slice("a-1", ["gpu-0"], count=2),
        _slice("b-0", ["gpu-0"], pool="node-a-right"),
    ]
    _why(api, tmp_path, slices)
    out = capsys.readouterr().out
    assert "on node-a (1 device(s)):\n" in out, out
    assert f"  {INVALID}; the scheduler allocates none of its 2 device(s)\n" in out, out
    assert "  wanted: would get gpu-0\n" in out, out


def test_a_request_for_all_devices_is_refused_on_a_node_with_an_invalid_pool(
    api: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api.add_claim(_all_claim("every"))
    api.add_pod(pod_doc("greedy", "every", None))
    slices = [
        _slice("a-0", ["gpu-0"], count=2),
        _slice("a-1", ["gpu-0"], count=2),
        _slice("b-0", ["gpu-0"], pool="node-a-right"),
    ]
    _why(api, tmp_path, slices, "greedy")
    out = capsys.readouterr().out
    assert (
        "  not allocatable: request 'gpus' asks for all devices, but resource pool "
        f"{DRIVER}/node-a is invalid: duplicate device name gpu-0\n"
    ) in out, out


def test_a_duplicate_only_in_an_older_generation_is_ignored(
    api: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """node-a's driver published generation 2 without the duplicate of generation 1 (the
    scheduler reads the newest generation only); node-b's newest still has it."""
    slices = [
        _slice("a-0", ["gpu-0"], count=2),
        _slice("a-1", ["gpu-0"], count=2),
        _slice("a-2", ["gpu-0", "gpu-1"], generation=2),
        _slice("b-0", ["gpu-0"], pool="node-b", node="node-b", count=2),
        _slice("b-1", ["gpu-0"], pool="node-b", node="node-b", count=2),
    ]
    _why(api, tmp_path, slices)
    out = capsys.readouterr().out
    assert "on node-a (2 device(s)):\n  wanted: would get gpu-0\n" in out, out
    assert f"pool {DRIVER}/node-a is invalid" not in out, out
    assert (
        f"on node-b (0 device(s)):\n  pool {DRIVER}/node-b is invalid: duplicate device name "
        "gpu-0; the scheduler allocates none of its 2 device(s)\n"
    ) in out, out
