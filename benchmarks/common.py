"""Helpers shared by the benchmark scripts (a benchmark never imports another benchmark)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The kubelet's calls to a device plugin, as the load benchmarks send them.
RESOURCE = "nvidia.com/gpu"
DEADLINE_S = 30.0
CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]


def percentile(samples: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0..1) of ``samples``."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def vm_field(pid: int, name: str) -> float:
    """A ``/proc/<pid>/status`` memory field (``VmRSS``, ``VmHWM``...) in MB; NaN if absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_mb(pid: int) -> float:
    """The resident set size of process ``pid`` in MB."""
    return vm_field(pid, "VmRSS")


def wait_for_socket(path: Path, timeout_s: float = 30) -> None:
    """Wait until ``path`` exists; exit the benchmark with a message after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {path} did not appear")
        time.sleep(0.05)


def requests_for(uuids: Sequence[str], calls: int, seed: int) -> list[tuple[str, Any]]:
    """``calls`` Allocate and ``calls`` GetPreferredAllocation requests over ``uuids``, as
    (method, request) pairs taking turns."""
    import random

    from cdigen.plugin.deviceplugin.api import deviceplugin_pb2 as pb

    rng = random.Random(seed)
    allocate = [
        pb.AllocateRequest(
            container_requests=[
                pb.ContainerAllocateRequest(
                    devices_ids=rng.sample(list(uuids), rng.randint(1, len(uuids)))
                )
            ]
        )
        for _ in range(calls)
    ]
    preferred = []
    for _ in range(calls):
        size = rng.randint(1, len(uuids))
        free = rng.sample(list(uuids), rng.randint(max(size, len(uuids) // 2), len(uuids)))
        must = free[:1] if rng.random() < 0.5 else []
        preferred.append(
            pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=free, must_include_deviceIDs=must, allocation_size=size
                    )
                ]
            )
        )
    return [
        pair
        for a, p in zip(allocate, preferred, strict=True)
        for pair in (("Allocate", a), ("GetPreferredAllocation", p))
    ]
