"""Device plugin round trips over unix sockets, against a do-nothing servicer in the same run.

    python benchmarks/bench_plugin.py [--calls N] [--node builtin:dgx-a100]

Starts two server processes on sockets of the same kind: the floor (a DevicePlugin servicer that
answers empty messages) and ``cdigen plugin serve`` on the node, with a CDI spec generated for it
and a kubelet simulator it registers with. One gRPC client then alternates batches of calls
between them: Allocate of all 8 GPUs, and GetPreferredAllocation over 8 GPUs with sizes 1..8
and varied must-include sets. Prints p50/p99 per call and the plugin/floor ratio at p99, and the
resident memory (VmRSS) of the serving plugin.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from plugin.api import deviceplugin_pb2 as pb  # noqa: E402
from plugin.api import deviceplugin_pb2_grpc as pb_grpc  # noqa: E402


class Floor(pb_grpc.DevicePluginServicer):  # type: ignore[misc]
    """Answers every call with an empty message: the cost of gRPC + Python alone."""

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    def Allocate(self, request: Any, context: Any) -> Any:
        return pb.AllocateResponse()

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        return pb.PreferredAllocationResponse()


def run_floor(socket: str) -> None:
    """Serve the floor servicer until SIGTERM."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_DevicePluginServicer_to_server(Floor(), server)
    server.add_insecure_port("unix:" + socket)
    server.start()
    signal.sigwait([signal.SIGTERM])
    server.stop(0)


def wait_for_socket(path: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {path} did not appear")
        time.sleep(0.05)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="measured calls per method/target")
    parser.add_argument("--node", default="builtin:dgx-a100")
    parser.add_argument(
        "--with-metrics", action="store_true", help="serve the plugin with --metrics-address"
    )
    parser.add_argument("--floor-server", metavar="SOCKET", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_server:
        run_floor(args.floor_server)
        return 0

    from cdigen.discover import load_node
    from tests.kubelet_sim import KubeletSimulator

    uuids = [g.uuid for g in load_node(args.node).gpus]
    tmp = Path(tempfile.mkdtemp(prefix="bench-plugin-"))
    plugin_dir, spec_dir = tmp / "plugins", tmp / "cdi"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "cdigen.cli",
            "generate",
            "--node",
            args.node,
            "--output-dir",
            str(spec_dir),
        ],
        check=True,
        capture_output=True,
    )
    kubelet = KubeletSimulator(plugin_dir).start()
    floor_sock = tmp / "floor.sock"
    floor = subprocess.Popen([sys.executable, __file__, "--floor-server", str(floor_sock)])
    plugin = subprocess.Popen(
        [sys.executable, "-m", "cdigen.cli", "plugin", "serve", "--node", args.node,
         "--plugin-dir", str(plugin_dir), "--spec-dir", str(spec_dir), "--log-level", "warning",
         *(["--metrics-address", "127.0.0.1:0"] if args.with_metrics else [])],
    )  # fmt: skip
    try:
        kubelet.wait_registered("nvidia.com/gpu", timeout_s=30)
        wait_for_socket(floor_sock)
        targets = {
            "floor": pb_grpc.DevicePluginStub(grpc.insecure_channel(f"unix:{floor_sock}")),
            "plugin": kubelet.stub("nvidia.com/gpu"),
        }
        allocate = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=uuids)]
        )
        preferred = [
            pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=uuids,
                        must_include_deviceIDs=uuids[m : m + 1] if m < 8 else [],
                        allocation_size=size,
                    )
                ]
            )
            for size, m in itertools.product(range(1, 9), range(9))
        ]
        methods: dict[str, Callable[[Any, int], Any]] = {
            "Allocate": lambda stub, i: stub.Allocate(allocate),
            "GetPreferredAllocation": lambda stub, i: stub.GetPreferredAllocation(
                preferred[i % len(preferred)]
            ),
        }
        samples: dict[tuple[str, str], list[float]] = {}
        for method, call in methods.items():
            for stub in targets.values():  # warm both: connections, caches, the allocator's memo
                for i in range(300):
                    call(stub, i)
            batch = 20  # small alternating batches: both targets see the same noise
            for start in range(0, args.calls, batch):
                for name, stub in targets.items():
                    out = samples.setdefault((method, name), [])
                    for i in range(start, start + batch):
                        t0 = time.perf_counter()
                        call(stub, i)
                        out.append((time.perf_counter() - t0) * 1000)
        rss = rss_mb(plugin.pid)
    finally:
        for proc in (plugin, floor):
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
        kubelet.stop()

    metrics = "on" if args.with_metrics else "off"
    print(f"unix-socket round trips: {args.calls} calls each, {args.node}, metrics {metrics}")
    print(f"{'method':<24}{'target':<8}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}")
    for (method, name), values in samples.items():
        print(
            f"{method:<24}{name:<8}{percentile(values, 0.5):>9.3f}{percentile(values, 0.99):>9.3f}"
            f"{statistics.fmean(values):>9.3f}"
        )
    for method in methods:
        p99 = percentile(samples[(method, "plugin")], 0.99)
        floor_p99 = percentile(samples[(method, "floor")], 0.99)
        p50 = percentile(samples[(method, "plugin")], 0.5)
        floor_p50 = percentile(samples[(method, "floor")], 0.5)
        verdict = "ok" if p99 <= 1.5 * floor_p99 else "OVER 1.5x"
        ratios = f"p99 {p99 / floor_p99:.2f}x, p50 {p50 / floor_p50:.2f}x"
        print(f"{method}: plugin/floor {ratios} ({verdict})")
    print(f"serving plugin RSS: {rss:.1f} MB ({'ok' if rss < 80 else 'OVER 80 MB'})")
    print(f"cpu count: {os.cpu_count()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
