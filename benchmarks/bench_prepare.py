"""DRA prepare in-process: the CPU time of Preparer.prepare for one claim, a whole GPU and a
dynamic-MIG placement, this tree against another (before/after), alternated in one sitting.

    python benchmarks/bench_prepare.py --base /tmp/base-tree [--calls 200] [--rounds 4]

Each round runs one worker process per tree, in alternating order; a worker builds the DRA
plugin in-process on a fake host (8 GPUs and ~60 driver libraries for the whole GPU; 2 GPUs, one
in MIG mode with the MIG double, for the placement), warms up, then prepares and unprepares
``--calls`` fresh claims (a new UID each: a spec written, the checkpoint saved), timing each
prepare with the calling thread's CPU clock (time.thread_time) and the wall clock. Specs and the
checkpoint go to /dev/shm where it exists (the disk's flushes are wall time, not CPU). Prints
p50 and p99 of both per tree and kind, and ours/base at p50 (goal: a whole GPU at p50 within
1.0 ms CPU, the placement no slower than before). ``--base`` is a checkout of the tree to
compare with (``git archive <commit> | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def worker(tree: str, kind: str, calls: int) -> dict[str, list[float]]:
    sys.path.insert(0, tree)
    from cdigen.plugin.dra.claims import ClaimRef
    from cdigen.plugin.dra.dynamic_mig import MigMaker
    from cdigen.plugin.dra.kubelet_plugin import DraPlugin
    from cdigen.plugin.dra.options import DraOptions
    from tests.cdihost import build_host, make_node
    from tests.fake_apiserver import allocated_claim
    from tests.fakes.fake_mig import MigNvml

    assert Path(sys.modules["plugin"].__file__ or "").resolve().is_relative_to(Path(tree))
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    work = Path(tempfile.mkdtemp(prefix="bprep-", dir=shm))
    if kind == "mig":
        node = make_node(2, mig_gpu=1)
        node = dataclasses.replace(
            node, gpus=(node.gpus[0], dataclasses.replace(node.gpus[1], mig_devices=()))
        )
        device = "gpu-1-3g-40gb-at-4"
    else:
        node, device = make_node(8), "gpu-3"
    host = build_host(work / "host", node, extra_libraries=45)
    nvml = MigNvml(host.node)
    nvml.nvmlInit()
    nvml.write_mig_minors(work / "proc")
    options = DraOptions(
        node_name="node-a",
        driver="gpu.cdigen.dev",
        kubelet_dir=work / "kl",
        cdi_dir=work / "cdi",
        driver_root=str(host.driver_root),
        dev_root=str(host.dev_root),
        sysfs_root=str(host.sysfs_root),
        mig_strategy="dynamic" if kind == "mig" else "mixed",
        proc_root=str(work / "proc"),
    )
    claims: dict[tuple[str, str], Any] = {}

    class Reader:
        def read_claim(self, namespace: str, name: str) -> Any:
            return claims[(namespace, name)]

    class Slices:
        def list_slices(self, driver: str, node_name: str) -> list[Any]:
            return []

        def create_slice(self, body: Any) -> None:
            return None

        def replace_slice(self, name: str, body: Any) -> None:
            return None

        def delete_slice(self, name: str) -> None:
            return None

    mig = MigMaker(nvml, str(work / "proc")) if kind == "mig" else None
    plugin = DraPlugin(options, host.node, slices=Slices(), claims=Reader(), mig=mig)
    preparer = plugin.preparer
    result = {"driver": "gpu.cdigen.dev", "pool": "node-a", "device": device, "request": "gpu"}
    cpu: list[float] = []
    wall: list[float] = []
    for i in range(calls + 20):  # the first 20 warm up
        uid = f"00000000-0000-4000-8000-{i:012d}"
        claims[("default", f"c{i}")] = allocated_claim(f"c{i}", uid, [result])
        ref = ClaimRef("default", uid, f"c{i}")
        c0, w0 = time.thread_time(), time.perf_counter()
        answer = preparer.prepare(ref)
        c1, w1 = time.thread_time(), time.perf_counter()
        assert not answer.error, answer.error
        assert preparer.unprepare(ref) == ""
        if i >= 20:
            cpu.append((c1 - c0) * 1000)
            wall.append((w1 - w0) * 1000)
    return {"cpu": cpu, "wall": wall}


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="a checkout of the tree to compare with")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--worker", nargs=2, metavar=("TREE", "KIND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], args.calls)))
        return
    trees = {"base": str(Path(args.base).resolve()), "ours": str(REPO)}
    got: dict[tuple[str, str], dict[str, list[float]]] = {}
    for n in range(args.rounds):
        order = ["base", "ours"] if n % 2 == 0 else ["ours", "base"]
        for kind in ("gpu", "mig"):
            for name in order:
                out = subprocess.run(
                    [sys.executable, __file__, "--base", args.base, "--calls", str(args.calls),
                     "--worker", trees[name], kind],
                    cwd=trees[name], check=True, capture_output=True, text=True,
                ).stdout  # fmt: skip
                samples = json.loads(out.strip().splitlines()[-1])
                slot = got.setdefault((kind, name), {"cpu": [], "wall": []})
                slot["cpu"] += samples["cpu"]
                slot["wall"] += samples["wall"]
    print(f"prepare in-process, {args.rounds} alternated rounds x {args.calls} calls per tree")
    print(f"{'kind':5} {'tree':5} {'cpu p50':>8} {'cpu p99':>8} {'wall p50':>9} {'wall p99':>9}")
    for kind in ("gpu", "mig"):
        for name in ("base", "ours"):
            s = got[(kind, name)]
            print(
                f"{kind:5} {name:5} {pct(s['cpu'], 0.5):8.3f} {pct(s['cpu'], 0.99):8.3f} "
                f"{pct(s['wall'], 0.5):9.3f} {pct(s['wall'], 0.99):9.3f}"
            )
        ratio = pct(got[(kind, "ours")]["cpu"], 0.5) / pct(got[(kind, "base")]["cpu"], 0.5)
        print(f"{kind:5} ours/base CPU p50: {ratio:.2f}")


if __name__ == "__main__":
    main()
