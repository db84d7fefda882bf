"""NVML discovery through the pynvml double: round trips, failing GPUs, missing NVML, MIG, NUMA."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pynvml
import pytest

from cdigen.discover import load_node
from cdigen.discover.builtin import names
from cdigen.discover.nvml import read_mig_minors
from cdigen.errors import DiscoveryError
from cdigen.model import Link, Node
from tests.fakes.fake_pynvml import FakeNvml


def discover(nvml: FakeNvml, tmp_path: Path, *, host_files: bool = True) -> Node:
    sysfs, proc = tmp_path / "sys", tmp_path / "proc"
    if host_files:
        nvml.write_host_files(proc_root=proc)
    return load_node("nvml", sysfs_root=sysfs, proc_root=proc, nvml_module=nvml)


def without_name(node: Node) -> Node:
    return dataclasses.replace(node, name="")


@pytest.mark.parametrize("sample", names())
def test_discovery_through_the_double_equals_the_sample(sample: str, tmp_path: Path) -> None:
    expected = load_node(f"builtin:{sample}")
    nvml = FakeNvml(expected)
    assert discover(nvml, tmp_path) == without_name(expected)
    assert nvml.initialized == 0  # nvmlShutdown was called


def test_old_pynvml_returning_bytes(tmp_path: Path) -> None:
    expected = load_node("builtin:dgx-a100-mig-mixed")
    assert discover(FakeNvml(expected, legacy_bytes=True), tmp_path) == without_name(expected)


def test_nvswitch_pairs_count_min_of_their_switch_links(tmp_path: Path) -> None:
    node = load_node("builtin:dgx-a100")
    nvml = FakeNvml(node)
    assert all(remote.startswith("00000001:") for remote in nvml.lanes[0])  # wired to switches
    found = discover(nvml, tmp_path)
    assert {k.nvlinks for k in found.links} == {12}
    # A GPU with fewer active switch links pulls its pairs down to its own count.
    nvml.lanes[3] = nvml.lanes[3][:4]
    found = discover(nvml, tmp_path)
    assert found.link(3, 5).nvlinks == 4  # type: ignore[union-attr]
    assert found.link(0, 5).nvlinks == 12  # type: ignore[union-attr]


def test_direct_nvlinks_are_counted_per_pair(tmp_path: Path) -> None:
    node = load_node("builtin:dgx1-v100")
    nvml = FakeNvml(node)
    assert not any(r.startswith("00000001:") for lanes in nvml.lanes.values() for r in lanes)
    found = discover(nvml, tmp_path)
    assert found.link(0, 3) == Link(a=0, b=3, pcie="PHB", nvlinks=2)
    assert found.link(0, 5) == Link(a=0, b=5, pcie="SYS", nvlinks=0)


def test_a_failing_gpu_does_not_stop_the_others(tmp_path: Path) -> None:
    node = load_node("builtin:ws-4xv100")
    lost = pynvml.NVML_ERROR_GPU_IS_LOST
    nvml = FakeNvml(node, fail={"nvmlDeviceGetMemoryInfo": {2: lost}})
    found = discover(nvml, tmp_path)
    assert found.gpus[2].error == "nvmlDeviceGetMemoryInfo failed: GPU is lost"
    assert found.gpus[2].memory_bytes == 0
    assert found.gpus[2].uuid == node.gpus[2].uuid  # what could be read is kept
    others = [g for g in found.gpus if g.index != 2]
    assert others == [g for g in node.gpus if g.index != 2]
    assert all(g.error is None for g in others)


def test_a_gpu_without_a_handle_gets_placeholders(tmp_path: Path) -> None:
    node = load_node("builtin:pcie-8x4090")
    nvml = FakeNvml(node, fail={"nvmlDeviceGetHandleByIndex": {5: pynvml.NVML_ERROR_GPU_IS_LOST}})
    found = discover(nvml, tmp_path)
    gpu = found.gpus[5]
    assert gpu.error == "nvmlDeviceGetHandleByIndex failed: GPU is lost"
    assert (gpu.uuid, gpu.minor, gpu.pci_bus_id) == ("GPU-unknown-index5", -1, "")
    assert found.link(4, 5) is None and found.link(4, 6) is not None
    assert len(found.gpus) == 8


def test_a_failing_gpu_round_trips_through_a_node_file(tmp_path: Path) -> None:
    from cdigen.nodefile import dump_node, load_node_file

    node = load_node("builtin:pcie-8x4090")
    nvml = FakeNvml(node, fail={"nvmlDeviceGetHandleByIndex": {5: pynvml.NVML_ERROR_GPU_IS_LOST}})
    found = discover(nvml, tmp_path)
    path = tmp_path / "node.yaml"
    path.write_text(dump_node(found))
    assert load_node_file(path) == found


def test_nvml_library_missing(tmp_path: Path) -> None:
    nvml = FakeNvml(load_node("builtin:rtx4090"), library_missing=True)
    with pytest.raises(DiscoveryError) as err:
        discover(nvml, tmp_path)
    message = str(err.value)
    assert "NVML library not found" in message and "--node builtin:" in message
    assert err.value.exit_code == 2


def test_driver_not_loaded(tmp_path: Path) -> None:
    class NoDriver(FakeNvml):
        def nvmlInit(self) -> None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    with pytest.raises(DiscoveryError, match="kernel driver is not loaded"):
        discover(NoDriver(load_node("builtin:rtx4090")), tmp_path)


def test_pynvml_not_importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(DiscoveryError, match=r"pynvml, from nvidia-ml-py\) is not installed"):
        load_node("nvml", sysfs_root=tmp_path, proc_root=tmp_path)


def test_real_pynvml_without_a_driver_is_a_discovery_error(tmp_path: Path) -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - only on a machine with a GPU driver
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(DiscoveryError, match="NVML"):
        load_node("nvml", sysfs_root=tmp_path, proc_root=tmp_path)


def test_numa_falls_back_to_sysfs(tmp_path: Path) -> None:
    node = load_node("builtin:dgx-a100")
    nvml = FakeNvml(node, memory_affinity=False)
    nvml.write_host_files(sysfs_root=tmp_path / "sys")
    found = discover(nvml, tmp_path)
    assert [g.numa_node for g in found.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert "nvmlDeviceGetMemoryAffinity" in nvml.calls


def test_numa_unknown_without_nvml_or_sysfs(tmp_path: Path) -> None:
    nvml = FakeNvml(load_node("builtin:dgx-a100"), memory_affinity=False)
    sysfs = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:07:00.0"
    sysfs.mkdir(parents=True)
    (sysfs / "numa_node").write_text("-1\n")
    found = discover(nvml, tmp_path)
    assert {g.numa_node for g in found.gpus} == {None}


def test_mig_devices_and_cap_minors(tmp_path: Path) -> None:
    node = load_node("builtin:dgx-a100-mig-mixed")
    found = discover(FakeNvml(node), tmp_path)
    gpu0 = found.gpus[0]
    assert gpu0.mig_enabled
    assert [(m.profile, m.gi_id, m.ci_id) for m in gpu0.mig_devices] == [
        ("3g.40gb", 1, 0), ("2g.20gb", 5, 0), ("1g.10gb", 13, 0), ("1g.10gb", 14, 0),
    ]  # fmt: skip
    assert gpu0.mig_devices[0].cap_minors == (12, 13)
    assert not found.gpus[5].mig_enabled and found.gpus[5].mig_devices == ()


def test_mig_devices_without_the_caps_file_have_no_minors(tmp_path: Path) -> None:
    found = discover(FakeNvml(load_node("builtin:h100-mig-single")), tmp_path, host_files=False)
    assert all(m.cap_minors == () for g in found.gpus for m in g.mig_devices)
    assert sum(len(g.mig_devices) for g in found.gpus) == 56


def test_mig_minors_file_format(tmp_path: Path) -> None:
    caps = tmp_path / "driver" / "nvidia-caps"
    caps.mkdir(parents=True)
    (caps / "mig-minors").write_text(
        "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n"
        "gpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu1/gi2/ci3/access 160\n"
    )
    minors = read_mig_minors(tmp_path)
    assert minors[(0, 1)] == 12 and minors[(0, 1, 0)] == 13 and minors[(1, 2, 3)] == 160
    assert read_mig_minors(tmp_path / "elsewhere") == {}


def test_mig_minors_not_text_reads_as_no_minors(tmp_path: Path) -> None:
    caps = tmp_path / "driver" / "nvidia-caps"
    caps.mkdir(parents=True)
    (caps / "mig-minors").write_bytes(b"\xff\xfe gpu0/gi1/access 12\n")
    assert read_mig_minors(tmp_path) == {}


def test_calls_before_init_fail_like_the_real_module() -> None:
    nvml = FakeNvml(load_node("builtin:rtx4090"))
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
