"""Property tests: every answer is valid, whatever the node, availability, must set and size."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdigen.model import PCIE_LEVELS, Gpu, Link, Node
from cdigen.policies.allocator import AllocationRequest, Allocator
from cdigen.policies.cel import compile_expression
from cdigen.policies.policy import builtin_policy

compile_expression("true")  # build the CEL parser (it raises the recursion limit) before hypothesis


@st.composite
def nodes(draw: st.DrawFn) -> Node:
    count = draw(st.integers(1, 10))
    gpus = tuple(
        Gpu(
            index=i,
            minor=i,
            uuid=f"GPU-{i:04d}",
            name="NVIDIA A100-SXM4-80GB",
            architecture="Ampere",
            cuda_compute_capability="8.0",
            memory_bytes=80 * 2**30,
            pci_bus_id=f"0000:{i:02x}:00.0",
            numa_node=draw(st.one_of(st.none(), st.integers(0, 3))),
            error=draw(st.sampled_from([None] * 9 + ["GPU is lost"])),
        )
        for i in range(count)
    )
    links = []
    for a in range(count):
        for b in range(a + 1, count):
            if draw(st.booleans()):
                links.append(
                    Link(
                        a,
                        b,
                        pcie=draw(st.one_of(st.none(), st.sampled_from(PCIE_LEVELS))),
                        nvlinks=draw(st.integers(0, 12)),
                    )
                )
    return Node(gpus=gpus, links=tuple(links), name="random")


@st.composite
def requests(draw: st.DrawFn) -> tuple[Node, AllocationRequest]:
    node = draw(nodes())
    replicas = draw(st.integers(1, 3))
    form = draw(st.sampled_from(["index", "uuid"]))
    ids = []
    for gpu in node.gpus:
        base = str(gpu.index) if form == "index" else gpu.uuid
        ids.extend([base] if replicas == 1 else [f"{base}::{n}" for n in range(replicas)])
    ids.extend(draw(st.lists(st.sampled_from(["GPU-unknown", "99"]), max_size=1, unique=True)))
    available = draw(st.lists(st.sampled_from(ids), min_size=1, unique=True))
    size = draw(st.integers(1, len(available)))
    must = draw(st.lists(st.sampled_from(available), max_size=size, unique=True))
    return node, AllocationRequest(tuple(available), tuple(must), size)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(), st.sampled_from(["default", "single-numa", "pack", "spread"]))
def test_every_answer_is_valid(case: tuple[Node, AllocationRequest], policy: str) -> None:
    node, request = case
    answer = Allocator(node, builtin_policy(policy)).prefer(request)
    assert len(answer.devices) == request.size
    assert len(set(answer.devices)) == request.size
    assert set(answer.devices) <= set(request.available)
    assert set(request.must_include) <= set(answer.devices)


def _replica_node(count: int = 8) -> Node:
    from tests.helpers.nodes import dgx1_v100

    return dgx1_v100() if count == 8 else dataclasses.replace(dgx1_v100())


def test_spread_puts_replicas_on_distinct_gpus() -> None:
    node = _replica_node()
    ids = tuple(f"{g.uuid}::{n}" for g in node.gpus for n in range(4))
    answer = Allocator(node, builtin_policy("spread")).prefer(AllocationRequest(ids, (), 2))
    physical = {d.split("::")[0] for d in answer.devices}
    assert len(physical) == 2
    assert answer.link_score == 200  # an NV2 pair, as for whole GPUs


def test_pack_puts_replicas_on_one_gpu() -> None:
    node = _replica_node()
    ids = tuple(f"{g.uuid}::{n}" for g in node.gpus for n in range(4))
    answer = Allocator(node, builtin_policy("pack")).prefer(AllocationRequest(ids, (), 3))
    assert len({d.split("::")[0] for d in answer.devices}) == 1


def test_pack_respects_must_include_and_capacity() -> None:
    node = _replica_node()
    ids = tuple(f"{g.uuid}::{n}" for g in node.gpus for n in range(2))
    must = (f"{node.gpus[5].uuid}::1",)
    answer = Allocator(node, builtin_policy("pack")).prefer(AllocationRequest(ids, must, 4))
    physical = {d.split("::")[0] for d in answer.devices}
    assert must[0] in answer.devices and len(physical) == 2 and node.gpus[5].uuid in physical
