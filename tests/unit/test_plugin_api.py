"""The committed v1beta1 stubs are what the proto generates; the wire format is the kubelet's."""

from __future__ import annotations

import tomllib
from pathlib import Path

from cdigen.plugin.agent.api.generate import GENERATED, PROTOS, REPO_ROOT, generate, generated_paths
from cdigen.plugin.deviceplugin.api import deviceplugin_pb2 as pb


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    written = generate(tmp_path)
    expected = [p for proto in PROTOS for p in generated_paths(proto)]
    assert [str(p.relative_to(tmp_path)) for p in written] == expected
    assert [p.name for p in written[:3]] == list(GENERATED)
    for path in written:
        committed = REPO_ROOT / path.relative_to(tmp_path)
        assert committed.read_bytes() == path.read_bytes(), (
            f"{committed} is stale: run 'python -m cdigen.plugin.agent.api.generate' and commit it"
        )


def test_stubs_import_through_the_package() -> None:
    text = (REPO_ROOT / "plugin" / "deviceplugin" / "api" / "deviceplugin_pb2_grpc.py").read_text()
    package = pb.__name__.rpartition(".")[0]  # the name plugin/deviceplugin/api/ is installed under
    assert f"from {package} import deviceplugin_pb2" in text


def test_field_numbers_are_the_kubelets() -> None:
    numbers = {
        pb.DevicePluginOptions: {"pre_start_required": 1, "get_preferred_allocation_available": 2},
        pb.RegisterRequest: {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4},
        pb.ListAndWatchResponse: {"devices": 1},
        pb.TopologyInfo: {"nodes": 1},
        pb.NUMANode: {"ID": 1},
        pb.Device: {"ID": 1, "health": 2, "topology": 3},
        pb.PreStartContainerRequest: {"devices_ids": 1},
        pb.PreferredAllocationRequest: {"container_requests": 1},
        pb.ContainerPreferredAllocationRequest: {
            "available_deviceIDs": 1,
            "must_include_deviceIDs": 2,
            "allocation_size": 3,
        },
        pb.PreferredAllocationResponse: {"container_responses": 1},
        pb.ContainerPreferredAllocationResponse: {"deviceIDs": 1},
        pb.AllocateRequest: {"container_requests": 1},
        pb.ContainerAllocateRequest: {"devices_ids": 1},
        pb.CDIDevice: {"name": 1},
        pb.AllocateResponse: {"container_responses": 1},
        pb.ContainerAllocateResponse: {
            "envs": 1,
            "mounts": 2,
            "devices": 3,
            "annotations": 4,
            "cdi_devices": 5,
        },
        pb.Mount: {"container_path": 1, "host_path": 2, "read_only": 3},
        pb.DeviceSpec: {"container_path": 1, "host_path": 2, "permissions": 3},
    }
    for message, expected in numbers.items():
        got = {f.name: f.number for f in message.DESCRIPTOR.fields}
        assert got == expected, message.DESCRIPTOR.full_name


def test_services_and_package() -> None:
    file = pb.DESCRIPTOR
    assert file.package == "v1beta1"
    registration = file.services_by_name["Registration"]
    assert [m.name for m in registration.methods] == ["Register"]
    plugin = file.services_by_name["DevicePlugin"]
    methods = {m.name: m for m in plugin.methods}
    assert set(methods) == {
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    }
    assert methods["ListAndWatch"].server_streaming  # type: ignore[attr-defined]
    # The wire name the kubelet calls:
    assert plugin.full_name == "v1beta1.DevicePlugin"


def test_a_kubelet_encoded_allocate_response_decodes() -> None:
    # Bytes as the Go kubelet would encode ContainerAllocateResponse{CdiDevices: [{Name: "a/b=c"}]}:
    # field 5, wire type 2 -> tag 0x2a; nested CDIDevice field 1 -> tag 0x0a.
    wire = bytes([0x2A, 0x07, 0x0A, 0x05]) + b"a/b=c"
    response = pb.ContainerAllocateResponse.FromString(wire)
    assert [d.name for d in response.cdi_devices] == ["a/b=c"]


def test_dra_protos_match_the_kubelets_at_the_named_tag() -> None:
    """Service names and field numbers the kubelet's DRA client uses (k8s.io/kubelet v0.36.3)."""
    from cdigen.plugin.dra.api import dra_health_v1alpha1_pb2 as health
    from cdigen.plugin.dra.api import dra_v1_pb2 as v1
    from cdigen.plugin.dra.api import dra_v1beta1_pb2 as v1beta1
    from cdigen.plugin.dra.api import pluginregistration_v1_pb2 as reg

    assert v1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == (
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    )
    assert v1beta1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == (
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    )
    assert reg.DESCRIPTOR.services_by_name["Registration"].full_name == (
        "pluginregistration.Registration"
    )
    assert health.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name == (
        "v1alpha1.DRAResourceHealth"
    )
    fields = {f.name: f.number for f in v1.Device.DESCRIPTOR.fields}
    assert fields == {
        "request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4, "share_id": 5,
    }  # fmt: skip
    info = {f.name: f.number for f in reg.PluginInfo.DESCRIPTOR.fields}
    assert info == {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
    for proto in PROTOS[1:]:
        assert "k8s.io/kubelet v0.36.3" in (REPO_ROOT / proto).read_text().splitlines()[1]


def test_protos_are_ours_under_the_projects_license() -> None:
    """Written here from the API's facts: our SPDX line, no upstream header or Go-only options."""
    license = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["license"]
    for proto in PROTOS:
        text = (REPO_ROOT / proto).read_text()
        assert text.splitlines()[0] == f"// SPDX-License-Identifier: {license}", proto
        assert "cdigen's definition of the kubelet" in text, proto
        for upstream in ("Copyright", "Licensed under", "Authors", "go_package", "gogoproto"):
            assert upstream not in text, (proto, upstream)
