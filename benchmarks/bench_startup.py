"""``plugin serve`` from exec to registered with the kubelet and the first ListAndWatch answered
(issue 36 goal: within 300 ms on 8 GPUs), beside a bare interpreter start in the same sitting.

    python benchmarks/bench_startup.py [--runs 7] [--node builtin:dgx-a100]

Each run: a kubelet simulator on a fresh plugin directory, a CDI spec generated for the node,
then the clock starts and ``python -m cdigen.cli plugin serve`` is exec'd; the simulator notes
when the plugin registers and when its first device list arrives. The child's CPU time (user +
system, /proc/<pid>/stat) is read at that moment. Runs alternate with the floor: ``python -c
pass`` exec'd and waited for. Prints medians and the spread.
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

from tests.kubelet_sim import KubeletSimulator  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def one_start(node: str, work: Path) -> tuple[float, float, float]:
    plugin_dir, spec_dir = work / "plugins", work / "cdi"
    subprocess.run(
        [sys.executable, "-m", "cdigen.cli", "generate", "--node", node,
         "--output-dir", str(spec_dir)],
        check=True, capture_output=True,
    )  # fmt: skip
    kubelet = KubeletSimulator(plugin_dir).start()
    started = time.perf_counter()
    plugin = subprocess.Popen(
        [sys.executable, "-m", "cdigen.cli", "plugin", "serve", "--node", node,
         "--plugin-dir", str(plugin_dir), "--spec-dir", str(spec_dir), "--log-level", "error"],
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
    args = parser.parse_args(argv)
    starts, floors = [], []
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        for n in range(args.runs):
            floors.append(floor_start())
            work = Path(tmp) / f"run{n}"
            work.mkdir()
            starts.append(one_start(args.node, work))
    reg = [s[0] * 1000 for s in starts]
    lst = [s[1] * 1000 for s in starts]
    cpu = [s[2] * 1000 for s in starts]
    fwall = [f[0] * 1000 for f in floors]
    fcpu = [f[1] * 1000 for f in floors]
    print(f"{args.node}, {args.runs} runs alternating with the floor (ms, median [min-max])")
    for label, values in (
        ("exec -> registered", reg),
        ("exec -> first ListAndWatch", lst),
        ("plugin CPU at first list", cpu),
        ("floor: python -c pass, wall", fwall),
        ("floor: python -c pass, CPU", fcpu),
    ):
        print(
            f"  {label:30} {statistics.median(values):7.0f} [{min(values):.0f}-{max(values):.0f}]"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
