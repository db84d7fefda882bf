"""``dra serve``'s Xid policy (issue 36, point 1): ``--ignored-xids`` and
``--recover-after-seconds``, the device plugin's ``health.ignoredXids`` and
``health.recoverAfterSeconds``, reach the device taints in the published slice, and a GPU whose
Xids have stopped comes back once it answers NVML again, as on the device-plugin wing. The NVML
events come from a double; the slices go to the fake API server through the official client."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cdigen.cli import build_parser, main
from cdigen.discover import load_node
from cdigen.plugin.agent.kubeapi import api_client
from cdigen.plugin.agent.xid import DEFAULT_IGNORED_XIDS, DEFAULT_RECOVER_AFTER_S
from cdigen.plugin.deviceplugin.config import load_config
from cdigen.plugin.dra.kube import KubeApi
from cdigen.plugin.dra.kubelet_plugin import DraPlugin
from cdigen.plugin.dra.serve_cli import _dra_options
from tests.cdihost import build_host
from tests.dra_kubelet_sim import DraKubeletSim
from tests.fake_apiserver import FakeApiServer
from tests.fakes.event_nvml import EventNvml
from tests.helpers.dra import NODE_NAME, dra_options

SERVE = ["dra", "serve", "--node", "builtin:rtx4090", "--node-name", NODE_NAME]


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    yield server
    server.stop()


def _options(*flags: str) -> dict[str, Any]:
    """What ``dra serve`` takes from ``flags`` for its Xid policy."""
    options = _dra_options(build_parser().parse_args([*SERVE, *flags]))
    return {"ignored_xids": options.ignored_xids, "recover_after_s": options.recover_after_s}


def _wait(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_the_flags_default_to_the_device_plugins_defaults() -> None:
    assert _options() == {
        "ignored_xids": DEFAULT_IGNORED_XIDS,
        "recover_after_s": DEFAULT_RECOVER_AFTER_S,
    }
    health = load_config(env={}).health
    assert (health.ignored_xids, health.recover_after_s) == tuple(_options().values())


def test_ignored_xids_leave_the_device_untainted_and_a_quiet_gpu_recovers(
    api: FakeApiServer, kubelet_dir: Path, tmp_path: Path
) -> None:
    flags = _options("--ignored-xids", "79,13", "--recover-after-seconds", "0.3")
    assert flags == {"ignored_xids": (13, 79), "recover_after_s": 0.3}
    host = build_host(tmp_path / "host", load_node("builtin:rtx4090"))
    (gpu,) = host.node.gpus
    nvml = EventNvml([gpu.uuid])
    options = dra_options(host, kubelet_dir, tmp_path / "cdi", health_poll_interval_s=0.05, **flags)
    kube = KubeApi(api_client(str(api.kubeconfig(tmp_path / "kubeconfig"))))
    plugin = DraPlugin(options, host.node, slices=kube, claims=kube, nvml=nvml)
    plugin.start()
    try:
        DraKubeletSim(kubelet_dir).register()
        assert plugin.wait_published(10), plugin.slice_problem

        def taints() -> list[Any]:
            slices = [json.loads(json.dumps(s)) for s in api.slices.values()]
            return [d.get("taints") for s in slices for d in s["spec"]["devices"]]

        nvml.xid(gpu.uuid, 79)  # fallen off the bus: a default taint, ignored here
        nvml.xid(gpu.uuid, 48)  # double-bit ECC: taints by default
        _wait(lambda: any(taints()), "Xid 48 did not taint the device")
        assert [t for t in taints() if t] == [
            [{"key": f"{options.driver}/xid", "value": "48", "effect": "NoSchedule"}]
        ]
        # no more Xids: after 0.3 s the GPU, answering NVML, is healthy and untainted again
        _wait(lambda: not any(taints()), "the GPU did not recover after 0.3 s", timeout_s=5)
    finally:
        plugin.stop()


@pytest.mark.parametrize("command", [SERVE, ["plugin", "serve", "--node", "builtin:rtx4090"]])
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ignored-xids", "13,bad"], "--ignored-xids: expected comma-separated Xid numbers"),
        (["--ignored-xids", "-1"], "--ignored-xids: expected comma-separated Xid numbers"),
        (["--recover-after-seconds", "-1"], "--recover-after-seconds: '-1' is not a number"),
        (["--recover-after-seconds", "nan"], "--recover-after-seconds: 'nan' is not a number"),
    ],
)
def test_bad_xid_flags_are_one_line_exit_2_on_both_wings(
    command: list[str], flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
