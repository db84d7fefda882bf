"""Kill -9 at every step of a dynamic-MIG prepare and unprepare: the plugin runs as a process
of its own (tests/helpers/dra_child.py) with the MIG double's state in a file, as the driver's
outlives the plugin, and stops itself with SIGKILL right after the Nth side effect (a test-only
crash point of the child, not of the plugin). After each restart no MIG device is left that no
claim holds, no claim is lost, and the kubelet's retry succeeds: for one placement, a create
that fails, an undo that fails too, and a claim of two placements."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pynvml
import pytest

from cdigen.plugin.dra.checkpoint import claim_spec_path
from tests.cdihost import FakeHost, build_host, make_node
from tests.dra_kubelet_sim import DraKubeletSim
from tests.fake_apiserver import FakeApiServer, allocated_claim
from tests.fakes.fake_mig import MigNvml
from tests.helpers.dra import DRIVER, NODE_NAME

REPO = Path(__file__).resolve().parents[2]
ONE = ("gpu-1-3g-40gb-at-4",)
TWO = ("gpu-1-3g-40gb-at-4", "gpu-2-3g-40gb-at-4")


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    """GPU 0 whole, GPUs 1 and 2 in MIG mode with no MIG devices yet."""
    node = make_node(3, mig_gpu=1)
    gpus = (
        node.gpus[0],
        dataclasses.replace(node.gpus[1], mig_devices=()),
        dataclasses.replace(node.gpus[1], index=2, minor=node.gpus[2].minor,
                            uuid=node.gpus[2].uuid, pci_bus_id=node.gpus[2].pci_bus_id,
                            mig_devices=()),
    )  # fmt: skip
    return build_host(tmp_path / "host", dataclasses.replace(node, gpus=gpus))


class Zygote:
    """tests/helpers/dra_child.py --zygote: forks plugin processes with the imports done."""

    def __init__(self, log: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.dra_child", "--zygote"],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log.open("ab"),
            text=True,
        )

    def fork(self, config: Path) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{config}\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Zygote]:
    one = Zygote(tmp_path_factory.mktemp("zygote") / "log")
    yield one
    one.close()


class Node1:
    """One node: the plugin process, its state on disk, the kubelet simulator."""

    def __init__(
        self, api: FakeApiServer, host: FakeHost, kubelet_dir: Path, tmp_path: Path, zygote: Zygote
    ) -> None:
        self.api, self.host, self.kubelet_dir, self.tmp = api, host, kubelet_dir, tmp_path
        self.zygote = zygote
        self.proc_root = tmp_path / "proc"
        self.mig_state = tmp_path / "mig-state.json"
        self.cdi_dir = tmp_path / "cdi"
        fake = MigNvml(host.node)
        fake.write_mig_minors(self.proc_root)
        (tmp_path / "node.pickle").write_bytes(pickle.dumps(host.node))
        self.kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        self.kubelet = DraKubeletSim(kubelet_dir, timeout_s=20)
        self.pid: int | None = None
        self.runs = 0

    def _config(self) -> Path:
        return self.tmp / f"config-{self.runs}.json"

    def start(self, kill_after: int | None = None, fail: dict[str, Any] | None = None) -> None:
        self.runs += 1
        ready = self.tmp / f"ready-{self.runs}"
        config = {
            "node": str(self.tmp / "node.pickle"),
            "host": {k: str(getattr(self.host, k)) for k in ("driver_root", "dev_root",
                                                               "sysfs_root")},
            "kubelet_dir": str(self.kubelet_dir), "cdi_dir": str(self.cdi_dir),
            "kubeconfig": str(self.kubeconfig), "proc_root": str(self.proc_root),
            "mig_state": str(self.mig_state), "kill_after": kill_after, "fail": fail or {},
            "steps": str(self.tmp / f"steps-{self.runs}"), "ready": str(ready),
        }  # fmt: skip
        self._config().write_text(json.dumps(config))
        self.pid = self.zygote.fork(self._config())
        deadline = time.monotonic() + 60
        exit_file = Path(f"{self._config()}.exit")
        while not ready.exists():
            assert not exit_file.exists(), "the plugin process ended before it was ready"
            assert time.monotonic() < deadline, "the plugin did not start"
            time.sleep(0.01)
        self.kubelet.register()

    def steps(self) -> list[str]:
        path = self.tmp / f"steps-{self.runs}"
        return path.read_text().splitlines() if path.exists() else []

    def _exit_code(self, timeout_s: float) -> int | None:
        exit_file = Path(f"{self._config()}.exit")
        deadline = time.monotonic() + timeout_s
        while not exit_file.exists():
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)
        return int(exit_file.read_text())

    def killed(self) -> bool:
        """Whether the plugin process killed itself (waits for it to end)."""
        return self._exit_code(10) == -signal.SIGKILL

    def stop(self) -> None:
        """Stop the plugin between calls (kill -9 too: what it did is all recorded)."""
        if self.pid is not None and self._exit_code(0) is None:
            os.kill(self.pid, signal.SIGKILL)
            assert self._exit_code(10) is not None
        self.pid = None

    def instances(self) -> set[tuple[str, int]]:
        """(GPU UUID, GI ID) of every GPU instance the driver (the double) holds now."""
        if not self.mig_state.exists():
            return set()
        uuids = {g.index: g.uuid for g in self.host.node.gpus}
        doc = json.loads(self.mig_state.read_text())
        return {(uuids[i["index"]], i["gi"]) for i in doc["instances"]}

    def checkpoint(self) -> dict[str, Any]:
        path = self.kubelet_dir / "plugins" / DRIVER / "checkpoint.json"
        return json.loads(path.read_text())["claims"] if path.exists() else {}

    def held(self) -> set[tuple[str, int]]:
        """What the checkpoint's claims hold."""
        return {(m["gpuUUID"], m["gi"]) for c in self.checkpoint().values()
                for m in c.get("migDevices", [])}  # fmt: skip


@pytest.fixture
def node(
    api: FakeApiServer, host: FakeHost, kubelet_dir: Path, tmp_path: Path, zygote: Zygote
) -> Iterator[Node1]:
    one = Node1(api, host, kubelet_dir, tmp_path, zygote)
    yield one
    one.stop()


def _claim(node: Node1, uid: str, devices: tuple[str, ...]) -> tuple[str, str, str]:
    results = [{"request": "gpu", "driver": DRIVER, "pool": NODE_NAME, "device": d}
               for d in devices]  # fmt: skip
    node.api.add_claim(allocated_claim("c", uid, results, node=NODE_NAME))
    return ("default", uid, "c")


def _prepare(node: Node1, ref: tuple[str, str, str]) -> str | None:
    """The claim's error ("" when prepared); None when the plugin died on the call."""
    try:
        return str(node.kubelet.prepare([ref]).claims[ref[1]].error)
    except grpc.RpcError:
        return None


def _unprepare(node: Node1, ref: tuple[str, str, str]) -> str | None:
    try:
        return str(node.kubelet.unprepare([ref]).claims[ref[1]].error)
    except grpc.RpcError:
        return None


def _consistent(node: Node1, ref: tuple[str, str, str], devices: tuple[str, ...]) -> None:
    """After a restart: every GPU instance is one a claim holds, and each claim's record is a
    GPU instance that exists."""
    assert node.instances() == node.held(), (node.instances(), node.checkpoint())
    claim = node.checkpoint().get(ref[1])
    if claim is not None and claim["state"] == "PrepareCompleted":
        assert {m["device"] for m in claim["migDevices"]} == {d for d in devices if "-at-" in d}


def _prepared_and_clean_up(
    node: Node1, ref: tuple[str, str, str], devices: tuple[str, ...]
) -> None:
    """The kubelet's retry prepares the claim, which then unprepares to nothing."""
    assert _prepare(node, ref) == ""
    claim = node.checkpoint()[ref[1]]
    assert len(claim["migDevices"]) == len(devices) == len(node.instances())
    assert claim_spec_path(node.cdi_dir, DRIVER, ref[1]).exists()
    assert _unprepare(node, ref) == ""
    assert node.instances() == set() and node.checkpoint() == {}
    assert not claim_spec_path(node.cdi_dir, DRIVER, ref[1]).exists()


NO_ROOM, IN_USE = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, pynvml.NVML_ERROR_IN_USE
SCENARIOS = {
    "one-placement": (ONE, {}),
    "create-fails": (ONE, {"nvmlGpuInstanceCreateComputeInstance": {"1": NO_ROOM}}),
    "create-and-undo-fail": (
        ONE,
        {
            "nvmlGpuInstanceCreateComputeInstance": {"1": NO_ROOM},
            "nvmlGpuInstanceDestroy": {"1": IN_USE},
        },
    ),
    "two-placements-second-fails-first-undo-fails": (
        TWO,
        {
            "nvmlGpuInstanceCreateComputeInstance": {"2": NO_ROOM},
            "nvmlGpuInstanceDestroy": {"1": IN_USE},
        },
    ),
    "two-placements": (TWO, {}),
}


@pytest.mark.parametrize(("devices", "fail"), list(SCENARIOS.values()), ids=list(SCENARIOS))
def test_a_kill_at_every_step_of_prepare_leaves_nothing_stranded(
    node: Node1, devices: tuple[str, ...], fail: dict[str, Any]
) -> None:
    killed_after: list[str] = []
    n = 0
    while True:
        n += 1
        ref = _claim(node, f"0000000{n % 10}-0000-4000-8000-00000000000{n % 10}", devices)
        node.start(kill_after=n, fail=fail)
        answer = _prepare(node, ref)
        if answer is not None:  # the call got through step n-1 and had no step n
            assert n > 1 and len(node.steps()) == n - 1
            assert (answer == "") == (not fail), answer
            break
        assert node.killed(), node.steps()
        killed_after.append(node.steps()[-1].split(" ", 1)[1])
        node.start()  # no failure now: the restart undoes what the killed one left
        _consistent(node, ref, devices)
        _prepared_and_clean_up(node, ref, devices)
        node.stop()
    # a failing prepare left nothing, or kept the claim half-prepared for the retry: the
    # restart (no failure now) undoes it, and the retry succeeds
    if "nvmlGpuInstanceDestroy" in fail:  # the undo failed: kept, with what it could not undo
        assert node.checkpoint()[ref[1]]["state"] == "PrepareStarted"
        assert node.instances(), "what the failed undo could not destroy is still there"
    elif fail:
        assert node.instances() == set() and node.checkpoint() == {}
    node.stop()
    node.start()
    _consistent(node, ref, devices)
    _prepared_and_clean_up(node, ref, devices)
    placements = len(devices)
    creates = killed_after.count("nvmlDeviceCreateGpuInstanceWithPlacement")
    assert killed_after[0] == "checkpoint" and creates == placements, killed_after
    if not fail:  # every step: the plan, each MIG device (GI, then CI), the spec, the end
        assert killed_after == [
            "checkpoint",
            *["nvmlDeviceCreateGpuInstanceWithPlacement",
              "nvmlGpuInstanceCreateComputeInstance"] * placements,
            "spec written",
            "checkpoint",
        ]  # fmt: skip


@pytest.mark.parametrize("devices", [ONE, TWO], ids=["one-placement", "two-placements"])
def test_a_kill_at_every_step_of_unprepare_leaves_nothing_stranded(
    node: Node1, devices: tuple[str, ...]
) -> None:
    killed_after: list[str] = []
    n = 0
    ref = _claim(node, "10000000-0000-4000-8000-000000000000", devices)
    node.start()
    assert _prepare(node, ref) == ""
    while True:
        n += 1
        node.stop()
        node.start(kill_after=n)
        answer = _unprepare(node, ref)
        if answer is not None:
            assert answer == "" and n > 1 and len(node.steps()) == n - 1
            assert node.instances() == set() and node.checkpoint() == {}
            break
        assert node.killed(), node.steps()
        killed_after.append(node.steps()[-1].split(" ", 1)[1])
        node.start()
        _consistent(node, ref, devices)
        assert _unprepare(node, ref) == ""  # the kubelet's retry
        assert node.instances() == set() and node.checkpoint() == {}
        assert not claim_spec_path(node.cdi_dir, DRIVER, ref[1]).exists()
        ref = _claim(node, f"1000000{n % 10}-0000-4000-8000-00000000000{n % 10}", devices)
        assert _prepare(node, ref) == ""  # the next round's claim, by the same process
    destroys = ["nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy"] * len(devices)
    assert killed_after == ["checkpoint", *destroys, "spec removed", "checkpoint"], killed_after


def test_the_double_keeps_its_instances_across_processes(host: FakeHost, tmp_path: Path) -> None:
    """What the crash tests rely on: the MIG double's state outlives the process."""
    from cdigen.plugin.dra.dynamic_mig import MigMaker
    from cdigen.policies.device_view import device_views

    state = tmp_path / "state.json"
    first = MigNvml(host.node, state=state)
    first.nvmlInit()
    first.write_mig_minors(tmp_path / "proc")
    view = next(v for v in device_views(host.node, mig_strategy="dynamic") if v.name == ONE[0])
    made = MigMaker(first, tmp_path / "proc").create(view)
    second = MigNvml(host.node, state=state)
    second.nvmlInit()
    assert second.node.gpus[1].mig_devices == (made.mig,)
    assert MigMaker(second, tmp_path / "proc").destroy(made.doc) == ""
    assert MigNvml(host.node, state=state).instances == {}
