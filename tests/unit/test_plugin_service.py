"""The DevicePlugin servicer over a real unix socket, driven by the kubelet simulator."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import threading
import time
from pathlib import Path

import grpc
import pytest

from cdigen.plugin.agent.health import SOURCE_NODE
from cdigen.plugin.deviceplugin.call_records import CallSummary, RequestRecorder
from cdigen.plugin.deviceplugin.kubelet_requests import (
    AllocateRefused,
    PreferenceRequest,
)
from cdigen.plugin.deviceplugin.native_edits import AllocateEdits, DeviceNodeEdit, MountEdit
from cdigen.plugin.deviceplugin.registration import socket_name
from cdigen.plugin.deviceplugin.servicer import Preference
from tests.helpers.servicer import RESOURCE, UUIDS, Harness


def test_registration_carries_version_endpoint_and_options(harness: Harness) -> None:
    reg = harness.kubelet.registrations[0]
    assert reg.resource == RESOURCE
    assert reg.endpoint == socket_name(RESOURCE) == "cdigen-nvidia.com-gpu.sock"
    assert reg.options.get_preferred_allocation_available
    assert not reg.options.pre_start_required
    assert (harness.plugin_dir / reg.endpoint).exists()


def test_list_and_watch_sends_every_device_with_numa(harness: Harness) -> None:
    devices = harness.kubelet.wait_devices(RESOURCE, lambda d: len(d) == 8)
    assert [d.ID for d in devices] == UUIDS
    assert all(d.health == "Healthy" for d in devices)
    numa = [[n.ID for n in d.topology.nodes] for d in devices]
    assert numa == [[3], [3], [1], [1], [7], [7], [], [0]]
    assert not devices[6].HasField("topology")  # unknown: no topology at all
    assert devices[7].HasField("topology")  # NUMA node 0 is still sent


def test_health_change_sends_a_new_full_list_and_recovers(harness: Harness) -> None:
    harness.kubelet.wait_devices(RESOURCE, lambda d: len(d) == 8)
    harness.board.set_reasons(SOURCE_NODE, {UUIDS[2]: "test flip"})
    down = harness.kubelet.wait_devices(RESOURCE, lambda d: d[2].health == "Unhealthy")
    assert len(down) == 8 and [d.ID for d in down if d.health == "Unhealthy"] == [UUIDS[2]]
    harness.board.set_reasons(SOURCE_NODE, {UUIDS[2]: None})
    up = harness.kubelet.wait_devices(RESOURCE, lambda d: d[2].health == "Healthy")
    assert all(d.health == "Healthy" for d in up)
    assert len(harness.kubelet.device_lists(RESOURCE)) == 3


def test_allocate_cdi_cri_returns_fully_qualified_names(harness: Harness) -> None:
    response = harness.kubelet.allocate(RESOURCE, [[UUIDS[0], UUIDS[1]], [UUIDS[5]]])
    first, second = response.container_responses
    assert [d.name for d in first.cdi_devices] == [
        f"nvidia.com/gpu={UUIDS[0]}",
        f"nvidia.com/gpu={UUIDS[1]}",
    ]
    assert [d.name for d in second.cdi_devices] == [f"nvidia.com/gpu={UUIDS[5]}"]
    assert not first.envs and not first.annotations and not first.devices and not first.mounts


def test_unknown_id_is_invalid_argument_and_the_server_keeps_serving(harness: Harness) -> None:
    with pytest.raises(grpc.RpcError) as info:
        harness.kubelet.allocate(RESOURCE, [[UUIDS[0], "GPU-not-here"]])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "GPU-not-here" in (info.value.details() or "")
    response = harness.kubelet.allocate(RESOURCE, [[UUIDS[3]]])
    assert [d.name for d in response.container_responses[0].cdi_devices] == [
        f"nvidia.com/gpu={UUIDS[3]}"
    ]


def test_preferred_allocation_uses_the_policy(harness: Harness) -> None:
    chosen = harness.kubelet.preferred(RESOURCE, UUIDS[:6], 2, must_include=[UUIDS[1]])
    assert chosen == [UUIDS[1], UUIDS[5]]


def test_each_request_logs_one_line_with_request_and_answer(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="cdigen")
    harness.kubelet.preferred(RESOURCE, UUIDS[:6], 2, must_include=[UUIDS[1]])
    harness.kubelet.allocate(RESOURCE, [[UUIDS[1], UUIDS[5]]])
    preferred = [r for r in caplog.records if r.getMessage().startswith("GetPreferredAllocation")]
    allocated = [r for r in caplog.records if r.getMessage().startswith("Allocate")]
    assert len(preferred) == 1 and preferred[0].levelno == logging.DEBUG
    assert f"must=[{UUIDS[1]}] size=2 -> [{UUIDS[1]},{UUIDS[5]}]" in preferred[0].getMessage()
    assert "link score 0" in preferred[0].getMessage()
    assert len(allocated) == 1 and allocated[0].levelno == logging.DEBUG
    assert allocated[0].getMessage() == (
        f"Allocate {RESOURCE}: [{UUIDS[1]},{UUIDS[5]}] -> "
        f"cdi_devices=[nvidia.com/gpu={UUIDS[1]},nvidia.com/gpu={UUIDS[5]}] (cdi-cri)"
    )


def test_preferred_allocation_ignores_unknown_available_ids(harness: Harness) -> None:
    chosen = harness.kubelet.preferred(RESOURCE, [UUIDS[0], "GPU-stranger", UUIDS[4]], 2)
    assert sorted(chosen) == sorted([UUIDS[0], UUIDS[4]])


def test_preferred_allocation_survives_a_failing_policy(harness: Harness) -> None:
    def broken(request: PreferenceRequest) -> Preference:
        raise RuntimeError("policy blew up")

    harness.prefer = broken
    chosen = harness.kubelet.preferred(RESOURCE, UUIDS[2:6], 3, must_include=[UUIDS[4]])
    assert len(chosen) == 3 and UUIDS[4] in chosen and set(chosen) <= set(UUIDS[2:6])


def test_preferred_allocation_too_big_is_invalid_argument(harness: Harness) -> None:
    with pytest.raises(grpc.RpcError) as info:
        harness.kubelet.preferred(RESOURCE, UUIDS[:2], 3)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("strategy", ["cdi-annotations", "envvar"])
def test_allocate_other_strategies(tmp_path: Path, strategy: str) -> None:
    with Harness(tmp_path, strategy=strategy) as h:
        response = h.kubelet.allocate(RESOURCE, [[UUIDS[0], UUIDS[7]]])
    (container,) = response.container_responses
    assert not container.cdi_devices
    if strategy == "envvar":
        assert dict(container.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{UUIDS[0]},{UUIDS[7]}"}
    else:
        ((key, value),) = container.annotations.items()
        assert key.startswith("cdi.k8s.io/cdigen_") and len(key.split("/", 1)[1]) <= 63
        assert value == f"nvidia.com/gpu={UUIDS[0]},nvidia.com/gpu={UUIDS[7]}"


def test_allocate_native_translates_edits(tmp_path: Path) -> None:
    asked: list[list[str]] = []

    def edits(names: object) -> AllocateEdits:
        asked.append(list(names))  # type: ignore[call-overload]
        return AllocateEdits(
            env=("NVIDIA_VISIBLE_DEVICES=void", "A=1=2"),
            device_nodes=(DeviceNodeEdit("/dev/nvidia0", "/dev/nvidia0", "rw"),),
            mounts=(MountEdit("/usr/lib/libcuda.so.1", "/usr/lib/libcuda.so.1", True),),
        )

    with Harness(tmp_path, strategy="native", edits=edits) as h:
        response = h.kubelet.allocate(RESOURCE, [[UUIDS[0]]])
    (container,) = response.container_responses
    assert asked == [[f"nvidia.com/gpu={UUIDS[0]}"]]
    assert dict(container.envs) == {"NVIDIA_VISIBLE_DEVICES": "void", "A": "1=2"}
    assert [(d.container_path, d.host_path, d.permissions) for d in container.devices] == [
        ("/dev/nvidia0", "/dev/nvidia0", "rw")
    ]
    assert [(m.container_path, m.host_path, m.read_only) for m in container.mounts] == [
        ("/usr/lib/libcuda.so.1", "/usr/lib/libcuda.so.1", True)
    ]


def test_native_missing_name_is_failed_precondition(tmp_path: Path) -> None:
    def edits(names: object) -> AllocateEdits:
        raise AllocateRefused("CDI device nvidia.com/gpu=X is not defined in /nowhere")

    with Harness(tmp_path, strategy="native", edits=edits) as h:
        with pytest.raises(grpc.RpcError) as info:
            h.kubelet.allocate(RESOURCE, [[UUIDS[0]]])
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "not defined" in (info.value.details() or "")


def test_stop_removes_the_socket_and_ends_the_stream(harness: Harness) -> None:
    harness.kubelet.wait_devices(RESOURCE)
    path = harness.server.socket_path
    harness.server.stop()
    assert not path.exists()


def test_allocate_logs_a_summary_each_interval_not_a_line_per_call(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 22: one INFO line per Allocate filled 14.8 MB in 58 s under load."""
    caplog.set_level(logging.INFO, logger="cdigen")
    with Harness(tmp_path, summary_interval_s=0.3) as h:
        for _ in range(5):
            h.kubelet.allocate(RESOURCE, [[UUIDS[0]]])
        with pytest.raises(grpc.RpcError):
            h.kubelet.allocate(RESOURCE, [["GPU-not-here"]])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not _summaries(caplog):
            time.sleep(0.05)
        time.sleep(0.7)  # two more intervals without a call: no more lines
        summaries = _summaries(caplog)
    assert len(summaries) == 1, summaries
    assert re.fullmatch(
        rf"Allocate {RESOURCE}: 6 call\(s\) in [\d.]+ s, 1 error\(s\), "
        r"median [\d.]+ ms, slowest [\d.]+ ms",
        summaries[0],
    ), summaries
    assert not [r for r in caplog.records if r.getMessage().startswith(f"Allocate {RESOURCE}: [")]


def _summaries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "call(s) in " in r.getMessage()]


def test_must_include_outside_the_available_list_is_the_requests_fault(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 22: was ERROR 'allocation policy gave an invalid answer', blaming the policy. The
    kubelet lists must-include devices among the available ones; NVIDIA's plugin includes them
    whatever the list says, and so do we, with one warning naming them."""
    caplog.set_level(logging.INFO, logger="cdigen")
    chosen = harness.kubelet.preferred(RESOURCE, UUIDS[2:6], 2, must_include=[UUIDS[0]])
    assert chosen[0] == UUIDS[0] and len(chosen) == 2 and chosen[1] in UUIDS[2:6]
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert lines == [
        (
            "WARNING",
            f"preferred allocation for {RESOURCE}: must-include device(s) {UUIDS[0]} not in the "
            "request's available list; answering with them included",
        )
    ]


def test_record_requests_writes_what_replay_reads(tmp_path: Path) -> None:
    recorder = RequestRecorder(tmp_path / "requests.jsonl")
    with Harness(tmp_path / "plugins", recorder=recorder) as h:
        h.kubelet.preferred(RESOURCE, UUIDS[:4], 2, must_include=[UUIDS[1]])
        h.kubelet.preferred(RESOURCE, UUIDS[4:], 1)
    recorder.close()
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"available": UUIDS[:4], "mustInclude": [UUIDS[1]], "size": 2},
        {"available": UUIDS[4:], "mustInclude": [], "size": 1},
    ]


def test_record_requests_stops_at_its_size_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = RequestRecorder(tmp_path / "requests.jsonl", max_bytes=100)
    for _ in range(3):
        recorder.record(["a" * 30], [], 1)
    recorder.close()
    assert len((tmp_path / "requests.jsonl").read_text().splitlines()) == 1
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"--record-requests {tmp_path / 'requests.jsonl'}: recording stopped, it reached 100 bytes"
    ]


def test_the_policy_gets_the_request_checked_once_with_the_advertised_devices(
    harness: Harness,
) -> None:
    """The request reaches the policy as the edge checked it: the advertised devices
    themselves (GPU position from the catalogue), an unknown ID left out and named, the
    must-include device by its place among the candidates."""
    seen: list[PreferenceRequest] = []

    def spy(request: PreferenceRequest) -> Preference:
        seen.append(request)
        return Preference(request.must_ids + request.ids[:1])

    harness.prefer = spy
    chosen = harness.kubelet.preferred(
        RESOURCE, [UUIDS[3], "GPU-stranger", UUIDS[6]], 2, must_include=[UUIDS[6]]
    )
    assert chosen == [UUIDS[6], UUIDS[3]]
    (request,) = seen
    assert [(d.id, d.gpu_position) for d in request.candidates] == [(UUIDS[3], 3), (UUIDS[6], 6)]
    assert request.must == (1,) and request.ignored == ("GPU-stranger",) and not request.outside


@pytest.mark.parametrize(
    ("strategy", "handed"),
    [
        ("envvar", f"envs=NVIDIA_VISIBLE_DEVICES={UUIDS[2]}"),
        ("cdi-annotations", "annotations=cdi.k8s.io/cdigen_"),
    ],
)
def test_the_allocate_debug_line_says_what_the_container_is_handed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, strategy: str, handed: str
) -> None:
    caplog.set_level(logging.DEBUG, logger="cdigen")
    with Harness(tmp_path, strategy=strategy) as h:
        h.kubelet.allocate(RESOURCE, [[UUIDS[2]]])
    (line,) = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.DEBUG and r.getMessage().startswith("Allocate ")
    ]
    assert line.startswith(f"Allocate {RESOURCE}: [{UUIDS[2]}] -> {handed}"), line
    assert line.endswith(f"({strategy})")


def test_a_call_summary_counts_times_and_errors_since_the_last_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="cdigen")
    stop = threading.Event()
    summary = CallSummary("Allocate r", stop, interval_s=3600)
    try:
        summary.record(5.0, ok=True)  # the window starts when the first call started
        summary.record(0.25, ok=False)
        summary.record(0.5, ok=True)
        summary.flush()
        summary.record(0.125, ok=True)
        summary.flush()
        summary.flush()  # no call since: no line
    finally:
        stop.set()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Allocate r")]
    assert len(lines) == 2, lines
    first = re.fullmatch(
        r"Allocate r: 3 call\(s\) in ([\d.]+) s, 1 error\(s\), median 500\.0 ms, "
        r"slowest 5000\.0 ms",
        lines[0],
    )
    assert first is not None and 5.0 <= float(first[1]) < 60, lines[0]
    second = re.fullmatch(
        r"Allocate r: 1 call\(s\) in ([\d.]+) s, 0 error\(s\), median 125\.0 ms, "
        r"slowest 125\.0 ms",
        lines[1],
    )
    assert second is not None and 0.1 <= float(second[1]) < 60, lines[1]


def test_record_requests_writes_a_line_that_fits_exactly_and_counts_what_the_file_held(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    line = json.dumps({"available": ["a"], "mustInclude": [], "size": 1}, separators=(",", ":"))
    path = tmp_path / "requests.jsonl"
    path.write_text("x" * 10)  # appended to: what is there counts against the limit
    recorder = RequestRecorder(path, max_bytes=10 + len(line) + 1)
    recorder.record(["a"], [], 1)  # fits to the byte
    recorder.record(["a"], [], 1)
    recorder.close()
    assert path.read_text() == "x" * 10 + line + "\n"
    limit = 10 + len(line) + 1
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"--record-requests {path}: recording stopped, it reached {limit} bytes"
    ]


def test_record_requests_names_a_mib_limit_in_mib_and_is_quiet_once_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "requests.jsonl"
    with path.open("wb") as f:
        f.truncate(3 * 2**20 - 10)  # nearly full (sparse)
    recorder = RequestRecorder(path, max_bytes=3 * 2**20)
    recorder.record(["a"], [], 1)
    recorder.close()
    recorder.record(["a"], [], 1)  # after close: nothing, and no second warning
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"--record-requests {path}: recording stopped, it reached 3 MiB"
    ]
    assert path.stat().st_size == 3 * 2**20 - 10


def test_record_requests_file_is_0644_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        RequestRecorder(tmp_path / "requests.jsonl").close()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "requests.jsonl").stat().st_mode) == 0o644


def test_record_requests_stops_at_64_mib_by_default(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "requests.jsonl"
    with path.open("wb") as f:
        f.truncate(64 * 2**20 - 10)  # sparse: nearly the default limit
    recorder = RequestRecorder(path)
    recorder.record(["a"], [], 1)
    recorder.close()
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"--record-requests {path}: recording stopped, it reached 64 MiB"
    ]
