"""Malformed Allocate and GetPreferredAllocation requests, and the policy under concurrent calls.

Over a real gRPC server on a real unix socket (the servicer harness of tests/helpers/servicer.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent import futures

import grpc
import pytest

from cdigen.plugin.deviceplugin.api import deviceplugin_pb2 as pb
from cdigen.plugin.deviceplugin.kubelet_requests import PreferenceRequest
from cdigen.plugin.deviceplugin.servicer import FifoGate, Preference, short_id
from tests.helpers.servicer import RESOURCE, UUIDS, Harness, last_two

BIG_ID = "GPU-" + "x" * (2**20 - 4)  # a 1 MB device ID


def allocate(h: Harness, *containers: Sequence[str]) -> grpc.RpcError:
    """The error of an Allocate that must fail."""
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=list(c)) for c in containers]
    )
    with pytest.raises(grpc.RpcError) as info:
        h.kubelet.stub(RESOURCE).Allocate(request, timeout=10)
    return info.value


def preferred(
    h: Harness, available: Sequence[str], size: int, must: Sequence[str] = ()
) -> grpc.RpcError:
    """The error of a GetPreferredAllocation that must fail."""
    with pytest.raises(grpc.RpcError) as info:
        h.kubelet.preferred(RESOURCE, available, size, must_include=must)
    return info.value


def prefer(h: Harness, available: Sequence[str], size: int, timeout_s: float) -> list[str]:
    """GetPreferredAllocation for one container, with its own deadline."""
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=list(available), allocation_size=size
            )
        ]
    )
    response = h.kubelet.stub(RESOURCE).GetPreferredAllocation(request, timeout=timeout_s)
    return list(response.container_responses[0].deviceIDs)


def details(error: grpc.RpcError) -> str:
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    text = error.details() or ""
    assert "\n" not in text and len(text) < 300, text  # one short line
    return text


# --- Allocate ---------------------------------------------------------------------------------


def test_allocate_of_no_devices_is_invalid(harness: Harness) -> None:
    assert details(allocate(harness, [])) == (
        "container request 0: no allocated device IDs: the request must list at least one"
    )
    assert details(allocate(harness, [UUIDS[0]], [])).startswith("container request 1: ")
    assert details(allocate(harness)) == "no container requests"


@pytest.mark.parametrize("copies", [2, 10_000])
def test_allocate_of_a_duplicated_id_is_invalid(harness: Harness, copies: int) -> None:
    text = details(allocate(harness, [UUIDS[1], *[UUIDS[2]] * copies]))
    assert text == (
        f"container request 0: allocated device {UUIDS[2]} is listed {copies} times: "
        "each device may appear once"
    )


def test_a_1mb_id_is_echoed_short_and_the_server_keeps_serving(harness: Harness) -> None:
    text = details(allocate(harness, [UUIDS[0], BIG_ID]))
    assert f"unknown device {BIG_ID[:64]}…(1048576 bytes) for {RESOURCE}" in text
    assert details(allocate(harness, [BIG_ID, BIG_ID])).startswith(
        f"container request 0: allocated device {BIG_ID[:64]}…(1048576 bytes) is listed 2 times"
    )
    response = harness.kubelet.allocate(RESOURCE, [[UUIDS[3]]])
    assert [d.name for d in response.container_responses[0].cdi_devices] == [
        f"nvidia.com/gpu={UUIDS[3]}"
    ]


# --- GetPreferredAllocation -------------------------------------------------------------------


def test_preferred_of_no_available_devices_is_invalid(harness: Harness) -> None:
    assert details(preferred(harness, [], 1)) == (
        "container request 0: no available device IDs: the request must list at least one"
    )
    assert "allocation size 0: must be at least 1" in details(preferred(harness, UUIDS[:2], 0))


@pytest.mark.parametrize("copies", [2, 10_000])
def test_preferred_with_duplicated_ids_is_invalid(harness: Harness, copies: int) -> None:
    text = details(preferred(harness, [UUIDS[0], *[UUIDS[4]] * copies], 1))
    assert f"available device {UUIDS[4]} is listed {copies} times" in text
    text = details(preferred(harness, UUIDS[:4], 2, must=[UUIDS[1]] * copies))
    assert f"must-include device {UUIDS[1]} is listed {copies} times" in text


def test_must_include_larger_than_size_is_invalid(harness: Harness) -> None:
    text = details(preferred(harness, UUIDS[:6], 2, must=UUIDS[:3]))
    assert text == (
        "container request 0: 3 must-include devices but the allocation size is 2: "
        "they cannot all be in the answer"
    )
    # the largest valid request still gets its answer
    assert harness.kubelet.preferred(RESOURCE, UUIDS[:6], 3, must_include=UUIDS[:3]) == UUIDS[:3]


def test_a_1mb_id_in_preferred_is_short_in_errors_and_logs(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    text = details(preferred(harness, [UUIDS[0], BIG_ID], 1, must=[BIG_ID]))
    assert f"must-include device {BIG_ID[:64]}…(1048576 bytes) is not advertised" in text
    caplog.set_level(logging.WARNING, logger="cdigen")
    unknown = [BIG_ID] + [f"GPU-stranger-{i}" for i in range(5000)]
    assert harness.kubelet.preferred(RESOURCE, [UUIDS[5], *unknown], 1) == [UUIDS[5]]
    (warning,) = [r.getMessage() for r in caplog.records if "unknown available" in r.getMessage()]
    assert warning.startswith("preferred allocation: ignoring 5001 unknown available ID(s): ")
    assert warning.endswith(", GPU-stranger-0, GPU-stranger-1, …") and len(warning) < 300


def test_short_id_keeps_short_ids_whole() -> None:
    assert short_id(UUIDS[0]) == UUIDS[0]
    assert short_id("é" * 100) == "é" * 64 + "…(200 bytes)"
    assert short_id("x" * 64) == "x" * 64  # 64 characters: whole; one more: cut
    assert short_id("x" * 65) == "x" * 64 + "…(65 bytes)"


# --- the policy under concurrent calls --------------------------------------------------------


class BlockingPolicy:
    """A policy that holds each computation until released; counts how many ran at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Semaphore(0)
        self._lock = threading.Lock()
        self.running = 0
        self.most_at_once = 0
        self.calls = 0

    def __call__(self, request: PreferenceRequest) -> Preference:
        with self._lock:
            self.running += 1
            self.calls += 1
            self.most_at_once = max(self.most_at_once, self.running)
        self.started.release()
        try:
            self.release.wait(timeout=20)
            return last_two(request)
        finally:
            with self._lock:
                self.running -= 1


def test_allocate_answers_while_many_calls_wait_for_the_policy(harness: Harness) -> None:
    policy = BlockingPolicy()
    harness.prefer = policy
    with futures.ThreadPoolExecutor(max_workers=12) as pool:
        waiting = [
            pool.submit(prefer, harness, UUIDS, 2, 30)
            for _ in range(12)  # more than the 8 server threads of old
        ]
        assert policy.started.acquire(timeout=10)  # one computation has started
        try:
            # Allocate does not queue behind them
            response = harness.kubelet.allocate(RESOURCE, [[UUIDS[0]]])
            assert response.container_responses[0].cdi_devices[0].name.endswith(UUIDS[0])
        finally:
            policy.release.set()
        answers = [w.result(timeout=30) for w in waiting]
    assert answers == [[UUIDS[7], UUIDS[6]]] * 12 and policy.calls == 12
    assert policy.most_at_once == 1  # one computation at a time per resource


def test_a_call_that_ends_while_waiting_for_the_policy_leaves_the_queue(harness: Harness) -> None:
    policy = BlockingPolicy()
    harness.prefer = policy
    with futures.ThreadPoolExecutor(max_workers=1) as pool:
        first = pool.submit(prefer, harness, UUIDS, 1, 30)
        assert policy.started.acquire(timeout=10)
        with pytest.raises(grpc.RpcError) as info:  # queued behind it, then past its deadline
            prefer(harness, UUIDS, 1, 0.5)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        gate = harness.server.service._policy_gate  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        while gate.waiting and time.monotonic() < deadline:  # the server sees the call end
            time.sleep(0.01)
        assert gate.waiting == 0  # it left the queue while the policy still computed
        policy.release.set()
        assert first.result(timeout=30) == [UUIDS[7]]
    assert harness.kubelet.preferred(RESOURCE, UUIDS, 2) == [UUIDS[7], UUIDS[6]]
    assert policy.calls == 2  # the call that left never reached the policy


def test_fifo_gate_serves_in_arrival_order_and_lets_waiters_leave() -> None:
    gate = FifoGate()
    assert gate.acquire(threading.Event())
    order: list[int] = []
    turns = [threading.Event() for _ in range(4)]

    def wait(k: int) -> None:
        if gate.acquire(turns[k]):
            order.append(k)
            gate.release()

    threads = []
    for k in range(4):
        threads.append(threading.Thread(target=wait, args=(k,)))
        threads[-1].start()
        while gate.waiting < k + 1:  # queued in this order
            time.sleep(0.01)
    turns[2].set()  # the third waiter's call ends: it leaves without the gate
    threads[2].join(timeout=10)
    gate.release()
    for thread in threads:
        thread.join(timeout=10)
    assert order == [0, 1, 3]
    assert gate.acquire(threading.Event())  # open again
