"""One GPU server per node: the device plugin and the DRA plugin, started on the same kubelet
dir, never both serve; the second says which one holds the node, in one line, exit 2. Real
``cdigen plugin serve`` and ``cdigen dra serve`` processes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

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
