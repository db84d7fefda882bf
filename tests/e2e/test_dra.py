"""`cdigen dra serve` end to end without a cluster: the kubelet's registration handshake and
prepare calls (tests/dra_kubelet_sim.py), a fake API server on loopback that the official
kubernetes client talks to (tests/fake_apiserver.py), and the CDI library on the transient
specs (podman, which vendors it: tests/helpers/cdi_runtime.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdigen.plugin.agent.xid import xid_reason
from cdigen.plugin.dra.checkpoint import claim_spec_path
from tests.cdihost import FakeHost, build_host, make_node
from tests.dra_kubelet_sim import RegistrationRefused
from tests.fake_apiserver import allocated_claim
from tests.helpers.cdi_runtime import CdiRuntime, cdi_runtime
from tests.helpers.dra import DRIVER, NODE_NAME, Harness
from tests.helpers.slice_rules import validate_pool


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path / "host", make_node(3, mig_gpu=2))


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiRuntime]:
    yield from cdi_runtime(tmp_path_factory)


# --------------------------------------------------------------------------- registration


def test_the_kubelet_registers_the_plugin_with_exact_versions(harness: Harness) -> None:
    plugin = harness.start()
    info = harness.kubelet.plugin
    assert info is not None
    reg_sock, dra_sock = plugin.socket_paths
    assert reg_sock == harness.kubelet_dir / "plugins_registry" / f"{DRIVER}-reg.sock"
    assert info.info.type == "DRAPlugin"
    assert info.driver == DRIVER
    assert info.endpoint == str(harness.kubelet_dir / "plugins" / DRIVER / "dra.sock")
    assert list(info.info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert info.service == "v1.DRAPlugin"
    assert plugin.registration.wait_registered(2)
    assert oct(dra_sock.stat().st_mode & 0o777) == "0o600"


def test_a_refusal_is_logged_with_the_kubelets_reason(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = harness.start()
    import grpc

    from cdigen.plugin.dra.api import pluginregistration_v1_pb2 as reg_pb
    from cdigen.plugin.dra.api import pluginregistration_v1_pb2_grpc as reg_grpc

    with grpc.insecure_channel(f"unix:{plugin.socket_paths[0]}") as channel:
        reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
            reg_pb.RegistrationStatus(plugin_registered=False, error="version skew"), timeout=5
        )
    assert plugin.registration.registered is False
    assert any("refused" in r.message and "version skew" in r.message for r in caplog.records)


def test_the_simulator_refuses_a_plugin_with_unknown_versions(harness: Harness) -> None:
    from cdigen.plugin.dra import grpc_services

    original = grpc_services.SUPPORTED_VERSIONS
    grpc_services.SUPPORTED_VERSIONS = ("v1beta1",)  # what a toy driver advertises
    try:
        with pytest.raises(RegistrationRefused, match="none of the supported versions"):
            harness.start()
        assert harness.plugin is not None
        assert harness.plugin.registration.wait_registered(0.2) is False
    finally:
        grpc_services.SUPPORTED_VERSIONS = original


# --------------------------------------------------------------------------- slices


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_published_slices_pass_strict_validation(harness: Harness, version: str) -> None:
    major, minor = version.split(".")
    harness.api.version = (major, minor)
    harness.start()
    slices = list(harness.api.slices.values())
    assert len(slices) == 1
    validate_pool(slices, version)
    spec = slices[0]["spec"]
    assert spec["driver"] == DRIVER and spec["nodeName"] == NODE_NAME
    assert spec["pool"] == {"name": NODE_NAME, "generation": 1, "resourceSliceCount": 1}
    names = [d["name"] for d in spec["devices"]]
    assert names == ["gpu-0", "gpu-1", "gpu-2-mig-7-0", "gpu-2-mig-8-0"]
    owner = slices[0]["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "Node" and owner["uid"] == "node-uid-1"


def test_a_layout_change_replaces_the_slices_with_a_new_generation(harness: Harness) -> None:
    from dataclasses import replace

    plugin = harness.start()
    node = plugin.node
    gpus = list(node.gpus)
    gpus[2] = replace(gpus[2], mig_enabled=False, mig_devices=())
    assert plugin.apply_node(replace(node, gpus=tuple(gpus)))
    (body,) = harness.api.slices.values()
    assert body["spec"]["pool"]["generation"] == 2
    assert [d["name"] for d in body["spec"]["devices"]] == ["gpu-0", "gpu-1", "gpu-2"]
    assert not plugin.apply_node(plugin.node), "an unchanged node publishes nothing"


def test_slices_are_deleted_on_a_clean_shutdown_when_configured(harness: Harness) -> None:
    harness.start(delete_slices_on_exit=True)
    assert harness.api.slices
    harness.stop()
    assert harness.api.slices == {}


def test_slices_stay_on_shutdown_by_default(harness: Harness) -> None:
    harness.start()
    harness.stop()
    assert len(harness.api.slices) == 1


# --------------------------------------------------------------------------- prepare


def test_prepare_writes_a_spec_the_cdi_library_injects_and_unprepare_removes_it(
    harness: Harness, podman: CdiRuntime
) -> None:
    """podman's CDI library loads every spec in the dir and a container given the claim's
    names has the claimed GPU, the claimed MIG device's capability node (not the other's),
    nvidiactl and libcuda.so.1."""
    harness.start()
    ref = harness.claim("train", "uid-1", "gpu-0", "gpu-2-mig-8-0")
    response = harness.kubelet.prepare([ref])
    answer = response.claims["uid-1"]
    assert answer.error == ""
    ids = [list(d.cdi_device_ids) for d in answer.devices]
    assert ids == [
        [f"k8s.{DRIVER}/claim=uid-1-gpu-0"],
        [f"k8s.{DRIVER}/claim=uid-1-gpu-2-mig-8-0"],
    ]
    assert [d.pool_name for d in answer.devices] == [NODE_NAME, NODE_NAME]
    path = claim_spec_path(harness.cdi_dir, DRIVER, "uid-1")
    assert path.exists()
    assert podman.load_errors(harness.cdi_dir) == ()
    seen = podman.run(harness.cdi_dir, [i[0] for i in ids])
    if not harness.host.real_nodes:
        assert not seen.unresolvable(), seen.error
        pytest.skip("mknod is not permitted here: podman cannot stat the device nodes")
    assert seen.ok, seen.error
    paths = set(seen.nodes)
    gpu0 = harness.host.node.gpus[0]
    assert f"/dev/nvidia{gpu0.minor}" in paths
    assert "/dev/nvidia-caps/nvidia-cap75" in paths  # the claimed MIG device's capabilities
    assert "/dev/nvidia-caps/nvidia-cap66" not in paths  # not the other MIG device's
    assert "/dev/nvidiactl" in paths
    assert any(m.endswith("libcuda.so.1") for m in seen.mounts)

    response = harness.kubelet.unprepare([ref])
    assert response.claims["uid-1"].error == ""
    assert not path.exists()
    assert harness.plugin is not None and harness.plugin.preparer.prepared() == {}


def test_prepare_is_idempotent(harness: Harness) -> None:
    harness.start()
    ref = harness.claim("a", "uid-a", "gpu-1")
    first = harness.kubelet.prepare([ref])
    second = harness.kubelet.prepare([ref, ref])
    assert first.claims["uid-a"] == second.claims["uid-a"]
    assert len(list(harness.cdi_dir.glob("*.json"))) == 1
    assert harness.kubelet.unprepare([ref]).claims["uid-a"].error == ""
    assert harness.kubelet.unprepare([ref]).claims["uid-a"].error == ""


def test_a_device_held_by_another_claim_is_refused_for_that_claim_only(harness: Harness) -> None:
    harness.start()
    first = harness.claim("first", "uid-1", "gpu-0")
    second = harness.claim("second", "uid-2", "gpu-0")
    third = harness.claim("third", "uid-3", "gpu-1")
    assert harness.kubelet.prepare([first]).claims["uid-1"].error == ""
    response = harness.kubelet.prepare([second, third])
    assert "already prepared for claim default/first (uid-1)" in response.claims["uid-2"].error
    assert response.claims["uid-3"].error == ""
    assert not claim_spec_path(harness.cdi_dir, DRIVER, "uid-2").exists()


def test_claims_allocated_for_sharing_may_share_a_device(harness: Harness) -> None:
    harness.start()
    a = harness.claim("a", "uid-a", "gpu-0", shareID="11111111-1111-1111-1111-111111111111")
    b = harness.claim("b", "uid-b", "gpu-0", shareID="22222222-2222-2222-2222-222222222222")
    response = harness.kubelet.prepare([a, b])
    assert response.claims["uid-a"].error == response.claims["uid-b"].error == ""
    assert response.claims["uid-b"].devices[0].share_id == "22222222-2222-2222-2222-222222222222"


def test_claim_errors_are_per_claim(harness: Harness) -> None:
    harness.start()
    good = harness.claim("good", "uid-g", "gpu-1")
    missing = ("default", "uid-m", "not-there")
    foreign = harness.claim("foreign", "uid-f", "gpu-9")
    response = harness.kubelet.prepare([good, missing, foreign])
    assert response.claims["uid-g"].error == ""
    assert "reading ResourceClaim default/not-there" in response.claims["uid-m"].error
    assert "'gpu-9'" in response.claims["uid-f"].error
    wrong_uid = ("default", "uid-other", "good")
    assert "was deleted and recreated" not in response.claims["uid-g"].error
    assert "has UID 'uid-g'" in harness.kubelet.prepare([wrong_uid]).claims["uid-other"].error


def test_the_v1beta1_service_prepares_too(harness: Harness) -> None:
    harness.start()
    ref = harness.claim("old", "uid-old", "gpu-1")
    response = harness.kubelet.prepare([ref], service="v1beta1.DRAPlugin")
    assert list(response.claims["uid-old"].devices[0].cdi_device_ids) == [
        f"k8s.{DRIVER}/claim=uid-old-gpu-1"
    ]


def test_a_restarted_plugin_unprepares_claims_prepared_before(harness: Harness) -> None:
    harness.start()
    ref = harness.claim("keep", "uid-k", "gpu-0")
    assert harness.kubelet.prepare([ref]).claims["uid-k"].error == ""
    path = claim_spec_path(harness.cdi_dir, DRIVER, "uid-k")
    harness.stop()
    assert path.exists(), "a stopping plugin leaves prepared claims alone"
    plugin = harness.start()
    assert set(plugin.preparer.prepared()) == {"uid-k"}
    other = harness.claim("other", "uid-o", "gpu-0")
    assert "already prepared" in harness.kubelet.prepare([other]).claims["uid-o"].error
    assert harness.kubelet.unprepare([ref]).claims["uid-k"].error == ""
    assert not path.exists()


def test_a_corrupt_checkpoint_stops_the_start_with_one_line(
    harness: Harness, tmp_path: Path
) -> None:
    from cdigen.errors import InputError

    checkpoint = harness.kubelet_dir / "plugins" / DRIVER / "checkpoint.json"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_text("{not json")
    with pytest.raises(InputError, match="checkpoint is not one cdigen wrote"):
        harness.start()


# --------------------------------------------------------------------------- health


def test_health_streams_every_device_and_then_changes(harness: Harness) -> None:
    import threading

    plugin = harness.start()
    got: list[Any] = []
    watcher = threading.Thread(target=harness.kubelet.watch_health, args=(2, got))
    watcher.start()
    import time

    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.02)
    gpu1 = plugin.node.gpus[1].uuid
    plugin.board.set_reasons("xid", {gpu1: xid_reason(79)})
    watcher.join(5)
    assert len(got) == 2
    first = {d.device.device_name: d.health for d in got[0].devices}
    assert set(first) == {"gpu-0", "gpu-1", "gpu-2-mig-7-0", "gpu-2-mig-8-0"}
    assert set(first.values()) == {1}  # HEALTHY
    second = {d.device.device_name: (d.health, d.message) for d in got[1].devices}
    assert second["gpu-1"] == (2, "critical Xid 79")  # UNHEALTHY, with the reason
    assert second["gpu-0"][0] == 1


# --------------------------------------------------------------------------- the command


def test_dra_serve_without_a_node_name_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cdigen.cli", "dra", "serve", "--node", "builtin:rtx4090"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "--node-name" in result.stderr


def test_a_claim_spec_failing_the_check_is_that_claims_error_and_leaves_no_file(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claim specs go through the spec service's check, as `cdigen generate`'s do: a spec the
    runtimes would refuse (here a device node with a relative path, which no claim makes today:
    the fault is planted) is refused before anything is written."""
    plugin = harness.start()
    preparer = plugin.preparer
    make_spec = preparer._specs.build

    def broken(*args: Any, **kwargs: Any) -> Any:
        spec = make_spec(*args, **kwargs)
        spec["devices"][0]["containerEdits"]["deviceNodes"] = [{"path": "dev/nvidia0"}]
        return spec

    monkeypatch.setattr(preparer._specs, "build", broken)
    bad = harness.claim("bad", "uid-bad", "gpu-0")
    good = harness.claim("good", "uid-good", "gpu-1")
    response = harness.kubelet.prepare([bad])
    error = response.claims["uid-bad"].error
    assert "dev/nvidia0" in error and "\n" not in error, error
    left = [p.name for p in harness.cdi_dir.glob("*")] if harness.cdi_dir.exists() else []
    assert [n for n in left if n != ".cdigen.lock"] == [], left
    monkeypatch.setattr(preparer._specs, "build", make_spec)
    assert harness.kubelet.prepare([good]).claims["uid-good"].error == ""
    spec = json.loads(claim_spec_path(harness.cdi_dir, DRIVER, "uid-good").read_text())
    assert spec["kind"] == f"k8s.{DRIVER}/claim"


def test_the_seeds_pod_served_through_an_extended_resource_claim(harness: Harness) -> None:
    """A pod asking ``nvidia.com/gpu: 1`` (and a second container 2) on a cluster where a
    DeviceClass carries ``extendedResourceName: nvidia.com/gpu``: the scheduler writes a special
    claim, as Kubernetes 1.36 makes it, and the kubelet asks us to prepare it like any other."""
    harness.start()
    uid = "ext-uid-1"
    results = [
        {"request": f"container-{c}-request-0", "driver": DRIVER, "pool": NODE_NAME, "device": d}
        for c, d in ((0, "gpu-0"), (1, "gpu-1"), (1, "gpu-2-mig-8-0"))
    ]
    claim = allocated_claim("seed-extended-resources-gl8fj", uid, results)
    claim["metadata"]["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    claim["spec"]["devices"]["requests"] = [
        {"name": f"container-{n}-request-0", "exactly": {"deviceClassName": "gpu.cdigen.dev",
         "allocationMode": "ExactCount", "count": count}}
        for n, count in ((0, 1), (1, 2))
    ]  # fmt: skip
    harness.api.add_claim(claim)
    ref = ("default", uid, "seed-extended-resources-gl8fj")
    answer = harness.kubelet.prepare([ref]).claims[uid]
    assert answer.error == ""
    by_request: dict[str, list[str]] = {}
    for device in answer.devices:
        for request in device.request_names:
            by_request.setdefault(request, []).extend(device.cdi_device_ids)
    assert by_request == {
        "container-0-request-0": [f"k8s.{DRIVER}/claim={uid}-gpu-0"],
        "container-1-request-0": [
            f"k8s.{DRIVER}/claim={uid}-gpu-1",
            f"k8s.{DRIVER}/claim={uid}-gpu-2-mig-8-0",
        ],
    }
    assert claim_spec_path(harness.cdi_dir, DRIVER, uid).exists()
    assert harness.kubelet.unprepare([ref]).claims[uid].error == ""
    assert not claim_spec_path(harness.cdi_dir, DRIVER, uid).exists()
