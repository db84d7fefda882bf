"""What the ``policy`` subcommands share: the engine their flags describe, and flag checks
(kept apart from :mod:`policies.cli` so that :mod:`policies.simulate_cli` can use them
without the two importing each other)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cdigen.errors import InputError

if TYPE_CHECKING:
    from policies.allocator import Allocator


def allocator_from_args(args: argparse.Namespace) -> Allocator:
    """The engine for ``--node`` (and its roots) under ``--policy``."""
    from cdigen.discover import load_node
    from policies.allocator import Allocator
    from policies.policy import load_policy

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
    from policies.shares import MAX_REPLICAS

    replicas, slice_mib = getattr(args, "replicas", None), getattr(args, "slice_mib", None)
    if replicas is not None:
        at_least("--replicas", replicas, 1, MAX_REPLICAS)
    if slice_mib is not None:
        at_least("--slice-mib", slice_mib, 1)
    return replicas, slice_mib
