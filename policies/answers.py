"""The engine's request and answers: what the kubelet asks (device ID strings), and what
:class:`~cdigen.policies.allocator.Allocator` answers for IDs and for device handles."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AllocationRequest:
    """What the kubelet asks: choose ``size`` of ``available`` (IDs: UUIDs, indexes, replicas)."""

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


@dataclass(frozen=True)
class AllocationAnswer:
    """The chosen IDs (in the form asked), their link score, NUMA nodes, and any fallback."""

    devices: tuple[str, ...]
    link_score: int
    numa_nodes: tuple[int, ...]
    fallback_reason: str | None = None


@dataclass(frozen=True)
class PositionAnswer:
    """The chosen devices as indexes into the request's ``available`` (ascending, except when
    more must-include devices than ``size`` were given: then the first of them, in order),
    their distinct GPU positions (ascending), link score, NUMA nodes and any fallback."""

    devices: tuple[int, ...]
    positions: tuple[int, ...]
    link_score: int
    numa_nodes: tuple[int, ...]
    fallback_reason: str | None = None
