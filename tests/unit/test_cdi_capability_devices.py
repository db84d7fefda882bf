"""Issue 17 point 2, per device and per resource: capability devices in the spec
(``--capability-devices``) and the plugin resources that ask for more than the node-wide
capabilities (Allocate over real gRPC on unix sockets; the CDI library's own injection)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdigen.cdi.capabilities import CAPABILITIES
from cdigen.cdi.names import (
    capability_device_name,
    capability_of,
    device_name_problem,
    parse_qualified_name,
)
from cdigen.cdi.spec import generate
from cdigen.cdi.validate import spec_problems
from cdigen.cdi.write import render_spec
from cdigen.errors import InputError
from cdigen.fileio import parse_document
from cdigen.nodefile import dump_node
from cdigen.plugin.deviceplugin.config import load_config
from cdigen.plugin.deviceplugin.generate_specs import write_specs
from cdigen.plugin.deviceplugin.runner import Plugin
from tests.cdihost import LIB_DIR, FakeHost, build_host, make_node
from tests.cdihost import spec_options as options
from tests.helpers.cdi_runtime import CdiRuntime, cdi_runtime
from tests.helpers.specs import upstream_schema_errors
from tests.kubelet_sim import KubeletSimulator

RHEL_DIR = "/usr/lib64"
GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
GRAPHICS = "nvidia.com/gpu=capability-graphics"
VULKAN_ICD = "/usr/share/vulkan/icd.d/nvidia_icd.json"
GRAPHICS_FILES = (
    VULKAN_ICD,
    "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
    f"{LIB_DIR}/libGLX_nvidia.so.0",
    f"{RHEL_DIR}/libGLX_nvidia.so.0",
    f"{LIB_DIR}/libEGL_nvidia.so.0",
    f"{RHEL_DIR}/libEGL_nvidia.so.0",
    f"{LIB_DIR}/libnvidia-egl-gbm.so.1",
)
GRAPHICS_LINKS = (f"{LIB_DIR}/libGLX_indirect.so.0", f"{LIB_DIR}/gbm/nvidia-drm_gbm.so")
VIDEO_FILES = (
    f"{LIB_DIR}/vdpau/libvdpau_nvidia.so.1",
    f"{RHEL_DIR}/vdpau/libvdpau_nvidia.so.1",
    f"{LIB_DIR}/libnvidia-encode.so.1",
    f"{RHEL_DIR}/libnvcuvid.so.1",
)


@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path / "host", make_node(2), graphics=True)


def device(spec: Any, name: str) -> dict[str, Any]:
    found = [d for d in spec["devices"] if d["name"] == name]
    assert len(found) == 1, f"{name} appears {len(found)} times"
    return found[0]["containerEdits"]  # type: ignore[no-any-return]


def mount_paths(edits: Any) -> dict[str, str]:
    return {m["containerPath"]: m["hostPath"] for m in edits.get("mounts", [])}


def links(edits: Any) -> set[str]:
    """The ``--link`` arguments of the edits' create-symlinks hooks."""
    out: set[str] = set()
    for hook in edits.get("hooks", []):
        if hook["args"][1] == "create-symlinks":
            out |= {a for a in hook["args"][2:] if a != "--link"}
    return out


# --- the spec ---------------------------------------------------------------------------------


def test_capability_device_names_follow_the_cdi_name_rules() -> None:
    for cap in CAPABILITIES:
        name = capability_device_name(cap)
        assert device_name_problem(name) is None
        assert parse_qualified_name(f"{GPU}={name}") == ("nvidia.com", "gpu", name)
        assert capability_of(f"{GPU}={name}") == capability_of(name) == cap
    assert capability_of(f"{GPU}=GPU-0000") is None and capability_of("0") is None


def test_capability_devices_hold_what_each_adds_and_nothing_else_changes(fake: FakeHost) -> None:
    default = generate(fake.node, options(fake))
    spec = generate(fake.node, options(fake, capability_devices=("graphics", "video")))
    # the GPU devices, all and the common edits are the default spec's, unchanged
    assert spec["containerEdits"] == default["containerEdits"]
    assert spec["devices"][: len(default["devices"])] == default["devices"]
    added = [d["name"] for d in spec["devices"][len(default["devices"]) :]]
    assert added == ["capability-graphics", "capability-video"]
    graphics = mount_paths(device(spec, "capability-graphics"))
    video = mount_paths(device(spec, "capability-video"))
    for path in (*GRAPHICS_FILES, *GRAPHICS_LINKS):
        assert path in graphics and path not in video, path
    for path in VIDEO_FILES:
        assert path in video and path not in graphics, path
    # together they are exactly what --capabilities adds, file for file
    common = mount_paths(default["containerEdits"])
    asked = options(fake, capabilities=("compute", "utility", "graphics", "video"))
    whole = mount_paths(generate(fake.node, asked)["containerEdits"])
    assert {**common, **graphics, **video} == whole
    assert not (set(graphics) | set(video)) & set(common)
    for name in ("capability-graphics", "capability-video"):
        assert set(device(spec, name)) == {"mounts"}  # no device nodes, env or hooks
    assert spec["cdiVersion"] == default["cdiVersion"] == "0.5.0"  # the lowest the content needs
    assert spec_problems(spec) == []
    assert upstream_schema_errors(spec) == []


def test_with_hooks_a_capability_device_adds_only_its_own_links(fake: FakeHost) -> None:
    hook = str(fake.driver_root / "usr/bin/nvidia-cdi-hook")
    default = generate(fake.node, options(fake, hook_path=hook))
    spec = generate(fake.node, options(fake, hook_path=hook, capability_devices=("graphics",)))
    graphics = device(spec, "capability-graphics")
    assert [(h["path"], h["args"][:2]) for h in graphics["hooks"]] == [
        (hook, ["nvidia-cdi-hook", "create-symlinks"])
    ]  # update-ldcache and enable-cuda-compat run once, from the common edits
    asked = options(fake, hook_path=hook, capabilities=("compute", "utility", "graphics"))
    whole = generate(fake.node, asked)["containerEdits"]
    assert links(graphics) == links(whole) - links(default["containerEdits"])
    assert f"libGLX_nvidia.so.0::{LIB_DIR}/libGLX_indirect.so.0" in links(graphics)
    assert f"{LIB_DIR}/libGLX_indirect.so.0" not in mount_paths(graphics)  # the hook makes it
    assert f"{LIB_DIR}/libGLX_nvidia.so.0" in mount_paths(graphics)
    assert spec["containerEdits"] == default["containerEdits"]
    assert spec_problems(spec) == []


def cdigen(fake: FakeHost, *extra: str) -> subprocess.CompletedProcess[str]:
    node_file = fake.base / "node.yaml"
    node_file.write_text(dump_node(fake.node, "yaml"))
    return subprocess.run(
        [
            sys.executable, "-m", "cdigen.cli", "generate", "--node", str(node_file),
            "--driver-root", str(fake.driver_root), "--dev-root", str(fake.dev_root),
            "--sysfs-root", str(fake.sysfs_root), *extra,
        ],
        capture_output=True, text=True,
    )  # fmt: skip


def test_cli_all_skips_the_common_ones_and_warns_once_for_a_capability_without_files(
    fake: FakeHost,
) -> None:
    plain = cdigen(fake, "--dry-run")
    run = cdigen(fake, "--dry-run", "--capability-devices", "all")
    assert run.returncode == 0, run.stderr
    names = [d["name"] for d in parse_document(run.stdout, where="stdout")["devices"]]
    assert [n for n in names if n.startswith("capability-")] == [
        "capability-video", "capability-graphics",
    ]  # fmt: skip  # compute and utility are common edits; the fake host has no X11 files
    warnings = run.stderr.strip().splitlines()
    assert len(warnings) == 1 and "capability-display" in warnings[0], run.stderr
    assert warnings[0].startswith("cdigen: warning: --capability-devices: no display files")
    # asking only for what the common edits have changes nothing, byte for byte
    same = cdigen(fake, "--dry-run", "--capability-devices", "compute,utility")
    assert same.returncode == 0 and same.stderr == plain.stderr
    assert same.stdout == plain.stdout
    more = cdigen(fake, "--dry-run", "--capabilities", "graphics", "--capability-devices", "video")
    names = [d["name"] for d in parse_document(more.stdout, where="stdout")["devices"]]
    assert "capability-video" in names and "capability-graphics" not in names


def test_cli_writes_a_spec_that_validates_and_refuses_an_unknown_capability(
    fake: FakeHost, tmp_path: Path
) -> None:
    out = tmp_path / "cdi"
    run = cdigen(fake, "--output-dir", str(out), "--capability-devices", "graphics,video")
    assert run.returncode == 0, run.stderr
    assert "(7 devices, cdiVersion 0.5.0)" in run.stdout  # 2 GPUs by index and UUID, all, 2
    check = subprocess.run(
        [sys.executable, "-m", "cdigen.cli", "validate", str(out)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    bad = cdigen(fake, "--dry-run", "--capability-devices", "graphics,vulkan")
    assert bad.returncode == 2 and bad.stdout == ""
    assert len(bad.stderr.strip().splitlines()) == 1
    assert "unknown driver capability 'vulkan'" in bad.stderr
    assert "--capability-devices" in bad.stderr


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiRuntime]:
    yield from cdi_runtime(tmp_path_factory)


def recording_hook(fake: FakeHost) -> Path:
    """A stand-in ``nvidia-cdi-hook`` (nvidia-container-toolkit is not in the registries) that
    runc runs as the spec's hooks say: it appends its arguments to the returned log."""
    log = fake.base / "hook.log"
    hook = fake.driver_root / "usr/bin/nvidia-cdi-hook"
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    hook.chmod(0o755)
    return log


@pytest.mark.parametrize("hooks", [False, True])
def test_the_cdi_library_injects_a_gpu_with_its_capability_device(
    fake: FakeHost, tmp_path: Path, hooks: bool, podman: CdiRuntime
) -> None:
    """podman (its CDI library, then runc) gives a container the GPU with and without its
    graphics capability device: only the first sees the Vulkan ICD (the host file's text) and
    the GLX library, both get the same device nodes, and runc runs the create-symlinks hook
    with the glvnd link."""
    if not fake.real_nodes:
        pytest.skip("mknod is not permitted here, so the device nodes are plain files")
    log = recording_hook(fake)
    hook = str(fake.driver_root / "usr/bin/nvidia-cdi-hook") if hooks else None
    spec = generate(fake.node, options(fake, hook_path=hook, capability_devices=("graphics",)))
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / "nvidia.com-gpu.yaml").write_text(render_spec(spec, "yaml"))
    uuid = fake.node.gpus[0].uuid
    with_graphics = podman.run(spec_dir, [f"{GPU}={uuid}", GRAPHICS], read=[VULKAN_ICD])
    assert with_graphics.ok, with_graphics.error
    icd = (fake.driver_root / VULKAN_ICD.lstrip("/")).read_text()
    assert with_graphics.files[VULKAN_ICD].strip() == icd.strip()
    assert f"{RHEL_DIR}/libGLX_nvidia.so.0" in with_graphics.mounts
    ran = log.read_text() if log.exists() else ""
    assert (f"libGLX_nvidia.so.0::{LIB_DIR}/libGLX_indirect.so.0" in ran) is hooks, ran
    without = podman.run(spec_dir, [f"{GPU}={uuid}"], read=[VULKAN_ICD])
    assert without.ok, without.error
    assert VULKAN_ICD not in without.mounts and VULKAN_ICD not in without.files
    assert with_graphics.nodes == without.nodes  # the capability device adds files, not devices
    assert f"/dev/nvidia{fake.node.gpus[0].minor}" in without.nodes


# --- the plugin: resources that ask for more --------------------------------------------------


def plugin_config(tmp_path: Path, fake: FakeHost, *, generate_specs: bool = True) -> Path:
    path = tmp_path / "plugin.yaml"
    path.write_text(
        f"driverRoot: {fake.driver_root}\n"
        f"devRoot: {fake.dev_root}\n"
        f"specDir: {tmp_path / 'cdi'}\n"
        f"generateSpecs: {str(generate_specs).lower()}\n"
        "resources:\n"
        f"  - name: {GPU}\n"
        "    gpus: [0]\n"
        "    capabilities: [compute, utility, graphics]\n"
        f"  - name: {SHARED}\n"
        "    gpus: [1]\n"
        "    sharing: {replicas: 2}\n"
        "    capabilities: [compute, utility]\n"  # the node-wide ones: nothing extra
    )
    return path


def serve(
    tmp_path: Path, fake: FakeHost, strategy: str, *, generate_specs: bool = True
) -> Iterator[KubeletSimulator]:
    """The plugin serving both resources to the kubelet simulator, until the loop ends."""
    config = load_config(
        plugin_config(tmp_path, fake, generate_specs=generate_specs),
        env={},
        flags={"plugin_dir": tmp_path / "plugins", "device_list_strategy": strategy},
    )
    plugin = Plugin(config, node=fake.node)
    with KubeletSimulator(config.plugin_dir) as kubelet:
        plugin.start()
        try:
            kubelet.wait_registered(GPU)
            kubelet.wait_registered(SHARED)
            yield kubelet
        finally:
            plugin.stop()


def names(response: Any) -> list[list[str]]:
    return [[d.name for d in c.cdi_devices] for c in response.container_responses]


def test_allocate_adds_the_capability_device_for_the_resource_that_asks(
    tmp_path: Path, fake: FakeHost, podman: CdiRuntime
) -> None:
    u0, u1 = (g.uuid for g in fake.node.gpus)
    for kubelet in serve(tmp_path, fake, "cdi-cri"):
        # generateSpecs wrote the capability devices the resources ask for, and only those
        spec = parse_document((tmp_path / "cdi/nvidia.com-gpu.yaml").read_text(), where="spec")
        capability = [d["name"] for d in spec["devices"] if d["name"].startswith("capability")]
        assert capability == ["capability-graphics"]
        assert all(d.health == "Healthy" for d in kubelet.wait_devices(GPU))
        whole = kubelet.allocate(GPU, [[u0], [u0]])
        assert names(whole) == [[f"{GPU}={u0}", GRAPHICS]] * 2
        shared = kubelet.allocate(SHARED, [[f"{u1}::0"]])
        assert names(shared) == [[f"{GPU}={u1}"]]
        # what a runtime (podman) makes of the names Allocate returned
        if not fake.real_nodes:
            return
        got = podman.run(tmp_path / "cdi", names(whole)[0])
        assert got.ok and VULKAN_ICD in got.mounts, got.error
        got = podman.run(tmp_path / "cdi", names(shared)[0])
        assert got.ok and VULKAN_ICD not in got.mounts, got.error


def _whole_and_shared(kubelet: Any, uuid: str, other: str) -> tuple[Any, Any]:
    """The container responses to Allocate of the whole GPU ``uuid`` (a resource asking for
    graphics) and of a shared replica of GPU ``other`` (a resource that does not)."""
    whole = kubelet.allocate(GPU, [[uuid]]).container_responses[0]
    shared = kubelet.allocate(SHARED, [[f"{other}::1"]]).container_responses[0]
    return whole, shared


def test_native_strategy_mounts_the_capability_files_for_that_resource_only(
    tmp_path: Path, fake: FakeHost
) -> None:
    u0, u1 = (g.uuid for g in fake.node.gpus)
    for kubelet in serve(tmp_path, fake, "native"):
        whole, shared = _whole_and_shared(kubelet, u0, u1)
        whole_mounts = {m.container_path: m.host_path for m in whole.mounts}
        assert whole_mounts[VULKAN_ICD] == str(fake.driver_root / VULKAN_ICD.lstrip("/"))
        assert f"{RHEL_DIR}/libEGL_nvidia.so.0" in whole_mounts
        assert VULKAN_ICD not in {m.container_path for m in shared.mounts}
        # each gets its GPU's device node, and both the common libraries
        for response, gpu in ((whole, fake.node.gpus[0]), (shared, fake.node.gpus[1])):
            assert f"/dev/nvidia{gpu.minor}" in {d.container_path for d in response.devices}
            assert f"{LIB_DIR}/libcuda.so.1" in {m.container_path for m in response.mounts}


def test_envvar_strategy_tells_the_nvidia_runtime_the_capabilities(
    tmp_path: Path, fake: FakeHost
) -> None:
    """No CDI names under envvar: nvidia-container-runtime reads NVIDIA_DRIVER_CAPABILITIES."""
    u0, u1 = (g.uuid for g in fake.node.gpus)
    for kubelet in serve(tmp_path, fake, "envvar"):
        whole, shared = _whole_and_shared(kubelet, u0, u1)
        assert dict(whole.envs) == {
            "NVIDIA_VISIBLE_DEVICES": u0,
            "NVIDIA_DRIVER_CAPABILITIES": "compute,utility,graphics",
        }
        assert "NVIDIA_DRIVER_CAPABILITIES" not in shared.envs  # the runtime's own default
        assert shared.envs["NVIDIA_VISIBLE_DEVICES"] == u1


def test_a_resource_asking_for_a_capability_the_spec_lacks_is_unhealthy(
    tmp_path: Path, fake: FakeHost, caplog: pytest.LogCaptureFixture
) -> None:
    # the spec written without --capability-devices: no capability-graphics to hand out
    run = cdigen(fake, "--output-dir", str(tmp_path / "cdi"))
    assert run.returncode == 0, run.stderr
    for kubelet in serve(tmp_path, fake, "cdi-cri", generate_specs=False):
        gpus = kubelet.wait_devices(GPU, lambda ds: all(d.health == "Unhealthy" for d in ds))
        assert len(gpus) == 1
        shares = kubelet.wait_devices(SHARED)
        assert shares and all(d.health == "Healthy" for d in shares)
        fix = f"--output-dir {tmp_path / 'cdi'} --capability-devices graphics')"
        assert fix in caplog.text  # the command that fixes it


# --- the plugin config ------------------------------------------------------------------------


def test_config_names_what_each_resource_asks_beyond_the_node_wide_capabilities(
    tmp_path: Path,
) -> None:
    path = tmp_path / "plugin.yaml"
    path.write_text(
        "capabilities: [compute, utility, video]\n"
        "resources:\n"
        f"  - name: {GPU}\n"
        "    gpus: [0]\n"
        "    capabilities: [video, graphics, compute]\n"
        f"  - name: {SHARED}\n"
        "    gpus: [1]\n"
        "    sharing: {replicas: 2}\n"
        "    capabilities: [all]\n"
        "  - name: example.com/plain\n"
        "    gpus: [2]\n"
        "    sharing: {replicas: 3}\n"
    )
    config = load_config(path, env={})
    assert config.extra_capabilities(GPU) == ("graphics",)
    assert config.extra_capabilities(SHARED) == ("graphics", "display")
    assert config.extra_capabilities("example.com/plain") == ()
    assert config.capability_devices == ("graphics", "display")
    # --resource renames the one resource and keeps what it asks for
    one = tmp_path / "one.yaml"
    one.write_text(f"resources:\n  - name: {GPU}\n    capabilities: [compute, video]\n")
    renamed = load_config(one, env={}, flags={"resource": "example.com/gpu"})
    assert renamed.extra_capabilities("example.com/gpu") == ("video",)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("capabilities: [compute, vulkan]", "resources[0].capabilities[1]"),
        ("capabilities: graphics", "resources[0].capabilities"),
        ("capabilities: []", "resources[0].capabilities"),
    ],
)
def test_bad_resource_capabilities_are_one_line_errors(
    tmp_path: Path, entry: str, message: str
) -> None:
    path = tmp_path / "plugin.yaml"
    path.write_text(f"resources:\n  - name: {GPU}\n    {entry}\n")
    with pytest.raises(InputError, match=re.escape(message)) as caught:
        load_config(path, env={})
    assert "\n" not in str(caught.value)
    run = subprocess.run(
        [sys.executable, "-m", "cdigen.cli", "plugin", "serve", "--config", str(path),
         "--node", "builtin:rtx4090", "--plugin-dir", str(tmp_path / "plugins")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and message in lines[0], run.stderr


def test_generate_specs_reads_the_configured_sysfs_root(tmp_path: Path, fake: FakeHost) -> None:
    """The plugin's spec has each GPU's DRM nodes, found under ``sysfsRoot`` as ``generate
    --sysfs-root`` finds them (it used to read the machine's /sys whatever the config said)."""
    config = plugin_config(tmp_path, fake)
    config.write_text(config.read_text() + f"sysfsRoot: {fake.sysfs_root}\n")
    loaded = load_config(config, env={}, flags={"plugin_dir": tmp_path / "plugins"})
    spec = parse_document(write_specs(fake.node, loaded).read_text(), where="spec")
    for gpu in fake.node.gpus:
        nodes = [n["path"] for n in device(spec, gpu.uuid)["deviceNodes"]]
        assert [p for p in nodes if p.startswith("/dev/dri/card")], nodes
