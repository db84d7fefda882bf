"""What the ``policy`` subcommands share: the engine their flags describe, flag checks, the
request check and the answer's JSON form (kept apart from :mod:`cdigen.policies.cli` so that the
handler modules, ``explain_cli``, ``replay_cli`` and ``simulate_cli``, can use them without
importing each other)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from cdigen.errors import InputError

if TYPE_CHECKING:
    from cdigen.policies.allocator import AllocationAnswer, AllocationRequest, Allocator


def allocator_from_args(args: argparse.Namespace) -> Allocator:
    """The engine for ``--node`` (and its roots) under ``--policy``."""
    from cdigen.discover import load_node
    from cdigen.policies.allocator import Allocator
    from cdigen.policies.policy import load_policy

    node = load_node(args.node, sysfs_root=args.sysfs_root, proc_root=args.proc_root)
    return Allocator(node, load_policy(args.policy))


def at_least(flag: str, value: int, minimum: int, maximum: int | None = None) -> None:
    """InputError naming ``flag`` when ``value`` is below ``minimum`` (or above ``maximum``)."""
    if value < minimum:
        raise InputError(f"{flag} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise InputError(f"{flag} must be at most {maximum}, got {value}")


def check_share_flags(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """``--replicas`` and ``--slice-mib`` (None where not given); InputError if out of range."""
    from cdigen.shares import MAX_REPLICAS

    replicas, slice_mib = getattr(args, "replicas", None), getattr(args, "slice_mib", None)
    if replicas is not None:
        at_least("--replicas", replicas, 1, MAX_REPLICAS)
    if slice_mib is not None:
        at_least("--slice-mib", slice_mib, 1)
    return replicas, slice_mib


def unique_ids(ids: tuple[str, ...], where: str) -> None:
    """InputError when ``ids`` names a device twice (``0`` and ``"0"`` are the same ID): the
    one check of explain's flags and replay's lines."""
    seen: set[str] = set()
    twice = [i for i in ids if i in seen or seen.add(i)]  # type: ignore[func-returns-value]
    if twice:
        shown = ", ".join(twice[:3])
        raise InputError(f"{where} lists a device twice: {shown}", hint="list each ID once")


def checked_request(
    allocator: Allocator,
    available: tuple[str, ...],
    must: tuple[str, ...],
    size: int,
    where: str,
) -> AllocationRequest:
    """A request checked the way the CLI is strict and prefer() is not."""
    from cdigen.policies.allocator import AllocationRequest

    outside = [m for m in must if m not in set(available)]
    if outside:
        raise InputError(
            f"must-include devices {', '.join(outside)} are not among the available ones",
            where=where,
            hint="add them to the available list",
        )
    unknown = [i for i in available if allocator.position_of(i) is None]
    if unknown:
        raise InputError(
            f"unknown device IDs {', '.join(unknown[:5])} on node {allocator.node.name or '?'}",
            where=where,
            hint="use GPU indexes or UUIDs from 'cdigen discover'",
        )
    if size < 1:
        raise InputError(f"size must be at least 1, got {size}", where=where)
    return AllocationRequest(available, must, size)


def answer_doc(answer: AllocationAnswer) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "devices": list(answer.devices),
        "linkScore": answer.link_score,
        "numaNodes": list(answer.numa_nodes),
    }
    if answer.fallback_reason:
        doc["fallbackReason"] = answer.fallback_reason
    return doc
