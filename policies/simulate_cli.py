"""``cdigen policy simulate``: random job arrivals and departures, ours beside the baseline."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cdigen.policies.cli_args import allocator_from_args, at_least, check_share_flags

MAX_STEPS = 100_000  # about a minute on one core; each step is one allocation of ours and theirs

if TYPE_CHECKING:
    from collections.abc import Callable

    from cdigen.policies.allocator import Allocator
    from cdigen.policies.simulate import Figures


def run_simulate(args: argparse.Namespace) -> int:
    """Handle ``cdigen policy simulate``."""
    from cdigen.policies.simulate import simulate

    at_least("--steps", args.steps, 1, MAX_STEPS)
    allocator = allocator_from_args(args)
    if args.replicas is not None or args.slice_mib is not None:
        return _simulate_shares(args, allocator)
    ours, theirs = simulate(allocator.node, allocator, seed=args.seed, steps=args.steps)
    node = allocator.node.name or args.node
    print(
        f"node {node} ({gpus(allocator.topology.size)}), policy {allocator.policy.name}, "
        f"seed {args.seed}, {args.steps} steps (1/2/4/8-GPU jobs, weights 40/30/20/10%)"
    )
    # rows that describe multi-GPU jobs only: both engines place the same jobs (same count)
    multi_rows: list[tuple[str, Callable[[Figures], str]]] = [
        ("multi-GPU jobs with the best link score", lambda f: f"{100 * f.share_best_link():.1f}%"),
        ("mean link score of multi-GPU jobs", lambda f: f"{f.mean_link_score():.1f}"),
        *(
            (f"  ... of {size}-GPU jobs", _mean_of(size))
            for size in sorted(ours.jobs_by_size)
            if size < allocator.topology.size
        ),
        (
            "multi-GPU jobs spanning avoidable NUMA nodes",
            lambda f: f"{100 * f.numa_excess_jobs / f.multi_jobs:.1f}%",
        ),
        ("mean NUMA-span excess per multi-GPU job", lambda f: f"{f.mean_numa_excess():.3f}"),
    ]
    rows: list[tuple[str, Callable[[Figures], str]]] = [
        ("jobs placed", lambda f: str(f.jobs)),
        ("  ... of them multi-GPU", lambda f: str(f.multi_jobs)),
        *(multi_rows if ours.multi_jobs else []),
        ("invalid answers (wrong count, empty slot)", lambda f: str(f.invalid_answers)),
    ]
    print(f"{'':44}{'cdigen':>14}{'best-effort':>14}")
    for label, value in rows:
        right = "n/a" if theirs.skipped else value(theirs)
        print(f"{label:44}{value(ours):>14}{right:>14}")
    if not ours.multi_jobs:
        print(f"{'link scores, NUMA spans':44}{'n/a (no multi-GPU jobs)':>28}")
    if theirs.skipped:
        print(f"baseline {theirs.skipped}")
    return 0


def gpus(count: int) -> str:
    """``1 GPU``, ``8 GPUs``."""
    return f"{count} GPU{'' if count == 1 else 's'}"


def _mean_of(size: int) -> Callable[[Figures], str]:
    return lambda f: f"{f.mean_link_score_of(size):.1f}"


def _simulate_shares(args: argparse.Namespace, allocator: Allocator) -> int:
    from cdigen.policies.simulate import ShareFigures, simulate_shares

    check_share_flags(args)
    ours, theirs = simulate_shares(
        allocator.node,
        allocator,
        replicas=args.replicas,
        slice_mib=args.slice_mib,
        seed=args.seed,
        steps=args.steps,
    )
    node = allocator.node.name or args.node
    what = (
        f"{args.replicas} replicas per GPU, pods asking 1/2 (80/20%)"
        if args.replicas is not None
        else f"{args.slice_mib} MiB slices, pods asking 1/2/3/4/8 (30/25/20/15/10%)"
    )
    print(
        f"node {node} ({gpus(allocator.topology.size)}), policy {allocator.policy.name}, "
        f"seed {args.seed}, {args.steps} steps; {what}"
    )
    rows: list[tuple[str, Callable[[ShareFigures], str]]] = [
        ("pods that arrived", lambda f: str(f.pods)),
        ("  admitted", lambda f: str(f.admitted)),
        ("  rejected: fewer free shares than asked", lambda f: str(f.insufficient)),
    ]
    if args.slice_mib is not None:
        rows += [
            ("  refused in Allocate: slices on 2+ GPUs", lambda f: str(f.refused)),
            ("    ... although one GPU had room", lambda f: str(f.avoidable_refusals)),
        ]
    else:
        rows.append(
            (
                "multi-replica pods on distinct GPUs",
                lambda f: f"{f.multi_distinct} of {f.multi}",
            )
        )
    print(f"{'':44}{'cdigen':>14}{'no preference':>14}")
    for label, value in rows:
        print(f"{label:44}{value(ours):>14}{value(theirs):>14}")
    return 0
