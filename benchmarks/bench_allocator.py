"""Speed and answer quality of the allocation engine, beside go-gpuallocator's best-effort.

In-process, warm (an engine built once per node and policy, as the plugin holds it). Prints
medians, p99 and the ratio to the baseline measured in the same run. Goals (issue 4), p99:
8 GPUs <= 100 µs (warm: a memoized lookup); 16 GPUs <= 20 ms exact (every request new to the
engine); 8 GPUs x 16 replicas <= 1 ms; a policy with a selector and a constraint within 2x of
the default. Sharing (issue 7), p99 <= 5 ms first sight: 8 GPUs x 16 replicas (spread and
pack), one 24 GB GPU and eight of them in 1 GiB memory slices; and how often a slice request
lands on one GPU, beside the kubelet's own choice (the first IDs offered) when a plugin gives
no preference. Quality on every 8-GPU sample over all availability patterns, sizes and single
must-include devices: valid answers, best link score, avoidable NUMA-span excess. Many jobs
(``cdigen policy simulate``, seeds 1-5): best-link share, mean link score (in all, 2- and 4-GPU
jobs) and NUMA-span excess, ours beside the baseline, "(behind)" where ours is lower.

Every cookbook policy (docs/policies) on 16 GPUs (issue 13, goal p99 <= 20 ms), wall clock and
CPU time of the thread.

Engine speed (issue 27; ``--engine`` runs only this): CPU time (``time.process_time_ns``, which
a busy shared machine does not inflate) beside wall time, with the load average. 8 GPUs: every
request of a node (each available set, size, no or one must-include GPU: 5,632, the requests
recorded from go-gpuallocator) first sight and warm, beside go-gpuallocator's figures from
issue 27 (its real Go code, measured there; not run here), and the engine build. 16 GPUs:
engine build, random requests first sight, and the worst request (a free node, every size; the
random ones).

    python benchmarks/bench_allocator.py [--quick] [--cookbook] [--engine]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.baseline_besteffort import BestEffortBaseline, partition_count
from benchmarks.common import percentile
from cdigen.discover import load_node
from cdigen.model import Node
from cdigen.policies.allocator import AllocationRequest, Allocator
from cdigen.policies.graph import Topology
from cdigen.policies.policy import builtin_policy, load_policy
from cdigen.shares import gpu_part, slice_count, slice_ids

EIGHT_GPU_SAMPLES = (
    "dgx1-v100",
    "dgx1-p100",
    "dgx-a100",
    "dgx-h100",
    "pcie-8x4090",
    "pcie-8gpu-phb",
)
SIXTEEN_GPU_SAMPLE = "dgx2-v100"
POLICY_WITH_CEL = """\
apiVersion: cdigen/v1alpha1
kind: AllocationPolicy
metadata: {name: bench}
spec:
  selector: device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("8Gi")) >= 0
  constraints:
    - allocation.numaNodes.size() <= 2
"""


def timed_us(call: Callable[[], object], repeat: int = 1) -> float:
    start = time.perf_counter_ns()
    for _ in range(repeat):
        call()
    return (time.perf_counter_ns() - start) / 1000 / repeat


def report(label: str, ours: Sequence[float], base: Sequence[float] | None = None) -> None:
    line = (
        f"{label:44} p50 {statistics.median(ours):10.1f} µs  p99 {percentile(ours, 0.99):10.1f} µs"
    )
    if base:
        ratio = percentile(base, 0.99) / percentile(ours, 0.99)
        line += (
            f"   baseline p50 {statistics.median(base):10.1f} µs p99 "
            f"{percentile(base, 0.99):10.1f} µs  (baseline/ours at p99: {ratio:.1f}x)"
        )
    print(line)


def random_requests(
    node: Node, count: int, seed: int, *, replicas: int = 1
) -> list[AllocationRequest]:
    rng = random.Random(seed)
    ids = [str(g.index) for g in node.gpus]
    out = []
    for _ in range(count):
        free = sorted(rng.sample(ids, rng.randint(1, len(ids))), key=int)
        size = rng.randint(1, len(free))
        must = rng.sample(free, rng.randint(0, min(1, size)))
        if replicas > 1:
            uuid = {str(g.index): g.uuid for g in node.gpus}
            avail = tuple(f"{uuid[i]}::{n}" for i in free for n in range(replicas))
            size = rng.randint(1, min(len(avail), 16))
            must_ids = tuple(f"{uuid[m]}::0" for m in must[:size])
            out.append(AllocationRequest(avail, must_ids, size))
        else:
            out.append(AllocationRequest(tuple(free), tuple(must), size))
    return out


def speed(quick: bool) -> None:
    print("== speed (in-process, warm engine; gc paused while timing, as timeit does)")
    node = load_node(f"builtin:{EIGHT_GPU_SAMPLES[0]}")
    allocator = Allocator(node)
    baseline = BestEffortBaseline(node)
    requests = random_requests(node, 300 if quick else 2000, seed=8)
    for r in requests:  # warm: the plugin sees the same few patterns again and again
        allocator.prefer(r)
    ours = [timed_us(lambda r=r: allocator.prefer(r)) for r in requests]
    base = [
        timed_us(
            lambda r=r: baseline.allocate(
                [int(i) for i in r.available], [int(i) for i in r.must_include], r.size
            )
        )
        for r in requests
    ]
    report("8 GPUs (dgx1-v100), warm", ours, base)
    fresh = Allocator(node)
    fresh.prefer(random_requests(node, 1, seed=99)[0])  # first-call setup
    first = [timed_us(lambda r=r: fresh.prefer(r)) for r in requests]
    report("8 GPUs, first sight (exact search, no memo)", first)
    cold = [timed_us(lambda r=r: Allocator(node).prefer(r)) for r in requests[:200]]
    report("8 GPUs, engine rebuilt per call (cold)", cold)

    big = load_node(f"builtin:{SIXTEEN_GPU_SAMPLE}")
    start = time.perf_counter()
    big_allocator = Allocator(big)
    build_ms = 1000 * (time.perf_counter() - start)
    print(f"{'16 GPUs: engine build (once per node)':44} {build_ms:.0f} ms")
    big_requests = random_requests(big, 100 if quick else 400, seed=16)
    ours16 = [timed_us(lambda r=r: big_allocator.prefer(r)) for r in big_requests]  # all new
    report("16 GPUs (dgx2-v100), exact, first sight", ours16)
    for k in (3, 5):
        print(
            f"{'':4}baseline on a free 16-GPU node, {k}-GPU request: {partition_count(16, k):,} "
            "partitions to enumerate (not run; the Go code takes seconds)"
        )

    replica_requests = random_requests(node, 200 if quick else 1000, seed=3, replicas=16)
    rep_allocator = Allocator(node)
    rep_allocator.prefer(random_requests(node, 1, seed=99, replicas=16)[0])  # first-call setup
    cold_rep = [timed_us(lambda r=r: rep_allocator.prefer(r)) for r in replica_requests]
    warm_rep = [timed_us(lambda r=r: rep_allocator.prefer(r)) for r in replica_requests]
    report("8 GPUs x 16 replicas, first sight", cold_rep)
    report("8 GPUs x 16 replicas, warm", warm_rep)

    policy_path = Path(__file__).resolve().parent / ".bench-policy.yaml"
    policy_path.write_text(POLICY_WITH_CEL, encoding="utf-8")
    try:
        cel_allocator = Allocator(node, load_policy(policy_path))
    finally:
        policy_path.unlink()
    for r in requests:
        cel_allocator.prefer(r)
    with_cel = [timed_us(lambda r=r: cel_allocator.prefer(r)) for r in requests]
    report("8 GPUs, selector + constraint, warm", with_cel)
    ratio = percentile(with_cel, 0.99) / percentile(ours, 0.99)
    print(f"{'':4}selector+constraint / default at p99: {ratio:.2f}x (goal <= 2x)")
    fresh_default = [timed_us(lambda r=r: Allocator(node).prefer(r)) for r in requests[:100]]
    fresh_cel = [
        timed_us(lambda r=r: cel_allocator.__class__(node, cel_allocator.policy).prefer(r))
        for r in requests[:100]
    ]
    print(
        f"{'':4}first sight (engine rebuilt), selector+constraint / default at p50: "
        f"{statistics.median(fresh_cel) / statistics.median(fresh_default):.2f}x"
    )


def slice_requests(node: Node, count: int, seed: int) -> list[AllocationRequest]:
    """Random slice states (each GPU 0..all slices free) and 1..8-slice requests that fit."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        free: list[str] = []
        for gpu in node.gpus:
            ids = slice_ids(gpu.uuid, slice_count(gpu, 1024))
            free += rng.sample(ids, rng.randint(0, len(ids)))
        size = rng.randint(1, 8)
        if size <= len(free):
            out.append(AllocationRequest(tuple(sorted(free)), (), size))
    return out


def sharing(quick: bool) -> None:
    print("== sharing (issue 7): first sight, every request new to the engine; goal p99 <= 5 ms")
    node = load_node(f"builtin:{EIGHT_GPU_SAMPLES[0]}")
    whole = Allocator(node)
    whole.prefer(random_requests(node, 1, seed=99)[0])
    base = [timed_us(lambda r=r: whole.prefer(r)) for r in random_requests(node, 300, seed=5)]
    report("reference: 8 whole GPUs, first sight", base)
    count = 200 if quick else 1000
    for name in ("spread", "pack"):
        allocator = Allocator(node, builtin_policy(name))
        requests = random_requests(node, count, seed=3, replicas=16)
        allocator.prefer(requests[0])
        times = [timed_us(lambda r=r, a=allocator: a.prefer(r)) for r in requests[1:]]
        report(f"8 GPUs x 16 replicas, {name}", times, base)
    for sample in ("rtx4090", "pcie-8x4090"):
        shared = load_node(f"builtin:{sample}")
        allocator = Allocator(shared)
        requests = slice_requests(shared, count, seed=7)
        allocator.prefer(requests[0])
        times = [timed_us(lambda r=r, a=allocator: a.prefer(r)) for r in requests[1:]]
        label = f"{len(shared.gpus)} x 24 GB in 1 GiB slices ({sample})"
        report(label, times, base)
        fits = ours_one = kubelet_one = 0
        for r in requests:
            per_gpu: dict[str, int] = {}
            for i in r.available:
                per_gpu[gpu_part(i)] = per_gpu.get(gpu_part(i), 0) + 1
            if max(per_gpu.values()) < r.size:
                continue
            fits += 1
            ours_one += len({gpu_part(i) for i in allocator.prefer(r).devices}) == 1
            kubelet_one += len({gpu_part(i) for i in r.available[: r.size]}) == 1
        print(
            f"{'':4}requests one GPU could hold: {fits}; on one GPU: ours {ours_one} "
            f"({100 * ours_one / fits:.1f}%), kubelet's first-offered {kubelet_one} "
            f"({100 * kubelet_one / fits:.1f}%)"
        )


def _brute(topology: Topology, free: Sequence[int], must: Sequence[int], size: int):  # type: ignore[no-untyped-def]
    rest = [p for p in free if p not in must]
    return [
        (topology.set_score(s), len(topology.numa_nodes(s)))
        for s in (tuple(sorted([*must, *extra])) for extra in combinations(rest, size - len(must)))
    ]


def quality() -> None:
    print("== quality: every availability pattern, size and single must-include (or none)")
    print(f"{'node':16}{'answers':>9}  {'valid':>14}  {'best link score':>18}  {'NUMA excess':>16}")
    for name in EIGHT_GPU_SAMPLES:
        node = load_node(f"builtin:{name}")
        allocator = Allocator(node)
        baseline = BestEffortBaseline(node)
        topo = allocator.topology
        tallies = {"ours": [0, 0, 0], "base": [0, 0, 0]}
        total = 0
        for mask in range(1, 1 << topo.size):
            free = [p for p in range(topo.size) if mask >> p & 1]
            for size in range(1, len(free) + 1):
                for must in [[], *([p] for p in free)]:
                    total += 1
                    options = _brute(topo, free, must, size)
                    best = max(s for s, _ in options)
                    ids = tuple(str(topo.gpus[p].index) for p in free)
                    must_ids = tuple(str(topo.gpus[p].index) for p in must)
                    answer = allocator.prefer(AllocationRequest(ids, must_ids, size)).devices
                    ours = [allocator.position_of(i) for i in answer]
                    theirs_idx = baseline.allocate(
                        [topo.gpus[p].index for p in free], [topo.gpus[p].index for p in must], size
                    )
                    theirs = [None if i is None else topo.position_by_index[i] for i in theirs_idx]
                    for who, chosen in (("ours", ours), ("base", theirs)):
                        valid = (
                            len(chosen) == size
                            and None not in chosen
                            and len(set(chosen)) == size
                            and set(must) <= set(chosen) <= set(free)  # type: ignore[operator]
                        )
                        if not valid:
                            continue
                        s = tuple(sorted(chosen))  # type: ignore[type-var]
                        score, span = topo.set_score(s), len(topo.numa_nodes(s))
                        tallies[who][0] += 1
                        tallies[who][1] += score == best
                        tallies[who][2] += span > min(sp for sc, sp in options if sc >= score)
        for who, label in (("ours", name), ("base", "  baseline")):
            valid, best_link, excess = tallies[who]
            print(
                f"{label:16}{total:>9}  {valid:>6} ({100 * valid / total:5.1f}%)  "
                f"{best_link:>8} ({100 * best_link / total:5.1f}%)  "
                f"{excess:>6} ({100 * excess / total:5.1f}%)"
            )


JOB_SAMPLES = (*EIGHT_GPU_SAMPLES, "ws-4xv100", "ws-4xrtx8000")


def jobs(quick: bool) -> None:
    """Arrivals and departures (``cdigen policy simulate``): ours beside the baseline, per seed."""
    from cdigen.policies.simulate import simulate

    seeds = (1,) if quick else (1, 2, 3, 4, 5)
    print("== many jobs: policy simulate, 2000 steps; multi-GPU jobs, ours / baseline")
    print(
        f"{'node':16}{'seed':>5}  {'best link score':>17}  {'mean link score':>17}  "
        f"{'2-GPU mean':>15}  {'4-GPU mean':>17}  {'NUMA excess':>11}"
    )
    for name in JOB_SAMPLES:
        node = load_node(f"builtin:{name}")
        allocator = Allocator(node)
        for seed in seeds:
            ours, theirs = simulate(node, allocator, seed=seed, steps=2000)
            behind = (
                ours.share_best_link() < theirs.share_best_link()
                or ours.mean_link_score() < theirs.mean_link_score()
            )
            print(
                f"{name:16}{seed:>5}  "
                f"{100 * ours.share_best_link():6.1f}% /{100 * theirs.share_best_link():6.1f}%  "
                f"{ours.mean_link_score():7.1f} /{theirs.mean_link_score():7.1f}  "
                f"{ours.mean_link_score_of(2):6.1f} /{theirs.mean_link_score_of(2):6.1f}  "
                f"{ours.mean_link_score_of(4):7.1f} /{theirs.mean_link_score_of(4):7.1f}  "
                f"{ours.numa_excess_jobs:>4} /{theirs.numa_excess_jobs:>4}"
                + ("  (behind)" if behind else "")
            )


def cookbook(quick: bool) -> None:
    """Every cookbook policy (docs/policies) on 16 GPUs, every request new to the engine."""
    print(f"== cookbook policies on {SIXTEEN_GPU_SAMPLE}, first sight (goal: p99 <= 20 ms)")
    big = load_node(f"builtin:{SIXTEEN_GPU_SAMPLE}")
    requests = random_requests(big, 100 if quick else 400, seed=13)
    cookbook_dir = Path(__file__).resolve().parent.parent / "docs" / "policies"
    print("    (wall clock, then CPU time of the thread: the second ignores a busy machine)")
    for path in sorted(cookbook_dir.glob("*.yaml")):
        allocator = Allocator(big, load_policy(path))
        wall, cpu = [], []
        for r in requests:
            start_cpu, start = time.thread_time_ns(), time.perf_counter_ns()
            allocator.prefer(r)
            wall.append((time.perf_counter_ns() - start) / 1000)
            cpu.append((time.thread_time_ns() - start_cpu) / 1000)
        report(f"16 GPUs, {path.stem}", wall)
        report("    CPU time", cpu)


# go-gpuallocator's figures in issue 27 (its Go code, CPU time, every request of these nodes)
GO_FIRST_SIGHT_US = {"p50": 1.5, "p99": "48-59"}
ENGINE_NODES = ("dgx1-v100", "dgx-a100", "pcie-8x4090")
LARGE_NODE_DIR = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "nodes"
LARGE_NODES = ("pcie-20gpu-2socket", "nvswitch-24gpu", "pcie-24gpu-2socket", "nvswitch-32gpu")


def every_request(node: Node) -> list[AllocationRequest]:
    """Each non-empty available set, each size up to it, with no must-include GPU and with
    each available one as must-include: the requests recorded from go-gpuallocator."""
    ids = [str(g.index) for g in sorted(node.gpus, key=lambda g: g.index)]
    out = []
    for mask in range(1, 1 << len(ids)):
        free = tuple(i for n, i in enumerate(ids) if mask >> n & 1)
        for size in range(1, len(free) + 1):
            for must in [(), *((i,) for i in free)]:
                out.append(AllocationRequest(free, must, size))
    return out


def cpu_and_wall(call: Callable[[], object]) -> tuple[float, float]:
    """CPU and wall time of one call, in µs."""
    cpu, wall = time.process_time_ns(), time.perf_counter_ns()
    call()
    return (time.process_time_ns() - cpu) / 1000, (time.perf_counter_ns() - wall) / 1000


def report_cpu(label: str, samples: Sequence[tuple[float, float]], unit: str = "µs") -> None:
    cpu = [c for c, _ in samples]
    wall = [w for _, w in samples]
    scale = 1000 if unit == "ms" else 1
    print(
        f"{label:48} CPU p50 {statistics.median(cpu) / scale:7.1f} p99 "
        f"{percentile(cpu, 0.99) / scale:7.1f} max {max(cpu) / scale:7.1f} {unit}   wall p50 "
        f"{statistics.median(wall) / scale:7.1f} p99 {percentile(wall, 0.99) / scale:7.1f}"
    )


def engine(quick: bool) -> None:
    """Issue 27: first sight and warm on 8 GPUs, the 16-GPU engine build and worst request."""
    print(
        "== engine speed (issue 27): CPU time beside wall; load average "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    print(
        f"{'':4}go-gpuallocator (issue 27, its Go code, not run here): first sight p50 "
        f"{GO_FIRST_SIGHT_US['p50']} µs, p99 {GO_FIRST_SIGHT_US['p99']} µs"
    )
    for name in ENGINE_NODES:
        node = load_node(f"builtin:{name}")
        requests = every_request(node)
        allocator = Allocator(node)  # the first build in a process also loads the policy
        builds = [cpu_and_wall(lambda n=node: Allocator(n)) for _ in range(3)]
        first = [cpu_and_wall(lambda r=r, a=allocator: a.prefer(r)) for r in requests]
        warm = [cpu_and_wall(lambda r=r, a=allocator: a.prefer(r)) for r in requests]
        report_cpu(f"8 GPUs ({name}): engine build", builds, "ms")
        report_cpu(f"8 GPUs ({name}), every request, first sight", first)
        report_cpu("    the same, warm (memoized)", warm)
    default = builtin_policy("default")
    big = load_node(f"builtin:{SIXTEEN_GPU_SAMPLE}")
    builds = [cpu_and_wall(lambda: Allocator(big, default)) for _ in range(2 if quick else 5)]
    report_cpu(f"16 GPUs ({SIXTEEN_GPU_SAMPLE}): engine build", builds, "ms")
    allocator = Allocator(big, default)
    free = tuple(str(g.index) for g in big.gpus)
    whole = [
        cpu_and_wall(lambda k=k: allocator.prefer(AllocationRequest(free, (), k)))
        for k in range(1, len(free) + 1)
    ]
    report_cpu("16 GPUs, a free node, every size, first sight", whole)
    requests = random_requests(big, 300 if quick else 2000, seed=27)
    times = [cpu_and_wall(lambda r=r: allocator.prefer(r)) for r in requests]
    report_cpu("16 GPUs, random requests, first sight", times)
    worst = max(c for c, _ in [*whole, *times])
    print(f"{'16 GPUs: worst request (CPU)':48} {worst / 1000:.2f} ms (goal <= 2 ms)")
    uuid = big.gpus[0].uuid
    shares = AllocationRequest((f"{uuid}::0", f"{uuid}::1", "3"), (), 2)
    engines = [Allocator(big, default) for _ in range(2 if quick else 3)]
    first_shared = [cpu_and_wall(lambda a=a: a.prefer(shares)) for a in engines]
    report_cpu("16 GPUs, first request over shares (table)", first_shared, "ms")
    for name in LARGE_NODES:
        node = load_node(str(LARGE_NODE_DIR / f"{name}.yaml"))
        builds = [cpu_and_wall(lambda n=node: Allocator(n, default)) for _ in range(3)]
        report_cpu(f"{len(node.gpus)} GPUs ({name}): engine build", builds, "ms")
        allocator = Allocator(node, default)
        requests = random_requests(node, 300 if quick else 1000, seed=len(node.gpus))
        times = [cpu_and_wall(lambda r=r, a=allocator: a.prefer(r)) for r in requests]
        report_cpu(f"{len(node.gpus)} GPUs, random requests, first sight", times)


def main() -> None:
    gc.disable()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests; skip quality")
    parser.add_argument("--cookbook", action="store_true", help="only the cookbook policies")
    parser.add_argument("--engine", action="store_true", help="only the engine speed (issue 27)")
    args = parser.parse_args()
    if args.engine:
        engine(args.quick)
        return
    cookbook(args.quick)
    if args.cookbook:
        return
    engine(args.quick)
    speed(args.quick)
    sharing(args.quick)
    jobs(args.quick)
    if not args.quick:
        quality()


if __name__ == "__main__":
    main()
