"""Sharing through a real ``cdigen plugin serve`` process and the kubelet simulator.

First the RTX 4090 story of docs/sharing.md, run as the doc writes it (its ``sharing.yaml`` and
its commands, with the doc's /tmp directories moved into a temp dir), then the slice and replica
rules on an 8-GPU node served from a node file (so health can be flipped).
"""

from __future__ import annotations

import random
import re
import shlex
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from cdigen.discover import load_node
from cdigen.model import Node
from cdigen.plugin.deviceplugin.api import deviceplugin_pb2 as pb
from cdigen.shares import gpu_part
from tests.helpers.served import ServedPlugin, cdigen
from tests.kubelet_sim import KubeletSimulator

DOC = Path(__file__).resolve().parents[2] / "docs" / "sharing.md"
SLICES = "nvidia.com/gpu-memory"
REPLICAS = "nvidia.com/gpu.shared"
LOG_PREFIX = re.compile(r"^\S+ \S+ cdigen-plugin ")


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def doc_config() -> str:
    """The ``# sharing.yaml`` block of the doc."""
    for block in re.findall(r"```yaml\n(.*?)```", _doc(), re.S):
        if block.startswith("# sharing.yaml\n"):
            return str(block)
    raise AssertionError("docs/sharing.md has no '# sharing.yaml' block")


def doc_session(program: str) -> tuple[list[str], list[str]]:
    """The doc's ``$ cdigen PROGRAM`` command (as argv) and the output lines under it."""
    for block in re.findall(r"```console\n(.*?)```", _doc(), re.S):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.startswith(f"$ cdigen {program} "):
                output = []
                for after in lines[i + 1 :]:
                    if after.startswith("$ "):
                        break
                    output.append(after)
                return shlex.split(line[2:]), output
    raise AssertionError(f"docs/sharing.md has no '$ cdigen {program}' session")


def relocate(text: str, tmp: Path) -> str:
    """The doc's /tmp/cdi and /tmp/dp inside ``tmp``."""
    return text.replace("/tmp/cdi", str(tmp / "cdi")).replace("/tmp/dp", str(tmp / "dp"))


def backticked(after: str) -> str:
    """The first backticked value in the doc's "What each pod sees" (the sharing.yaml story)
    that starts with ``after``."""
    story = _doc().partition("## What to configure")[2]
    found = re.search(rf"`({re.escape(after)}[^`]*)`", story)
    assert found is not None, f"docs/sharing.md quotes no `{after}…`"
    return found.group(1)


def healthy(devices: list[pb.Device]) -> bool:
    return bool(devices) and all(d.health == "Healthy" for d in devices)


def test_rtx4090_story_runs_as_the_doc_writes_it(tmp_path: Path) -> None:
    (tmp_path / "sharing.yaml").write_text(doc_config())
    generate, generated = doc_session("generate")
    result = cdigen(*(relocate(a, tmp_path) for a in generate[1:]))
    assert result.stdout.splitlines() == [relocate(line, tmp_path) for line in generated]

    serve, logged = doc_session("plugin serve")
    # the doc runs in the directory that holds sharing.yaml
    args = [str(tmp_path / a) if a == "sharing.yaml" else relocate(a, tmp_path) for a in serve[1:]]
    assert args[:2] == ["plugin", "serve"] and "--plugin-dir" in args
    at = args.index("--plugin-dir")
    plugin_dir = Path(args[at + 1])
    kubelet = KubeletSimulator(plugin_dir).start()
    # ServedPlugin puts its own --plugin-dir first; the doc's comes later and wins
    plugin = ServedPlugin(tmp_path, *args[2:])
    plugin.plugin_dir = plugin_dir
    try:
        kubelet.wait_registered(SLICES, timeout_s=20)
        slices = kubelet.wait_devices(SLICES, healthy)
        uuid = load_node("builtin:rtx4090").gpus[0].uuid
        assert [d.ID for d in slices] == [f"{uuid}::slice-{k}" for k in range(23)]
        with pytest.raises(KeyError):
            kubelet.stub("nvidia.com/gpu")  # the card has one owner: the slices

        # two notebook pods asking nvidia.com/gpu-memory: 3 each
        free = [d.ID for d in slices]
        pods = []
        for _ in range(2):
            chosen = kubelet.preferred(SLICES, free, 3)
            free = [i for i in free if i not in chosen]
            pods.append(kubelet.allocate(SLICES, [chosen]).container_responses[0])
        cdi_name = backticked("nvidia.com/gpu=")
        limit = backticked("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=").partition("=")[2]
        threads = backticked("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=").partition("=")[2]
        pipe = backticked("CUDA_MPS_PIPE_DIRECTORY=").partition("=")[2]
        shm = yaml.safe_load(doc_config())["resources"][0]["sharing"]["mps"]["shmDirectory"]
        assert (cdi_name, limit) == (f"nvidia.com/gpu={uuid}", "0=3072M")
        for pod in pods:
            assert [d.name for d in pod.cdi_devices] == [cdi_name]
            assert pod.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == limit
            assert pod.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == threads
            assert pod.envs["CUDA_MPS_PIPE_DIRECTORY"] == pipe
            mounts = [(m.host_path, m.container_path, m.read_only) for m in pod.mounts]
            # the pipe directory read-only, the daemon's shared memory writable at /dev/shm
            assert mounts == [(pipe, pipe, True), (shm, "/dev/shm", False)]
        assert len(free) == 17

        # a pod asking for 30 slices: the GPU has 23
        with pytest.raises(grpc.RpcError) as refused:
            kubelet.preferred(SLICES, [d.ID for d in slices], 30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "allocation size 30 but 23 device(s) available" in (refused.value.details() or "")
    finally:
        assert plugin.stop() == 0
        kubelet.stop()
    seen = [LOG_PREFIX.sub("", line) for line in plugin.logs().splitlines()]
    seen = [re.sub(r"\(pid \d+\)", "(pid N)", line) for line in seen]
    expected = [re.sub(r"\(pid \d+\)", "(pid N)", relocate(line, tmp_path)) for line in logged]
    assert [line for line in seen if line in expected] == expected
    assert "Traceback" not in plugin.logs()


def test_the_advisory_warning_quoted_in_the_doc_is_logged_without_mps(tmp_path: Path) -> None:
    quoted = backticked(f"{SLICES}: memory slices without")
    config = tmp_path / "slices.yaml"
    config.write_text(f"resources:\n  - name: {SLICES}\n    sharing: {{memorySliceMiB: 1024}}\n")
    kubelet = KubeletSimulator(tmp_path / "plugins").start()
    plugin = ServedPlugin(tmp_path, "--node", "builtin:rtx4090", "--config", str(config))
    try:
        kubelet.wait_registered(SLICES, timeout_s=20)
    finally:
        assert plugin.stop() == 0
        kubelet.stop()
    assert f"WARNING: {quoted}" in plugin.logs()


# --- an 8-GPU node served from a node file ----------------------------------------------------

EIGHT = "builtin:pcie-8x4090"


@pytest.fixture(scope="module")
def eight() -> Node:
    return load_node(EIGHT)


@pytest.fixture
def served_eight(
    tmp_path: Path, eight: Node
) -> Iterator[tuple[ServedPlugin, KubeletSimulator, Path]]:
    """The 8-GPU node from a node file, in 1 GiB slices and 4 replicas per GPU."""
    node_file = tmp_path / "node.yaml"
    cdigen("discover", "--node", EIGHT, "--output", str(node_file))
    cdigen("generate", "--node", EIGHT, "--output-dir", str(tmp_path / "cdi"))
    config = tmp_path / "sharing.yaml"
    config.write_text(
        f"resources:\n"
        f"  - name: {SLICES}\n    gpus: [0, 1, 2, 3]\n    sharing: {{memorySliceMiB: 1024}}\n"
        f"  - name: {REPLICAS}\n    gpus: [4, 5, 6, 7]\n    sharing: {{replicas: 4}}\n"
    )
    kubelet = KubeletSimulator(tmp_path / "plugins").start()
    plugin = ServedPlugin(
        tmp_path,
        "--node",
        str(node_file),
        "--config",
        str(config),
        "--spec-dir",
        str(tmp_path / "cdi"),
        "--health-poll-interval",
        "0.1",
    )
    try:
        kubelet.wait_registered(SLICES, timeout_s=20)
        kubelet.wait_registered(REPLICAS, timeout_s=5)
        kubelet.wait_devices(SLICES, healthy)
        kubelet.wait_devices(REPLICAS, healthy)
        yield plugin, kubelet, node_file
    finally:
        assert plugin.stop() == 0
        kubelet.stop()


def by_gpu(ids: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for device_id in ids:
        out.setdefault(gpu_part(device_id), []).append(device_id)
    return out


def test_five_slices_never_span_gpus_when_one_gpu_has_room(
    served_eight: tuple[ServedPlugin, KubeletSimulator, Path], eight: Node
) -> None:
    _, kubelet, _ = served_eight
    per_gpu = by_gpu([d.ID for d in kubelet.wait_devices(SLICES)])
    assert sorted(len(v) for v in per_gpu.values()) == [23] * 4  # GPUs 0-3: the slices' own
    rng = random.Random(7)
    for _ in range(40):
        # every GPU keeps 0-4 free slices, one GPU (or more) keeps 5-23
        roomy = rng.sample(sorted(per_gpu), rng.randint(1, 3))
        free = []
        for uuid, ids in per_gpu.items():
            keep = rng.randint(5, 23) if uuid in roomy else rng.randint(0, 4)
            free += rng.sample(ids, keep)
        rng.shuffle(free)
        chosen = kubelet.preferred(SLICES, free, 5)
        assert len(chosen) == 5 and set(chosen) <= set(free)
        assert len({gpu_part(i) for i in chosen}) == 1, (free, chosen)
        assert gpu_part(chosen[0]) in roomy
        response = kubelet.allocate(SLICES, [chosen]).container_responses[0]
        assert response.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].endswith("=5120M")


def test_a_spanning_set_fails_in_allocate(
    served_eight: tuple[ServedPlugin, KubeletSimulator, Path], eight: Node
) -> None:
    _, kubelet, _ = served_eight
    per_gpu = by_gpu([d.ID for d in kubelet.wait_devices(SLICES)])
    first, second = (per_gpu[g.uuid] for g in eight.gpus[:2])
    offered = first[:2] + second[:3]  # no GPU has 5 free: the kubelet offers a spanning set
    chosen = kubelet.preferred(SLICES, offered, 5)
    assert sorted(chosen) == sorted(offered)
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.allocate(SLICES, [chosen])
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = refused.value.details() or ""
    assert "no single GPU has 5 free slices (5120 MiB)" in details
    assert details.startswith("container request 0:")
    # the plugin keeps serving
    ok = kubelet.allocate(SLICES, [second[:3]]).container_responses[0]
    assert [d.name for d in ok.cdi_devices] == [f"nvidia.com/gpu={eight.gpus[1].uuid}"]


def test_two_replicas_spread_to_distinct_gpus(
    served_eight: tuple[ServedPlugin, KubeletSimulator, Path],
) -> None:
    _, kubelet, _ = served_eight
    replicas = [d.ID for d in kubelet.wait_devices(REPLICAS)]
    assert len(replicas) == 16  # GPUs 4-7, 4 replicas each
    chosen = kubelet.preferred(REPLICAS, replicas, 2)
    assert len({gpu_part(i) for i in chosen}) == 2
    response = kubelet.allocate(REPLICAS, [chosen]).container_responses[0]
    assert sorted(d.name for d in response.cdi_devices) == sorted(
        f"nvidia.com/gpu={gpu_part(i)}" for i in chosen
    )


def test_replicas_and_slices_of_an_unhealthy_gpu_all_turn_unhealthy_and_back(
    served_eight: tuple[ServedPlugin, KubeletSimulator, Path], eight: Node
) -> None:
    """GPU 3 (slices) and GPU 4 (replicas) turn unhealthy: every share of each does."""
    _, kubelet, node_file = served_eight
    doc = yaml.safe_load(node_file.read_text())
    sick_uuids = {eight.gpus[3].uuid, eight.gpus[4].uuid}

    def only_those_sick(devices: list[pb.Device]) -> bool:
        return all((d.health == "Unhealthy") == (gpu_part(d.ID) in sick_uuids) for d in devices)

    for index in (3, 4):
        doc["gpus"][index]["healthy"] = False
    node_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    started = time.monotonic()
    sick = kubelet.wait_devices(REPLICAS, only_those_sick, timeout_s=10)
    assert [d.ID for d in sick if d.health == "Unhealthy"] == [
        f"{eight.gpus[4].uuid}::{k}" for k in range(4)
    ]
    sick_slices = kubelet.wait_devices(SLICES, only_those_sick, timeout_s=10)
    assert sum(d.health == "Unhealthy" for d in sick_slices) == 23
    assert time.monotonic() - started < 10
    for index in (3, 4):
        doc["gpus"][index]["healthy"] = True
    node_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    kubelet.wait_devices(REPLICAS, healthy, timeout_s=10)
    kubelet.wait_devices(SLICES, healthy, timeout_s=10)
