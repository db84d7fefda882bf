"""CUDA-style programs in a real Debian container find the driver libraries (issue 17).

A Debian bookworm root made with mmdebstrap (tests/debian_root.py, built once and cached), run
by podman + runc through an overlay (``--rootfs DIR:O``), so the cached root stays clean. The fake
host's libcuda and libnvidia-ml are real ELF stubs with the real SONAMEs, built here with gcc.

- Hook-free spec: a program linked against the stubs resolves libcuda.so.1 and libnvidia-ml.so.1
  with the image's own loader; ``gcc -lcuda`` links; the RHEL-family directory /usr/lib64 is
  checked by making the loader search only there (``ld.so --inhibit-cache --library-path
  /usr/lib64``: no cache, and that directory before the built-in ones, as a RHEL loader searches
  its built-in /usr/lib64), with LD_DEBUG showing where libcuda.so.1 came from.
- Spec with hooks: a stand-in ``nvidia-cdi-hook`` on the host (nvidia-container-toolkit is not
  installed here) does what the real one does for ``create-symlinks`` and ``update-ldcache``
  (links in the container's root; ``ldconfig`` run chrooted into it) so ``ldconfig -p`` lists the
  libraries; ``enable-cuda-compat`` is accepted and does nothing (no compat libraries in the image).
- Capability devices (``--capability-devices graphics``): a container given
  ``<kind>=capability-graphics`` beside its GPU sees the Vulkan ICD JSON and the GLX libraries
  (and the glvnd link, mounted or made by the hook); one given only the GPU sees none of them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cdigen.nodefile import dump_node
from tests.cdihost import DRIVER_VERSION, LIB_DIR, FakeHost, build_host, make_node
from tests.debian_root import cached_debian_root, missing_tools
from tests.helpers.podman import GRAPHICS_FILES, Podman, file_check

PACKAGES = ("gcc", "libc6-dev")
STUB_CUDA = "int cuInit(unsigned int flags) { return (int)flags + 100; }\n"
STUB_NVML = "int nvmlInit_v2(void) { return 7; }\n"
PROGRAM = (
    "#include <stdio.h>\nint cuInit(unsigned int);\nint nvmlInit_v2(void);\n"
    'int main(void) { printf("cuInit=%d nvmlInit=%d\\n", cuInit(1), nvmlInit_v2()); return 0; }\n'
)
# What nvidia-cdi-hook does for these three subcommands, for a runc createContainer hook: the
# OCI state on stdin names the bundle; its config.json names the root, here already holding
# the spec's bind mounts (createContainer runs in the container's mount namespace).
FAKE_HOOK = """#!{python}
import json, os, subprocess, sys
state = json.load(sys.stdin)
with open(os.path.join(state["bundle"], "config.json")) as f:
    root = json.load(f)["root"]["path"]
root = os.path.join(state["bundle"], root)
args = sys.argv[1:]
command, rest = args[0], args[1:]
if command == "create-symlinks":
    for target, link in (v.split("::") for k, v in zip(rest[::2], rest[1::2]) if k == "--link"):
        path = root + link
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.lexists(path):
            os.symlink(target, path)
elif command == "update-ldcache":
    folders = [v for k, v in zip(rest[::2], rest[1::2]) if k == "--folder"]
    os.makedirs(root + "/etc/ld.so.conf.d", exist_ok=True)
    with open(root + "/etc/ld.so.conf.d/00-nvcr-cdigen.conf", "w") as f:
        f.write("".join(d + "\\n" for d in folders))
    subprocess.run(["chroot", root, "/sbin/ldconfig"], check=True)
elif command != "enable-cuda-compat":
    sys.exit(f"unknown hook command {{command}}")
"""


@dataclass(frozen=True)
class Setup:
    podman: Podman
    host: FakeHost
    program: Path  # host path of the test program's directory, mounted at /work


def _missing() -> str | None:
    for tool in ("podman", "runc", "unshare", "gcc", "chroot"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install podman runc mmdebstrap gcc)"
    return missing_tools()


def _gcc(*args: str) -> None:
    subprocess.run(["gcc", *args], check=True, capture_output=True)


def _stub_libraries(host: FakeHost, work: Path) -> Path:
    """Replace the fake libcuda/libnvidia-ml with ELF stubs; build the program against them."""
    build = work / "build"
    build.mkdir()
    lib_dir = host.driver_root / LIB_DIR.lstrip("/")
    for stem, soname, source in (
        ("libcuda", "libcuda.so.1", STUB_CUDA),
        ("libnvidia-ml", "libnvidia-ml.so.1", STUB_NVML),
    ):
        (build / f"{stem}.c").write_text(source)
        versioned = lib_dir / f"{stem}.so.{DRIVER_VERSION}"
        versioned.unlink()
        _gcc(
            "-shared",
            "-fPIC",
            f"-Wl,-soname,{soname}",
            "-o",
            str(versioned),
            str(build / f"{stem}.c"),
        )
        os.symlink(versioned, build / f"{stem}.so")  # linker names, for this build only
    program = work / "program"
    program.mkdir()
    (build / "main.c").write_text(PROGRAM)
    _gcc(
        "-o",
        str(program / "cudaprog"),
        str(build / "main.c"),
        f"-L{build}",
        "-lcuda",
        "-lnvidia-ml",
    )
    (program / "main.c").write_text(PROGRAM)
    return program


def _generate(host: FakeHost, node_file: Path, out: Path, *extra: str) -> None:
    result = subprocess.run(
        [
            sys.executable, "-m", "cdigen.cli", "generate", "--node", str(node_file),
            "--driver-root", str(host.driver_root), "--dev-root", str(host.dev_root),
            "--sysfs-root", str(host.sysfs_root), "--output", str(out), *extra,
        ],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    try:
        root = cached_debian_root(PACKAGES)
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
        pytest.skip(f"cannot build the Debian root: {exc}")
    base = tmp_path_factory.mktemp("containerlibs")
    store = Path(tempfile.mkdtemp(prefix="cdigen-libs-", dir="/tmp"))
    try:
        podman = Podman(base / "work", store, rootfs=root)
        smoke = podman.run("true")
        if smoke.returncode != 0:
            pytest.skip(f"this machine cannot run containers: {smoke.stderr.strip()[-300:]}")
        host = build_host(base / "host", make_node(1), hook=True, graphics=True)
        if not host.real_nodes:
            pytest.skip("mknod is not permitted here, so no real device nodes for podman")
        hook = host.driver_root / "usr/bin/nvidia-cdi-hook"
        hook.write_text(FAKE_HOOK.format(python=sys.executable))
        program = _stub_libraries(host, base)
        node_file = base / "node.yaml"
        node_file.write_text(dump_node(host.node, "yaml"))
        # two kinds: vendor "plain" (no hooks), vendor "hooked" (the host has nvidia-cdi-hook)
        _generate(
            host, node_file, podman.cdi / "plain.yaml", "--vendor", "plain.example", "--no-hooks"
        )
        _generate(host, node_file, podman.cdi / "hooked.yaml", "--vendor", "hooked.example")
        for vendor, extra in (("capsplain.example", ["--no-hooks"]), ("capshooked.example", [])):
            _generate(
                host, node_file, podman.cdi / f"{vendor}.yaml", "--vendor", vendor,
                "--capability-devices", "graphics", *extra,
            )  # fmt: skip
        yield Setup(podman, host, program)
    finally:
        shutil.rmtree(store, ignore_errors=True)


def _run(setup: Setup, script: str, *devices: str) -> subprocess.CompletedProcess[str]:
    result = setup.podman.run(script, *devices, extra=f"-v {setup.program}:/work:ro")
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_hook_free_program_resolves_the_driver_libraries(setup: Setup) -> None:
    result = _run(setup, "/work/cudaprog && ldd /work/cudaprog", "plain.example/gpu=0")
    assert "cuInit=101 nvmlInit=7" in result.stdout
    # Debian's merged /usr: the loader names /lib/x86_64-linux-gnu, the same directory
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
        assert re.search(rf"{soname} => (/usr)?/lib/x86_64-linux-gnu/{soname} ", result.stdout)


def test_hook_free_gcc_links_with_lcuda(setup: Setup) -> None:
    script = "gcc -o /tmp/p /work/main.c -lcuda -lnvidia-ml && /tmp/p"
    assert "cuInit=101 nvmlInit=7" in _run(setup, script, "plain.example/gpu=0").stdout


def test_rhel_family_directory_alone_is_enough(setup: Setup) -> None:
    loader = "/lib64/ld-linux-x86-64.so.2"
    script = f"LD_DEBUG=libs {loader} --inhibit-cache --library-path /usr/lib64 /work/cudaprog 2>&1"
    out = _run(setup, script, "plain.example/gpu=0").stdout
    assert "cuInit=101 nvmlInit=7" in out
    assert "trying file=/usr/lib64/libcuda.so.1" in out
    assert "trying file=/usr/lib64/libnvidia-ml.so.1" in out
    assert f"trying file={LIB_DIR}/libcuda.so.1" not in out  # found in /usr/lib64 first


def test_hooks_put_the_libraries_in_ldconfig(setup: Setup) -> None:
    script = "ldconfig -p; gcc -o /tmp/p /work/main.c -lcuda -lnvidia-ml && /tmp/p"
    out = _run(setup, script, "hooked.example/gpu=0").stdout
    assert f"libcuda.so.1 (libc6,x86-64) => {LIB_DIR}/libcuda.so.1" in out
    assert "libnvidia-ml.so.1 (libc6,x86-64) =>" in out
    assert "cuInit=101 nvmlInit=7" in out  # libcuda.so, libnvidia-ml.so: create-symlinks


def test_without_hooks_ldconfig_knows_nothing(setup: Setup) -> None:
    out = _run(setup, "ldconfig -p", "plain.example/gpu=0").stdout
    assert "libcuda.so.1" not in out  # why the hook-free spec mounts in every family dir


GRAPHICS_CHECK = f"/work/cudaprog; {file_check(GRAPHICS_FILES)}"


@pytest.mark.parametrize("vendor", ["capsplain.example", "capshooked.example"])
def test_only_a_container_given_the_capability_device_sees_the_graphics_files(
    setup: Setup, vendor: str
) -> None:
    gpu = f"{vendor}/gpu={setup.host.node.gpus[0].uuid}"
    given = _run(setup, GRAPHICS_CHECK, gpu, f"{vendor}/gpu=capability-graphics").stdout
    assert "cuInit=101 nvmlInit=7" in given  # the GPU's common edits still work
    for path in GRAPHICS_FILES:
        assert f"HAVE {path}" in given, given
    assert '{"file": "/usr/share/vulkan/icd.d/nvidia_icd.json"}' in given  # the host's file
    # the glvnd link: made by the capability device's create-symlinks hook, else mounted
    link = f"LINK {LIB_DIR}/libGLX_indirect.so.0 libGLX_nvidia.so.0"
    assert (link in given) == (vendor == "capshooked.example"), given
    alone = _run(setup, GRAPHICS_CHECK, gpu).stdout
    assert "cuInit=101 nvmlInit=7" in alone
    assert "HAVE" not in alone and "libGLX_nvidia" not in alone, alone
