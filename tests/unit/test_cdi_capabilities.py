"""Issue 17 and issue 13 point 1: libraries every image finds, hooks, capabilities, IPC safety."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdigen.cdi.capabilities import CAPABILITIES, parse_capabilities
from cdigen.cdi.hostfs import HOST
from cdigen.cdi.ipc import ipc_problem
from cdigen.cdi.spec import generate
from cdigen.cdi.validate import spec_problems
from cdigen.cdi.write import render_spec
from cdigen.errors import InputError
from cdigen.nodefile import dump_node
from tests.cdihost import (
    CONFIG_FILES,
    DRIVER_VERSION,
    LIB_DIR,
    FakeHost,
    build_host,
    make_node,
)
from tests.cdihost import spec_options as options
from tests.helpers.cdi_runtime import CdiRuntime, cdi_runtime

RHEL_DIR = "/usr/lib64"


def mounts(spec: Any) -> dict[str, dict[str, Any]]:
    return {m["containerPath"]: m for m in spec["containerEdits"].get("mounts", [])}


@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path, make_node(2), graphics=True)


def test_soname_and_linker_names_in_both_library_dir_families(fake: FakeHost) -> None:
    spec = generate(fake.node, options(fake))
    found = mounts(spec)
    for directory in (LIB_DIR, RHEL_DIR):
        for name in (
            "libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1", "libnvidia-ml.so",
            "libnvidia-ptxjitcompiler.so.1", "libnvidia-ptxjitcompiler.so",
            "libnvidia-nvvm.so.4", "libnvidia-nvvm.so",
        ):  # fmt: skip
            stem = name.partition(".so")[0]
            assert found[f"{directory}/{name}"]["hostPath"] == str(
                fake.driver_root / f"{LIB_DIR.lstrip('/')}/{stem}.so.{DRIVER_VERSION}"
            )
    destinations = [m["containerPath"] for m in spec["containerEdits"]["mounts"]]
    assert len(destinations) == len(set(destinations))  # runtimes refuse duplicates
    assert "hooks" not in spec["containerEdits"]
    assert f"TRITON_LIBCUDA_PATH={LIB_DIR}" in spec["containerEdits"]["env"]
    assert spec["cdiVersion"] == "0.5.0"  # the lowest rule holds: digits in names
    assert spec_problems(spec) == []


def test_hooks_when_the_host_has_nvidia_cdi_hook_and_none_with_no_hooks(tmp_path: Path) -> None:
    fake = build_host(tmp_path, make_node(1), hook=True)
    node_file = tmp_path / "node.yaml"
    node_file.write_text(dump_node(fake.node, "yaml"))

    def run(*extra: str) -> dict[str, Any]:
        result = subprocess.run(
            [
                sys.executable, "-m", "cdigen.cli", "generate", "--dry-run", "--format", "json",
                "--node", str(node_file), "--driver-root", str(fake.driver_root),
                "--dev-root", str(fake.dev_root), "--sysfs-root", str(fake.sysfs_root), *extra,
            ],
            capture_output=True, text=True,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)  # type: ignore[no-any-return]

    hooked = run()
    hooks = hooked["containerEdits"]["hooks"]
    hook = str(fake.driver_root / "usr/bin/nvidia-cdi-hook")
    assert [(h["path"], h["args"][1]) for h in hooks] == [
        (hook, "create-symlinks"), (hook, "enable-cuda-compat"), (hook, "update-ldcache"),
    ]  # fmt: skip
    # linker names come from the hook; SONAME paths stay mounted for images the cache misses
    assert f"{RHEL_DIR}/libcuda.so" not in mounts(hooked)
    assert f"{RHEL_DIR}/libcuda.so.1" in mounts(hooked)
    assert not any(e.startswith("TRITON") for e in hooked["containerEdits"]["env"])
    plain = run("--no-hooks")
    assert "hooks" not in plain["containerEdits"]
    assert f"{RHEL_DIR}/libcuda.so" in mounts(plain)


def test_no_hooks_and_hook_path_together_is_a_usage_error(fake: FakeHost) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cdigen.cli", "generate", "--dry-run", "--node", "builtin:dgx-a100",
         "--no-hooks", "--hook-path", "/usr/bin/nvidia-cdi-hook"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "--no-hooks" in result.stderr


def test_graphics_and_video_add_their_files_and_the_default_leaves_them_out(
    fake: FakeHost,
) -> None:
    default = mounts(generate(fake.node, options(fake)))
    more = mounts(generate(fake.node, options(fake, capabilities=("graphics", "video"))))
    video = [
        f"{LIB_DIR}/libnvidia-encode.so.1", f"{LIB_DIR}/libnvcuvid.so.1",
        f"{LIB_DIR}/vdpau/libvdpau_nvidia.so.1", f"{RHEL_DIR}/vdpau/libvdpau_nvidia.so.1",
    ]  # fmt: skip
    graphics = [
        f"{LIB_DIR}/libGLX_nvidia.so.0", f"{RHEL_DIR}/libEGL_nvidia.so.0",
        f"{LIB_DIR}/libGLX_indirect.so.0", f"{LIB_DIR}/gbm/nvidia-drm_gbm.so",
        f"{LIB_DIR}/libnvidia-egl-gbm.so.1",
    ]  # fmt: skip
    configs = [c for c in CONFIG_FILES.values() if "OpenCL" not in c]
    for path in video + graphics + configs:
        assert path in more and path not in default, path
    # the Vulkan layer file found under /etc goes where the loader reads it
    layer = "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json"
    assert more[layer]["hostPath"] == str(
        fake.driver_root / "etc/vulkan/implicit_layer.d/nvidia_layers.json"
    )
    assert "/etc/OpenCL/vendors/nvidia.icd" in default  # OpenCL is compute
    assert f"{LIB_DIR}/libnvidia-ml.so.1" not in more  # utility was not asked for
    only_compute = mounts(generate(fake.node, options(fake, capabilities=("compute",))))
    assert f"{LIB_DIR}/libnvidia-ml.so.1" not in only_compute
    assert "/usr/bin/nvidia-smi" not in only_compute


def test_capability_names() -> None:
    assert parse_capabilities("video, graphics") == ("video", "graphics")
    assert parse_capabilities("all") == CAPABILITIES
    with pytest.raises(InputError, match="unknown driver capability 'gpu'"):
        parse_capabilities("compute,gpu")
    with pytest.raises(InputError):
        parse_capabilities("")


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiRuntime]:
    yield from cdi_runtime(tmp_path_factory)


@pytest.mark.parametrize(
    "caps", [("compute", "utility"), ("compute",), ("utility",), ("video",), ("graphics",),
             ("display",), CAPABILITIES],
)  # fmt: skip
@pytest.mark.parametrize("hooks", [False, True])
def test_podman_injects_every_capability_set(
    fake: FakeHost, tmp_path: Path, podman: CdiRuntime, caps: tuple[str, ...], hooks: bool
) -> None:
    """podman (the CDI library it vendors, then runc) starts a container given
    ``nvidia.com/gpu=0`` and ``nvidia.com/gpu=all`` from the spec of each capability set, with
    and without hooks, and the container has every device node the spec names (the host node's
    major and minor) and every mount destination. runc runs the hooks: where the spec has them,
    the host gets a stand-in ``nvidia-cdi-hook`` that exits 0 (nvidia-container-toolkit is not
    in the registries)."""
    if not fake.real_nodes:
        pytest.skip("mknod is not permitted here, so the device nodes are plain files")
    hook = fake.driver_root / "usr/bin/nvidia-cdi-hook"
    if hooks:
        hook.parent.mkdir(parents=True, exist_ok=True)
        hook.write_text("#!/bin/sh\nexit 0\n")
        hook.chmod(0o755)
    spec = generate(
        fake.node, options(fake, capabilities=caps, hook_path=str(hook) if hooks else None)
    )
    assert spec_problems(spec) == []
    assert ("hooks" in spec["containerEdits"]) is hooks
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / "nvidia.com-gpu.yaml").write_text(render_spec(spec, "yaml"))
    container = podman.run(spec_dir, ["nvidia.com/gpu=0", "nvidia.com/gpu=all"])
    assert container.ok, container.error
    edits = [spec["containerEdits"]] + [
        d["containerEdits"] for d in spec["devices"] if d["name"] in ("0", "all")
    ]
    nodes = {
        n["path"]: n.get("hostPath", n["path"]) for e in edits for n in e.get("deviceNodes", [])
    }
    assert {
        path: (os.major(os.stat(host).st_rdev), os.minor(os.stat(host).st_rdev))
        for path, host in nodes.items()
    } == {path: container.nodes.get(path) for path in nodes}
    destinations = {m["containerPath"] for e in edits for m in e.get("mounts", [])}
    assert destinations and destinations <= set(container.mounts)


def _socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cwd = os.getcwd()
    os.chdir(path.parent)
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(path.name)
    finally:
        os.chdir(cwd)


def test_mps_pipe_dir_is_never_in_the_spec(tmp_path: Path) -> None:
    fake = build_host(tmp_path, make_node(1))
    mps = fake.driver_root / "tmp/nvidia-mps"
    mps.mkdir(parents=True)
    assert "/tmp/nvidia-mps" not in mounts(generate(fake.node, options(fake)))


def test_ipc_symlinks_and_world_writable_places_are_refused(tmp_path: Path) -> None:
    fake = build_host(tmp_path, make_node(1), ipc=False)
    root = fake.driver_root
    # a symlink where persistenced's socket goes, to a directory outside
    (root / "run/nvidia-persistenced").mkdir(parents=True)
    os.symlink("/", root / "run/nvidia-persistenced/socket")
    # a socket in a world-writable directory
    (root / "var/run/nvidia-fabricmanager").mkdir(parents=True)
    (root / "var/run/nvidia-fabricmanager").chmod(0o1777)
    _socket(root / "var/run/nvidia-fabricmanager/socket")
    found = mounts(generate(fake.node, options(fake)))
    assert not any(p.endswith("/socket") for p in found)
    fs = HOST
    assert "symlink" in str(ipc_problem(str(root / "run/nvidia-persistenced/socket"), fs))
    assert "world-writable" in str(
        ipc_problem(str(root / "var/run/nvidia-fabricmanager/socket"), fs)
    )
    # the real MPS pipe dir may sit in /tmp; a symlink there may not
    tmp = root / "tmp"
    tmp.mkdir(exist_ok=True)
    tmp.chmod(0o1777)
    (tmp / "nvidia-mps").mkdir()
    assert ipc_problem(str(tmp / "nvidia-mps"), directory=True) is None
    os.rename(tmp / "nvidia-mps", tmp / "real")
    os.symlink("/", tmp / "nvidia-mps")
    assert "symlink" in str(ipc_problem(str(tmp / "nvidia-mps"), directory=True))


def test_driver_root_absolute_symlink_resolves_inside_the_root(tmp_path: Path) -> None:
    fake = build_host(tmp_path / "host", make_node(1))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "nvidia-smi").write_text("#!/bin/sh\necho outside\n")
    smi = fake.driver_root / "usr/bin/nvidia-smi"
    smi.unlink()
    os.symlink(str(outside / "nvidia-smi"), smi)  # absolute: outside the driver root
    assert "/usr/bin/nvidia-smi" not in mounts(generate(fake.node, options(fake)))
    # a target that exists inside the root is what --host-root would mount: use it
    inside = fake.driver_root / str(outside).lstrip("/")
    inside.mkdir(parents=True)
    (inside / "nvidia-smi").write_text("#!/bin/sh\necho inside\n")
    found = mounts(generate(fake.node, options(fake)))
    assert found["/usr/bin/nvidia-smi"]["hostPath"] == str(inside / "nvidia-smi")


def test_only_memory_slice_containers_get_the_mps_pipe_dir_read_only(tmp_path: Path) -> None:
    from cdigen.catalogue import share_ids
    from cdigen.plugin.deviceplugin.sharing import ShareRefused, Sharing, allocate_shares

    node = make_node(1)
    gpu = node.gpus[0]
    pipe = tmp_path / "nvidia-mps"
    pipe.mkdir(mode=0o755)
    sharing = Sharing(memory_slice_mib=1024, mps_pipe_directory=str(pipe))
    ids = share_ids(gpu, sharing)[:2]
    allocation = allocate_shares(ids, node, sharing, cdi_kind="nvidia.com/gpu", resource="r")
    assert [(m.host_path, m.container_path, m.read_only) for m in allocation.mounts] == [
        (str(pipe), str(pipe), True)
    ]
    # a whole-GPU container gets the spec's edits only, and those have no pipe dir
    pipe_in_tmp = tmp_path / "host"
    fake = build_host(pipe_in_tmp, node)
    (fake.driver_root / "tmp/nvidia-mps").mkdir(parents=True)
    assert not any("nvidia-mps" in p for p in mounts(generate(fake.node, options(fake))))
    # a pipe dir that is a symlink is refused, not mounted
    pipe.rmdir()
    os.symlink("/", pipe)
    with pytest.raises(ShareRefused, match="symlink"):
        allocate_shares(ids, node, sharing, cdi_kind="nvidia.com/gpu", resource="r")
