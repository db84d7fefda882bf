"""`cdigen dra why POD` on a node where two devices have one name: NVIDIA's DRA driver beside
ours (both publish ``gpu-0``), or two pools of ours. A device is its driver, pool and name
(ResourceSlice's API reference): what an allocated claim holds, the selectors' verdicts and
matchAttribute are each about the one device, never about another of the same name."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from cdigen.cli import main
from cdigen.plugin.agent.kubeapi import api_client
from tests.fake_apiserver import FakeApiServer
from tests.helpers.why_docs import (
    api_with_classes,
    claim_doc,
    pod_doc,
    slice_doc,
)

OURS = "gpu.cdigen.dev"
NVIDIA = "gpu.nvidia.com"  # NVIDIA's DRA driver, its class named after it as it ships
NODE = "node-a"
# (driver, pool, device, numa) of what node-a publishes, in the order the slices are created
Published = Sequence[tuple[str, str, str, int]]
TWO_DRIVERS: Published = ((OURS, NODE, "gpu-0", 0), (NVIDIA, NODE, "gpu-0", 0))
TWO_POOLS: Published = ((OURS, "left", "gpu-0", 0), (OURS, "right", "gpu-0", 0))


def _slices(published: Published, node: str = NODE) -> list[dict[str, Any]]:
    pools: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for driver, pool, device, numa in published:
        attributes = {"type": {"string": "gpu"}, "numa": {"int": numa}}
        pools.setdefault((driver, pool), []).append({"name": device, "attributes": attributes})
    return [
        slice_doc(f"{node}-{driver}-{pool}", driver, node, pool, devices)
        for (driver, pool), devices in pools.items()
    ]


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with api_with_classes() as server:
        selector = {"cel": {"expression": f'device.driver == "{NVIDIA}"'}}
        nvidia = {"metadata": {"name": NVIDIA}, "spec": {"selectors": [selector]}}
        server.add_class({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", **nvidia})
        yield server


def _why(
    api: FakeApiServer,
    tmp_path: Path,
    published: Published,
    wanted: dict[str, Any],
    held: dict[str, Any] | None = None,
) -> None:
    """``dra why`` for a pending pod of claim ``wanted``, a running pod holding ``held``."""
    from kubernetes import client

    path = api.kubeconfig(tmp_path / "kubeconfig")
    resource = client.ResourceV1Api(api_client(str(path)))
    for body in _slices(published):
        resource.create_resource_slice(body)
    if held is not None:
        api.add_claim(held)
        api.add_pod(pod_doc("holder", held["metadata"]["name"], NODE))
    api.add_claim(wanted)
    api.add_pod(pod_doc("waiting", wanted["metadata"]["name"], None))
    code = main(["dra", "why", "--kubeconfig", str(path), "waiting"])
    assert code == 0


@pytest.mark.parametrize(
    ("published", "held", "wanted_class", "verdict"),
    [
        # NVIDIA's gpu-0 is held; ours, of the same name, is free for a claim of our class
        (TWO_DRIVERS, (NVIDIA, NODE, "gpu-0"), OURS, f"wanted: would get {OURS}/{NODE}/gpu-0"),
        (TWO_DRIVERS, (OURS, NODE, "gpu-0"), NVIDIA, f"wanted: would get {NVIDIA}/{NODE}/gpu-0"),
        (TWO_POOLS, (OURS, "left", "gpu-0"), OURS, f"wanted: would get {OURS}/right/gpu-0"),
        (TWO_POOLS, (OURS, "right", "gpu-0"), OURS, f"wanted: would get {OURS}/left/gpu-0"),
    ],
)
def test_the_device_of_the_same_name_that_is_free_is_the_one_a_pending_claim_gets(
    api: FakeApiServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    published: Published,
    held: tuple[str, str, str],
    wanted_class: str,
    verdict: str,
) -> None:
    holder = claim_doc("holder", held[0], held=[held])
    _why(api, tmp_path, published, claim_doc("wanted", wanted_class), holder)
    out = capsys.readouterr().out
    assert f"on {NODE} (2 device(s), after 1 allocated claim(s) there):\n" in out, out
    assert f"  {verdict}\n" in out, out


def test_a_held_device_is_held_only_in_its_own_driver(
    api: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Our gpu-0 held, a claim of our class waits: NVIDIA's gpu-0 does not match our class,
    ours is held; each device is told by driver, pool and name."""
    holder = claim_doc("holder", OURS, held=[(OURS, NODE, "gpu-0")])
    _why(api, tmp_path, TWO_DRIVERS, claim_doc("wanted", OURS), holder)
    out = capsys.readouterr().out
    assert "  request gpus: 1 device(s) match its class and selectors, 0 of them" in out, out
    assert "not allocatable: request 'gpus': 0 device(s) match and fit, 1 needed" in out, out
    assert f"    {OURS}/{NODE}/gpu-0: held by another claim\n" in out, out
    assert f"    {NVIDIA}/{NODE}/gpu-0: class {OURS} selector 0 is false\n" in out, out


def test_match_attribute_compares_the_devices_picked_not_others_of_their_name(
    api: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two GPUs on one NUMA node wanted: left's gpu-0 is alone on NUMA 0, so first fit goes
    on to left's gpu-1 and right's gpu-0, both on NUMA 1 (right's gpu-0 is not left's)."""
    published = (
        (OURS, "left", "gpu-0", 0),
        (OURS, "left", "gpu-1", 1),
        (OURS, "right", "gpu-0", 1),
    )
    same_numa = {"requests": ["gpus"], "matchAttribute": f"{OURS}/numa"}
    wanted = claim_doc("wanted", OURS, count=2, constraints=[same_numa])
    _why(api, tmp_path, published, wanted)
    out = capsys.readouterr().out
    assert f"  wanted: would get gpu-1, {OURS}/right/gpu-0\n" in out, out


def test_nodes_of_one_shape_keep_each_its_own_held_devices(
    api: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """node-a and node-b publish the same devices, each in a pool of its own name (``dra
    why`` simulates such nodes with one fit, node-a's): node-a's gpu-1 is held, node-b's gpu-0."""
    from kubernetes import client

    path = api.kubeconfig(tmp_path / "kubeconfig")
    resource = client.ResourceV1Api(api_client(str(path)))
    for node, held in (("node-a", "gpu-1"), ("node-b", "gpu-0")):
        for body in _slices(((OURS, node, "gpu-0", 0), (OURS, node, "gpu-1", 0)), node):
            resource.create_resource_slice(body)
        api.add_claim(claim_doc(f"held-{node}", OURS, held=[(OURS, node, held)]))
        api.add_pod(pod_doc(f"holder-{node}", f"held-{node}", node))
    api.add_claim(claim_doc("wanted", OURS))
    api.add_pod(pod_doc("waiting", "wanted", None))
    assert main(["dra", "why", "--kubeconfig", str(path), "waiting"]) == 0
    out = capsys.readouterr().out
    assert (
        "on node-a (2 device(s), after 1 allocated claim(s) there):\n  wanted: would get gpu-0\n"
        in out
    ), out
    assert (
        "on node-b (2 device(s), after 1 allocated claim(s) there):\n  wanted: would get gpu-1\n"
        in out
    ), out
