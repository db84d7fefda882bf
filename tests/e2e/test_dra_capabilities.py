"""Issue 17 point 2 for DRA: claims that ask for driver capabilities through opaque device
configuration (GpuConfig, from a DeviceClass or the claim). NodePrepareResources over real
gRPC on unix sockets (tests/dra_kubelet_sim.py), claims from the fake API server, and the CDI
library (podman, which vendors it: tests/helpers/cdi_runtime.py) injecting the returned names."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdigen.cdi.capabilities import CAPABILITIES
from cdigen.plugin.dra.checkpoint import claim_spec_path
from cdigen.plugin.dra.cli import DEFAULT_DRIVER
from cdigen.plugin.dra.config import API_VERSION, KIND
from cdigen.schemas import load_schema
from tests.cdihost import FakeHost, build_host, make_node
from tests.helpers.cdi_runtime import CdiRuntime, cdi_runtime
from tests.helpers.dra import DRIVER, Harness, add_claim, entry, gpu_config

CLAIM_KIND = f"k8s.{DRIVER}/claim"
VULKAN_ICD = "/usr/share/vulkan/icd.d/nvidia_icd.json"


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path / "host", make_node(3), graphics=True)


def ids_of(response: Any, uid: str) -> list[list[str]]:
    answer = response.claims[uid]
    assert answer.error == ""
    return [list(d.cdi_device_ids) for d in answer.devices]


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiRuntime]:
    yield from cdi_runtime(tmp_path_factory)


def test_class_and_claim_config_asking_graphics_get_the_capability_device_after_the_gpu(
    harness: Harness, podman: CdiRuntime
) -> None:
    """The claim's entry replaces the class's; podman's CDI library loads the claim spec, and
    a container given the first GPU with the capability device sees the Vulkan ICD and
    libcuda.so.1 and no video library, one given the GPU alone no Vulkan ICD."""
    harness.start(capability_devices=("graphics", "video"))
    config = [
        entry("FromClass", gpu_config("video"), "gpu"),
        entry("FromClaim", gpu_config("compute", "graphics")),
        entry("FromClaim", {"anything": "goes"}, driver="other.example.com"),
    ]
    ref = add_claim(harness, "render", "uid-r", {"gpu-0": "gpu", "gpu-1": "gpu"}, config)
    ids = ids_of(harness.kubelet.prepare([ref]), "uid-r")
    graphics = f"{CLAIM_KIND}=uid-r-capability-graphics"
    assert ids == [
        [f"{CLAIM_KIND}=uid-r-gpu-0", graphics],
        [f"{CLAIM_KIND}=uid-r-gpu-1", graphics],
    ]  # the claim's entry replaced the class's video: nothing of video
    spec = json.loads(claim_spec_path(harness.cdi_dir, DRIVER, "uid-r").read_text())
    names = [d["name"] for d in spec["devices"]]
    assert names == ["uid-r-gpu-0", "uid-r-gpu-1", "uid-r-capability-graphics"]
    assert podman.load_errors(harness.cdi_dir) == ()
    injected = podman.run(harness.cdi_dir, ids[0])
    if not harness.host.real_nodes:
        assert not injected.unresolvable(), injected.error
        pytest.skip("mknod is not permitted here: podman cannot stat the device nodes")
    assert injected.ok, injected.error
    mounts = set(injected.mounts)
    assert VULKAN_ICD in mounts
    assert any(m.endswith("libcuda.so.1") for m in mounts)
    assert not any("libnvcuvid" in m for m in mounts)  # video was the class's, overridden
    # the same claim's GPU without the capability device has no graphics
    plain = podman.run(harness.cdi_dir, ids[0][:1])
    assert plain.ok and VULKAN_ICD not in plain.mounts, plain.error


def test_a_claim_without_config_gets_only_its_gpu(harness: Harness) -> None:
    harness.start(capability_devices=("graphics",))
    ref = add_claim(harness, "plain", "uid-p", {"gpu-2": "gpu"}, [])
    assert ids_of(harness.kubelet.prepare([ref]), "uid-p") == [[f"{CLAIM_KIND}=uid-p-gpu-2"]]
    spec = json.loads(claim_spec_path(harness.cdi_dir, DRIVER, "uid-p").read_text())
    assert [d["name"] for d in spec["devices"]] == ["uid-p-gpu-2"]
    assert VULKAN_ICD not in {m["containerPath"] for m in spec["containerEdits"]["mounts"]}


def test_config_applies_only_to_the_requests_it_names(harness: Harness) -> None:
    harness.start(capability_devices=("graphics",))
    config = [entry("FromClaim", gpu_config("graphics"), "render")]
    devices = {"gpu-0": "compute", "gpu-1": "render/big"}  # a subrequest of request render
    ref = add_claim(harness, "two", "uid-2", devices, config)
    ids = ids_of(harness.kubelet.prepare([ref]), "uid-2")
    assert ids == [
        [f"{CLAIM_KIND}=uid-2-gpu-0"],
        [f"{CLAIM_KIND}=uid-2-gpu-1", f"{CLAIM_KIND}=uid-2-capability-graphics"],
    ]


def test_claim_config_overrides_class_config_and_node_wide_capabilities_add_nothing(
    harness: Harness, podman: CdiRuntime
) -> None:
    """The claim's entry wins wherever it is listed; two claims asking the same capabilities
    get their own devices, which podman's CDI library loads without a conflict and resolves."""
    harness.start(capability_devices=("graphics", "video"))
    config = [
        entry("FromClaim", gpu_config("compute", "utility")),  # listed first, still wins
        entry("FromClass", gpu_config("graphics")),
    ]
    ref = add_claim(harness, "cls", "uid-c", {"gpu-0": "gpu"}, config)
    assert ids_of(harness.kubelet.prepare([ref]), "uid-c") == [[f"{CLAIM_KIND}=uid-c-gpu-0"]]
    # two claims asking the same capability each get their own device: no CDI name conflict
    a = add_claim(harness, "a", "uid-a", {"gpu-1": "gpu"}, [entry("FromClass", gpu_config("all"))])
    b = add_claim(harness, "b", "uid-b", {"gpu-2": "gpu"}, [entry("FromClass", gpu_config("all"))])
    harness.stop()
    harness.start(capability_devices=CAPABILITIES)
    response = harness.kubelet.prepare([a, b])
    assert ids_of(response, "uid-a")[0][1:] == [
        f"{CLAIM_KIND}=uid-a-capability-video",
        f"{CLAIM_KIND}=uid-a-capability-graphics",
    ]
    assert ids_of(response, "uid-b")[0][1:] == [
        f"{CLAIM_KIND}=uid-b-capability-video",
        f"{CLAIM_KIND}=uid-b-capability-graphics",
    ]  # display: the fake driver root has no X server module, so `all` brings none
    assert podman.load_errors(harness.cdi_dir) == ()
    both = [n for uid in ("uid-a", "uid-b") for n in ids_of(response, uid)[0]]
    seen = podman.run(harness.cdi_dir, both)
    assert seen.ok or (not harness.host.real_nodes and not seen.unresolvable()), seen.error


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (gpu_config("graphix"), "opaque.parameters.capabilities[0]: expected one of compute"),
        (gpu_config("graphics", gpus=2), "opaque.parameters: Additional properties"),
        ({**gpu_config("graphics"), "kind": "TpuConfig"}, "opaque.parameters.kind: 'GpuConfig'"),
        ({"kind": KIND, "capabilities": []}, "'apiVersion' is a required property"),
        ("graphics", "opaque.parameters: expected object"),
    ],
)
def test_a_bad_config_is_a_per_claim_error_and_nothing_is_prepared(
    harness: Harness, parameters: Any, message: str
) -> None:
    harness.start(capability_devices=("graphics",))
    good = add_claim(harness, "good", "uid-g", {"gpu-1": "gpu"}, [])
    bad_config = [entry("FromClass", gpu_config()), entry("FromClaim", parameters)]
    bad = add_claim(harness, "bad", "uid-b", {"gpu-0": "gpu"}, bad_config)
    response = harness.kubelet.prepare([bad, good])
    error = response.claims["uid-b"].error
    assert "ResourceClaim default/bad status.allocation.devices.config[1] (FromClaim)" in error
    assert message in error
    assert f"apiVersion: {API_VERSION}, kind: {KIND}" in error
    assert "\n" not in error
    assert response.claims["uid-b"].devices == [] or not list(response.claims["uid-b"].devices)
    assert not claim_spec_path(harness.cdi_dir, DRIVER, "uid-b").exists()
    assert response.claims["uid-g"].error == ""
    assert harness.plugin is not None and set(harness.plugin.preparer.prepared()) == {"uid-g"}
    # the device was not held: a fixed claim for it prepares
    fixed = add_claim(harness, "fixed", "uid-f", {"gpu-0": "gpu"}, [])
    assert harness.kubelet.prepare([fixed]).claims["uid-f"].error == ""


def test_a_capability_the_driver_does_not_offer_names_the_flag(harness: Harness) -> None:
    harness.start()  # no --capability-devices
    config = [entry("FromClass", gpu_config("graphics", "video"))]
    ref = add_claim(harness, "want", "uid-w", {"gpu-0": "gpu"}, config)
    error = harness.kubelet.prepare([ref]).claims["uid-w"].error
    assert "request 'gpu' asks for driver capabilities video, graphics" in error
    assert "config[0] (FromClass)" in error
    assert "--capability-devices video,graphics" in error
    assert not claim_spec_path(harness.cdi_dir, DRIVER, "uid-w").exists()


def test_a_capability_the_driver_root_lacks_is_a_per_claim_error(harness: Harness) -> None:
    harness.start(capability_devices=("display",))
    ref = add_claim(
        harness, "x", "uid-x", {"gpu-0": "gpu"}, [entry("FromClaim", gpu_config("display"))]
    )
    error = harness.kubelet.prepare([ref]).claims["uid-x"].error
    assert "has no files for driver capabilities display" in error
    assert not claim_spec_path(harness.cdi_dir, DRIVER, "uid-x").exists()


def test_the_schema_knows_every_capability_and_the_driver() -> None:
    schema = load_schema("dra-gpu-config")
    assert schema["properties"]["capabilities"]["items"]["enum"] == [*CAPABILITIES, "all"]
    assert schema["properties"]["apiVersion"]["const"] == API_VERSION
    assert API_VERSION.startswith(f"{DEFAULT_DRIVER}/")
