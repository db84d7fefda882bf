"""``cdigen dra serve --numa-node-attribute list`` (KEP-6072): ``resource.kubernetes.io/numaNode``
as the GPU's NUMA node and its same-socket nodes at the least SLIT distance, read from a fake
sysfs tree; the scalar form by default. Published through the fake API server and validated
strictly as Kubernetes 1.34-1.37 take it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from cdigen.discover.numa import numa_neighbours, parse_range_list
from tests.cdihost import FakeHost, build_host, make_node
from tests.helpers.dra import Harness
from tests.helpers.slice_rules import validate_pool

NUMA = "resource.kubernetes.io/numaNode"
# AMD EPYC, two sockets in NPS4: nodes 0-3 on socket 0, 4-7 on socket 1 (numactl -H's shape)
EPYC_NPS4 = [[10 if a == b else 12 if a // 4 == b // 4 else 32 for b in range(8)] for a in range(8)]


def write_numa(
    sysfs: Path,
    distances: Sequence[Sequence[int]],
    *,
    online: Sequence[int] | None = None,
    sockets: Sequence[int | None] | None = None,
) -> None:
    """``devices/system/node`` and the CPUs' packages under ``sysfs``: one row of ``distances``
    per online node (``online``: their numbers, default 0..n-1), two CPUs per node on socket
    ``sockets[i]`` (None: a memory-only node, no CPUs)."""
    online = list(online if online is not None else range(len(distances)))
    sockets = list(sockets if sockets is not None else [0] * len(online))
    base = sysfs / "devices/system/node"
    base.mkdir(parents=True, exist_ok=True)
    (base / "online").write_text(",".join(map(str, online)) + "\n")
    for i, (node, row) in enumerate(zip(online, distances, strict=True)):
        folder = base / f"node{node}"
        folder.mkdir(exist_ok=True)
        (folder / "distance").write_text(" ".join(map(str, row)) + "\n")
        socket = sockets[i]
        cpus = [] if socket is None else [2 * i, 2 * i + 1]
        (folder / "cpulist").write_text(f"{cpus[0]}-{cpus[1]}\n" if cpus else "\n")
        for cpu in cpus:
            topology = sysfs / f"devices/system/cpu/cpu{cpu}/topology"
            topology.mkdir(parents=True, exist_ok=True)
            (topology / "physical_package_id").write_text(f"{socket}\n")


# -- the list itself ---------------------------------------------------------------------------


def test_epyc_nps4_lists_the_node_then_its_socket_neighbours(tmp_path: Path) -> None:
    write_numa(tmp_path, EPYC_NPS4, sockets=[n // 4 for n in range(8)])
    assert numa_neighbours(tmp_path, 5) == (5, 4, 6, 7)
    assert numa_neighbours(tmp_path, 0) == (0, 1, 2, 3)


def test_two_sockets_one_node_each_give_the_node_alone(tmp_path: Path) -> None:
    write_numa(tmp_path, [[10, 21], [21, 10]], sockets=[0, 1])
    assert numa_neighbours(tmp_path, 1) == (1,)


def test_a_node_at_the_least_distance_on_another_socket_is_left_out(tmp_path: Path) -> None:
    rows = [[10, 12, 12, 12], [12, 10, 12, 12], [12, 12, 10, 12], [12, 12, 12, 10]]
    write_numa(tmp_path, rows, sockets=[0, 0, 0, 1])
    assert numa_neighbours(tmp_path, 0) == (0, 1, 2)


def test_only_the_least_distance_counts(tmp_path: Path) -> None:
    rows = [[10, 11, 12, 12], [11, 10, 12, 12], [12, 12, 10, 11], [12, 12, 11, 10]]
    write_numa(tmp_path, rows)  # all on one socket: SNC-style sub-clusters
    assert numa_neighbours(tmp_path, 2) == (2, 3)


def test_distance_columns_follow_the_online_nodes_not_their_numbers(tmp_path: Path) -> None:
    # nodes 0 and 2 online: node0's row "10 12" means 12 to node 2 (not to node 1)
    write_numa(tmp_path, [[10, 12], [12, 10]], online=[0, 2], sockets=[0, 0])
    assert numa_neighbours(tmp_path, 0) == (0, 2)
    assert numa_neighbours(tmp_path, 2) == (2, 0)


def test_memory_only_nodes_have_no_socket_and_are_left_out(tmp_path: Path) -> None:
    rows = [[10, 12, 12], [12, 10, 12], [12, 12, 10]]
    write_numa(tmp_path, rows, sockets=[0, None, 0])
    assert numa_neighbours(tmp_path, 0) == (0, 2)


@pytest.mark.parametrize(
    "damage",
    ["no-tree", "short-row", "garbage-row", "symlinked-row", "not-online", "huge-row"],
)
def test_anything_unreadable_gives_the_node_alone(tmp_path: Path, damage: str) -> None:
    if damage != "no-tree":
        write_numa(tmp_path, EPYC_NPS4, sockets=[n // 4 for n in range(8)])
    row = tmp_path / "devices/system/node/node5/distance"
    if damage == "short-row":
        row.write_text("32 32 12\n")
    elif damage == "garbage-row":
        row.write_text("10 12 x 12\n")
    elif damage == "symlinked-row":
        (tmp_path / "elsewhere").write_text(" ".join(map(str, EPYC_NPS4[5])))
        row.unlink()
        row.symlink_to(tmp_path / "elsewhere")
    elif damage == "not-online":
        (tmp_path / "devices/system/node/online").write_text("0-3\n")
    elif damage == "huge-row":
        row.write_text("12 " * 40000)
    assert numa_neighbours(tmp_path, 5) == (5,)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("", ()), ("0", (0,)), ("0-3", (0, 1, 2, 3)), ("0,2-3,7", (0, 2, 3, 7)), ("3-1", None)],
)
def test_range_lists(text: str, parsed: tuple[int, ...] | None) -> None:
    assert parse_range_list(text) == parsed


# -- published by dra serve --------------------------------------------------------------------


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    """Eight GPUs, two per NUMA node 0-3 of socket 0 on an EPYC in NPS4 (nodes 4-7: socket 1)."""
    node = make_node(8)
    gpus = tuple(dataclasses.replace(g, numa_node=g.index // 2) for g in node.gpus)
    built = build_host(tmp_path / "host", dataclasses.replace(node, gpus=gpus))
    write_numa(built.sysfs_root, EPYC_NPS4, sockets=[n // 4 for n in range(8)])
    return built


def _numa(slices: list[dict[str, Any]]) -> dict[str, Any]:
    return {d["name"]: d["attributes"][NUMA] for s in slices for d in s["spec"]["devices"]}


def test_by_default_the_attribute_stays_an_int(harness: Harness) -> None:
    harness.start()
    published = _numa(list(harness.api.slices.values()))
    assert published["gpu-0"] == {"int": 0}
    assert published["gpu-7"] == {"int": 3}


@pytest.mark.parametrize("version", ["1.36", "1.37"])
def test_the_list_form_is_published_and_validates(harness: Harness, version: str) -> None:
    major, minor = version.split(".")
    harness.api.version = (major, minor)
    harness.start(numa_form="list")
    slices = list(harness.api.slices.values())
    validate_pool(slices, version)
    published = _numa(slices)
    assert published["gpu-0"] == {"ints": [0, 1, 2, 3]}
    assert published["gpu-5"] == {"ints": [2, 0, 1, 3]}


@pytest.mark.parametrize("version", ["1.34", "1.35"])
def test_a_server_without_list_attributes_gets_the_scalar_and_a_warning(
    harness: Harness, version: str, caplog: pytest.LogCaptureFixture
) -> None:
    major, minor = version.split(".")
    harness.api.version = (major, minor)
    harness.start(numa_form="list")
    slices = list(harness.api.slices.values())
    validate_pool(slices, version)
    assert _numa(slices)["gpu-5"] == {"int": 2}
    warned = [r.message for r in caplog.records if "list attributes" in r.message]
    assert len(warned) == 1 and f"1.{minor}" in warned[0]


def test_the_flag_takes_only_its_two_forms() -> None:
    cdigen = str(Path(sys.executable).parent / "cdigen")
    help_text = subprocess.run(
        [cdigen, "dra", "serve", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "--numa-node-attribute {scalar,list}" in help_text.stdout
    bad = subprocess.run(
        [cdigen, "dra", "serve", "--numa-node-attribute=lists"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "--numa-node-attribute" in bad.stderr and "Traceback" not in bad.stderr


def test_the_simulator_reads_the_list_as_cel_does(harness: Harness) -> None:
    """`dra why` and the first-fit simulator read published slices: a list attribute is a CEL
    list there, as in the scheduler (not its text)."""
    from celpy import celtypes

    from cdigen.policies.dra.slice_devices import slice_devices

    harness.start(numa_form="list")
    devices = {d.name: d for d in slice_devices(harness.api.slices.values())}
    numa = devices["gpu-5"].cel_value()["attributes"]["resource.kubernetes.io"]["numaNode"]
    assert isinstance(numa, celtypes.ListType)
    assert [int(n) for n in numa] == [2, 0, 1, 3]
