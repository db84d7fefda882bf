"""Per-node configs: named configs in one directory (a ConfigMap's files), the node label
choosing one, switched live. A real ``plugin serve`` process, the kubelet simulator and an API
server on loopback whose Node labels the test changes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cdigen.discover import load_node
from tests.fake_apiserver import FakeApiServer
from tests.helpers.served import ServedPlugin, cdigen
from tests.kubelet_sim import KubeletSimulator

NODE = "builtin:dgx-a100"
CONFIGS = {
    "default.yaml": "resources: [{name: nvidia.com/gpu}]\n",
    "ts4.yaml": "resources: [{name: nvidia.com/gpu, sharing: {replicas: 4}}]\n",
    # NVIDIA's own config format is not ours: named here, it is refused and the config stays
    "nvidia": "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}]}}\n",
}


def _label(api: FakeApiServer, key: str | None, value: str = "") -> None:
    labels = {"kubernetes.io/hostname": "n1"}
    if key:
        labels[key] = value
    with api.lock:
        api.nodes["n1"] = {"metadata": {"name": "n1", "uid": "u-n1", "labels": labels}}


def _wait_log(plugin: ServedPlugin, text: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in plugin.logs():
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{plugin.logs()}"
        time.sleep(0.05)


@pytest.fixture
def configs(tmp_path: Path) -> Path:
    directory = tmp_path / "configs"
    directory.mkdir()
    for name, text in CONFIGS.items():
        (directory / name).write_text(text)
    (directory / "..data").mkdir()  # what a mounted ConfigMap also holds: skipped
    return directory


def test_a_label_change_switches_config_live_and_the_kubelet_sees_the_new_resources(
    tmp_path: Path, configs: Path
) -> None:
    gpus = len(load_node(NODE).gpus)
    api = FakeApiServer().start()
    _label(api, None)
    kubelet = KubeletSimulator(tmp_path / "plugins").start()
    plugin = ServedPlugin(
        tmp_path,
        "--node", NODE,
        "--config-dir", str(configs),
        "--node-name", "n1",
        "--kubeconfig", str(api.kubeconfig(tmp_path / "kubeconfig")),
        "--config-poll-interval", "0.2",
    )  # fmt: skip
    try:
        kubelet.wait_registered("nvidia.com/gpu", timeout_s=20)
        kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == gpus)
        _wait_log(plugin, "serving config 'default'")

        # NVIDIA's label works too: the node is switched to 4 replicas per GPU, same process
        _label(api, "nvidia.com/device-plugin.config", "ts4")
        kubelet.wait_registered("nvidia.com/gpu", timeout_s=10, count=2)
        devices = kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 4 * gpus)
        assert all("::" in d.ID for d in devices)
        _wait_log(plugin, "switching config 'default' -> 'ts4'")

        # a name with no config: one ERROR line, the config in force stays
        _label(api, "cdigen.dev/device-plugin.config", "nope")
        _wait_log(plugin, "node label cdigen.dev/device-plugin.config=nope names no config")
        time.sleep(0.6)  # three more polls: said once
        assert plugin.logs().count("=nope names no config") == 1
        # a config that does not load: one ERROR line, still ts4
        _label(api, "cdigen.dev/device-plugin.config", "nvidia")
        _wait_log(plugin, "config 'nvidia' not applied, keeping the one in force")
        assert "cdigen plugin config convert" in plugin.logs()
        assert len(kubelet.device_lists("nvidia.com/gpu")[-1]) == 4 * gpus

        # our label back to the default: whole GPUs again
        _label(api, "cdigen.dev/device-plugin.config", "default")
        kubelet.wait_registered("nvidia.com/gpu", timeout_s=10, count=3)
        kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == gpus)
        assert plugin.proc.poll() is None  # never restarted
    finally:
        assert plugin.stop() == 0
        kubelet.stop()
        api.stop()
    assert "Traceback" not in plugin.logs()


def test_an_edited_config_file_is_applied_without_a_label_change(
    tmp_path: Path, configs: Path
) -> None:
    gpus = len(load_node(NODE).gpus)
    api = FakeApiServer().start()
    _label(api, "cdigen.dev/device-plugin.config", "ts4")
    kubelet = KubeletSimulator(tmp_path / "plugins").start()
    plugin = ServedPlugin(
        tmp_path,
        "--node", NODE,
        "--config-dir", str(configs),
        "--node-name", "n1",
        "--kubeconfig", str(api.kubeconfig(tmp_path / "kubeconfig")),
        "--config-poll-interval", "0.2",
    )  # fmt: skip
    try:
        kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 4 * gpus, timeout_s=20)
        (configs / "ts4.yaml").write_text(
            "resources: [{name: nvidia.com/gpu, sharing: {replicas: 2}}]\n"
        )
        kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 2 * gpus, timeout_s=10)
    finally:
        assert plugin.stop() == 0
        kubelet.stop()
        api.stop()


def test_unreachable_api_server_serves_the_default_and_says_why(
    tmp_path: Path, configs: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    api = FakeApiServer()  # never started: its port is bound but nothing answers
    api.kubeconfig(kubeconfig)
    api._server.server_close()  # now nothing listens there: connections are refused
    kubelet = KubeletSimulator(tmp_path / "plugins").start()
    plugin = ServedPlugin(
        tmp_path,
        "--node", NODE,
        "--config-dir", str(configs),
        "--node-name", "n1",
        "--kubeconfig", str(kubeconfig),
    )  # fmt: skip
    try:
        kubelet.wait_registered("nvidia.com/gpu", timeout_s=20)
        _wait_log(plugin, "cannot read the labels of Node n1")
        _wait_log(plugin, "serving config 'default'")
    finally:
        assert plugin.stop() == 0
        kubelet.stop()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--default-config", "gone"], "no config named 'gone'"),
        (["--config", "x.yaml"], "--config and --config-dir both given"),
        (["--node-name", ""], "no node name"),
        (["--config-poll-interval", "0"], "expected seconds in (0, 3600]"),
    ],
)
def test_bad_named_config_settings_are_one_line_exit_2(
    args: list[str], message: str, tmp_path: Path, configs: Path
) -> None:
    base = ["plugin", "serve", "--node", NODE, "--plugin-dir", str(tmp_path / "dp")]
    base += ["--config-dir", str(configs), "--node-name", "n1", "--kubeconfig", "/nonexistent"]
    result = cdigen(*base, *args, check=False)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_several_configs_and_no_default_is_one_line(tmp_path: Path) -> None:
    directory = tmp_path / "configs"
    directory.mkdir()
    for name in ("a.yaml", "b.yaml"):
        (directory / name).write_text("resources: [{name: nvidia.com/gpu}]\n")
    result = cdigen(
        "plugin", "serve", "--node", NODE, "--config-dir", str(directory), "--node-name", "n1",
        check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "2 configs (a, b) and none is the default" in result.stderr


# --- issue 36: a config that fails at start keeps the one in force; the reader's rules -------

MIG_NODE = "builtin:dgx-a100-mig-mixed"  # 4 of 8 GPUs MIG-enabled: migStrategy single fails
SECRET = "root:$6$SECRETHASH:19000:0:99999:7:::\n"


def _serve_configs(tmp_path: Path, configs: Path, api: FakeApiServer, node: str) -> ServedPlugin:
    return ServedPlugin(
        tmp_path,
        "--node", node,
        "--config-dir", str(configs),
        "--node-name", "n1",
        "--kubeconfig", str(api.kubeconfig(tmp_path / "kubeconfig")),
        "--config-poll-interval", "0.2",
    )  # fmt: skip


def test_a_config_that_fails_at_start_keeps_the_config_in_force(
    tmp_path: Path, configs: Path
) -> None:
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    (configs / "nopolicy.yaml").write_text("resources: [{name: nvidia.com/gpu, policy: nope}]\n")
    (configs / "migsingle.yaml").write_text(
        "migStrategy: single\nresources: [{name: nvidia.com/gpu}]\n"
    )
    (configs / "port.yaml").write_text(
        f"metricsAddress: 127.0.0.1:{port}\nresources: [{{name: nvidia.com/gpu}}]\n"
    )
    api = FakeApiServer().start()
    _label(api, None)
    kubelet = KubeletSimulator(tmp_path / "plugins").start()
    plugin = _serve_configs(tmp_path, configs, api, MIG_NODE)
    try:
        kubelet.wait_registered("nvidia.com/gpu", timeout_s=20)
        gpus = len(kubelet.wait_devices("nvidia.com/gpu"))  # the GPUs without MIG
        registrations = 1
        for name, why in (
            ("nopolicy", "no policy named 'nope'"),
            ("port", "Address already in use"),
        ):
            _label(api, "cdigen.dev/device-plugin.config", name)
            _wait_log(plugin, f"config {name!r} failed to start")
            assert why in plugin.logs()
            _wait_log(plugin, "config 'default' is served again")
            registrations += 1  # the servers of 'default' came back and registered again
            kubelet.wait_registered("nvidia.com/gpu", timeout_s=10, count=registrations)
            kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == gpus)
            time.sleep(0.6)  # three more polls: not retried while label and file stay
            assert plugin.logs().count(f"config {name!r} failed to start") == 1
        # fails to build: nothing in force is stopped
        _label(api, "cdigen.dev/device-plugin.config", "migsingle")
        _wait_log(plugin, "config 'migsingle' not applied, keeping the one in force")
        assert "migStrategy 'single' needs every GPU MIG-enabled" in plugin.logs()
        assert len(kubelet.registrations) == registrations
        # relabelled back, then to a good config: switching still works, same process
        _label(api, "cdigen.dev/device-plugin.config", "default")
        time.sleep(0.6)
        (configs / "ts4.yaml").write_text(
            "resources: [{name: nvidia.com/gpu, sharing: {replicas: 4}}]\n"
        )
        _label(api, "cdigen.dev/device-plugin.config", "ts4")
        kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 4 * gpus, timeout_s=10)
        assert plugin.proc.poll() is None
    finally:
        taken.close()
        assert plugin.stop() == 0
        kubelet.stop()
        api.stop()
    assert "Traceback" not in plugin.logs()
    assert "keeping the config in force" not in plugin.logs()  # the old, untrue line


def test_a_config_that_is_a_symlink_out_is_not_read_nor_logged(
    tmp_path: Path, configs: Path
) -> None:
    secret = tmp_path / "shadow"
    secret.write_text(SECRET)
    (configs / "evil.yaml").symlink_to(secret)
    # inside the dir, content that does not validate: named by file and field, never quoted
    (configs / "inside.yaml").write_text(SECRET)
    (configs / "big.yaml").touch()
    os.truncate(configs / "big.yaml", 1 << 30)  # a sparse 1 GiB file: refused by its size
    gpus = len(load_node(NODE).gpus)
    api = FakeApiServer().start()
    _label(api, "cdigen.dev/device-plugin.config", "evil")
    kubelet = KubeletSimulator(tmp_path / "plugins").start()
    plugin = _serve_configs(tmp_path, configs, api, NODE)
    try:
        kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == gpus, timeout_s=20)
        _wait_log(plugin, "config 'evil' not applied, serving the default")
        assert "leads out of the config directory" in plugin.logs()
        _label(api, "cdigen.dev/device-plugin.config", "inside")
        _wait_log(plugin, "config 'inside' not applied, keeping the one in force")
        assert "inside.yaml: <root>: not valid" in plugin.logs()
        _label(api, "cdigen.dev/device-plugin.config", "big")
        _wait_log(plugin, "config 'big' not applied, keeping the one in force")
        assert f"it is {1 << 30} bytes, more than" in plugin.logs()
        time.sleep(1.0)  # five more polls of the big file
        status = Path(f"/proc/{plugin.proc.pid}/status").read_text()
        peak_kib = int(status.split("VmHWM:")[1].split()[0])
        assert peak_kib < 400 * 1024, status  # never read: the process stays its usual size
        assert plugin.proc.poll() is None
    finally:
        assert plugin.stop() == 0
        kubelet.stop()
        api.stop()
    logs = plugin.logs()
    assert "SECRETHASH" not in logs and "19000" not in logs, logs
    assert "Traceback" not in logs
