"""``dra serve`` from exec to registered with the kubelet, with ``--health-address`` (its HTTP
worker: /healthz and /metrics), against a baseline tree in the same sitting, alternating.

    python benchmarks/bench_dra_startup.py [--runs 9] [--gpus 8] [--baseline DIR]

Each run: a fresh kubelet directory; the clock starts and ``python -m cdigen.cli dra serve`` is
exec'd against a fake API server and a fake host of ``--gpus`` GPUs (tests/cdihost.py); a
kubelet simulator polls for the registration socket every millisecond and registers the plugin
(GetInfo, NotifyRegistrationStatus) at once. Measured: exec -> registered (wall), and the CPU
time (user + system, /proc/<pid>/stat) the plugin and its children (the HTTP worker) have used
then. ``--baseline DIR``: a checkout of the tree to compare with (``git worktree add --detach
DIR main``, or ``git archive``), its plugin started from DIR (the interpreter finds DIR's
packages first; DIR/.venv's Python where DIR has one), runs alternating with ours. Bytecode is
cached per tree (``PYTHONPYCACHEPREFIX``, filled by one untimed start), as the image ships it.

Figures (2026-12-05, the 2-core shared dev machine, 9 runs alternating, medians [min-max];
baseline 13ec347 (worker started before registering), ours the h19 branch (once registered,
or 2 s later)):

    python benchmarks/bench_dra_startup.py --runs 9 --baseline /tmp/h19-base
      baseline: exec -> registered 1024 [970-1046] ms, CPU (with children) 1050 [990-1070] ms
      ours:     exec -> registered 1001 [975-1028] ms, CPU (with children)  990 [960-1010] ms

The worker no longer starts while the plugin is getting ready: about 20 ms sooner registered
and 60 ms less CPU spent by then (the worker's start, now after).

Then the API classes made on first use instead of at start (importing ``CoreV1Api`` and
``ResourceV1Api`` imports the models their methods name, Pod and PersistentVolume among them;
the trace of who imported them came from an audit hook in the child), against the tree just
before, same sitting::

    python benchmarks/bench_dra_startup.py --runs 9 --baseline DIR
      baseline: exec -> registered 1024 [996-1172] ms, CPU (with children) 1000 [960-1130] ms
      ours:     exec -> registered  531 [497-553] ms,  CPU (with children)  490 [480-530] ms

What remains before registering is mostly imports: the kubernetes package itself (about
0.16 s, its ``__init__`` imports config, dynamic, watch and stream), networkx for the NVLink
cliques (0.06 s) and grpc (``plugin serve`` registers in ~200 ms: benchmarks/bench_startup.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cdigen.nodefile import dump_node  # noqa: E402
from tests.cdihost import build_host, make_node  # noqa: E402
from tests.dra_kubelet_sim import DraKubeletSim  # noqa: E402
from tests.fake_apiserver import FakeApiServer  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
DRIVER = "gpu.cdigen.dev"
NODE_NAME = "bench-node"


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its living children (user + system)."""
    total = 0.0
    pids = [pid]
    while pids:
        current = pids.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
            tasks = Path(f"/proc/{current}/task")
            for task in tasks.iterdir():
                children = (task / "children").read_text().split()
                pids += [int(c) for c in children]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def tree_python(tree: Path) -> str:
    own = tree / ".venv" / "bin" / "python"
    return str(own) if tree != REPO and own.exists() else sys.executable


def registration_socket(registry: Path, timeout_s: float = 30) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = sorted(registry.glob("*.sock")) if registry.is_dir() else []
        if found:
            return found[0]
        time.sleep(0.001)
    raise TimeoutError(f"no registration socket in {registry}")


def one_start(work: Path, setup: dict[str, Path], tree: Path, pycache: Path) -> tuple[float, float]:
    kubelet_dir = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))  # short socket paths
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(pycache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    command = [
        tree_python(tree), "-m", "cdigen.cli", "dra", "serve",
        "--node", str(setup["node"]), "--node-name", NODE_NAME, "--driver-name", DRIVER,
        "--kubelet-dir", str(kubelet_dir), "--cdi-dir", str(work / "cdi"),
        "--kubeconfig", str(setup["kubeconfig"]), "--driver-root", str(setup["driver"]),
        "--dev-root", str(setup["dev"]), "--sysfs-root", str(setup["sys"]),
        "--health-address", "127.0.0.1:0", "--log-level", "error",
    ]  # fmt: skip
    kubelet = DraKubeletSim(kubelet_dir, timeout_s=30)
    started = time.perf_counter()
    plugin = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.DEVNULL)
    try:
        kubelet.register(registration_socket(kubelet.registry))
        registered = time.perf_counter() - started
        cpu = tree_cpu_s(plugin.pid)
    finally:
        plugin.send_signal(signal.SIGTERM)
        plugin.wait(timeout=10)
        shutil.rmtree(kubelet_dir, ignore_errors=True)
    return registered, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--baseline", type=Path, help="a checkout of the tree to compare with")
    args = parser.parse_args(argv)
    trees = ([("baseline", args.baseline.resolve())] if args.baseline else []) + [("ours", REPO)]
    starts: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in trees}
    api = FakeApiServer().start()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-dra-startup-") as tmp:
            base = Path(tmp)
            fake = build_host(base / "host", make_node(args.gpus))
            node_file = base / "node.yaml"
            node_file.write_text(dump_node(fake.node, "yaml"))
            setup = {
                "node": node_file,
                "kubeconfig": api.kubeconfig(base / "kubeconfig"),
                "driver": fake.driver_root,
                "dev": fake.dev_root,
                "sys": fake.sysfs_root,
            }
            caches = {name: base / f"pyc-{name}" for name, _ in trees}
            for n in range(args.runs + 1):  # the first (untimed) fills each tree's bytecode
                for name, tree in trees:
                    work = base / f"run{n}-{name}"
                    work.mkdir()
                    result = one_start(work, setup, tree, caches[name])
                    if n:
                        starts[name].append(result)
    finally:
        api.stop()
    print(f"{args.gpus} GPUs, {args.runs} runs alternating (ms, median [min-max])")
    for name, _ in trees:
        for label, values in (
            (f"{name}: exec -> registered", [s[0] * 1000 for s in starts[name]]),
            (f"{name}: CPU then (with children)", [s[1] * 1000 for s in starts[name]]),
        ):
            print(
                f"  {label:36} {statistics.median(values):7.0f} "
                f"[{min(values):.0f}-{max(values):.0f}]"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
