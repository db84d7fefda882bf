"""DRA part 2 end to end without a cluster: one 24 GB card shared by claims with their own
limits (consumable capacity), one claim shared by several pods (time-slicing), and health as
device taints; the plugin talks to the fake API server through the official client, the kubelet
simulator prepares, and the scheduler's side is cdigen.policies.dra.claims' first fit over the
slices the plugin actually published."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdigen.discover import load_node
from cdigen.memory_shares import MemoryShares
from cdigen.plugin.agent.kubeapi import api_client
from cdigen.plugin.agent.xid import xid_reason
from cdigen.plugin.dra.checkpoint import claim_spec_path
from cdigen.plugin.dra.kube import KubeApi
from cdigen.plugin.dra.kubelet_plugin import DraPlugin
from cdigen.plugin.dra.mps import MpsSettings
from cdigen.policies.dra.claim_docs import claim_from_doc, device_class
from cdigen.policies.dra.claims import FirstFit, NodeState
from cdigen.policies.dra.slice_devices import slice_devices
from tests.cdihost import FakeHost, build_host
from tests.dra_kubelet_sim import DraKubeletSim
from tests.fake_apiserver import FakeApiServer, allocated_claim
from tests.helpers.cdi_runtime import CdiRuntime, Container, cdi_runtime
from tests.helpers.dra import DRIVER, NODE_NAME, dra_options
from tests.helpers.podman import Podman
from tests.helpers.podman import missing_tools as podman_missing_tools

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "deploy" / "dra" / "examples"
GIB = 1 << 30


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    yield server
    server.stop()


class Plugin:
    """One DRA plugin for builtin:rtx4090 (or another node) against the fake API server."""

    def __init__(self, api: FakeApiServer, kubelet_dir: Path, tmp_path: Path) -> None:
        self.api = api
        self.kubelet_dir = kubelet_dir
        self.tmp_path = tmp_path
        self.cdi_dir = tmp_path / "run-cdi"
        self.kubelet = DraKubeletSim(kubelet_dir)
        self.plugin: DraPlugin | None = None
        self.host: FakeHost | None = None

    def start(self, source: str = "builtin:rtx4090", **overrides: Any) -> DraPlugin:
        self.host = build_host(self.tmp_path / "host", load_node(source))
        options = dra_options(self.host, self.kubelet_dir, self.cdi_dir, **overrides)
        kube = KubeApi(api_client(str(self.api.kubeconfig(self.tmp_path / "kubeconfig"))))
        self.plugin = DraPlugin(options, self.host.node, slices=kube, claims=kube)
        self.plugin.start()
        self.kubelet.register()
        assert self.plugin.wait_published(10), "the slices were not published"
        return self.plugin

    def slices(self) -> list[dict[str, Any]]:
        return [json.loads(json.dumps(s)) for s in self.api.slices.values()]

    def spec(self, uid: str) -> dict[str, Any]:
        doc: dict[str, Any] = yaml.safe_load(claim_spec_path(self.cdi_dir, DRIVER, uid).read_text())
        return doc

    def stop(self) -> None:
        if self.plugin is not None:
            self.plugin.stop()


@pytest.fixture
def plugin(api: FakeApiServer, kubelet_dir: Path, tmp_path: Path) -> Iterator[Plugin]:
    p = Plugin(api, kubelet_dir, tmp_path)
    yield p
    p.stop()


def _classes() -> dict[str, Any]:
    path = EXAMPLES.parent / "deviceclasses.yaml"
    docs = list(yaml.safe_load_all(path.read_text()))
    return {d["metadata"]["name"]: device_class(d, str(path)) for d in docs}


def _memory_claim(amount: str, name: str) -> Any:
    # the template (the pods using it follow it in the file)
    doc = next(yaml.safe_load_all((EXAMPLES / "memory-3gi.yaml").read_text()))
    doc["metadata"]["name"] = name
    doc["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = (
        amount
    )
    return claim_from_doc(doc, name)


def _strict(body: dict[str, Any], version: str) -> None:
    import kubernetes_validate

    clean = json.loads(json.dumps(body))
    clean["metadata"].pop("resourceVersion", None)
    clean["metadata"].pop("uid", None)
    kubernetes_validate.validate(clean, version, strict=True)


# --------------------------------------------------------------------------- the 4090 story


def test_the_4090_story_two_3gi_claims_get_their_own_limits_and_a_third_is_refused(
    plugin: Plugin,
) -> None:
    plugin.start(
        memory_shares=MemoryShares(step=GIB),
        mps=MpsSettings(pipe_dir="/run/nvidia/mps", thread_percentage=0),
    )
    (body,) = plugin.slices()
    for version in ("1.34", "1.35", "1.36", "1.37"):
        _strict(body, version)
    (device,) = body["spec"]["devices"]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"]["memory"]["requestPolicy"] == {
        "default": "23Gi",  # a claim naming no memory takes the whole GPU unless told otherwise
        "validRange": {"min": "1Gi", "max": "23Gi", "step": "1Gi"},
    }

    # the scheduler's side: first fit with its capacity check, over what was published
    fit = FirstFit(slice_devices([body]), _classes())
    state = NodeState()
    results = []
    for n, name in enumerate(("notebook-a", "notebook-b")):
        allocation = fit.allocate(_memory_claim("3Gi", name), state)
        assert allocation.devices == ("gpu-0",), allocation.error
        assert allocation.picks[0].consumed == {f"{DRIVER}/memory": 3 * GIB}
        state.add(allocation.picks, fit.by_key)
        results.append(
            {
                "request": "share",
                "driver": DRIVER,
                "pool": NODE_NAME,
                "device": "gpu-0",
                "shareID": f"{n + 1}1111111-1111-1111-1111-111111111111",
                "consumedCapacity": {"memory": "3Gi"},
            }
        )
    third = fit.allocate(_memory_claim("18Gi", "notebook-c"), state)
    assert third.picks == ()
    assert "1 needed" in third.error and "0 device(s) match and fit" in third.error
    _, reasons = fit.explain(_memory_claim("18Gi", "notebook-c"), state)
    assert reasons == [("gpu-0", "needs memory 18Gi, 18420Mi left")]  # 23.99 GiB - 6 GiB
    assert fit.allocate(_memory_claim("17Gi", "notebook-d"), state).devices == ("gpu-0",)

    # the kubelet's side: each claim prepared with its own limit
    refs = []
    for n, result in enumerate(results):
        uid = f"uid-{n}"
        plugin.api.add_claim(allocated_claim(f"notebook-{n}", uid, [result]))
        refs.append(("default", uid, f"notebook-{n}"))
    response = plugin.kubelet.prepare(refs)
    for uid in ("uid-0", "uid-1"):
        assert response.claims[uid].error == ""
        env = plugin.spec(uid)["containerEdits"]["env"]
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3072M" in env
        assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in env
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=12" in env  # 3 of 23.99 GiB, rounded down
        assert "CUDA_MPS_PIPE_DIRECTORY=/run/nvidia/mps" in env
        mounts = plugin.spec(uid)["containerEdits"]["mounts"]
        assert {"hostPath": "/run/nvidia/mps", "containerPath": "/run/nvidia/mps"}.items() <= (
            mounts[-1].items()
        )
        assert "ro" in mounts[-1]["options"]  # clients connect to the sockets, nothing more
    assert response.claims["uid-1"].devices[0].share_id == results[1]["shareID"]


def test_limits_keyed_by_uuid_when_asked(plugin: Plugin) -> None:
    p = plugin.start(memory_shares=MemoryShares(), mps=MpsSettings(limit_key="uuid"))
    uuid = p.node.gpus[0].uuid
    result = {
        "request": "share",
        "driver": DRIVER,
        "pool": NODE_NAME,
        "device": "gpu-0",
        "shareID": "31111111-1111-1111-1111-111111111111",
        "consumedCapacity": {"memory": "5Gi"},
    }
    plugin.api.add_claim(allocated_claim("a", "uid-a", [result]))
    assert plugin.kubelet.prepare([("default", "uid-a", "a")]).claims["uid-a"].error == ""
    env = plugin.spec("uid-a")["containerEdits"]["env"]
    assert env.count(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={uuid}=5120M") == 1
    assert not any(e.startswith(("CUDA_DEVICE_ORDER", "CUDA_MPS_ACTIVE")) for e in env)


def test_without_sharing_options_slices_stay_exclusive_and_specs_carry_no_limits(
    plugin: Plugin,
) -> None:
    plugin.start()
    (body,) = plugin.slices()
    (device,) = body["spec"]["devices"]
    assert "allowMultipleAllocations" not in device
    assert "requestPolicy" not in device["capacity"]["memory"]
    for version in ("1.34", "1.35", "1.36", "1.37"):
        _strict(body, version)
    plugin.api.add_claim(
        allocated_claim(
            "w", "uid-w", [{"request": "g", "driver": DRIVER, "pool": NODE_NAME, "device": "gpu-0"}]
        )
    )
    assert plugin.kubelet.prepare([("default", "uid-w", "w")]).claims["uid-w"].error == ""
    assert "env" not in plugin.spec("uid-w").get("containerEdits", {}) or not any(
        "MPS" in e for e in plugin.spec("uid-w")["containerEdits"]["env"]
    )


# --------------------------------------------------------------------------- time-slicing


def test_one_claim_shared_by_several_pods_is_prepared_once_per_claim(plugin: Plugin) -> None:
    """DRA-native time-slicing: pods that reference one ResourceClaim share its GPU. The kubelet
    prepares per claim: a second pod's prepare returns the same devices and writes nothing new;
    the claim is unprepared once, when the last pod using it is gone."""
    p = plugin.start(mps=MpsSettings(replicas=4, pipe_dir="/run/nvidia/mps"))
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE_NAME, "device": "gpu-0"}
    plugin.api.add_claim(allocated_claim("shared-gpu", "uid-s", [result]))
    ref = ("default", "uid-s", "shared-gpu")
    pod_a = plugin.kubelet.prepare([ref])
    path = claim_spec_path(plugin.cdi_dir, DRIVER, "uid-s")
    first = path.stat().st_mtime_ns
    pod_b = plugin.kubelet.prepare([ref])
    assert pod_a.claims["uid-s"] == pod_b.claims["uid-s"]
    assert list(pod_a.claims["uid-s"].devices[0].cdi_device_ids) == [
        f"k8s.{DRIVER}/claim=uid-s-gpu-0"
    ]
    assert path.stat().st_mtime_ns == first and len(list(plugin.cdi_dir.glob("*.json"))) == 1
    assert set(p.preparer.prepared()) == {"uid-s"}
    quarter = (p.node.gpus[0].memory_bytes // 4) >> 20
    env = plugin.spec("uid-s")["containerEdits"]["env"]
    assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={quarter}M" in env  # replicas: 1/4 each

    # another claim for the same GPU is still refused: sharing is by the one claim
    plugin.api.add_claim(allocated_claim("other", "uid-o", [result]))
    refused = plugin.kubelet.prepare([("default", "uid-o", "other")]).claims["uid-o"].error
    assert "already prepared for claim default/shared-gpu" in refused

    assert plugin.kubelet.unprepare([ref]).claims["uid-s"].error == ""
    assert not path.exists() and p.preparer.prepared() == {}


# --------------------------------------------------------------------------- taints


def test_a_critical_xid_taints_the_device_in_the_slice_and_recovery_clears_it(
    plugin: Plugin,
) -> None:
    p = plugin.start("builtin:dgx1-v100", taint_xids={79: "NoExecute", 94: "NoSchedule"})
    (before,) = plugin.slices()
    assert not any("taints" in d for d in before["spec"]["devices"])
    gpu3 = next(g for g in p.node.gpus if g.index == 3)
    gpu5 = next(g for g in p.node.gpus if g.index == 5)

    p.board.set_reasons("xid", {gpu3.uuid: xid_reason(79), gpu5.uuid: xid_reason(94)})
    (tainted,) = plugin.slices()
    for version in ("1.34", "1.35", "1.36", "1.37"):
        _strict(tainted, version)
    taints = {d["name"]: d.get("taints") for d in tainted["spec"]["devices"]}
    assert taints["gpu-3"] == [{"key": f"{DRIVER}/xid", "value": "79", "effect": "NoExecute"}]
    assert taints["gpu-5"] == [{"key": f"{DRIVER}/xid", "value": "94", "effect": "NoSchedule"}]
    assert [n for n, t in taints.items() if t] == ["gpu-3", "gpu-5"]
    generation = tainted["spec"]["pool"]["generation"]
    assert generation == before["spec"]["pool"]["generation"] + 1

    # the scheduler's first fit skips tainted devices
    fit = FirstFit(slice_devices([tainted]), _classes())
    two = yaml.safe_load((EXAMPLES / "two-gpus-one-nvlink-clique.yaml").read_text())
    allocation = fit.allocate(claim_from_doc(two, "two"))
    # tainted GPUs move to the end of the slice: first fit lands on the best untainted pair
    # (6+7, double-linked like 2+3) instead of 2+0 after 3's place in the old order
    assert allocation.devices == ("gpu-6", "gpu-7")
    assert "gpu-3" not in allocation.devices
    assert {d["name"] for d in tainted["spec"]["devices"][-2:]} == {"gpu-3", "gpu-5"}

    # an Xid not in the list marks the device unhealthy but does not taint it
    p.board.set_reasons("xid", {gpu5.uuid: xid_reason(31)})
    (after,) = plugin.slices()
    assert {d["name"] for d in after["spec"]["devices"] if "taints" in d} == {"gpu-3"}

    p.board.set_reasons("xid", {gpu3.uuid: None, gpu5.uuid: None})
    (cleared,) = plugin.slices()
    assert not any("taints" in d for d in cleared["spec"]["devices"])
    assert cleared["spec"]["pool"]["generation"] == generation + 2


def test_only_an_xid_event_taints_not_a_reason_that_reads_like_one(plugin: Plugin) -> None:
    """The Xid travels as a number beside the reason's text (was: read back with a regex, so
    any watcher's text naming "critical Xid 79" tainted the device)."""
    p = plugin.start("builtin:dgx1-v100", taint_xids={79: "NoExecute"})
    gpu3 = next(g for g in p.node.gpus if g.index == 3)
    p.board.set_reasons("node", {gpu3.uuid: "critical Xid 79 (copied from a node file)"})
    (slice_,) = plugin.slices()
    assert not any("taints" in d for d in slice_["spec"]["devices"])
    p.board.set_reasons("xid", {gpu3.uuid: xid_reason(79)})
    (slice_,) = plugin.slices()
    assert [d["name"] for d in slice_["spec"]["devices"] if "taints" in d] == ["gpu-3"]


# --------------------------------------------------------------------------- MPS shared memory


def _mps_dirs(tmp_path: Path) -> tuple[Path, Path]:
    """A pipe directory and a shared-memory directory on the "node", as the MPS component makes
    them (the shm directory world-writable, as /dev/shm is), with a segment of the daemon's."""
    pipe, shm = tmp_path / "node-run" / "mps", tmp_path / "node-run" / "mps-shm"
    pipe.mkdir(parents=True, mode=0o755)
    shm.mkdir(mode=0o755)
    shm.chmod(0o1777)
    (shm / "cuda.shm.daemon").write_text("the MPS daemon's segment\n")
    return pipe, shm


def _prepare_limited_and_whole(plugin: Plugin, pipe: Path, shm: Path) -> Any:
    """The plugin on dgx1-v100 with MPS pipe and shm directories, and the kubelet's answer to
    preparing two claims at once: ``uid-l``, a 4Gi memory share of gpu-0 (limited), and
    ``uid-w``, the whole gpu-1 (exclusive)."""
    plugin.start(
        "builtin:dgx1-v100",
        memory_shares=MemoryShares(step=GIB),
        mps=MpsSettings(pipe_dir=str(pipe), shm_dir=str(shm)),
    )
    plugin.api.add_claim(allocated_claim("limited", "uid-l", [_share("gpu-0", "4Gi", 1)]))
    whole = {"request": "gpu", "driver": DRIVER, "pool": NODE_NAME, "device": "gpu-1"}
    plugin.api.add_claim(allocated_claim("whole", "uid-w", [whole]))
    return plugin.kubelet.prepare([("default", "uid-l", "limited"), ("default", "uid-w", "whole")])


def _share(device: str, memory: str, n: int) -> dict[str, Any]:
    return {
        "request": "share",
        "driver": DRIVER,
        "pool": NODE_NAME,
        "device": device,
        "shareID": f"{n}1111111-1111-1111-1111-111111111111",
        "consumedCapacity": {"memory": memory},
    }


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiRuntime]:
    yield from cdi_runtime(tmp_path_factory)


def test_a_limited_claim_gets_the_daemons_shm_at_dev_shm_and_a_whole_gpu_claim_does_not(
    plugin: Plugin, tmp_path: Path, podman: CdiRuntime
) -> None:
    """--mps-shm-dir: the claim's CDI spec mounts the node's shm directory at /dev/shm, and the
    CDI library that runtimes use (podman's) injects it: the container sees the daemon's segment
    there and gets the pipe directory in its env; an exclusive whole GPU gets neither MPS
    mount."""
    pipe, shm = _mps_dirs(tmp_path)
    response = _prepare_limited_and_whole(plugin, pipe, shm)
    assert response.claims["uid-l"].error == "" and response.claims["uid-w"].error == ""

    limited = plugin.spec("uid-l")["containerEdits"]["mounts"]
    # as a runtime mounts a container's own /dev/shm: writable, nosuid, nodev, noexec
    shm_options = ["rw", "nosuid", "nodev", "noexec", "rbind", "rprivate"]
    assert {"hostPath": str(shm), "containerPath": "/dev/shm", "options": shm_options} in limited
    plain = plugin.spec("uid-w").get("containerEdits", {}).get("mounts", [])
    assert not [m for m in plain if m["hostPath"] in (str(pipe), str(shm))]
    assert "/dev/shm" not in [m["containerPath"] for m in plain]

    assert plugin.host is not None
    if not plugin.host.real_nodes:
        pytest.skip("mknod is not permitted here: the CDI library cannot stat the device nodes")
    segment = "/dev/shm/cuda.shm.daemon"
    seen = _run(podman, plugin, "uid-l", tmp_path, segment)
    assert seen.ok, seen.error
    assert seen.files[segment] == (shm / "cuda.shm.daemon").read_text()
    assert set(shm_options[:4]) <= set(seen.mounts["/dev/shm"])
    assert seen.env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    whole = _run(podman, plugin, "uid-w", tmp_path, segment)
    assert whole.ok and segment not in whole.files, whole.error
    assert "CUDA_MPS_PIPE_DIRECTORY" not in whole.env


def _run(podman: CdiRuntime, plugin: Plugin, uid: str, tmp_path: Path, *read: str) -> Container:
    """A container given the claim's devices (its spec in /var/run/cdi, as DRA writes them)."""
    names = [f"k8s.{DRIVER}/claim={d['name']}" for d in plugin.spec(uid)["devices"]]
    empty = tmp_path / "etc-cdi"
    empty.mkdir(exist_ok=True)
    return podman.run(empty, names, var_run_cdi=plugin.cdi_dir, read=read)


def test_a_container_of_a_limited_claim_sees_the_daemons_segment_in_dev_shm(
    plugin: Plugin, tmp_path: Path
) -> None:
    """podman + runc with the claim's CDI device: /dev/shm is the node directory (the daemon's
    file is there, and what the container writes lands on the node); a whole GPU's container
    keeps a /dev/shm of its own."""
    reason = podman_missing_tools()
    if reason:
        pytest.skip(reason)
    pipe, shm = _mps_dirs(tmp_path)
    answer = _prepare_limited_and_whole(plugin, pipe, shm)
    assert plugin.host is not None
    if not plugin.host.real_nodes:
        pytest.skip("mknod is not permitted here, so no real device nodes for podman to use")
    (limited,) = answer.claims["uid-l"].devices
    (exclusive,) = answer.claims["uid-w"].devices
    store = Path(tempfile.mkdtemp(prefix="cdigen-podman-", dir="/tmp"))
    try:
        podman = Podman(tmp_path / "work", store)
        podman.etc_cdi, podman.var_run_cdi = tmp_path / "work" / "empty", plugin.cdi_dir
        script = (
            "cat /dev/shm/cuda.shm.daemon && echo client > /dev/shm/cuda.shm.client && "
            f"(touch {pipe}/planted 2>&1; true)"
        )
        seen = podman.run(script, *limited.cdi_device_ids)
        if seen.returncode != 0 and "cuda.shm" not in seen.stderr:
            smoke = podman.run("true")
            if smoke.returncode != 0:
                pytest.skip(f"this machine cannot run containers: {smoke.stderr.strip()[-300:]}")
        assert seen.returncode == 0, seen.stderr + seen.stdout
        assert seen.stdout.splitlines()[0] == "the MPS daemon's segment"
        assert (shm / "cuda.shm.client").read_text() == "client\n"
        # the pipe directory is read-only in the container: nothing planted beside the sockets
        assert "Read-only file system" in seen.stdout and not (pipe / "planted").exists()
        other = podman.run("ls -A /dev/shm; echo done", *exclusive.cdi_device_ids)
        assert other.returncode == 0, other.stderr + other.stdout
        assert other.stdout.splitlines() == ["done"]  # its own, empty /dev/shm
    finally:
        shutil.rmtree(store, ignore_errors=True)


@pytest.mark.parametrize("which", ["pipe", "shm"])
def test_a_limited_claim_is_refused_when_an_mps_directory_is_a_symlink(
    plugin: Plugin, tmp_path: Path, which: str
) -> None:
    """A pipe or shm directory replaced by a symlink is not mounted: the limited claim fails,
    naming the flag and the path; an exclusive whole-GPU claim, which mounts neither, is fine."""
    pipe, shm = _mps_dirs(tmp_path)
    bad = pipe if which == "pipe" else shm
    elsewhere = tmp_path / "elsewhere"
    bad.rename(elsewhere)
    bad.symlink_to(elsewhere)
    response = _prepare_limited_and_whole(plugin, pipe, shm)
    error = response.claims["uid-l"].error
    assert f"--mps-{which}-dir" in error and f"{bad} is a symlink" in error, error
    assert not response.claims["uid-l"].devices
    assert not claim_spec_path(plugin.cdi_dir, DRIVER, "uid-l").exists()
    assert response.claims["uid-w"].error == "" and response.claims["uid-w"].devices


# --------------------------------------------------------------------------- per-claim sharing

API = "gpu.cdigen.dev/v1alpha1"


def _config(source: str, sharing: dict[str, Any], *requests: str) -> dict[str, Any]:
    """One status.allocation.devices.config entry of our driver, as the scheduler copies it."""
    entry: dict[str, Any] = {
        "source": source,
        "opaque": {
            "driver": DRIVER,
            "parameters": {"apiVersion": API, "kind": "GpuConfig", "sharing": sharing},
        },
    }
    if requests:
        entry["requests"] = list(requests)
    return entry


def _claim_with(
    plugin: Plugin, uid: str, config: list[dict[str, Any]], **result: Any
) -> tuple[str, dict[str, Any]]:
    """Prepare a claim of gpu-0 with ``config`` entries: its error and its spec's edits (then
    unprepare it, so that the next claim may have the GPU)."""
    doc = allocated_claim(
        uid,
        uid,
        [{"request": "g", "driver": DRIVER, "pool": NODE_NAME, "device": "gpu-0", **result}],
    )
    doc["status"]["allocation"]["devices"]["config"] = config
    plugin.api.add_claim(doc)
    ref = ("default", uid, uid)
    error = plugin.kubelet.prepare([ref]).claims[uid].error
    path = claim_spec_path(plugin.cdi_dir, DRIVER, uid)
    edits = plugin.spec(uid).get("containerEdits", {}) if path.exists() else {}
    assert plugin.kubelet.unprepare([ref]).claims[uid].error == ""
    return error, edits


MPS_25 = {
    "strategy": "MPS",
    "mpsConfig": {"defaultActiveThreadPercentage": 25, "defaultPinnedDeviceMemoryLimit": "4Gi"},
}


def test_a_claim_sets_its_own_mps_limits_and_the_claim_wins_over_the_class(
    plugin: Plugin,
) -> None:
    plugin.start(mps=MpsSettings(pipe_dir="/run/nvidia/mps", thread_percentage=0, replicas=2))
    # node-wide: half the card and a proportional SM share
    error, edits = _claim_with(plugin, "node-wide", [])
    env = edits["env"]
    assert error == ""
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=12282M" in env
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in env
    # the class says MPS 25% / 4Gi, the claim says 10% / 2Gi: the claim's entry wins whole
    claim_mps = {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 10,
                 "defaultPerDevicePinnedMemoryLimit": {"0": "2Gi"}}}  # fmt: skip
    error, edits = _claim_with(
        plugin, "own", [_config("FromClass", MPS_25), _config("FromClaim", claim_mps)]
    )
    env = edits["env"]
    assert error == ""
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M" in env
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10" in env
    assert "CUDA_MPS_PIPE_DIRECTORY=/run/nvidia/mps" in env
    # the class alone
    error, edits = _claim_with(plugin, "class", [_config("FromClass", MPS_25)])
    env = edits["env"]
    assert error == ""
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M" in env
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in env


def test_an_mps_limit_never_exceeds_the_memory_the_claim_consumed(plugin: Plugin) -> None:
    plugin.start(memory_shares=MemoryShares(), mps=MpsSettings(pipe_dir="/run/nvidia/mps"))
    error, edits = _claim_with(
        plugin,
        "small",
        [_config("FromClaim", MPS_25)],
        shareID="41111111-1111-1111-1111-111111111111",
        consumedCapacity={"memory": "3Gi"},
    )
    assert error == ""
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3072M" in edits["env"]  # not the config's 4Gi


def test_time_slicing_for_a_claim_means_no_mps_limits_on_an_mps_node(plugin: Plugin) -> None:
    plugin.start(mps=MpsSettings(pipe_dir="/run/nvidia/mps", replicas=4))
    sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}
    error, edits = _claim_with(plugin, "ts", [_config("FromClaim", sharing)])
    assert error == ""
    assert not any("MPS" in e for e in edits.get("env", []))
    assert not any(m["hostPath"] == "/run/nvidia/mps" for m in edits.get("mounts", []))


@pytest.mark.parametrize(
    ("sharing", "message"),
    [
        (MPS_25, "the claim asks for MPS sharing, but this driver runs with no MPS daemon"),
        (
            {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"3": "1Gi"}}},
            "defaultPerDevicePinnedMemoryLimit names 3, not a GPU of this claim",
        ),
        (
            {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "512Ki"}},
            "less than 1Mi",
        ),
        (
            {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
            "interval: expected one of Default",
        ),
    ],
)
def test_a_sharing_setting_that_cannot_be_honoured_is_that_claims_one_line_error(
    plugin: Plugin, sharing: dict[str, Any], message: str
) -> None:
    pipe = None if message.startswith("the claim asks for MPS") else "/run/nvidia/mps"
    plugin.start(mps=MpsSettings(pipe_dir=pipe))
    error, edits = _claim_with(plugin, "bad", [_config("FromClaim", sharing)])
    assert message in error and "\n" not in error, error
    assert edits == {}  # no spec was written


def test_the_default_taint_is_no_schedule_as_nvidias_driver_does(plugin: Plugin) -> None:
    p = plugin.start("builtin:dgx1-v100")
    gpu3 = next(g for g in p.node.gpus if g.index == 3)
    p.board.set_reasons("xid", {gpu3.uuid: xid_reason(79)})
    (tainted,) = plugin.slices()
    taints = {d["name"]: d.get("taints") for d in tainted["spec"]["devices"] if d.get("taints")}
    assert taints == {"gpu-3": [{"key": f"{DRIVER}/xid", "value": "79", "effect": "NoSchedule"}]}


def test_a_pool_above_64_devices_with_a_taint_is_cut_into_slices_of_64() -> None:
    """resource.k8s.io/v1 refuses a slice of more than 64 devices when one has a taint."""
    from dataclasses import replace

    from cdigen.plugin.dra.slices import MAX_DEVICES_PER_SLICE, build_slices
    from cdigen.policies.device_view import device_views

    node = load_node("builtin:dgx2-v100")
    base = device_views(node, mig_strategy="none")
    views = []  # 100 GPUs, gpu-0 to gpu-99: the 16 again and again under new indexes
    for n in range(100):
        view = base[n % len(base)]
        gpu = replace(view.gpu, index=n)
        views.append(replace(view, entry=replace(view.entry, gpu=gpu)))
    plain = build_slices(views, driver=DRIVER, node_name=NODE_NAME, generation=1)
    assert [len(s["spec"]["devices"]) for s in plain] == [100]  # <= 128 untainted
    taint = [{"key": f"{DRIVER}/xid", "value": "79", "effect": "NoSchedule"}]
    tainted = build_slices(
        views, driver=DRIVER, node_name=NODE_NAME, generation=2, taints={"gpu-70": taint}
    )
    assert [len(s["spec"]["devices"]) for s in tainted] == [64, 36]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in tainted} == {2}
    assert MAX_DEVICES_PER_SLICE == 128
    for body in tainted:
        body["metadata"]["uid"] = "x"  # _strict drops it, as the API server's own fields
        for version in ("1.35", "1.36", "1.37"):
            _strict(body, version)


@pytest.mark.parametrize(("server", "published"), [(("1", "36"), True), (("1", "34"), False)])
def test_an_informational_taint_goes_only_to_a_server_that_knows_effect_none(
    plugin: Plugin, server: tuple[str, str], published: bool, caplog: pytest.LogCaptureFixture
) -> None:
    plugin.api.version = server
    p = plugin.start("builtin:dgx1-v100", taint_xids={79: "None", 48: "NoSchedule"})
    gpu3 = next(g for g in p.node.gpus if g.index == 3)
    gpu5 = next(g for g in p.node.gpus if g.index == 5)
    p.board.set_reasons("xid", {gpu3.uuid: xid_reason(79), gpu5.uuid: xid_reason(48)})
    (body,) = plugin.slices()
    taints = {d["name"]: d.get("taints") for d in body["spec"]["devices"] if d.get("taints")}
    assert taints["gpu-5"] == [{"key": f"{DRIVER}/xid", "value": "48", "effect": "NoSchedule"}]
    if published:
        assert taints["gpu-3"] == [{"key": f"{DRIVER}/xid", "value": "79", "effect": "None"}]
        for version in ("1.35", "1.36", "1.37"):
            _strict(body, version)
    else:
        assert "gpu-3" not in taints
        said = [r.getMessage() for r in caplog.records if "effect None" in r.getMessage()]
        assert said == [
            "taints of effect None left out of the ResourceSlices: the API server is 1.34, "
            "and the effect needs Kubernetes 1.35 or newer"
        ]


def test_a_claim_holding_every_step_of_its_gpu_is_prepared_as_a_whole_gpu(plugin: Plugin) -> None:
    """A claim naming no memory takes the whole GPU by default (23Gi of a 4090 in 1Gi steps:
    not one more step fits beside it): no MPS limit and no MPS mounts, as an exclusive GPU;
    a 22Gi claim, beside which one step still fits, keeps its limit."""
    plugin.start(memory_shares=MemoryShares(step=GIB), mps=MpsSettings(pipe_dir="/run/nvidia/mps"))
    (body,) = plugin.slices()
    assert body["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]["default"] == "23Gi"
    plugin.api.add_claim(allocated_claim("whole", "uid-w", [_share("gpu-0", "23Gi", 1)]))
    plugin.api.add_claim(allocated_claim("most", "uid-m", [_share("gpu-0", "22Gi", 2)]))
    answer = plugin.kubelet.prepare([("default", "uid-w", "whole"), ("default", "uid-m", "most")])
    assert answer.claims["uid-w"].error == answer.claims["uid-m"].error == ""
    whole = plugin.spec("uid-w").get("containerEdits", {})
    assert not any(e.startswith("CUDA_MPS") for e in whole.get("env", [])), whole
    assert not any("/run/nvidia/mps" in m["hostPath"] for m in whole.get("mounts", [])), whole
    assert (
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=22528M" in plugin.spec("uid-m")["containerEdits"]["env"]
    )
