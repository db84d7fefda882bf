"""``cdigen generate --host-root DIR``: the host's ``/`` mounted at DIR in a container.

The proof is a run on "the host itself": a child process chroots into the fake host tree and
generates there with the plain roots, so the kernel resolves every symlink as the host would. The
``--host-root`` spec must match it byte for byte. The tree has absolute symlinks, a library
directory reached only through one, and links that would leave DIR (to a decoy library outside
it, absolutely and by ``..``): any lookup that escapes DIR changes the spec.
"""

from __future__ import annotations

import errno
import os
import traceback
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdigen.cdi.driverfiles import find_hook
from cdigen.cdi.hostfs import HostFS
from cdigen.cdi.spec import SpecOptions, generate
from cdigen.cdi.write import render_spec
from cdigen.cli import main
from cdigen.nodefile import dump_node
from tests.cdihost import DRIVER_VERSION, LIB_DIR, FakeHost, build_host, make_node

VENDOR_DIR = "/opt/vendor/lib64"  # reached only through the absolute link /usr/lib64 -> here


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def host_tree(tmp_path: Path, *, absolute_links: bool = True) -> tuple[FakeHost, Path]:
    """A host ``/`` at tmp/host with traps (a decoy library outside it); (host, node file)."""
    node = make_node(2, mig_gpu=1)
    fake = build_host(
        tmp_path / "host", node, hook=True, merged=True, absolute_links=absolute_links
    )
    root = fake.base
    outside = tmp_path / "outside"
    _write(outside / f"libnvidia-decoy.so.{DRIVER_VERSION}", "must never be found\n")
    if absolute_links:
        # a library directory reached only through an absolute link, SONAME link absolute too
        vendor = root / VENDOR_DIR.lstrip("/")
        _write(vendor / f"libnvidia-vendor.so.{DRIVER_VERSION}", "vendor lib\n")
        os.symlink(f"{VENDOR_DIR}/libnvidia-vendor.so.{DRIVER_VERSION}", vendor / "libvendor.so.1")
        os.symlink(VENDOR_DIR, root / "usr/lib64")
        # escapes: an absolute link to a real directory outside the tree, and one by '..'
        os.symlink(str(outside), root / "usr/lib/aarch64-linux-gnu")
        os.symlink("../" * 30 + str(outside).lstrip("/"), root / "lib64")
    node_file = tmp_path / "node.yaml"
    node_file.write_text(dump_node(node, "yaml"))
    return fake, node_file


def generate_with_host_root(root: Path, node_file: Path, out: Path, *extra: str) -> str:
    """Run the real CLI with ``--host-root root``; the spec text it wrote."""
    args = ["--host-root", str(root), "--node", str(node_file), "--output", str(out), *extra]
    code = main(["generate", *args])
    assert code == 0
    return out.read_text()


def generate_in_chroot(root: Path, node_file: Path) -> str:
    """The spec ``cdigen generate`` writes when ``root`` *is* ``/`` (a chrooted child process)."""
    from cdigen.discover import load_node

    node = load_node(str(node_file))
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        status = 0
        try:
            os.close(read_end)
            os.chroot(root)
            os.chdir("/")
            options = SpecOptions(hook_path=find_hook("/"))
            text = render_spec(generate(node, options), "yaml")
        except BaseException:
            status, text = 1, traceback.format_exc()
        with os.fdopen(write_end, "w") as pipe:
            pipe.write(text)
        os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, text
    return text


def can_chroot(tmp_path: Path) -> bool:
    """Whether this process may chroot (root, or CAP_SYS_CHROOT), tried in a child."""
    pid = os.fork()
    if pid == 0:
        try:
            os.chroot(tmp_path)
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def mounts(spec_text: str) -> dict[str, str]:
    """containerPath -> hostPath of the spec's mounts."""
    spec = yaml.safe_load(spec_text)
    return {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}


def test_spec_is_byte_identical_to_a_run_on_the_host_itself(tmp_path: Path) -> None:
    fake, node_file = host_tree(tmp_path)
    in_container = generate_with_host_root(fake.base, node_file, tmp_path / "out.yaml")
    if not can_chroot(tmp_path):
        pytest.skip("chroot needs root or CAP_SYS_CHROOT (the mapping test below still runs)")
    on_host = generate_in_chroot(fake.base, node_file)
    assert in_container == on_host
    # and the comparison is not vacuous: the traps are in the tree and were handled
    found = mounts(in_container)
    vendor_lib = f"/usr/lib64/libnvidia-vendor.so.{DRIVER_VERSION}"  # /usr/lib64 -> VENDOR_DIR
    assert found[vendor_lib] == vendor_lib
    assert found["/usr/lib64/libvendor.so.1"] == vendor_lib
    assert found[f"{LIB_DIR}/libcuda.so.1"] == f"{LIB_DIR}/libcuda.so.{DRIVER_VERSION}"
    assert "decoy" not in in_container and str(tmp_path) not in in_container


def test_host_paths_have_the_root_stripped_and_nothing_outside_is_read(tmp_path: Path) -> None:
    fake, node_file = host_tree(tmp_path)
    spec = yaml.safe_load(generate_with_host_root(fake.base, node_file, tmp_path / "out.yaml"))
    edits = spec["containerEdits"]
    host_paths = [m["hostPath"] for m in edits["mounts"]]
    assert all(p.startswith("/") and not p.startswith(str(tmp_path)) for p in host_paths)
    assert f"{LIB_DIR}/libcuda.so.{DRIVER_VERSION}" in host_paths
    assert "/usr/bin/nvidia-smi" in host_paths
    assert f"/lib/firmware/nvidia/{DRIVER_VERSION}/gsp_ga10x.bin" in host_paths
    assert "/run/nvidia-persistenced/socket" in host_paths
    assert {h["path"] for h in edits["hooks"]} == {"/usr/bin/nvidia-cdi-hook"}
    nodes = [n for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
    # the device nodes are at their host paths: no hostPath needed, stat fields read under DIR
    assert {"/dev/nvidia1", "/dev/nvidia0", "/dev/dri/card1", "/dev/nvidia-caps/nvidia-cap66"} <= {
        n["path"] for n in nodes
    }
    assert not [n for n in nodes if "hostPath" in n]
    if fake.real_nodes:
        gpu_nodes = {(n["path"], n["major"], n["minor"]) for n in nodes if n["path"][-1].isdigit()}
        assert {("/dev/nvidia0", 195, 0), ("/dev/nvidia1", 195, 1)} <= gpu_nodes
    assert "decoy" not in str(spec)


def _mapped(spec_text: str, root: Path) -> str:
    """A spec generated with roots under ``root``, rewritten as if ``root`` were ``/``."""
    spec: Any = yaml.safe_load(spec_text.partition("\n")[2])
    prefix = str(root)

    def strip(path: str) -> str:
        return path[len(prefix) :] if path.startswith(prefix + "/") else path

    edits = [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]
    for edit in edits:
        for n in edit.get("deviceNodes", []):
            if "hostPath" in n and strip(n["hostPath"]) == n["path"]:
                del n["hostPath"]
        for m in edit.get("mounts", []):
            m["hostPath"] = strip(m["hostPath"])
        for h in edit.get("hooks", []):
            h["path"] = strip(h["path"])
    return render_spec(spec, "yaml")


def test_matches_a_run_with_plain_roots_after_mapping(tmp_path: Path) -> None:
    """Without chroot rights: relative links only, so the plain run resolves them the same."""
    fake, node_file = host_tree(tmp_path, absolute_links=False)
    root = str(fake.base)
    in_container = generate_with_host_root(fake.base, node_file, tmp_path / "a/nvidia.yaml")
    roots = ["--driver-root", root, "--dev-root", root, "--sysfs-root", f"{root}/sys"]
    plain_out = tmp_path / "b/nvidia.yaml"
    assert main(["generate", "--node", str(node_file), "--output", str(plain_out), *roots]) == 0
    plain = plain_out.read_text()
    assert root in plain  # the plain run names the tree's paths ...
    assert in_container == _mapped(plain, fake.base)  # ... which are the host's, DIR stripped


def test_operator_driver_root_under_the_host_root(tmp_path: Path) -> None:
    """``--host-root /host --driver-root /run/nvidia/driver``: host paths keep the driver root."""
    node = make_node(1)
    host = tmp_path / "host"
    fake = build_host(host / "run/nvidia/driver", node)
    # dev nodes and sysfs of the split fake host, moved to where a host has them
    os.rename(fake.dev_root / "dev", host / "dev")
    os.rename(fake.sysfs_root, host / "sys")
    node_file = tmp_path / "node.yaml"
    node_file.write_text(dump_node(node, "yaml"))
    text = generate_with_host_root(
        host, node_file, tmp_path / "out.yaml", "--driver-root", "/run/nvidia/driver/driver"
    )
    found = mounts(text)
    lib = f"{LIB_DIR}/libcuda.so.{DRIVER_VERSION}"
    assert found[lib] == f"/run/nvidia/driver/driver{lib}"
    assert str(tmp_path) not in text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--host-root", "/nonexistent/host"], "--host-root: '/nonexistent/host' is not a dir"),
        (["--driver-root", "run/nvidia/driver"], "--driver-root: 'run/nvidia/driver' is not an"),
    ],
)
def test_bad_host_root_flags_fail_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    node_file = tmp_path / "node.yaml"
    node_file.write_text(dump_node(make_node(1), "yaml"))
    base = ["generate", "--node", str(node_file), "--output", str(tmp_path / "o.yaml")]
    host = [] if "--host-root" in flags else ["--host-root", str(tmp_path)]
    assert main(base + host + flags) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "o.yaml").exists()


def test_hostfs_resolves_links_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/real.so.1").write_text("x")
    os.symlink("/usr/lib", root / "lib")
    os.symlink("/usr/lib/real.so.1", root / "usr/lib/abs.so")
    os.symlink("../../../../../../usr/lib/real.so.1", root / "usr/lib/dotdot.so")
    os.symlink("loop-b", root / "loop-a")
    os.symlink("/loop-a", root / "loop-b")
    fs = HostFS(str(root))
    real = str(root / "usr/lib/real.so.1")
    assert fs.locate("/lib/abs.so") == real
    assert fs.locate("/lib/dotdot.so") == real
    assert fs.locate("/lib/abs.so", follow=False) == str(root / "usr/lib/abs.so")
    assert fs.readlink("/lib/abs.so") == "/usr/lib/real.so.1"
    assert fs.isfile("/lib/abs.so") and fs.islink("/lib/abs.so") and not fs.isfile("/lib")
    assert fs.locate("/missing/x") == str(root / "missing/x")
    with pytest.raises(OSError) as loop:
        fs.locate("/loop-a")
    assert loop.value.errno == errno.ELOOP
    assert not fs.exists("/loop-a") and fs.lexists("/loop-a")
    # not confined: paths are used as they are, the kernel resolves them
    assert HostFS("/").locate("/lib/abs.so") == "/lib/abs.so"


def test_a_symlink_loop_under_the_host_root_is_an_error_not_a_hang(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake, node_file = host_tree(tmp_path, absolute_links=False)
    os.rename(fake.base / "sys", tmp_path / "real-sys")
    os.symlink("/sys", fake.base / "sys")  # a loop only inside the root: /sys -> /sys
    out = tmp_path / "out.yaml"
    args = ["--host-root", str(fake.base), "--node", str(node_file), "--output", str(out)]
    assert main(["generate", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot resolve /sys: too many levels of symbolic links" in err
    assert len(err.splitlines()) == 1 and not out.exists()
