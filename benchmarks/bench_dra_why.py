"""``cdigen dra why`` at cluster scale (issue 36 goal: 5,000 nodes of 8 GPUs within 3 s and
200 MB), against a baseline tree measured in the same sitting, alternating.

    python benchmarks/bench_dra_why.py [--nodes 5000] [--rounds 3] [--baseline DIR] [--varied]

The cluster: ``--nodes`` nodes, each publishing the ResourceSlice ``cdigen dra serve
--memory-step 1Mi`` publishes for builtin:dgx-a100 (8 A100s, memory shares); on every node two
allocated claims hold 3Gi of a GPU; the DeviceClasses of deploy/dra/deviceclasses.yaml; and a
pending pod whose claim asks 90Gi (fits nowhere: every node is simulated and explained). The
objects are JSON text as the API server sends its lists; one run is a fresh process that parses
them (as that tree's ``read_cluster`` does) and runs ``explain_pod``, measured by wall clock, CPU
time (user + system) and peak RSS (the whole process: the interpreter and imports too;
``VmHWM``). ``--baseline DIR``: a checkout of the tree to compare with (e.g. ``git worktree
add --detach DIR main``); runs alternate: baseline, ours, baseline, ours...

Figures (2026-12-05, the 2-core shared dev machine, 3 rounds alternating, medians; baseline
main at 04fc289, ours the h14 branch):

    python benchmarks/bench_dra_why.py --nodes 5000 --rounds 3 --baseline /work/h14-base
      baseline: wall 21.22 s, CPU 20.96 s, peak RSS 419 MB
      ours:     wall  1.91 s, CPU  1.88 s, peak RSS 108 MB
    ... --varied (every node's claims hold other amounts: no two nodes in one state)
      baseline: wall 21.04 s, CPU 20.94 s, peak RSS 419 MB
      ours:     wall  2.72 s, CPU  2.68 s, peak RSS 121 MB

Where it went (plugin/dra/why_memo.py): nodes of equal devices share one simulator and, in
equal states, one story; selector verdicts are kept by the CEL ``device`` value; equal JSON
objects of an API answer are one dict (the parsed slices: ~250 MB -> ~60 MB); quantities and
qualified names are parsed once; the cycle collector is paused (no cycles, millions of
objects); a node's devices are made one node at a time.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DRIVER = "gpu.cdigen.dev"
CLAIM_REQUEST = {
    "name": "share",
    "exactly": {
        "deviceClassName": DRIVER,
        "allocationMode": "ExactCount",
        "count": 1,
        "capacity": {"requests": {"memory": "{memory}"}},
    },
}


def _claim(name: str, uid: str, memory: str, node: str | None, device: str) -> dict:
    request = json.loads(json.dumps(CLAIM_REQUEST).replace("{memory}", memory))
    doc: dict = {
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"devices": {"requests": [request]}},
    }
    if node:
        doc["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "share", "driver": DRIVER, "pool": node, "device": device,
                         "shareID": uid, "consumedCapacity": {"memory": memory}}
                    ]
                },
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
            }
        }  # fmt: skip
    return doc


def make_cluster(nodes: int, out: Path, varied: bool = False) -> None:
    """Write the cluster's JSON lists into ``out`` (made with this tree's slice builder);
    ``varied``: the claims of each node hold other amounts (1Gi + n Mi, 2Gi + n Mi), so that
    no two nodes are in the same state (the worst case for ``dra why``'s memo)."""
    import yaml

    sys.path.insert(0, str(REPO))
    from cdigen.discover import load_node
    from cdigen.plugin.dra.slices import MemoryShares, build_slices
    from cdigen.policies.device_view import device_views
    from cdigen.policies.dra.order import ordered_views

    node = load_node("builtin:dgx-a100")
    views = ordered_views(device_views(node), node)
    template = build_slices(
        views, driver=DRIVER, node_name="NODE", generation=1, shares=MemoryShares(1 << 20)
    )
    text = json.dumps(template)
    slices, claims = [], []
    for n in range(nodes):
        name = f"node-{n:05}"
        for k, body in enumerate(json.loads(text.replace('"NODE', f'"{name}'))):
            body["metadata"] = {"name": f"{name}-{DRIVER}-{k}"}
            slices.append(body)
        for k in range(2):
            uid = f"{n:08x}-0000-4000-8000-{k:012x}"
            held = f"{(k + 1) * 1024 + n}Mi" if varied else "3Gi"
            claims.append(_claim(f"{name}-held-{k}", uid, held, name, f"gpu-{k}"))
    claims.append(_claim("pending-gpu", "ffffffff-0000-4000-8000-000000000000", "90Gi", None, ""))
    classes = list(yaml.safe_load_all((REPO / "deploy/dra/deviceclasses.yaml").read_text()))
    pod = {
        "metadata": {"name": "pending", "namespace": "default"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "pending-gpu"}]},
        "status": {"phase": "Pending"},
    }
    for what, items in (("slices", slices), ("claims", claims), ("classes", classes)):
        (out / f"{what}.json").write_text(json.dumps({"items": items}))
    (out / "pod.json").write_text(json.dumps(pod))


def _peak_rss_kib() -> int:
    """This process's peak RSS: ``VmHWM`` of /proc/self/status. Not ``ru_maxrss``, which Linux
    carries across exec: a child started by this script reported the parent's size (358 MB
    after the parent made a 5,000-node cluster, where the child itself peaked at 304 MB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_once(tree: Path, data: Path) -> dict:
    """One measured run in this process (``--child``): parse, explain, report."""
    sys.path.insert(0, str(tree))
    from cdigen.plugin.dra.why import Cluster, explain_pod

    try:  # parse as that tree's read_cluster does (from 2026-12-05: the collector paused)
        from cdigen.plugin.dra.why_memo import loads
    except ImportError:
        loads = json.loads

    started, cpu0 = time.perf_counter(), time.process_time()
    lists = {w: loads((data / f"{w}.json").read_bytes())["items"] for w in
             ("slices", "claims", "classes")}  # fmt: skip
    pod = loads((data / "pod.json").read_bytes())
    claims = {}
    for claim in lists["claims"]:
        meta = claim.get("metadata") or {}
        claims[(str(meta.get("namespace", "")), str(meta.get("name", "")))] = claim
    lines = explain_pod(Cluster(pod, claims, lists["slices"], lists["classes"]), driver=DRIVER)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
    peak_mb = _peak_rss_kib() / 1024
    return {"wall_s": wall, "cpu_s": cpu, "peak_mb": peak_mb, "lines": len(lines)}


def measure(tree: Path, data: Path) -> dict:
    result = subprocess.run(
        [sys.executable, __file__, "--child", str(tree), str(data)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(result.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="a checkout of the tree to compare with")
    parser.add_argument(
        "--varied", action="store_true", help="each node's claims hold another amount"
    )
    parser.add_argument("--data", type=Path, help="where the cluster's JSON goes (kept)")
    parser.add_argument("--child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_once(*args.child)))
        return 0
    import tempfile

    data = args.data or Path(tempfile.mkdtemp(prefix="bench-why-"))
    data.mkdir(parents=True, exist_ok=True)
    make_cluster(args.nodes, data, args.varied)
    size_mb = sum(p.stat().st_size for p in data.glob("*.json")) / 1e6
    print(f"{args.nodes} nodes x 8 GPUs, {2 * args.nodes} allocated claims: {size_mb:.0f} MB JSON")
    trees = ([("baseline", args.baseline)] if args.baseline else []) + [("ours", REPO)]
    runs: dict[str, list[dict]] = {name: [] for name, _ in trees}
    for r in range(args.rounds):
        for name, tree in trees:
            result = measure(tree, data)
            runs[name].append(result)
            print(f"round {r + 1} {name:8}: wall {result['wall_s']:.2f} s, "
                  f"CPU {result['cpu_s']:.2f} s, peak RSS {result['peak_mb']:.0f} MB, "
                  f"{result['lines']} lines", flush=True)  # fmt: skip
    for name, _ in trees:
        med = {
            k: statistics.median(r[k] for r in runs[name]) for k in ("wall_s", "cpu_s", "peak_mb")
        }
        print(f"median {name:8}: wall {med['wall_s']:.2f} s, CPU {med['cpu_s']:.2f} s, "
              f"peak RSS {med['peak_mb']:.0f} MB")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
