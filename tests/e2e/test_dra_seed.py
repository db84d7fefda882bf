"""The seed's story on the DRA wing: two unchanged ``nvidia.com/gpu: 1`` pods on one 24 GB
RTX 4090, each with an MPS limit the operator chose (``--memory-step 1Gi --shares-per-gpu 4``).

The parts are the real ones where the test can have them: the DeviceClasses as
``kubectl kustomize`` renders deploy/dra with the extended-resource component, the plugin's
slices as the fake API server stored them (it refuses request policies the real one refuses),
the scheduler's extended-resource claim (KEP-5004: one request per container,
``container-0-request-0``, of the class naming the resource, count 1) allocated by the
first-fit simulator over those slices, and the kubelet's prepare over gRPC on the plugin's unix
socket.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdigen.discover import load_node
from cdigen.memory_shares import MemoryShares
from cdigen.plugin.agent.kubeapi import api_client
from cdigen.plugin.dra.kube import KubeApi
from cdigen.plugin.dra.kubelet_plugin import DraPlugin
from cdigen.plugin.dra.mps import MpsSettings
from cdigen.plugin.dra.prepare import claim_spec_path
from cdigen.policies.dra.claim_docs import claim_from_doc, device_class
from cdigen.policies.dra.claims import FirstFit, NodeState
from cdigen.policies.dra.slice_devices import slice_devices
from tests.cdihost import FakeHost, build_host
from tests.dra_kubelet_sim import DraKubeletSim
from tests.fake_apiserver import FakeApiServer
from tests.helpers.deploy import render_with_component
from tests.helpers.dra import DRIVER, NODE_NAME, dra_options
from tests.helpers.podman import Podman
from tests.helpers.podman import missing_tools as podman_missing_tools
from tests.helpers.slice_rules import validate_pool

REPO_ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
SEED_POD = {  # docs/dra.md's seed pod, as the user wrote it
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "seed"},
    "spec": {
        "containers": [
            {
                "name": "main",
                "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                "command": ["nvidia-smi"],
                "resources": {"limits": {"nvidia.com/gpu": 1}},
            }
        ]
    },
}


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    yield server
    server.stop()


def rendered_classes(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The DeviceClasses of deploy/dra with components/extended-resource, as an overlay of the
    user's own renders them (docs/dra.md, step 4)."""
    rendered = render_with_component(tmp_path_factory, "extended-resource")
    return [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "DeviceClass"]


def extended_resource_claim(
    pod: dict[str, Any], classes: list[dict[str, Any]], n: int
) -> dict[str, Any]:
    """The ResourceClaim the scheduler writes for ``pod``'s extended resources (KEP-5004): one
    request per container and resource, of the class that names the resource."""
    by_resource = {c["spec"]["extendedResourceName"]: c["metadata"]["name"]
                   for c in classes if c["spec"].get("extendedResourceName")}  # fmt: skip
    requests = []
    for c, container in enumerate(pod["spec"]["containers"]):
        for r, (resource, count) in enumerate(sorted(container["resources"]["limits"].items())):
            requests.append(
                {
                    "name": f"container-{c}-request-{r}",
                    "exactly": {
                        "deviceClassName": by_resource[resource],
                        "allocationMode": "ExactCount",
                        "count": int(count),
                    },
                }
            )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"seed-{n}-extended-resources",
            "namespace": "default",
            "uid": f"5eed0000-0000-4000-8000-00000000000{n}",
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
        },
        "spec": {"devices": {"requests": requests}},
    }


@dataclass
class SeedNode:
    """The 4090 node after the scheduler allocated two seed pods' claims and the kubelet
    prepared them: the kubelet's answer, the claims' UIDs, what is left for more."""

    answer: Any
    uids: list[str]
    cdi_dir: Path
    host: FakeHost
    fit: FirstFit
    state: NodeState
    classes: list[dict[str, Any]]
    slices: list[dict[str, Any]]


@pytest.fixture
def seed_node(
    api: FakeApiServer,
    kubelet_dir: Path,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SeedNode]:
    classes = rendered_classes(tmp_path_factory)
    assert {c["metadata"]["name"]: c["spec"].get("extendedResourceName") for c in classes}[
        "gpu.cdigen.dev"
    ] == "nvidia.com/gpu"
    host = build_host(tmp_path / "host", load_node("builtin:rtx4090"))
    pipe = tmp_path / "node-run" / "mps"  # the MPS component's pipe directory on the node
    pipe.mkdir(parents=True, mode=0o755)
    options = dra_options(
        host,
        kubelet_dir,
        tmp_path / "run-cdi",
        memory_shares=MemoryShares(step=GIB, per_gpu=4),  # --memory-step 1Gi --shares-per-gpu 4
        mps=MpsSettings(pipe_dir=str(pipe)),
    )
    kube = KubeApi(api_client(str(api.kubeconfig(tmp_path / "kubeconfig"))))
    plugin = DraPlugin(options, host.node, slices=kube, claims=kube)
    kubelet = DraKubeletSim(kubelet_dir)
    plugin.start()
    try:
        kubelet.register()
        assert plugin.wait_published(10), plugin.slice_problem
        slices = [json.loads(json.dumps(s)) for s in api.slices.values()]
        fit = FirstFit(
            slice_devices(slices),
            {c["metadata"]["name"]: device_class(c, "rendered") for c in classes},
        )
        state = NodeState()
        refs = []
        for n in (1, 2):
            doc = extended_resource_claim(SEED_POD, classes, n)
            allocation = fit.allocate(claim_from_doc(doc, doc["metadata"]["name"]), state)
            assert allocation.devices == ("gpu-0",), allocation.error
            state.add(allocation.picks, fit.by_key)
            (pick,) = allocation.picks
            assert pick.consumed == {f"{DRIVER}/memory": 5 * GIB}
            doc["status"] = {"allocation": {"devices": {"results": [{
                "request": pick.request, "driver": DRIVER, "pool": NODE_NAME,
                "device": pick.device, "shareID": f"{n}a2b3c4d-0000-4000-8000-000000000000",
                "consumedCapacity": {"memory": "5Gi"},
            }]}}}  # fmt: skip
            api.add_claim(doc)
            refs.append(("default", doc["metadata"]["uid"], doc["metadata"]["name"]))
        answer = kubelet.prepare(refs)
        yield SeedNode(answer, [u for _, u, _ in refs], tmp_path / "run-cdi", host, fit, state,
                       classes, slices)  # fmt: skip
    finally:
        plugin.stop()


def test_two_unchanged_seed_pods_share_one_4090_each_with_its_own_mps_limit(
    seed_node: SeedNode,
) -> None:
    validate_pool(seed_node.slices, "1.36")  # what the API server takes, request policy included
    (device,) = seed_node.slices[0]["spec"]["devices"]
    assert device["capacity"]["memory"]["requestPolicy"]["default"] == "5Gi"  # 23.99 GiB / 4
    limits = []
    for uid in seed_node.uids:
        assert seed_node.answer.claims[uid].error == ""
        (prepared,) = seed_node.answer.claims[uid].devices
        assert prepared.request_names == ["container-0-request-0"]
        assert prepared.cdi_device_ids == [f"k8s.{DRIVER}/claim={uid}-gpu-0"]
        spec = json.loads(claim_spec_path(seed_node.cdi_dir, DRIVER, uid).read_text())
        env = spec["containerEdits"]["env"]  # the claim-wide edits: the MPS limits
        limits += [e for e in env if e.startswith("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=")]
        assert any(e.startswith("CUDA_MPS_PIPE_DIRECTORY=") for e in env)
    assert limits == ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=5120M"] * 2
    # two more fit (4 shares per GPU), a fifth does not
    fit, state, classes = seed_node.fit, seed_node.state, seed_node.classes
    for n in (3, 4):
        more = fit.allocate(
            claim_from_doc(extended_resource_claim(SEED_POD, classes, n), "c"), state
        )
        assert more.devices == ("gpu-0",), more.error
        state.add(more.picks, fit.by_key)
    _, reasons = fit.explain(
        claim_from_doc(extended_resource_claim(SEED_POD, classes, 5), "c"), state
    )
    assert reasons == [("gpu-0", "needs memory 5Gi, 4084Mi left")]


def test_both_seed_containers_run_with_the_gpu_and_their_limit(
    seed_node: SeedNode, tmp_path: Path
) -> None:
    """podman (the CDI consumer) runs each pod's container with its claim's CDI device: the
    GPU's device node is there and the limit is in its environment."""
    reason = podman_missing_tools()
    if reason:
        pytest.skip(reason)
    if not seed_node.host.real_nodes:
        pytest.skip("mknod is not permitted here, so no real device nodes for podman to use")
    store = Path(tempfile.mkdtemp(prefix="cdigen-podman-", dir="/tmp"))
    try:
        podman = Podman(tmp_path / "work", store)
        podman.etc_cdi, podman.var_run_cdi = tmp_path / "work" / "empty", seed_node.cdi_dir
        for uid in seed_node.uids:
            (prepared,) = seed_node.answer.claims[uid].devices
            seen = podman.run(
                "ls /dev/nvidia0 && echo $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
                *prepared.cdi_device_ids,
            )
            if seen.returncode != 0 and podman.run("true").returncode != 0:
                pytest.skip(f"this machine cannot run containers: {seen.stderr.strip()[-300:]}")
            assert seen.returncode == 0, seen.stderr + seen.stdout
            assert seen.stdout.split() == ["/dev/nvidia0", "0=5120M"], seen.stdout
    finally:
        shutil.rmtree(store, ignore_errors=True)
