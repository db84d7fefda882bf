"""NUMA neighbours from sysfs, for ``resource.kubernetes.io/numaNode`` in list form (KEP-6072).

The list is the device's own NUMA node first, then every other node that is both at the least
SLIT distance from it (``<sysfs>/devices/system/node/node<N>/distance``) and on the same CPU
socket (the ``physical_package_id`` of the node's CPUs), in ascending order: on an AMD EPYC in
NPS4 mode a GPU on node 5 gets ``[5, 4, 6, 7]``; on a two-socket machine with one node per
socket it gets ``[0]`` (the least distance leads to the other socket).

Facts (Linux ``drivers/base/node.c``, ``drivers/base/topology.c``):
* ``node<N>/distance`` holds one distance per *online* node, in the order of
  ``devices/system/node/online`` (a range list such as ``0-3`` or ``0,2``), not by node number.
* ``node<N>/cpulist`` lists its CPUs (empty for a memory-only node, whose socket is unknown and
  which is left out); ``cpu/cpu<M>/topology/physical_package_id`` is the CPU's socket.

Anything missing or malformed gives the one-element list of the device's own node, the form
that holds no claim about neighbours.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Literal

# How resource.kubernetes.io/numaNode is published: one int, or (with the cluster's
# DRAListTypeAttributes gate on) the list this module makes.
NumaForm = Literal["scalar", "list"]
NUMA_FORMS: tuple[NumaForm, ...] = ("scalar", "list")

_MAX_BYTES = 64 * 1024  # a distance row of 4096 nodes is about 12 KiB
_RANGE_LIST = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")


def _read(path: Path) -> str | None:
    """The text of a small regular sysfs file (no symlink followed), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, _MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > _MAX_BYTES:
        return None
    try:
        return data.decode("ascii").strip()
    except UnicodeDecodeError:
        return None


def parse_range_list(text: str) -> tuple[int, ...] | None:
    """``"0-2,5"`` -> ``(0, 1, 2, 5)``; ``""`` -> ``()``; None when malformed."""
    if text == "":
        return ()
    if not _RANGE_LIST.fullmatch(text):
        return None
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if last < first or last - first > 65536:
            return None
        out.extend(range(first, last + 1))
    return tuple(out)


def _socket(sysfs_root: Path, node: int) -> int | None:
    """The socket of NUMA node ``node``: its first CPU's physical_package_id (None: unknown)."""
    text = _read(sysfs_root / "devices" / "system" / "node" / f"node{node}" / "cpulist")
    cpus = parse_range_list(text) if text is not None else None
    if not cpus:
        return None
    package = _read(
        sysfs_root
        / "devices"
        / "system"
        / "cpu"
        / f"cpu{cpus[0]}"
        / "topology"
        / "physical_package_id"
    )
    return int(package) if package is not None and package.isdecimal() else None


def numa_neighbours(sysfs_root: str | Path, node: int) -> tuple[int, ...]:
    """``node`` and its same-socket NUMA nodes at the least SLIT distance (see the module)."""
    root = Path(sysfs_root)
    base = root / "devices" / "system" / "node"
    online_text = _read(base / "online")
    online = parse_range_list(online_text) if online_text is not None else None
    row_text = _read(base / f"node{node}" / "distance")
    if not online or row_text is None or node not in online:
        return (node,)
    try:
        row = [int(word) for word in row_text.split()]
    except ValueError:
        return (node,)
    if len(row) != len(online):
        return (node,)
    others = {n: d for n, d in zip(online, row, strict=True) if n != node}
    if not others:
        return (node,)
    least = min(others.values())
    own_socket = _socket(root, node)
    if own_socket is None:
        return (node,)
    near = sorted(n for n, d in others.items() if d == least and _socket(root, n) == own_socket)
    return (node, *near)
