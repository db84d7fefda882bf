"""The issue's sharing rules at unit level: the allocator chooses, plugin/deviceplugin/sharing.py
hands out."""

from __future__ import annotations

import dataclasses

import pytest

from cdigen.discover import load_node
from cdigen.errors import AllocationError, InputError
from cdigen.model import Node
from cdigen.plugin.deviceplugin.sharing import (
    ShareRefused,
    Sharing,
    advisory_warning,
    allocate_shares,
    share_devices,
    shares_by_gpu,
    sharing_from_doc,
)
from cdigen.policies.allocator import AllocationRequest, Allocator
from cdigen.policies.policy import builtin_policy
from cdigen.shares import gpu_part

KIND = "nvidia.com/gpu"
SLICES = Sharing(memory_slice_mib=1024)


@pytest.fixture(scope="module")
def rtx4090() -> Node:
    return load_node("builtin:rtx4090")


@pytest.fixture(scope="module")
def eight_4090() -> Node:
    return load_node("builtin:pcie-8x4090")


def _take(allocator: Allocator, free: list[str], size: int) -> tuple[str, ...]:
    """The allocator's answer for ``size`` of ``free``; the chosen IDs leave ``free``."""
    answer = allocator.prefer(AllocationRequest(tuple(free), (), size))
    for device_id in answer.devices:
        free.remove(device_id)
    return answer.devices


def test_rtx4090_in_1gib_slices_is_23_devices(rtx4090: Node) -> None:
    devices = share_devices(rtx4090, SLICES)
    uuid = rtx4090.gpus[0].uuid
    # 25757220864 bytes = 24564 MiB: 23 whole GiB slices
    assert [d.id for d in devices] == [f"{uuid}::slice-{k}" for k in range(23)]
    assert shares_by_gpu(devices) == {uuid: tuple(d.id for d in devices)}


def test_two_pods_of_three_slices_share_the_gpu_with_their_own_limits(rtx4090: Node) -> None:
    allocator = Allocator(rtx4090)
    free = [d.id for d in share_devices(rtx4090, SLICES)]
    uuid = rtx4090.gpus[0].uuid
    pods = [_take(allocator, free, 3), _take(allocator, free, 3)]
    assert not set(pods[0]) & set(pods[1])
    given = [allocate_shares(p, rtx4090, SLICES, cdi_kind=KIND, resource="r") for p in pods]
    for allocation in given:
        assert allocation.cdi_names == (f"nvidia.com/gpu={uuid}",)
        env = allocation.env_dict()
        # keyed by CUDA ordinal in PCI bus order, as the DRA driver does (was the UUID)
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=3072M"
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "12"  # 3072 of 24564 MiB (was 13)
        assert allocation.mounts == ()
    assert len(free) == 17


def test_thirty_slices_are_more_than_the_gpu_has(rtx4090: Node) -> None:
    free = tuple(d.id for d in share_devices(rtx4090, SLICES))
    with pytest.raises(AllocationError, match="30 devices but only 23"):
        Allocator(rtx4090).prefer(AllocationRequest(free, (), 30))


def test_five_slices_never_span_gpus_when_one_has_room(eight_4090: Node) -> None:
    allocator = Allocator(eight_4090)
    free = [d.id for d in share_devices(eight_4090, SLICES)]
    # fill every GPU but GPU 5 down to 4 free slices; GPU 5 keeps 6
    for gpu in eight_4090.gpus:
        mine = [i for i in free if gpu_part(i) == gpu.uuid]
        for device_id in mine[: len(mine) - (6 if gpu.index == 5 else 4)]:
            free.remove(device_id)
    answer = allocator.prefer(AllocationRequest(tuple(free), (), 5))
    assert {gpu_part(i) for i in answer.devices} == {eight_4090.gpus[5].uuid}
    assert answer.fallback_reason is None


def test_slices_go_to_the_best_fit(eight_4090: Node) -> None:
    """Of GPUs with 10, 4 and 23 free slices, a 4-slice request takes the one with 4."""
    allocator = Allocator(eight_4090)
    keep = {0: 10, 1: 4, 2: 23}
    free = []
    for gpu in eight_4090.gpus[:3]:
        ids = [d.id for d in share_devices(eight_4090, SLICES) if d.gpu_uuid == gpu.uuid]
        free += ids[: keep[gpu.index]]
    answer = allocator.prefer(AllocationRequest(tuple(free), (), 4))
    assert {gpu_part(i) for i in answer.devices} == {eight_4090.gpus[1].uuid}


def test_slices_fill_one_gpu_before_opening_another(eight_4090: Node) -> None:
    allocator = Allocator(eight_4090)
    free = [d.id for d in share_devices(eight_4090, SLICES)]
    used = {gpu_part(i) for _ in range(7) for i in _take(allocator, free, 3)}
    assert len(used) == 1  # 7 x 3 = 21 slices of 23 on the first GPU


def test_a_spanning_set_is_offered_only_as_a_fallback_and_refused(eight_4090: Node) -> None:
    allocator = Allocator(eight_4090)
    per_gpu = {d.gpu_uuid: [] for d in share_devices(eight_4090, SLICES)}
    for d in share_devices(eight_4090, SLICES):
        per_gpu[d.gpu_uuid].append(d.id)
    free = tuple(ids[0] for ids in list(per_gpu.values())[:2]) + tuple(
        ids[1] for ids in list(per_gpu.values())[:2]
    )
    answer = allocator.prefer(AllocationRequest(free, (), 3))
    assert answer.fallback_reason is not None and "no single GPU has 3" in answer.fallback_reason
    with pytest.raises(ShareRefused, match="no single GPU has 3 free slices"):
        allocate_shares(answer.devices, eight_4090, SLICES, cdi_kind=KIND, resource="gpu-memory")


def test_mps_pipe_directory_is_mounted_and_named(rtx4090: Node) -> None:
    sharing = Sharing(memory_slice_mib=2048, mps_pipe_directory="/run/nvidia/mps")
    ids = [d.id for d in share_devices(rtx4090, sharing)][:2]
    allocation = allocate_shares(ids, rtx4090, sharing, cdi_kind=KIND, resource="r")
    env = allocation.env_dict()
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia/mps"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].endswith("=4096M")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "16"  # 4096 of 24564 MiB (was 18)
    assert [(m.host_path, m.container_path) for m in allocation.mounts] == [
        ("/run/nvidia/mps", "/run/nvidia/mps")
    ]
    assert advisory_warning(sharing, "r") is None
    assert "advisory" in (advisory_warning(SLICES, "nvidia.com/gpu-memory") or "")


def test_replicas_map_to_each_gpu_once_and_spread_by_default(eight_4090: Node) -> None:
    sharing = Sharing(replicas=4)
    devices = share_devices(eight_4090, sharing)
    assert len(devices) == 32 and devices[1].id == f"{eight_4090.gpus[0].uuid}::1"
    answer = Allocator(eight_4090).prefer(AllocationRequest(tuple(d.id for d in devices), (), 2))
    allocation = allocate_shares(answer.devices, eight_4090, sharing, cdi_kind=KIND, resource="r")
    assert len(allocation.gpu_uuids) == 2 and allocation.env == ()  # no MPS: no limits
    same_gpu = [d.id for d in devices[:2]]
    twice = allocate_shares(same_gpu, eight_4090, sharing, cdi_kind=KIND, resource="r")
    assert twice.cdi_names == (f"nvidia.com/gpu={eight_4090.gpus[0].uuid}",)
    assert twice.shares_per_gpu == (2,)


def test_pack_puts_replicas_on_the_fullest_gpu_that_fits(eight_4090: Node) -> None:
    sharing = Sharing(replicas=4)
    devices = share_devices(eight_4090, sharing)
    # GPU 0 has 1 free replica, GPU 1 has 2, the rest 4: a 2-replica request goes to GPU 1
    free = tuple(d.id for d in devices if not d.id.startswith(eight_4090.gpus[0].uuid))
    busy = {devices[4].id, devices[5].id}
    free = (devices[3].id, *(i for i in free if i not in busy))
    answer = Allocator(eight_4090, builtin_policy("pack")).prefer(AllocationRequest(free, (), 2))
    assert {gpu_part(i) for i in answer.devices} == {eight_4090.gpus[1].uuid}


def test_fail_requests_greater_than_one_refuses_two_replicas(rtx4090: Node) -> None:
    sharing = sharing_from_doc({"replicas": 4, "failRequestsGreaterThanOne": True}, where="r")
    assert sharing is not None
    ids = [d.id for d in share_devices(rtx4090, sharing)]
    assert allocate_shares(ids[:1], rtx4090, sharing, cdi_kind=KIND, resource="r").gpu_uuids
    with pytest.raises(ShareRefused, match="failRequestsGreaterThanOne"):
        allocate_shares(ids[:2], rtx4090, sharing, cdi_kind=KIND, resource="nvidia.com/gpu.shared")


def test_ids_of_another_kind_are_refused(rtx4090: Node) -> None:
    replica = f"{rtx4090.gpus[0].uuid}::0"
    with pytest.raises(ShareRefused, match="not a slice"):
        allocate_shares([replica], rtx4090, SLICES, cdi_kind=KIND, resource="r")


def test_replicas_with_mps_get_a_proportional_limit(rtx4090: Node) -> None:
    sharing = Sharing(replicas=4, mps_pipe_directory="/run/nvidia/mps")
    ids = [d.id for d in share_devices(rtx4090, sharing)][:1]
    env = allocate_shares(ids, rtx4090, sharing, cdi_kind=KIND, resource="r").env_dict()
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6141M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


def test_unhealthy_gpu_is_skipped_for_slices(eight_4090: Node) -> None:
    gpus = list(eight_4090.gpus)
    gpus[0] = dataclasses.replace(gpus[0], healthy=False)
    node = dataclasses.replace(eight_4090, gpus=tuple(gpus))
    free = tuple(d.id for d in share_devices(node, SLICES))
    answer = Allocator(node).prefer(AllocationRequest(free, (), 4))
    assert gpu_part(answer.devices[0]) != gpus[0].uuid


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({}, "exactly one of replicas and memorySliceMiB"),
        ({"replicas": 2, "memorySliceMiB": 1024}, "exactly one"),
        ({"replicas": 0}, "replicas must be a positive integer"),
        ({"memorySliceMiB": "1G"}, "memorySliceMiB must be a positive integer"),
        ({"memorySliceMiB": 1024, "failRequestsGreaterThanOne": True}, "replicas only"),
        ({"replicas": 2, "mps": {"pipeDirectory": "run/mps"}}, "absolute path"),
        ({"replicas": 2, "timeSlice": 5}, "unknown sharing keys"),
    ],
)
def test_bad_sharing_blocks_get_one_line_errors(doc: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message) as caught:
        sharing_from_doc(doc, where="resources[1].sharing")
    assert "\n" not in str(caught.value) and "resources[1].sharing" in str(caught.value)


def test_mps_limits_are_keyed_by_cuda_ordinal_in_bus_order_or_by_uuid(eight_4090: Node) -> None:
    """Replicas on two GPUs: ordinals follow PCI bus order whatever the order of the IDs; the
    config's mps.limitKey: uuid names the GPUs instead; a bad key is one error."""
    doc = {"replicas": 2, "mps": {"pipeDirectory": "/run/nvidia/mps"}}
    sharing = sharing_from_doc(doc, where="r")
    assert sharing is not None
    high, low = sorted(eight_4090.gpus, key=lambda g: g.pci_bus_id)[-1:-3:-1]
    ids = [f"{high.uuid}::0", f"{low.uuid}::0"]
    env = allocate_shares(ids, eight_4090, sharing, cdi_kind=KIND, resource="r").env_dict()
    half = (low.memory_bytes >> 20) // 2
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"1={half}M,0={half}M"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    by_uuid = sharing_from_doc({**doc, "mps": {**doc["mps"], "limitKey": "uuid"}}, where="r")
    assert by_uuid is not None
    env = allocate_shares(ids, eight_4090, by_uuid, cdi_kind=KIND, resource="r").env_dict()
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{high.uuid}={half}M,{low.uuid}={half}M"
    assert "CUDA_DEVICE_ORDER" not in env
    with pytest.raises(InputError, match=r"mps.limitKey must be one of index, uuid, got 'bus'"):
        sharing_from_doc({**doc, "mps": {**doc["mps"], "limitKey": "bus"}}, where="r")
