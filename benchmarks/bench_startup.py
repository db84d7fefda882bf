"""``plugin serve`` from exec to registered with the kubelet and the first ListAndWatch answered
(issue 36 goal: within 300 ms on 8 GPUs), beside a bare interpreter start in the same sitting.

    python benchmarks/bench_startup.py [--runs 7] [--node builtin:dgx-a100] [--baseline DIR]
        [--metrics] [--node-configs]

Each run: a kubelet simulator on a fresh plugin directory, a CDI spec generated for the node,
then the clock starts and ``python -m cdigen.cli plugin serve`` is exec'd; the simulator notes
when the plugin registers and when its first device list arrives. The child's CPU time (user +
system, /proc/<pid>/stat) is read at that moment. Runs alternate with the floor: ``python -c
pass`` exec'd and waited for. Prints medians and the spread. ``--baseline DIR``: a checkout of
the tree to compare with (``git worktree add --detach DIR main``), its plugin started from DIR
(the interpreter finds DIR's packages first; DIR/.venv's Python where DIR has one, for its entry
points) in runs alternating with ours. ``--metrics``: the plugin serves /metrics too (its HTTP
worker process started), as the DaemonSet runs it.

Bytecode: the image ships every module compiled (deploy/image/Containerfile runs compileall),
so the plugins run here with their bytecode cached (``PYTHONPYCACHEPREFIX``, one folder per
tree, filled by one untimed start of each) even where ``PYTHONDONTWRITEBYTECODE`` is set;
without that every start compiled some 150 modules (~150 ms of CPU) no node pays.

Figures (2026-12-05, the 2-core shared dev machine, 9 runs alternating, medians [min-max];
baseline main at 04fc289, ours the h14 branch):

    python benchmarks/bench_startup.py --runs 9 --baseline /work/h14-base
      baseline: exec -> registered 348 [339-370] ms, first ListAndWatch 349 [343-373] ms,
                CPU 320 [310-340] ms
      ours:     exec -> registered 202 [195-215] ms, first ListAndWatch 207 [197-219] ms,
                CPU 180 [170-190] ms
      floor (python -c pass): 22 ms wall, 20 ms CPU

    With /metrics served (its HTTP worker process), against f8de378 (threads in the plugin);
    ``--runs 9 --baseline /work/base --metrics``, medians: registered 213 ms (baseline 212),
    first ListAndWatch 214 (214). Started before registering, the worker cost 25 ms (240
    against 215); started once registered, nothing.

With per-node configs (``--node-configs``: the config named by the Node's label, read from an
API server on loopback before serving), against the tree before the API calls went through
``raw_call`` (agent/kubeapi.py), same sitting, 5 runs: registered 399 [375-418] ms against
805 [800-813], CPU 380 against 780 ms. Making ``CoreV1Api`` imported the models its methods
name (0.4 s); what is left over the 200 ms is importing the kubernetes package itself and
loading the kubeconfig, which choosing a config by label needs before serving.

What went: on a policy without CEL (the built-ins but single-numa) the plugin imports neither
the CEL engine (celpy, lark, re2, pendulum) nor jsonschema: CEL is imported where an
expression is compiled or evaluated, the built-in policies are checked against the schema by
the tests instead of at each start, and a policy with nothing to try gets no trial run.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fake_apiserver import FakeApiServer  # noqa: E402
from tests.kubelet_sim import KubeletSimulator  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
NODE_NAME = "bench-node"


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def _env(pycache: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def tree_python(tree: Path) -> str:
    """The Python to run ``tree`` with: its own venv's where it has one (``cdigen plugin``'s
    entry point is read from the installed metadata, so another tree needs its own install)."""
    own = tree / ".venv" / "bin" / "python"
    return str(own) if tree != REPO and own.exists() else sys.executable


def node_configs(api: FakeApiServer, work: Path) -> list[str]:
    """``plugin serve`` flags for per-node configs (one named config, chosen by the Node's
    label on ``api``), as the DaemonSet's node-configs component runs it."""
    configs = work / "configs"
    configs.mkdir()
    (configs / "whole.yaml").write_text("resources: [{name: nvidia.com/gpu}]\n")
    with api.lock:
        labels = {"cdigen.dev/device-plugin.config": "whole"}
        api.nodes[NODE_NAME] = {"metadata": {"name": NODE_NAME, "uid": "u1", "labels": labels}}
    kubeconfig = str(api.kubeconfig(work / "kubeconfig"))
    return ["--config-dir", str(configs), "--node-name", NODE_NAME, "--kubeconfig", kubeconfig]


def one_start(
    node: str, work: Path, tree: Path = REPO, pycache: Path | None = None, metrics: bool = False,
    api: FakeApiServer | None = None,
) -> tuple[float, float, float]:  # fmt: skip
    plugin_dir, spec_dir = work / "plugins", work / "cdi"
    env = _env(pycache)
    python = tree_python(tree)
    served = ["--metrics-address", "127.0.0.1:0"] if metrics else []
    if api is not None:
        served += node_configs(api, work)
    subprocess.run(
        [python, "-m", "cdigen.cli", "generate", "--node", node,
         "--output-dir", str(spec_dir)],
        check=True, capture_output=True, cwd=tree, env=env,
    )  # fmt: skip
    kubelet = KubeletSimulator(plugin_dir).start()
    started = time.perf_counter()
    plugin = subprocess.Popen(
        [python, "-m", "cdigen.cli", "plugin", "serve", "--node", node,
         "--plugin-dir", str(plugin_dir), "--spec-dir", str(spec_dir), "--log-level", "error",
         *served],
        cwd=tree, env=env,
    )  # fmt: skip
    try:
        kubelet.wait_registered("nvidia.com/gpu", timeout_s=30)
        registered = time.perf_counter() - started
        kubelet.wait_devices("nvidia.com/gpu", timeout_s=30)
        listed = time.perf_counter() - started
        cpu = cpu_s(plugin.pid)
    finally:
        plugin.send_signal(signal.SIGTERM)
        plugin.wait(timeout=10)
        kubelet.stop()
    return registered, listed, cpu


def floor_start() -> tuple[float, float]:
    started = time.perf_counter()
    before = os.times()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    after = os.times()
    cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    return time.perf_counter() - started, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--node", default="builtin:dgx-a100")
    parser.add_argument("--baseline", type=Path, help="a checkout of the tree to compare with")
    parser.add_argument(
        "--metrics", action="store_true", help="serve /metrics too, as the DaemonSet does"
    )
    parser.add_argument(
        "--node-configs",
        action="store_true",
        help="per-node configs (--config-dir, the config named by the Node's label, read from "
        "an API server on loopback), as the node-configs component runs it",
    )
    args = parser.parse_args(argv)
    api = FakeApiServer().start() if args.node_configs else None
    trees = ([("baseline", args.baseline.resolve())] if args.baseline else []) + [("ours", REPO)]
    starts: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _ in trees}
    floors = []
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        caches = {name: Path(tmp) / f"pyc-{name}" for name, _ in trees}
        for name, tree in trees:  # untimed: fills the tree's bytecode cache
            warm = Path(tmp) / f"warm-{name}"
            warm.mkdir()
            one_start(args.node, warm, tree, caches[name], args.metrics, api)
        for n in range(args.runs):
            floors.append(floor_start())
            for name, tree in trees:
                work = Path(tmp) / f"run{n}-{name}"
                work.mkdir()
                starts[name].append(
                    one_start(args.node, work, tree, caches[name], args.metrics, api)
                )
    if api is not None:
        api.stop()
    print(f"{args.node}, {args.runs} runs alternating with the floor (ms, median [min-max])")
    rows = []
    for name, _ in trees:
        mine = starts[name]
        rows += [
            (f"{name}: exec -> registered", [s[0] * 1000 for s in mine]),
            (f"{name}: exec -> first ListAndWatch", [s[1] * 1000 for s in mine]),
            (f"{name}: plugin CPU at first list", [s[2] * 1000 for s in mine]),
        ]
    rows += [
        ("floor: python -c pass, wall", [f[0] * 1000 for f in floors]),
        ("floor: python -c pass, CPU", [f[1] * 1000 for f in floors]),
    ]
    for label, values in rows:
        print(
            f"  {label:36} {statistics.median(values):7.0f} [{min(values):.0f}-{max(values):.0f}]"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
