"""Random arrivals and departures of 1-, 2-, 4- and 8-GPU jobs on one node, for ``policy simulate``.

Both engines see the same random workload (same seed, same draws); each keeps its own node
state. The workload is the same job for job: whether a job fits, which job leaves and every
draw depend only on how many GPUs are free and how many jobs run, never on which GPUs an engine
chose (an invalid answer is topped up to the size asked), so both engines place the same jobs
of the same sizes in the same order and their figures compare like with like.

Figures for multi-GPU jobs: the share that got a set with the best link score possible on an
empty node for that size, the mean link score (in all and per job size), and the NUMA-span
excess (NUMA nodes spanned beyond the fewest that a set of the free GPUs with at least the same
link score spans: the avoidable part).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from math import comb

from cdigen.model import Node
from cdigen.policies.allocator import AllocationRequest, Allocator
from cdigen.policies.baseline import BestEffortBaseline, partition_count
from cdigen.policies.graph import Topology

JOB_SIZES = (1, 2, 4, 8)
JOB_WEIGHTS = (0.4, 0.3, 0.2, 0.1)
BASELINE_PARTITION_LIMIT = 200_000
EXHAUSTIVE_LIMIT = 5000

Chooser = Callable[[list[int], int], list[int | None]]


@dataclass
class Figures:
    """What one engine achieved over a simulation."""

    engine: str
    jobs: int = 0
    rejected: int = 0
    multi_jobs: int = 0
    multi_best_link: int = 0
    link_score_total: int = 0
    numa_excess_jobs: int = 0
    numa_excess_total: int = 0
    invalid_answers: int = 0
    jobs_by_size: dict[int, int] = field(default_factory=dict)
    link_score_by_size: dict[int, int] = field(default_factory=dict)
    skipped: str | None = None
    notes: list[str] = field(default_factory=list)

    def share_best_link(self) -> float:
        """Share of multi-GPU jobs with the best link score possible on an empty node."""
        return self.multi_best_link / self.multi_jobs if self.multi_jobs else 1.0

    def mean_link_score(self) -> float:
        """Mean link score of multi-GPU jobs."""
        return self.link_score_total / self.multi_jobs if self.multi_jobs else 0.0

    def mean_link_score_of(self, size: int) -> float:
        """Mean link score of the ``size``-GPU jobs (0 when there were none)."""
        jobs = self.jobs_by_size.get(size, 0)
        return self.link_score_by_size.get(size, 0) / jobs if jobs else 0.0

    def mean_numa_excess(self) -> float:
        """Mean avoidable NUMA-span excess per multi-GPU job."""
        return self.numa_excess_total / self.multi_jobs if self.multi_jobs else 0.0


def best_empty_scores(topology: Topology, sizes: Sequence[int]) -> dict[int, int]:
    """The best link score of each size on an empty node (through the exact engine)."""
    allocator = Allocator(topology.node)
    everything = tuple(str(g.index) for g in topology.gpus)
    return {
        k: allocator.prefer(AllocationRequest(everything, (), k)).link_score
        for k in sizes
        if k <= topology.size
    }


def _min_span(topology: Topology, free: Sequence[int], size: int, score: int) -> int:
    """The fewest NUMA nodes a set of ``size`` free GPUs with link score >= ``score`` spans.

    Exhaustive up to ``EXHAUSTIVE_LIMIT`` sets; beyond that, the fewest NUMA nodes any set of
    that size spans (ignoring the link score: an excess there may be the price of links).
    """
    if comb(len(free), size) <= EXHAUSTIVE_LIMIT:
        spans = [
            len(topology.numa_nodes(s))
            for s in combinations(free, size)
            if topology.set_score(s) >= score
        ]
        return min(spans)
    by_numa: dict[int | None, int] = {}
    for p in free:
        by_numa[topology.numa[p]] = by_numa.get(topology.numa[p], 0) + 1
    taken = span = 0
    for count in sorted((c for n, c in by_numa.items() if n is not None), reverse=True):
        if taken >= size:
            break
        taken += count
        span += 1
    return span


def run(
    node: Node,
    chooser: Chooser,
    engine: str,
    topology: Topology,
    best: dict[int, int],
    *,
    seed: int,
    steps: int,
) -> Figures:
    """Simulate ``steps`` events with ``chooser(free_positions, size) -> positions``."""
    rng = random.Random(seed)
    figures = Figures(engine)
    free = set(range(topology.size))
    running: list[list[int]] = []
    for _ in range(steps):
        if running and rng.random() < 0.5:
            for p in running.pop(rng.randrange(len(running))):
                free.add(p)
            continue
        size = rng.choices(JOB_SIZES, JOB_WEIGHTS)[0]
        if size > len(free) or size > topology.size:
            figures.rejected += 1
            continue
        ordered = sorted(free)
        answer = chooser(ordered, size)
        chosen = [p for p in answer if p is not None and p in free]
        if len(set(chosen)) != size or len(answer) != size:
            figures.invalid_answers += 1
            chosen = list(dict.fromkeys(chosen))
            chosen += [p for p in ordered if p not in chosen][: size - len(chosen)]
        figures.jobs += 1
        if size > 1:
            positions = tuple(sorted(chosen))
            score = topology.set_score(positions)
            figures.multi_jobs += 1
            figures.link_score_total += score
            figures.jobs_by_size[size] = figures.jobs_by_size.get(size, 0) + 1
            figures.link_score_by_size[size] = figures.link_score_by_size.get(size, 0) + score
            figures.multi_best_link += score >= best[size]
            span = len(topology.numa_nodes(positions))
            excess = span - _min_span(topology, ordered, size, score)
            if excess > 0:
                figures.numa_excess_jobs += 1
                figures.numa_excess_total += excess
        for p in chosen:
            free.discard(p)
        running.append(chosen)
    return figures


def simulate(
    node: Node, allocator: Allocator, *, seed: int = 1, steps: int = 2000
) -> tuple[Figures, Figures]:
    """Our engine's figures and the best-effort baseline's, on the same random workload."""
    topology = allocator.topology
    best = best_empty_scores(topology, JOB_SIZES)

    def ours(free: list[int], size: int) -> list[int | None]:
        ids = tuple(str(topology.gpus[p].index) for p in free)
        answer = allocator.prefer(AllocationRequest(ids, (), size))
        return [allocator.position_of(i) for i in answer.devices]

    baseline = BestEffortBaseline(node)

    def theirs(free: list[int], size: int) -> list[int | None]:
        indexes = [topology.gpus[p].index for p in free]
        answer = baseline.allocate(indexes, [], size)
        return [None if i is None else topology.position_by_index[i] for i in answer]

    our_figures = run(node, ours, "cdigen", topology, best, seed=seed, steps=steps)
    worst = max(partition_count(topology.size, k) for k in JOB_SIZES if k <= topology.size)
    if worst > BASELINE_PARTITION_LIMIT:
        skipped = Figures("best-effort baseline")
        skipped.skipped = (
            f"not run: up to {worst:,} partitions per request on {topology.size} GPUs "
            "(the Go code takes seconds per call there)"
        )
        return our_figures, skipped
    return our_figures, run(
        node, theirs, "best-effort baseline", topology, best, seed=seed, steps=steps
    )


SLICE_JOB_SIZES = (1, 2, 3, 4, 8)
SLICE_JOB_WEIGHTS = (0.3, 0.25, 0.2, 0.15, 0.1)
REPLICA_JOB_SIZES = (1, 2)
REPLICA_JOB_WEIGHTS = (0.8, 0.2)


@dataclass
class ShareFigures:
    """What one chooser achieved for pods asking for shares (slices or replicas)."""

    engine: str
    pods: int = 0
    admitted: int = 0
    insufficient: int = 0  # fewer free shares than asked, in all: the kubelet rejects the pod
    refused: int = 0  # slices on several GPUs: Allocate refuses, the pod fails
    avoidable_refusals: int = 0  # ... although one GPU had enough free slices
    multi: int = 0  # admitted pods asking for more than one share
    multi_distinct: int = 0  # ... whose shares are on distinct GPUs


@dataclass(frozen=True)
class ShareSizes:
    """A sharing setting by itself (``--replicas`` or ``--slice-mib``), as the catalogue's
    :func:`~cdigen.catalogue.share_ids` reads one."""

    replicas: int | None = None
    memory_slice_mib: int | None = None


def every_share_id(node: Node, *, replicas: int | None, slice_mib: int | None) -> list[str]:
    """Every share ID of ``node`` for a resource with ``replicas`` or ``slice_mib`` set (MIG
    GPUs too: the simulation treats every GPU as whole)."""
    from cdigen.catalogue import share_ids

    if replicas is None and slice_mib is None:
        return []
    sizes = ShareSizes(replicas=replicas, memory_slice_mib=slice_mib)
    return [i for gpu in sorted(node.gpus, key=lambda g: g.index) for i in share_ids(gpu, sizes)]


def simulate_shares(
    node: Node,
    allocator: Allocator,
    *,
    replicas: int | None = None,
    slice_mib: int | None = None,
    seed: int = 1,
    steps: int = 2000,
) -> tuple[ShareFigures, ShareFigures]:
    """Pods asking for slices or replicas: our preference beside the kubelet's own pick.

    Without a preference the kubelet takes the first free IDs it holds (here: in advertised
    order). A slice set that spans GPUs is refused in Allocate, as the plugin does. Pods
    leave with a probability that grows with the number running, so the node stays near full.
    """
    everything = every_share_id(node, replicas=replicas, slice_mib=slice_mib)
    slices = slice_mib is not None
    sizes, weights = (
        (SLICE_JOB_SIZES, SLICE_JOB_WEIGHTS) if slices else (REPLICA_JOB_SIZES, REPLICA_JOB_WEIGHTS)
    )

    def ours(free: list[str], size: int) -> tuple[str, ...]:
        return allocator.prefer(AllocationRequest(tuple(free), (), size)).devices

    def kubelet(free: list[str], size: int) -> tuple[str, ...]:
        return tuple(free[:size])

    # departures become likelier as the node fills: it hovers near full, where choices matter
    mean_size = sum(s * w for s, w in zip(sizes, weights, strict=True))
    target = max(1.0, 2 * len(everything) / mean_size)  # balance (p = 0.5) at a full node
    runs = [
        _share_run(name, choose, everything, (sizes, weights), slices, target, seed, steps)
        for name, choose in (("cdigen", ours), ("kubelet, no preference", kubelet))
    ]
    return runs[0], runs[1]


def _share_run(
    name: str,
    choose: Callable[[list[str], int], tuple[str, ...]],
    everything: Sequence[str],
    mix: tuple[Sequence[int], Sequence[float]],
    slices: bool,
    target: float,
    seed: int,
    steps: int,
) -> ShareFigures:
    """One run of :func:`simulate_shares` with ``choose`` picking the shares: pods of the
    sizes and weights in ``mix`` arrive, or leave with a probability growing to 0.95 as the
    running count nears ``target``."""
    from cdigen.shares import gpu_part

    order = {i: n for n, i in enumerate(everything)}
    sizes, weights = mix
    rng = random.Random(seed)
    figures = ShareFigures(name)
    free = set(everything)
    running: list[tuple[str, ...]] = []
    for _ in range(steps):
        if running and rng.random() < min(0.95, len(running) / target):
            free.update(running.pop(rng.randrange(len(running))))
            continue
        size = rng.choices(sizes, weights)[0]
        figures.pods += 1
        if size > len(free):
            figures.insufficient += 1
            continue
        ordered = sorted(free, key=order.__getitem__)
        chosen = choose(ordered, size)
        gpus = {gpu_part(i) for i in chosen}
        if slices and len(gpus) > 1:
            figures.refused += 1
            per_gpu: dict[str, int] = {}
            for i in ordered:
                per_gpu[gpu_part(i)] = per_gpu.get(gpu_part(i), 0) + 1
            figures.avoidable_refusals += max(per_gpu.values()) >= size
            continue
        figures.admitted += 1
        if size > 1:
            figures.multi += 1
            figures.multi_distinct += len(gpus) == size
        free.difference_update(chosen)
        running.append(chosen)
    return figures
