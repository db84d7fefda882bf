"""Spec content (names, device nodes, mounts, hooks, version) for fake hosts and built-in nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdigen.cdi.devnodes import CONTROL_NODES
from cdigen.cdi.spec import SpecOptions, generate, parse_name_strategies
from cdigen.cdi.validate import spec_problems
from cdigen.errors import InputError
from cdigen.model import Node
from tests.cdihost import DRIVER_VERSION, LIB_DIR, FakeHost, build_host, make_node
from tests.cdihost import spec_options as options
from tests.helpers.specs import upstream_schema_errors, upstream_validator


def device(spec: Any, name: str) -> dict[str, Any]:
    found = [d for d in spec["devices"] if d["name"] == name]
    assert len(found) == 1, f"{name} appears {len(found)} times"
    return found[0]  # type: ignore[no-any-return]


def node_paths(dev: dict[str, Any]) -> list[str]:
    return [n["path"] for n in dev["containerEdits"]["deviceNodes"]]


@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path, make_node(3, mig_gpu=2))


def test_names_nodes_and_all(fake: FakeHost) -> None:
    spec = generate(fake.node, options(fake))
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == "nvidia.com/gpu"
    gpu0, gpu1, gpu2 = fake.node.gpus
    names = [d["name"] for d in spec["devices"]]
    assert names == [
        "0", gpu0.uuid, "1", gpu1.uuid,
        "2:0", gpu2.mig_devices[0].uuid, "2:1", gpu2.mig_devices[1].uuid,
        "all",
    ]  # fmt: skip
    # by minor, not by index; DRM nodes of that GPU's PCI function
    assert node_paths(device(spec, "0")) == [
        f"/dev/nvidia{gpu0.minor}",
        "/dev/dri/card1",
        "/dev/dri/renderD128",
    ]
    assert device(spec, "0") == {**device(spec, gpu0.uuid), "name": "0"}
    assert node_paths(device(spec, "2:1")) == [
        f"/dev/nvidia{gpu2.minor}",
        "/dev/nvidia-caps/nvidia-cap75",
        "/dev/nvidia-caps/nvidia-cap76",
    ]
    all_paths = node_paths(device(spec, "all"))
    # two GPUs with DRM nodes, the MIG parent once, and four capability nodes
    assert len(all_paths) == len(set(all_paths)) == 3 + 3 + 1 + 4
    assert spec_problems(spec) == []


def test_node_fields_come_from_the_real_node(fake: FakeHost) -> None:
    if not fake.real_nodes:
        pytest.skip("mknod is not permitted here")
    spec = generate(fake.node, options(fake))
    gpu0 = fake.node.gpus[0]
    assert device(spec, "0")["containerEdits"]["deviceNodes"][0] == {
        "path": f"/dev/nvidia{gpu0.minor}",
        "hostPath": str(fake.dev_root / f"dev/nvidia{gpu0.minor}"),
        "type": "c",
        "major": 195,
        "minor": gpu0.minor,
        "fileMode": 0o666,
        "permissions": "rw",
    }
    control = spec["containerEdits"]["deviceNodes"]
    assert [n["path"] for n in control] == list(CONTROL_NODES)
    assert control[0]["major"] == 195 and control[0]["minor"] == 255


def test_mounts_versioned_and_soname_with_driver_root_in_host_path(fake: FakeHost) -> None:
    spec = generate(fake.node, options(fake))
    mounts = {m["containerPath"]: m for m in spec["containerEdits"]["mounts"]}
    versioned = f"{LIB_DIR}/libcuda.so.{DRIVER_VERSION}"
    host = str(fake.driver_root) + versioned
    assert mounts[versioned]["hostPath"] == host
    assert mounts[f"{LIB_DIR}/libcuda.so.1"]["hostPath"] == host
    assert mounts[versioned]["options"] == ["ro", "nosuid", "nodev", "rbind", "rprivate"]
    # without hooks: the linker name and the RHEL-family directory too
    for path in (f"{LIB_DIR}/libcuda.so", "/usr/lib64/libcuda.so.1", "/usr/lib64/libcuda.so"):
        assert mounts[path]["hostPath"] == host
    assert "/usr/bin/nvidia-smi" in mounts
    assert f"/lib/firmware/nvidia/{DRIVER_VERSION}/gsp_ga10x.bin" in mounts
    sock = mounts["/run/nvidia-persistenced/socket"]
    assert sock["options"] == ["ro", "nosuid", "nodev", "rbind", "rprivate", "noexec"]
    assert not any(m["containerPath"].startswith(str(fake.driver_root)) for m in mounts.values())


def test_no_hooks_without_a_hook_program(fake: FakeHost) -> None:
    spec = generate(fake.node, options(fake))
    assert "hooks" not in spec["containerEdits"]


def test_hooks_with_a_hook_program(fake: FakeHost) -> None:
    spec = generate(fake.node, options(fake, hook_path="/usr/bin/nvidia-cdi-hook"))
    hooks = spec["containerEdits"]["hooks"]
    assert [h["hookName"] for h in hooks] == ["createContainer"] * 3
    links = hooks[0]["args"]
    assert links[:2] == ["nvidia-cdi-hook", "create-symlinks"]
    for link in (f"{LIB_DIR}/libcuda.so", "/usr/lib64/libcuda.so"):
        assert f"libcuda.so.1::{link}" in links
    assert hooks[1]["args"] == [
        "nvidia-cdi-hook", "enable-cuda-compat", f"--host-driver-version={DRIVER_VERSION}",
    ]  # fmt: skip
    assert hooks[2]["args"] == [
        "nvidia-cdi-hook", "update-ldcache", "--folder", LIB_DIR, "--folder", "/opt/nvidia/lib64",
    ]  # fmt: skip
    assert spec_problems(spec) == []


def test_missing_device_nodes_keep_the_path_and_still_validate(tmp_path: Path) -> None:
    fake = build_host(tmp_path, make_node(1), dev_nodes=False)
    spec = generate(fake.node, options(fake))
    assert device(spec, "0")["containerEdits"]["deviceNodes"][0] == {
        "path": "/dev/nvidia0",
        "hostPath": str(fake.dev_root / "dev/nvidia0"),
    }
    assert "deviceNodes" not in spec["containerEdits"]  # control nodes: only those that exist
    assert len(device(spec, "0")["containerEdits"]["deviceNodes"]) == 1  # DRM nodes: the same
    assert spec_problems(spec) == []


def test_plain_host_root_has_no_host_paths(tmp_path: Path) -> None:
    spec = generate(
        make_node(1), SpecOptions(driver_root=str(tmp_path), dev_root="/", sysfs_root=str(tmp_path))
    )
    assert device(spec, "0")["containerEdits"]["deviceNodes"][0]["path"] == "/dev/nvidia0"
    assert all("hostPath" not in n for n in device(spec, "0")["containerEdits"]["deviceNodes"])


def test_name_strategies(fake: FakeHost) -> None:
    spec = generate(fake.node, options(fake, name_strategies=("type-index",)))
    assert [d["name"] for d in spec["devices"]] == ["gpu0", "gpu1", "mig2:0", "mig2:1", "all"]
    # no name starts with a digit and no device node has a hostPath... but these do: 0.5.0
    assert spec["cdiVersion"] == "0.5.0"
    assert parse_name_strategies("uuid, index") == ("uuid", "index")
    with pytest.raises(InputError, match="unknown device name strategy 'minor'"):
        parse_name_strategies("index,minor")


def test_version_floor_and_pinning(tmp_path: Path) -> None:
    node = make_node(1)
    plain = SpecOptions(
        driver_root=str(tmp_path), sysfs_root=str(tmp_path), name_strategies=("type-index",)
    )
    assert generate(node, plain)["cdiVersion"] == "0.3.0"
    pinned = SpecOptions(driver_root=str(tmp_path), sysfs_root=str(tmp_path), cdi_version="1.1.0")
    assert generate(node, pinned)["cdiVersion"] == "1.1.0"
    too_low = SpecOptions(driver_root=str(tmp_path), sysfs_root=str(tmp_path), cdi_version="0.4.0")
    with pytest.raises(InputError, match=r"--cdi-version: cdiVersion 0.4.0 is too low: .*digit"):
        generate(node, too_low)


def test_other_vendor_and_class(fake: FakeHost) -> None:
    spec = generate(fake.node, options(fake, vendor="example.com", cls="gpu.full"))
    assert spec["kind"] == "example.com/gpu.full" and spec["cdiVersion"] == "0.6.0"
    with pytest.raises(InputError, match="invalid vendor"):
        generate(fake.node, options(fake, vendor="-bad"))


def test_a_node_without_gpus_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no GPUs"):
        generate(Node(gpus=()), SpecOptions(driver_root=str(tmp_path), sysfs_root=str(tmp_path)))


def _builtin_nodes() -> list[str]:
    try:
        from cdigen.discover import builtin
    except ImportError:
        return []
    return list(builtin.names())


@pytest.mark.parametrize("name", _builtin_nodes() or ["<none>"])
def test_every_builtin_node_gives_a_valid_spec(name: str, tmp_path: Path) -> None:
    if name == "<none>":
        pytest.skip("cdigen.discover.builtin has no samples yet")
    from cdigen.discover import load_node

    node = load_node(f"builtin:{name}")
    fake = build_host(tmp_path, node)
    spec = generate(node, options(fake))
    assert spec_problems(spec) == []
    assert spec["cdiVersion"] == "0.5.0"
    assert sum(d["name"] == "all" for d in spec["devices"]) == 1
    assert upstream_schema_errors(spec) == []


def test_upstream_schema_is_weaker_than_ours() -> None:
    bad = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"env": ["NOEQUALS"], "x": 1}}],
    }
    assert list(upstream_validator().iter_errors(bad)) == []  # the reason ours exists
    assert len(spec_problems(bad)) == 2
