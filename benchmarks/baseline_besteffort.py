"""go-gpuallocator's best-effort policy, the comparison baseline for the benchmarks.

The baseline itself lives in ``policies/baseline.py`` (so that ``cdigen policy simulate`` can
use it without importing ``benchmarks/``); this module re-exports it for the benchmark scripts.
"""

from __future__ import annotations

from cdigen.policies.baseline import BestEffortBaseline, is_nvswitch, partition_count

__all__ = ["BestEffortBaseline", "is_nvswitch", "partition_count"]
