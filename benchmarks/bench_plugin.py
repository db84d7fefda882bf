"""Device plugin round trips over unix sockets, against a do-nothing servicer in the same run.

    python benchmarks/bench_plugin.py [--calls N] [--node builtin:dgx-a100]

Starts two server processes on sockets of the same kind: the floor (a DevicePlugin servicer that
answers empty messages) and ``cdigen plugin serve`` on the node, with a CDI spec generated for it
and a kubelet simulator it registers with. One gRPC client then alternates batches of calls
between them: Allocate of all 8 GPUs, and GetPreferredAllocation over 8 GPUs with sizes 1..8
and varied must-include sets. Prints p50/p99 per call and the plugin/floor ratio at p99, and the
resident memory (VmRSS) of the serving plugin.

Then sharing (``--part sharing`` for that alone): ``builtin:pcie-8x4090`` as 8 GPUs x 16
replicas (``nvidia.com/gpu.shared``) and ``builtin:rtx4090`` in 1 GiB slices
(``nvidia.com/gpu-memory``, 23 slices), each served by its own plugin process;
GetPreferredAllocation over random free sets (seeded) of sizes 1..4 (replicas) and 1..6
(slices), against the floor with the same messages. The target is p99 under 5 ms.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
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

from benchmarks.common import percentile, rss_mb, wait_for_socket  # noqa: E402
from cdigen.plugin.deviceplugin.api import deviceplugin_pb2 as pb  # noqa: E402
from cdigen.plugin.deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc  # noqa: E402


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


Method = Callable[[Any, int], Any]


def measure(
    targets: dict[str, Any], methods: dict[str, Method], calls: int
) -> dict[tuple[str, str], list[float]]:
    """Milliseconds per call, per (method, target): warmed, then in small alternating batches."""
    samples: dict[tuple[str, str], list[float]] = {}
    for method, call in methods.items():
        for stub in targets.values():  # warm both: connections, caches, the allocator's memo
            for i in range(300):
                call(stub, i)
        batch = 20  # small alternating batches: both targets see the same noise
        for start in range(0, calls, batch):
            for name, stub in targets.items():
                out = samples.setdefault((method, name), [])
                for i in range(start, start + batch):
                    t0 = time.perf_counter()
                    call(stub, i)
                    out.append((time.perf_counter() - t0) * 1000)
    return samples


def print_table(samples: dict[tuple[str, str], list[float]]) -> None:
    """p50, p99 and mean per (method, target)."""
    print(f"{'method':<34}{'target':<8}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}")
    for (method, name), values in samples.items():
        print(
            f"{method:<34}{name:<8}{percentile(values, 0.5):>9.3f}{percentile(values, 0.99):>9.3f}"
            f"{statistics.fmean(values):>9.3f}"
        )


def preferred_requests(
    ids: list[str], sizes: range, count: int, seed: int
) -> list[pb.PreferredAllocationRequest]:
    """``count`` requests over random free subsets of ``ids`` (at least the size free)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        size = rng.choice(sizes)
        free = rng.sample(ids, rng.randint(max(size, len(ids) // 4), len(ids)))
        out.append(
            pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=free, allocation_size=size
                    )
                ]
            )
        )
    return out


SHARING_CASES = (
    # label, node, resource, sharing block, sizes
    ("8 GPUs x 16 replicas", "builtin:pcie-8x4090", "nvidia.com/gpu.shared", "{replicas: 16}",
     range(1, 5)),
    ("24 GB in 1 GiB slices", "builtin:rtx4090", "nvidia.com/gpu-memory",
     "{memorySliceMiB: 1024}", range(1, 7)),
)  # fmt: skip


def bench_sharing(calls: int, tmp: Path, floor_stub: Any) -> None:
    """GetPreferredAllocation p99 for replicas and slices, each on its own serving plugin."""
    from tests.kubelet_sim import KubeletSimulator

    print(f"sharing: GetPreferredAllocation, {calls} calls each, random free sets")
    verdicts = []
    for n, (label, node, resource, sharing, sizes) in enumerate(SHARING_CASES):
        case = tmp / f"sharing-{n}"
        plugin_dir, spec_dir = case / "plugins", case / "cdi"
        case.mkdir()
        subprocess.run(
            [sys.executable, "-m", "cdigen.cli", "generate", "--node", node,
             "--output-dir", str(spec_dir)],
            check=True, capture_output=True,
        )  # fmt: skip
        config = case / "sharing.yaml"
        config.write_text(f"resources:\n  - name: {resource}\n    sharing: {sharing}\n")
        kubelet = KubeletSimulator(plugin_dir).start()
        plugin = subprocess.Popen(
            [sys.executable, "-m", "cdigen.cli", "plugin", "serve", "--node", node,
             "--config", str(config), "--plugin-dir", str(plugin_dir),
             "--spec-dir", str(spec_dir), "--log-level", "error"],
        )  # fmt: skip
        try:
            kubelet.wait_registered(resource, timeout_s=30)
            ids = [d.ID for d in kubelet.wait_devices(resource, timeout_s=30)]
            # one request per call (no repeats): the allocator's memo does not help
            requests = preferred_requests(ids, sizes, calls + 300, seed=n)
            method = f"Preferred {label}"

            def call(stub: Any, i: int, requests: list[Any] = requests) -> Any:
                return stub.GetPreferredAllocation(requests[i])

            samples = measure(
                {"floor": floor_stub, "plugin": kubelet.stub(resource)},
                {method: call},
                calls,
            )
        finally:
            plugin.send_signal(signal.SIGTERM)
            plugin.wait(timeout=10)
            kubelet.stop()
        print_table(samples)
        p99 = percentile(samples[(method, "plugin")], 0.99)
        floor_p99 = percentile(samples[(method, "floor")], 0.99)
        verdict = "ok" if p99 < 5.0 else "OVER 5 ms"
        verdicts.append(
            f"{label} ({len(ids)} devices): p99 {p99:.3f} ms, {p99 / floor_p99:.2f}x floor "
            f"({verdict})"
        )
    for line in verdicts:
        print(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="measured calls per method/target")
    parser.add_argument("--node", default="builtin:dgx-a100")
    parser.add_argument(
        "--with-metrics", action="store_true", help="serve the plugin with --metrics-address"
    )
    parser.add_argument(
        "--part", choices=("all", "whole", "sharing"), default="all", help="what to measure"
    )
    parser.add_argument("--floor-server", metavar="SOCKET", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_server:
        run_floor(args.floor_server)
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="bench-plugin-"))
    floor_sock = tmp / "floor.sock"
    floor = subprocess.Popen([sys.executable, __file__, "--floor-server", str(floor_sock)])
    try:
        wait_for_socket(floor_sock)
        floor_stub = pb_grpc.DevicePluginStub(grpc.insecure_channel(f"unix:{floor_sock}"))
        if args.part in ("all", "whole"):
            bench_whole(args, tmp, floor_stub)
        if args.part in ("all", "sharing"):
            bench_sharing(args.calls, tmp, floor_stub)
    finally:
        floor.send_signal(signal.SIGTERM)
        floor.wait(timeout=10)
    print(f"cpu count: {os.cpu_count()}")
    return 0


def bench_whole(args: argparse.Namespace, tmp: Path, floor_stub: Any) -> None:
    """Allocate and GetPreferredAllocation of whole GPUs, plugin against the floor."""
    from cdigen.discover import load_node
    from tests.kubelet_sim import KubeletSimulator

    uuids = [g.uuid for g in load_node(args.node).gpus]
    plugin_dir, spec_dir = tmp / "plugins", tmp / "cdi"
    subprocess.run(
        [sys.executable, "-m", "cdigen.cli", "generate", "--node", args.node,
         "--output-dir", str(spec_dir)],
        check=True, capture_output=True,
    )  # fmt: skip
    kubelet = KubeletSimulator(plugin_dir).start()
    plugin = subprocess.Popen(
        [sys.executable, "-m", "cdigen.cli", "plugin", "serve", "--node", args.node,
         "--plugin-dir", str(plugin_dir), "--spec-dir", str(spec_dir), "--log-level", "warning",
         *(["--metrics-address", "127.0.0.1:0"] if args.with_metrics else [])],
    )  # fmt: skip
    try:
        kubelet.wait_registered("nvidia.com/gpu", timeout_s=30)
        targets = {"floor": floor_stub, "plugin": kubelet.stub("nvidia.com/gpu")}
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
        methods: dict[str, Method] = {
            "Allocate": lambda stub, i: stub.Allocate(allocate),
            "GetPreferredAllocation": lambda stub, i: stub.GetPreferredAllocation(
                preferred[i % len(preferred)]
            ),
        }
        samples = measure(targets, methods, args.calls)
        rss = rss_mb(plugin.pid)
    finally:
        plugin.send_signal(signal.SIGTERM)
        plugin.wait(timeout=10)
        kubelet.stop()

    metrics = "on" if args.with_metrics else "off"
    print(f"unix-socket round trips: {args.calls} calls each, {args.node}, metrics {metrics}")
    print_table(samples)
    for method in methods:
        p99 = percentile(samples[(method, "plugin")], 0.99)
        floor_p99 = percentile(samples[(method, "floor")], 0.99)
        p50 = percentile(samples[(method, "plugin")], 0.5)
        floor_p50 = percentile(samples[(method, "floor")], 0.5)
        verdict = "ok" if p99 <= 1.5 * floor_p99 else "OVER 1.5x"
        ratios = f"p99 {p99 / floor_p99:.2f}x, p50 {p50 / floor_p50:.2f}x"
        print(f"{method}: plugin/floor {ratios} ({verdict})")
    print(f"serving plugin RSS: {rss:.1f} MB ({'ok' if rss < 80 else 'OVER 80 MB'})")


if __name__ == "__main__":
    sys.exit(main())
