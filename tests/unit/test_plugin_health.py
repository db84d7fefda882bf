"""Device health: the board, node-file re-reads, the CDI spec check, and NVML Xid events."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cdigen.cdi.cache import SpecCache
from cdigen.model import Gpu, Node
from cdigen.plugin.agent.health import (
    SOURCE_NODE,
    SOURCE_SPEC,
    SOURCE_XID,
    HealthBoard,
    node_reasons,
)
from cdigen.plugin.agent.health_watchers import NodeWatcher, SpecDirWatcher
from cdigen.plugin.agent.xid import XidHealth, xid_reason
from tests.fakes.event_nvml import EventNvml
from tests.helpers.clock import FakeClock

UUIDS = ["GPU-a", "GPU-b", "GPU-c"]


def test_a_device_is_healthy_only_when_no_source_holds_it() -> None:
    board = HealthBoard(UUIDS)
    assert board.set_reasons(SOURCE_XID, {"GPU-a": xid_reason(79)})
    assert board.set_reasons(SOURCE_SPEC, {"GPU-a": "CDI name missing"})
    assert not board.healthy("GPU-a")
    board.set_reasons(SOURCE_XID, {"GPU-a": None})
    assert not board.healthy("GPU-a")  # the spec reason still holds it down
    board.set_reasons(SOURCE_SPEC, {"GPU-a": None})
    assert board.healthy("GPU-a")


def test_version_changes_only_on_real_changes() -> None:
    board = HealthBoard(UUIDS)
    v0 = board.version
    assert not board.set_reasons(SOURCE_NODE, {"GPU-a": None, "GPU-unknown": "x"})
    assert board.version == v0
    board.set_reasons(SOURCE_NODE, {"GPU-b": "down"})
    assert board.version == v0 + 1
    assert not board.set_reasons(SOURCE_NODE, {"GPU-b": "down"})
    assert board.wait_for_change(v0, 0.01) == v0 + 1


def _gpu(i: int, **kw: Any) -> Gpu:
    return Gpu(i, i, UUIDS[i], "A100", "Ampere", "8.0", 1, f"0000:0{i}:00.0", **kw)


def test_node_reasons_from_health_flag_and_discovery_error() -> None:
    node = Node(gpus=(_gpu(0), _gpu(1, healthy=False), _gpu(2, error="NVML_ERROR_GPU_IS_LOST")))
    reasons = node_reasons(node)
    assert reasons["GPU-a"] is None
    assert "unhealthy" in (reasons["GPU-b"] or "")
    assert "GPU_IS_LOST" in (reasons["GPU-c"] or "")


def test_node_watcher_rereads_on_change_and_keeps_health_on_a_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("healthy")
    board = HealthBoard(UUIDS)
    contents = {
        "healthy": Node(gpus=(_gpu(0), _gpu(1))),
        "sick": Node(gpus=(_gpu(0), _gpu(1, healthy=False))),
    }

    def load() -> Node:
        text = path.read_text()
        if text not in contents:
            raise ValueError("bad node file")
        return contents[text]

    watcher = NodeWatcher(
        load, lambda node: board.set_reasons(SOURCE_NODE, node_reasons(node)), path=path
    )
    watcher.poll()
    assert board.healthy("GPU-b")
    path.write_text("sick")
    os.utime(path, ns=(1, 10**18))  # a clear mtime change even on coarse clocks
    watcher.poll()
    assert not board.healthy("GPU-b")
    path.write_text("garbage!")
    watcher.poll()
    assert not board.healthy("GPU-b")  # last good health stays
    path.write_text("healthy")
    watcher.poll()
    assert board.healthy("GPU-b")


def test_spec_watcher_marks_missing_names_until_the_spec_has_them(tmp_path: Path) -> None:
    board = HealthBoard(UUIDS)
    names = {u: [f"nvidia.com/gpu={u}"] for u in UUIDS}
    watcher = SpecDirWatcher(SpecCache([tmp_path]), names, board)
    watcher.poll()
    assert not any(board.healthy(u) for u in UUIDS)
    devices = "".join(
        f"- name: {u}\n  containerEdits:\n    env: [X=1]\n" for u in ("GPU-a", "GPU-b")
    )
    (tmp_path / "nvidia.yaml").write_text(
        f"cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n{devices}"
    )
    watcher.poll()
    assert board.healthy("GPU-a") and board.healthy("GPU-b") and not board.healthy("GPU-c")
    _, reasons = board.snapshot()
    assert "nvidia.com/gpu=GPU-c" in reasons["GPU-c"][0]


@pytest.fixture
def xid_setup() -> tuple[EventNvml, HealthBoard, XidHealth, FakeClock]:
    nvml = EventNvml(UUIDS)
    board = HealthBoard(UUIDS)
    clock = FakeClock()
    health = XidHealth(
        nvml, board, UUIDS, ignored_xids=(13, 31, 43, 45, 68, 109), recover_after_s=30, clock=clock
    )
    health.open()
    return nvml, board, health, clock


def test_critical_xid_marks_unhealthy_and_quiet_recovery_brings_it_back(
    xid_setup: tuple[EventNvml, HealthBoard, XidHealth, FakeClock],
) -> None:
    nvml, board, health, clock = xid_setup
    assert [h for h, _ in nvml.registered] == [f"handle:{u}" for u in UUIDS]
    nvml.xid("GPU-b", 79)
    assert health.wait_once(100)
    assert not board.healthy("GPU-b")
    clock.now += 10
    health.poll()
    assert not board.healthy("GPU-b")  # still within the quiet period
    clock.now += 25
    health.poll()
    assert board.healthy("GPU-b")  # NVIDIA's plugin would leave it Unhealthy forever


def test_application_xids_are_ignored(
    xid_setup: tuple[EventNvml, HealthBoard, XidHealth, FakeClock],
) -> None:
    nvml, board, health, _ = xid_setup
    for xid in (13, 31, 43, 45, 68, 109):
        nvml.xid("GPU-a", xid)
        assert health.wait_once(100)
    assert board.healthy("GPU-a")
    assert not health.wait_once(10)  # a timeout is not an event


def test_a_gpu_that_stops_answering_is_unhealthy_until_it_answers(
    xid_setup: tuple[EventNvml, HealthBoard, XidHealth, FakeClock],
) -> None:
    nvml, board, health, _ = xid_setup
    nvml.lost.add("GPU-c")
    health.poll()
    _, reasons = board.snapshot()
    assert reasons["GPU-c"] and "probe failed" in reasons["GPU-c"][0]
    nvml.lost.clear()
    health.poll()
    assert board.healthy("GPU-c")


def test_an_xid_arriving_while_a_poll_probes_is_not_cleared_by_that_poll(
    xid_setup: tuple[EventNvml, HealthBoard, XidHealth, FakeClock],
) -> None:
    nvml, board, health, _ = xid_setup
    answer = nvml.nvmlDeviceGetMemoryInfo

    def probe_while_an_xid_arrives(handle: str) -> object:
        if handle == "handle:GPU-b":  # the event thread handles an Xid on GPU-a meanwhile
            health.handle_event("GPU-a", 79)
        return answer(handle)

    nvml.nvmlDeviceGetMemoryInfo = probe_while_an_xid_arrives  # type: ignore[method-assign]
    health.poll()
    assert not board.healthy("GPU-a")


def test_a_gpu_that_cannot_be_watched_is_unhealthy() -> None:
    nvml = EventNvml(UUIDS, unregistrable=("GPU-a",))
    board = HealthBoard(UUIDS)
    XidHealth(nvml, board, UUIDS, ignored_xids=(), recover_after_s=1).open()
    assert not board.healthy("GPU-a") and board.healthy("GPU-b")


def test_event_thread_delivers_and_stops(
    xid_setup: tuple[EventNvml, HealthBoard, XidHealth, FakeClock],
) -> None:
    nvml, board, health, _ = xid_setup
    seen = board.version
    health.start()
    nvml.xid("GPU-a", 48)
    board.wait_for_change(seen, 5)
    assert not board.healthy("GPU-a")
    health.stop()
    assert nvml.freed


def test_transitions_are_logged_once_each(caplog: pytest.LogCaptureFixture) -> None:
    board = HealthBoard(UUIDS)
    with caplog.at_level("INFO", logger="cdigen.plugin"):
        board.set_reasons(SOURCE_XID, {"GPU-a": xid_reason(79), "GPU-b": None})
        board.set_reasons(SOURCE_SPEC, {"GPU-a": "missing"})  # already down: no new warning
        board.set_reasons(SOURCE_XID, {"GPU-a": None, "GPU-c": None})
        board.set_reasons(SOURCE_SPEC, {"GPU-a": None})
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "device GPU-a is Unhealthy: critical Xid 79",
        "device GPU-a is Healthy again",
    ]
