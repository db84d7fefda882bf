"""The native strategy: CDI spec edits, found through the spec cache, as AllocateResponse fields."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cdigen.cdi.cache import SpecCache
from cdigen.cdi.validate import spec_problems
from cdigen.fileio import parse_document
from cdigen.plugin.deviceplugin.api import deviceplugin_pb2 as pb
from cdigen.plugin.deviceplugin.kubelet_requests import AllocateRefused
from cdigen.plugin.deviceplugin.native_edits import SpecEdits, fill_native

SPEC = """\
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: GPU-aaaa
  containerEdits:
    deviceNodes:
    - {path: /dev/nvidia0}
    env: [GPU_SPECIFIC=a]
- name: GPU-bbbb
  containerEdits:
    deviceNodes:
    - {path: /dev/nvidia1, hostPath: /host/dev/nvidia1, permissions: rw}
containerEdits:
  env: [NVIDIA_VISIBLE_DEVICES=void, CUDA_X=1]
  deviceNodes:
  - {path: /dev/nvidiactl}
  - {path: /dev/nvidia-uvm}
  mounts:
  - {hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15,
     containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15, options: [ro, nosuid, bind]}
  - {hostPath: /host/libcuda.so.1, containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.1,
     options: [ro, bind]}
  - {hostPath: /run/nvidia-persistenced/socket, containerPath: /run/nvidia-persistenced/socket,
     options: [rw, bind]}
  hooks:
  - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook,
     args: [nvidia-cdi-hook, update-ldcache]}
"""


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    doc = parse_document(SPEC, where="SPEC")
    assert spec_problems(doc) == []  # the fixture is a spec a runtime would load
    (tmp_path / "nvidia.yaml").write_text(SPEC)
    return tmp_path


def test_edits_merge_spec_wide_then_per_device(spec_dir: Path) -> None:
    edits = SpecEdits(SpecCache([spec_dir]))(["nvidia.com/gpu=GPU-aaaa", "nvidia.com/gpu=GPU-bbbb"])
    assert [n.path for n in edits.device_nodes] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia0",
        "/dev/nvidia1",
    ]
    assert edits.device_nodes[3].host_path == "/host/dev/nvidia1"
    assert edits.device_nodes[3].permissions == "rw"
    assert edits.env == ("NVIDIA_VISIBLE_DEVICES=void", "CUDA_X=1", "GPU_SPECIFIC=a")
    assert edits.hooks == ("createContainer",)


def test_response_fields_carry_the_edits(spec_dir: Path) -> None:
    response = pb.ContainerAllocateResponse()
    fill_native(response, SpecEdits(SpecCache([spec_dir]))(["nvidia.com/gpu=GPU-aaaa"]))
    assert dict(response.envs) == {
        "NVIDIA_VISIBLE_DEVICES": "void",
        "CUDA_X": "1",
        "GPU_SPECIFIC": "a",
    }
    assert [(d.container_path, d.host_path, d.permissions) for d in response.devices] == [
        ("/dev/nvidiactl", "/dev/nvidiactl", "rwm"),
        ("/dev/nvidia-uvm", "/dev/nvidia-uvm", "rwm"),
        ("/dev/nvidia0", "/dev/nvidia0", "rwm"),
    ]
    mounts = {m.container_path: (m.host_path, m.read_only) for m in response.mounts}
    assert mounts["/usr/lib/x86_64-linux-gnu/libcuda.so.1"] == ("/host/libcuda.so.1", True)
    assert mounts["/run/nvidia-persistenced/socket"][1] is False
    assert len(mounts) == 3


def test_unknown_name_is_refused_naming_it_and_the_spec_dirs(spec_dir: Path) -> None:
    with pytest.raises(AllocateRefused, match=re.escape(f"GPU-cccc (not defined in {spec_dir})")):
        SpecEdits(SpecCache([spec_dir]))(["nvidia.com/gpu=GPU-cccc"])


def test_spec_changes_are_picked_up(spec_dir: Path) -> None:
    lookup = SpecEdits(SpecCache([spec_dir]))
    with pytest.raises(AllocateRefused):
        lookup(["nvidia.com/gpu=GPU-cccc"])
    (spec_dir / "more.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
        "- name: GPU-cccc\n  containerEdits:\n    deviceNodes: [{path: /dev/nvidia2}]\n"
    )
    assert [n.path for n in lookup(["nvidia.com/gpu=GPU-cccc"]).device_nodes] == ["/dev/nvidia2"]


def test_each_spec_file_is_parsed_once_per_change(
    spec_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cdigen.cdi.cache as cache

    parsed: list[Path] = []
    real = cache.load_spec

    def counting(path: Path, priority: int) -> object:
        parsed.append(path)
        return real(path, priority)

    monkeypatch.setattr(cache, "load_spec", counting)
    lookup = SpecEdits(SpecCache([spec_dir]))
    lookup(["nvidia.com/gpu=GPU-aaaa"])
    lookup(["nvidia.com/gpu=GPU-bbbb"])
    assert parsed == [spec_dir / "nvidia.yaml"]
