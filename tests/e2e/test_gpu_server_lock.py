"""One GPU server per node: the device plugin and the DRA plugin, started on the same kubelet
dir, never both serve; the second says which one holds the node, in one line, exit 2. Real
``cdigen plugin serve`` and ``cdigen dra serve`` processes."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.fake_apiserver import FakeApiServer
from tests.helpers.served import ServedPlugin

NODE = "builtin:dgx-a100"


def _dra_serve(kubelet: Path, tmp: Path, api: FakeApiServer) -> list[str]:
    return [
        sys.executable, "-m", "cdigen.cli", "dra", "serve", "--node", NODE, "--node-name", "n1",
        "--kubelet-dir", str(kubelet), "--cdi-dir", str(tmp / "cdi"),
        "--kubeconfig", str(api.kubeconfig(tmp / "kubeconfig")),
    ]  # fmt: skip


def _wait_for(path: Path, text: str) -> None:
    deadline = time.monotonic() + 30
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < deadline, f"no {text!r} in {path}"
        time.sleep(0.1)


def test_dra_serve_is_refused_where_the_device_plugin_serves(tmp_path: Path) -> None:
    api = FakeApiServer().start()
    plugin = ServedPlugin(tmp_path, "--node", NODE, "--spec-dir", str(tmp_path / "cdi"))
    # ServedPlugin's plugin dir is tmp_path/plugins: its kubelet dir is tmp_path
    try:
        _wait_for(tmp_path / "plugins" / "cdigen-gpus.lock", "cdigen plugin serve")
        _wait_for(plugin.log, "cdigen device plugin ready")
        result = subprocess.run(
            _dra_serve(tmp_path, tmp_path, api), capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 2, result.stderr
        lines = [ln for ln in result.stderr.splitlines() if ln.startswith("cdigen: error")]
        assert len(lines) == 1, result.stderr
        assert "already served by cdigen plugin serve (pid " in lines[0]
        assert (
            "never both" in lines[0] and "Moving a node from the device plugin to DRA" in lines[0]
        )
        assert plugin.proc.poll() is None  # the one serving goes on
    finally:
        assert plugin.stop() == 0
        api.stop()


def test_the_device_plugin_is_refused_where_dra_serves(tmp_path: Path) -> None:
    api = FakeApiServer().start()
    log = tmp_path / "dra.log"
    with log.open("w") as out:
        dra = subprocess.Popen(_dra_serve(tmp_path, tmp_path, api), stdout=out, stderr=out)
    try:
        _wait_for(tmp_path / "plugins" / "cdigen-gpus.lock", "cdigen dra serve")
        _wait_for(log, "cdigen DRA plugin ready")  # SIGTERM is handled from then on
        result = subprocess.run(
            [sys.executable, "-m", "cdigen.cli", "plugin", "serve", "--node", NODE,
             "--plugin-dir", str(tmp_path / "device-plugins")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert "already served by cdigen dra serve (pid " in result.stderr
        assert dra.poll() is None
    finally:
        dra.terminate()
        assert dra.wait(10) == 0
        api.stop()
    # once the DRA plugin is gone the device plugin may serve the node
    with (tmp_path / "plugin.log").open("w") as out:
        plugin = subprocess.Popen(
            [sys.executable, "-m", "cdigen.cli", "plugin", "serve", "--node", NODE,
             "--plugin-dir", str(tmp_path / "device-plugins")],
            stdout=out, stderr=out,
        )  # fmt: skip
    try:
        _wait_for(tmp_path / "plugins" / "cdigen-gpus.lock", "cdigen plugin serve")
        _wait_for(tmp_path / "plugin.log", "cdigen device plugin ready")
    finally:
        plugin.terminate()
        assert plugin.wait(10) == 0


# --- a lock file that is not ours alone: refused in one line, left untouched (issue 36) -------

VICTIM = "another driver's checkpoint\n"


def _plugin_serve(kubelet: Path) -> subprocess.CompletedProcess[str]:
    """``plugin serve`` on ``kubelet``; it is refused before it serves, or killed after 30 s."""
    return subprocess.run(
        [sys.executable, "-m", "cdigen.cli", "plugin", "serve", "--node", NODE,
         "--plugin-dir", str(kubelet / "device-plugins")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def _one_error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cdigen: error"), result.stderr
    assert "cdigen-gpus.lock" in lines[0]
    return lines[0]


def _lock(kubelet: Path) -> Path:
    (kubelet / "plugins").mkdir(parents=True, exist_ok=True)
    return kubelet / "plugins" / "cdigen-gpus.lock"


def test_a_lock_that_is_a_hard_link_to_another_file_is_refused_and_left_as_it_was(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    os.link(victim, _lock(tmp_path))
    line = _one_error_line(_plugin_serve(tmp_path), 2)
    assert "2 hard links" in line and "left untouched" in line
    assert victim.read_text() == VICTIM


def test_dra_serve_refuses_a_hard_linked_lock_too(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    os.link(victim, _lock(tmp_path))
    api = FakeApiServer().start()
    try:
        result = subprocess.run(
            _dra_serve(tmp_path, tmp_path, api), capture_output=True, text=True, timeout=60
        )
    finally:
        api.stop()
    assert result.returncode == 2, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("cdigen: error")]
    assert len(errors) == 1 and "2 hard links" in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert victim.read_text() == VICTIM


def test_a_lock_that_is_a_symlink_out_is_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    _lock(tmp_path).symlink_to(victim)
    line = _one_error_line(_plugin_serve(tmp_path), 2)
    assert "symlink" in line
    assert victim.read_text() == VICTIM


def test_a_lock_that_is_a_fifo_is_one_line_and_exit_2(tmp_path: Path) -> None:
    os.mkfifo(_lock(tmp_path))
    line = _one_error_line(_plugin_serve(tmp_path), 2)
    assert "a pipe, not a regular file" in line


def test_a_lock_that_is_a_character_device_is_one_line_and_exit_2(tmp_path: Path) -> None:
    try:
        os.mknod(_lock(tmp_path), 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    line = _one_error_line(_plugin_serve(tmp_path), 2)
    assert "a character device, not a regular file" in line


def test_a_lock_held_by_a_holder_with_escapes_is_printed_escaped(tmp_path: Path) -> None:
    """The holder text comes from the file: it can neither forge a line nor drive the terminal."""
    lock = _lock(tmp_path)
    lock.write_text("evil\n\x1b[2Jpod default/other: Running\n")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
         str(lock)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        line = _one_error_line(_plugin_serve(tmp_path), 2)
    finally:
        holder.kill()
        holder.wait()
    assert "\x1b" not in line
    assert "already served by evil\\n\\x1b[2Jpod default/other: Running;" in line


def _chattr(path: Path, flag: str) -> bool:
    return (
        shutil.which("chattr") is not None
        and subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0
    )


def test_an_immutable_lock_refuses_to_serve(tmp_path: Path) -> None:
    """EPERM (root opening an immutable file): one line, exit 1, nothing served."""
    lock = _lock(tmp_path)
    lock.write_text("")
    if os.geteuid() == 0:
        if not _chattr(lock, "+i"):
            pytest.skip("chattr +i is not supported on this filesystem")
    else:
        lock.chmod(0o444)  # EACCES for a non-root user: the same refusal
    try:
        line = _one_error_line(_plugin_serve(tmp_path), 1)
    finally:
        if os.geteuid() == 0:
            _chattr(lock, "-i")
    assert "cannot take the GPU-server lock" in line and "does not serve without it" in line
    assert not (tmp_path / "device-plugins").exists() or not any(
        p.name.endswith(".sock") for p in (tmp_path / "device-plugins").iterdir()
    )


def test_a_lock_on_a_read_only_filesystem_refuses_to_serve(tmp_path: Path) -> None:
    """EROFS: the kubelet's plugins dir bind-mounted read-only in a private mount namespace."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a read-only bind mount")
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    script = (
        f"mount --bind {plugins} {plugins} && mount -o remount,ro,bind {plugins} {plugins} && "
        f"exec {sys.executable} -m cdigen.cli plugin serve --node {NODE} "
        f"--plugin-dir {tmp_path / 'device-plugins'}"
    )
    result = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if "mount:" in result.stderr or "unshare:" in result.stderr:
        pytest.skip(f"no read-only bind mount here: {result.stderr.strip()}")
    line = _one_error_line(result, 1)
    assert "Read-only file system" in line


def test_dra_serve_under_umask_000_creates_no_writable_directory(tmp_path: Path) -> None:
    # not there yet: dra serve creates it and what is under it (a short path: a unix socket's
    # path holds 107 bytes, which pytest's tmp_path may exceed)
    kubelet = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp")) / "kubelet"
    api = FakeApiServer().start()
    log = tmp_path / "dra.log"
    old = os.umask(0)
    try:
        with log.open("w") as out:
            dra = subprocess.Popen(_dra_serve(kubelet, tmp_path, api), stdout=out, stderr=out)
    finally:
        os.umask(old)
    try:
        deadline = time.monotonic() + 60
        while "cdigen DRA plugin ready" not in log.read_text():
            assert dra.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        modes = {}
        for root, dirs, _ in os.walk(kubelet):  # a bind dir may come and go meanwhile
            for path in [root, *(os.path.join(root, d) for d in dirs)]:
                with contextlib.suppress(FileNotFoundError):
                    modes[path] = stat.S_IMODE(os.lstat(path).st_mode)
        loose = {p: oct(m) for p, m in modes.items() if m & 0o022}
        assert not loose, loose
        assert stat.S_IMODE(kubelet.stat().st_mode) == 0o755
    finally:
        dra.terminate()
        assert dra.wait(10) == 0
        api.stop()
        shutil.rmtree(kubelet.parent, ignore_errors=True)
