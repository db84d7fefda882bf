"""Helpers shared by the benchmark scripts (a benchmark never imports another benchmark)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path


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
