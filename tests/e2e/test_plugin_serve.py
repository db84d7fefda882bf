"""``cdigen plugin serve`` as a real process, against the kubelet simulator on real unix sockets.

The node is ``builtin:dgx-a100`` (8 A100s, NUMA 3,3,1,1,7,7,5,5) and the spec dir holds what
``cdigen generate`` writes for it, as in the acceptance test of the plugin issue.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cdigen.discover import load_node
from cdigen.model import Node
from tests.helpers.served import ServedPlugin, cdigen
from tests.kubelet_sim import KubeletSimulator

RESOURCE = "nvidia.com/gpu"
SOCKET = "cdigen-nvidia.com-gpu.sock"
NODE_SRC = "builtin:dgx-a100"


@pytest.fixture(scope="module")
def node() -> Node:
    return load_node(NODE_SRC)


@pytest.fixture(scope="module")
def spec_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cdi")
    cdigen("generate", "--node", NODE_SRC, "--output-dir", str(out))
    return out


@pytest.fixture
def served(tmp_path: Path, spec_dir: Path) -> Iterator[tuple[ServedPlugin, KubeletSimulator]]:
    kubelet = KubeletSimulator(tmp_path / "plugins").start()
    plugin = ServedPlugin(tmp_path, "--node", NODE_SRC, "--spec-dir", str(spec_dir))
    try:
        kubelet.wait_registered(RESOURCE, timeout_s=20)
        yield plugin, kubelet
    finally:
        plugin.stop()
        kubelet.stop()


def test_acceptance_register_list_allocate(
    served: tuple[ServedPlugin, KubeletSimulator], node: Node, spec_dir: Path
) -> None:
    _plugin, kubelet = served
    reg = kubelet.registrations[0]
    assert reg.endpoint == SOCKET and reg.options.get_preferred_allocation_available
    devices = kubelet.wait_devices(RESOURCE, lambda d: len(d) == 8)
    assert [(d.ID, d.health, [n.ID for n in d.topology.nodes]) for d in devices] == [
        (g.uuid, "Healthy", [g.numa_node]) for g in node.gpus
    ]
    response = kubelet.allocate(RESOURCE, [[devices[0].ID, devices[5].ID], [devices[7].ID]])
    names = [d.name for c in response.container_responses for d in c.cdi_devices]
    assert names == [f"nvidia.com/gpu={node.gpus[i].uuid}" for i in (0, 5, 7)]
    listed = {
        line.split("\t")[0]
        for line in cdigen("list", "--spec-dir", str(spec_dir)).stdout.splitlines()
    }
    assert set(names) <= listed


def test_kubelet_restart_reregisters_within_a_second(
    served: tuple[ServedPlugin, KubeletSimulator],
) -> None:
    plugin, kubelet = served
    kubelet.stop()  # the kubelet goes away and kubelet.sock with it
    assert not (plugin.plugin_dir / "kubelet.sock").exists()
    time.sleep(0.3)
    restarted = KubeletSimulator(plugin.plugin_dir).start()
    started = time.monotonic()
    try:
        reg = restarted.wait_registered(RESOURCE, timeout_s=5)
        assert reg.at - started < 1.0
        devices = restarted.wait_devices(RESOURCE, lambda d: len(d) == 8)
        assert all(d.health == "Healthy" for d in devices)
    finally:
        restarted.stop()


def test_removed_plugin_socket_is_recreated_and_registered(
    served: tuple[ServedPlugin, KubeletSimulator],
) -> None:
    plugin, kubelet = served
    (plugin.plugin_dir / SOCKET).unlink()  # what a kubelet restart does to our socket
    started = time.monotonic()
    reg = kubelet.wait_registered(RESOURCE, timeout_s=5, count=2)
    assert reg.at - started < 1.0
    assert (plugin.plugin_dir / SOCKET).exists()
    response = kubelet.allocate(RESOURCE, [[kubelet.wait_devices(RESOURCE)[0].ID]])
    assert len(response.container_responses[0].cdi_devices) == 1


def test_unknown_id_is_invalid_argument_and_serving_goes_on(
    served: tuple[ServedPlugin, KubeletSimulator],
) -> None:
    _, kubelet = served
    with pytest.raises(grpc.RpcError) as info:
        kubelet.allocate(RESOURCE, [["GPU-00000000-0000-0000-0000-000000000000"]])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "GPU-00000000-0000-0000-0000-000000000000" in (info.value.details() or "")
    first = kubelet.wait_devices(RESOURCE)[0].ID
    assert (
        kubelet.allocate(RESOURCE, [[first]])
        .container_responses[0]
        .cdi_devices[0]
        .name.endswith(first)
    )


@pytest.mark.parametrize(
    ("available", "size", "must"),
    [(range(8), 2, ()), (range(8), 4, (2,)), ((0, 2, 4, 5, 6), 3, ())],
)
def test_preferred_allocation_matches_policy_explain(
    served: tuple[ServedPlugin, KubeletSimulator],
    node: Node,
    available: range | tuple[int, ...],
    size: int,
    must: tuple[int, ...],
) -> None:
    _, kubelet = served
    uuids = [node.gpus[i].uuid for i in available]
    must_uuids = [node.gpus[i].uuid for i in must]
    chosen = kubelet.preferred(RESOURCE, uuids, size, must_include=must_uuids)
    args = ["policy", "explain", "--node", NODE_SRC, "--available", ",".join(uuids)]
    args += ["--size", str(size), "--format", "json"]
    if must_uuids:
        args += ["--must", ",".join(must_uuids)]
    explained = json.loads(cdigen(*args).stdout)
    assert chosen == explained["devices"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_exits_0_and_removes_the_socket(
    served: tuple[ServedPlugin, KubeletSimulator], signum: int
) -> None:
    plugin, _ = served
    assert (plugin.plugin_dir / SOCKET).exists()
    plugin.signal(signum)
    assert plugin.proc.wait(timeout=10) == 0
    assert not (plugin.plugin_dir / SOCKET).exists()
    assert "Traceback" not in plugin.logs()


def test_ctrl_c_to_the_process_group_stops_the_plugin_and_its_http_worker(
    tmp_path: Path, spec_dir: Path
) -> None:
    """A terminal's Ctrl-C reaches every process of the foreground group: the plugin stops as
    on SIGINT, and its /metrics worker goes with it (it does not die first, with a traceback,
    nor get started again)."""
    import socket
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kubelet = KubeletSimulator(tmp_path / "plugins").start()
    plugin = ServedPlugin(
        tmp_path, "--node", NODE_SRC, "--spec-dir", str(spec_dir),
        "--metrics-address", f"127.0.0.1:{port}", own_group=True,
    )  # fmt: skip
    try:
        kubelet.wait_registered(RESOURCE, timeout_s=20)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as answer:
            assert answer.status == 200
        plugin.signal_group(signal.SIGINT)
        assert plugin.proc.wait(timeout=10) == 0
    finally:
        plugin.stop()
        kubelet.stop()
    logs = plugin.logs()
    assert "Traceback" not in logs and "HTTP worker exited" not in logs, logs
    with pytest.raises(OSError):  # no worker left holding the port
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_health_flip_in_the_node_file_reaches_list_and_watch(
    tmp_path: Path, spec_dir: Path
) -> None:
    import yaml

    node_file = tmp_path / "node.yaml"
    cdigen("discover", "--node", NODE_SRC, "--output", str(node_file))
    doc = yaml.safe_load(node_file.read_text())
    kubelet = KubeletSimulator(tmp_path / "plugins").start()
    plugin = ServedPlugin(
        tmp_path,
        "--node",
        str(node_file),
        "--spec-dir",
        str(spec_dir),
        "--health-poll-interval",
        "0.1",
    )
    try:
        kubelet.wait_registered(RESOURCE, timeout_s=20)
        kubelet.wait_devices(RESOURCE, lambda d: all(x.health == "Healthy" for x in d))
        doc["gpus"][3]["healthy"] = False
        node_file.write_text(yaml.safe_dump(doc, sort_keys=False))
        sick = kubelet.wait_devices(RESOURCE, lambda d: d[3].health == "Unhealthy")
        assert [x.health for x in sick].count("Unhealthy") == 1
        doc["gpus"][3]["healthy"] = True
        node_file.write_text(yaml.safe_dump(doc, sort_keys=False))
        kubelet.wait_devices(RESOURCE, lambda d: all(x.health == "Healthy" for x in d))
    finally:
        assert plugin.stop() == 0
        kubelet.stop()


def test_missing_cdi_name_is_unhealthy_until_the_spec_has_it(tmp_path: Path) -> None:
    empty_spec_dir = tmp_path / "cdi"
    empty_spec_dir.mkdir()
    kubelet = KubeletSimulator(tmp_path / "plugins").start()
    plugin = ServedPlugin(
        tmp_path,
        "--node",
        NODE_SRC,
        "--spec-dir",
        str(empty_spec_dir),
        "--health-poll-interval",
        "0.1",
    )
    try:
        kubelet.wait_registered(RESOURCE, timeout_s=20)
        devices = kubelet.wait_devices(RESOURCE, lambda d: len(d) == 8)
        assert all(d.health == "Unhealthy" for d in devices)
        cdigen("generate", "--node", NODE_SRC, "--output-dir", str(empty_spec_dir))
        kubelet.wait_devices(RESOURCE, lambda d: all(x.health == "Healthy" for x in d))
    finally:
        plugin.stop()
        kubelet.stop()
    # one line for the 8 GPUs (was one each), with a hint that works without a driver (was
    # 'cdigen generate --output-dir DIR', which would try NVML)
    lines = [line for line in plugin.logs().splitlines() if "not defined in" in line]
    assert len(lines) == 1, lines
    assert " ERROR: CDI names nvidia.com/gpu=" in lines[0] and " and 5 more are " in lines[0]
    assert lines[0].endswith(
        f"8 device(s) advertised Unhealthy until the spec has them (run 'cdigen generate --node "
        f"{NODE_SRC} --output-dir {empty_spec_dir}')"
    )


POLICY = """\
apiVersion: cdigen/v1alpha1
kind: AllocationPolicy
metadata: {{name: {name}}}
spec:
  resource: nvidia.com/gpu
  selector: device.attributes["cdigen.dev"].index >= {lowest}
"""


def test_sighup_reloads_policies_and_a_bad_file_keeps_the_old_ones(
    tmp_path: Path, spec_dir: Path, node: Node
) -> None:
    policy_dir = tmp_path / "policies"
    policy_dir.mkdir()
    policy_file = policy_dir / "mine.yaml"
    policy_file.write_text(POLICY.format(name="high-half", lowest=4))
    kubelet = KubeletSimulator(tmp_path / "plugins").start()
    plugin = ServedPlugin(
        tmp_path, "--node", NODE_SRC, "--spec-dir", str(spec_dir), "--policy-dir", str(policy_dir)
    )
    uuids = [g.uuid for g in node.gpus]
    index = {u: i for i, u in enumerate(uuids)}

    def chosen() -> set[int]:
        return {index[u] for u in kubelet.preferred(RESOURCE, uuids, 2)}

    def wait_for(expected: set[int]) -> set[int]:
        deadline = time.monotonic() + 10
        got = chosen()
        while got != expected and time.monotonic() < deadline:
            time.sleep(0.1)
            got = chosen()
        return got

    try:
        kubelet.wait_registered(RESOURCE, timeout_s=20)
        first = chosen()
        assert first <= {4, 5, 6, 7} and len(first) == 2
        policy_file.write_text(POLICY.format(name="top-two", lowest=6))
        plugin.signal(signal.SIGHUP)
        assert wait_for({6, 7}) == {6, 7}
        policy_file.write_text(
            "apiVersion: cdigen/v1alpha1\nkind: AllocationPolicy\nspec: [broken\n"
        )
        plugin.signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "policy reload failed" not in plugin.logs() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "policy reload failed" in plugin.logs()
        assert chosen() == {6, 7}
        assert plugin.proc.poll() is None
    finally:
        assert plugin.stop() == 0
        kubelet.stop()


def test_bad_config_is_one_line_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "plugin.yaml"
    config.write_text("deviceListStrategy: magic\n")
    result = cdigen("plugin", "serve", "--config", str(config), "--node", NODE_SRC, check=False)
    assert result.returncode == 2
    assert "deviceListStrategy" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_plugin_dir_that_cannot_hold_a_socket_is_exit_2(tmp_path: Path, spec_dir: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = cdigen(
        "plugin",
        "serve",
        "--node",
        NODE_SRC,
        "--plugin-dir",
        str(blocker / "sub"),
        "--spec-dir",
        str(spec_dir),
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert os.fspath(blocker) in result.stderr


@pytest.mark.parametrize("strategy", ["cdi-cri", "cdi-annotations", "envvar", "native"])
def test_allocate_each_strategy(tmp_path: Path, spec_dir: Path, node: Node, strategy: str) -> None:
    kubelet = KubeletSimulator(tmp_path / "plugins").start()
    plugin = ServedPlugin(
        tmp_path,
        "--node",
        NODE_SRC,
        "--spec-dir",
        str(spec_dir),
        "--device-list-strategy",
        strategy,
    )
    uuids = [node.gpus[2].uuid, node.gpus[3].uuid]
    names = [f"nvidia.com/gpu={u}" for u in uuids]
    try:
        kubelet.wait_registered(RESOURCE, timeout_s=20)
        (container,) = kubelet.allocate(RESOURCE, [uuids]).container_responses
    finally:
        plugin.stop()
        kubelet.stop()
    if strategy == "cdi-cri":
        assert [d.name for d in container.cdi_devices] == names
    elif strategy == "cdi-annotations":
        assert list(container.annotations.values()) == [",".join(names)]
        assert next(iter(container.annotations)).startswith("cdi.k8s.io/cdigen_")
    elif strategy == "envvar":
        assert dict(container.envs) == {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)}
    else:  # the spec's own edits: its device nodes for GPUs 2 and 3, its env
        assert [d.container_path for d in container.devices] == ["/dev/nvidia2", "/dev/nvidia3"]
        assert container.envs["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert not container.cdi_devices


def test_json_logs_are_one_object_per_line(tmp_path: Path, spec_dir: Path) -> None:
    kubelet = KubeletSimulator(tmp_path / "plugins").start()
    plugin = ServedPlugin(
        tmp_path,
        *("--node", NODE_SRC, "--spec-dir", str(spec_dir), "--log-format", "json"),
        *("--log-level", "debug"),
    )
    try:
        kubelet.wait_registered(RESOURCE, timeout_s=20)
        kubelet.allocate(RESOURCE, [[kubelet.wait_devices(RESOURCE)[0].ID]])
    finally:
        assert plugin.stop() == 0
        kubelet.stop()
    records = [json.loads(line) for line in plugin.logs().splitlines()]
    assert {"time", "level", "logger", "msg"} <= set(records[0])
    allocated = [r for r in records if r["msg"].startswith(f"Allocate {RESOURCE}: [GPU-")]
    assert len(allocated) == 1 and allocated[0]["level"] == "debug"
    assert "-> cdi_devices=[nvidia.com/gpu=GPU-" in allocated[0]["msg"]
    # the calls since the last summary, logged at stop
    summary = [r for r in records if r["msg"].startswith(f"Allocate {RESOURCE}: 1 call(s) in ")]
    assert len(summary) == 1 and summary[0]["level"] == "info"
    assert any("signal SIGTERM" in r["msg"] for r in records)


def test_plugin_started_before_the_kubelet_registers_when_it_appears(
    tmp_path: Path, spec_dir: Path
) -> None:
    plugin = ServedPlugin(tmp_path, "--node", NODE_SRC, "--spec-dir", str(spec_dir))
    try:
        deadline = time.monotonic() + 20
        while not (plugin.plugin_dir / SOCKET).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the plugin is serving and retrying; no kubelet yet
        with KubeletSimulator(plugin.plugin_dir) as kubelet:
            started = time.monotonic()
            reg = kubelet.wait_registered(RESOURCE, timeout_s=5)
            assert reg.at - started < 2.5  # within one backoff step (at most 2 s)
            assert len(kubelet.wait_devices(RESOURCE, lambda d: len(d) == 8)) == 8
    finally:
        assert plugin.stop() == 0


def test_recorded_requests_replay_to_the_answers_the_kubelet_got(
    tmp_path: Path, spec_dir: Path, node: Node
) -> None:
    """Rough edge 5 of issue 26: ``policy replay`` took recorded kubelet requests, but nothing
    recorded them."""
    recorded = tmp_path / "requests.jsonl"
    kubelet = KubeletSimulator(tmp_path / "plugins").start()
    plugin = ServedPlugin(
        tmp_path,
        "--node",
        NODE_SRC,
        "--spec-dir",
        str(spec_dir),
        "--record-requests",
        str(recorded),
    )
    uuids = [g.uuid for g in node.gpus]
    try:
        kubelet.wait_registered(RESOURCE, timeout_s=20)
        answers = [
            kubelet.preferred(RESOURCE, uuids, 2),
            kubelet.preferred(RESOURCE, uuids[1:7], 4, must_include=[uuids[3]]),
            kubelet.preferred(RESOURCE, uuids[::2], 1),
        ]
    finally:
        plugin.stop()
        kubelet.stop()
    replayed = cdigen("policy", "replay", "--node", NODE_SRC, "--requests", str(recorded))
    assert [json.loads(line)["devices"] for line in replayed.stdout.splitlines()] == answers


def test_generate_specs_keeps_the_guards_of_cdigen_generate(tmp_path: Path) -> None:
    """Was: a --driver-root that does not exist gave a spec without driver libraries, served."""
    result = cdigen(
        "plugin", "serve", "--node", NODE_SRC, "--plugin-dir", str(tmp_path / "dp"),
        "--spec-dir", str(tmp_path / "cdi"), "--generate-specs", "--driver-root", "/nonexistent",
        check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("cdigen: error: --driver-root: '/nonexistent' does not exist")
    assert not (tmp_path / "cdi").exists() or not list((tmp_path / "cdi").glob("*.yaml"))
