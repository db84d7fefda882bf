"""The device plugin under concurrent load: calls/s and latency at 1, 8 and 64 clients.

    python benchmarks/bench_load.py [--calls 1000] [--clients 1,8,64] [--node builtin:dgx2-v100]

Starts ``cdigen plugin serve`` on the node (16 GPUs by default; a CDI spec generated for it, a
kubelet simulator it registers with, the default log level, its log written to a file) and, as the
baseline in the same run, a DevicePlugin servicer in its own process that answers empty messages
(the floor: what gRPC and Python cost alone). For each client count, ``--calls`` Allocate calls
and ``--calls`` GetPreferredAllocation calls are spread over that many clients, each a thread with
its own channel (its own connection) on a loopback unix socket: one client sends them in turn;
of 8 or 64, half send Allocate and half GetPreferredAllocation, all at once. The floor gets the
same messages from the same clients. Allocate asks for random GPU sets of 1..16;
GetPreferredAllocation for sizes 1..16 out of random free sets of at least half the GPUs, half of
them with a must-include GPU (seeded; new requests for each client count).

Prints per (clients, method, target): calls/s, p50 and p99 latency and errors; the plugin/floor
ratios; the plugin's p99 at each client count against its own one-client p99; and the serving
plugin's resident memory (VmRSS, and its peak VmHWM) after the load. Every loop is bounded (a
fixed number of calls, a 30 s deadline per call).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from benchmarks.common import (  # noqa: E402
    CHANNEL_OPTIONS,
    DEADLINE_S,
    RESOURCE,
    percentile,
    requests_for,
    rss_mb,
    vm_field,
    wait_for_socket,
)
from cdigen.plugin.deviceplugin.api import deviceplugin_pb2 as pb  # noqa: E402
from cdigen.plugin.deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc  # noqa: E402

# a connection per client, as separate kubelets or tools would have (gRPC shares one otherwise)


@dataclass(frozen=True)
class Run:
    """One method's calls in a batch: latencies (ms), errors, seconds until its last answer."""

    latencies: list[float]
    errors: int
    wall_s: float

    @property
    def rate(self) -> float:
        """Completed calls per second."""
        return len(self.latencies) / self.wall_s


def call(stub: Any, method: str, message: Any) -> Any:
    """One unary call of ``method`` with ``message``, under the deadline."""
    return getattr(stub, method)(message, timeout=DEADLINE_S)


def drive(socket: Path, clients: int, messages: Sequence[tuple[str, Any]]) -> dict[str, Run]:
    """Send ``messages`` over ``clients`` concurrent clients (each a thread and a connection);
    one :class:`Run` per method, timed from the start until that method's last answer. With
    ``messages`` taking turns and an even number of clients, half the clients send only Allocate
    and half only GetPreferredAllocation; one client sends both in turn."""
    channels = [
        grpc.insecure_channel(f"unix:{socket}", options=CHANNEL_OPTIONS) for _ in range(clients)
    ]
    stubs = [pb_grpc.DevicePluginStub(c) for c in channels]
    for channel, stub in zip(channels, stubs, strict=True):  # connect and warm each client
        grpc.channel_ready_future(channel).result(timeout=DEADLINE_S)
        stub.GetDevicePluginOptions(pb.Empty(), timeout=DEADLINE_S)
    latencies: list[dict[str, list[float]]] = [{} for _ in range(clients)]
    errors: list[dict[str, int]] = [{} for _ in range(clients)]
    done: list[dict[str, float]] = [{} for _ in range(clients)]  # when each method's last ended
    start = threading.Barrier(clients + 1)

    def client(k: int) -> None:
        stub, out, failed, ended = stubs[k], latencies[k], errors[k], done[k]
        start.wait()
        for method, message in messages[k::clients]:
            t0 = time.perf_counter()
            try:
                call(stub, method, message)
            except grpc.RpcError:
                failed[method] = failed.get(method, 0) + 1
                continue
            ended[method] = time.perf_counter()
            out.setdefault(method, []).append((ended[method] - t0) * 1000)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    t0 = time.perf_counter()
    for thread in threads:
        thread.join()
    for channel in channels:
        channel.close()
    methods = dict.fromkeys(m for m, _ in messages)
    return {
        m: Run(
            [x for part in latencies for x in part.get(m, [])],
            sum(e.get(m, 0) for e in errors),
            max(d.get(m, t0) for d in done) - t0,
        )
        for m in methods
    }


def main() -> int:
    """Run the load benchmark; prints the table, ratios and RSS."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per method and client count")
    parser.add_argument("--clients", default="1,8,64", help="comma-separated client counts")
    parser.add_argument("--node", default="builtin:dgx2-v100")
    parser.add_argument("--log-level", default="info", help="the plugin's --log-level")
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",")]

    from cdigen.discover import load_node
    from tests.kubelet_sim import KubeletSimulator

    uuids = [g.uuid for g in sorted(load_node(args.node).gpus, key=lambda g: g.index)]
    tmp = Path(tempfile.mkdtemp(prefix="bench-load-"))
    plugin_dir, spec_dir, floor_sock = tmp / "plugins", tmp / "cdi", tmp / "floor.sock"
    subprocess.run(
        [sys.executable, "-m", "cdigen.cli", "generate", "--node", args.node,
         "--output-dir", str(spec_dir)],
        check=True, capture_output=True,
    )  # fmt: skip
    floor = subprocess.Popen(
        [sys.executable, str(REPO / "benchmarks/bench_plugin.py"), "--floor-server",
         str(floor_sock)]
    )  # fmt: skip
    kubelet = KubeletSimulator(plugin_dir).start()
    log_path = tmp / "plugin.log"
    with log_path.open("wb") as log_file:
        plugin = subprocess.Popen(
            [sys.executable, "-m", "cdigen.cli", "plugin", "serve", "--node", args.node,
             "--plugin-dir", str(plugin_dir), "--spec-dir", str(spec_dir),
             "--log-level", args.log_level],
            stderr=log_file,
        )  # fmt: skip
    results: dict[tuple[int, str, str], Run] = {}
    try:
        wait_for_socket(floor_sock)
        kubelet.wait_registered(RESOURCE, timeout_s=30)
        kubelet.wait_devices(RESOURCE, lambda d: len(d) == len(uuids), timeout_s=30)
        sockets = {"floor": floor_sock, "plugin": plugin_dir / kubelet.registrations[0].endpoint}
        rss_start = rss_mb(plugin.pid)
        for clients in counts:
            # new requests for each client count: the allocator's memo holds the earlier ones
            messages = requests_for(uuids, args.calls, seed=clients)
            for target, socket in sockets.items():
                for method, run in drive(socket, clients, messages).items():
                    results[(clients, method, target)] = run
        rss, hwm = vm_field(plugin.pid, "VmRSS"), vm_field(plugin.pid, "VmHWM")
    finally:
        plugin.send_signal(signal.SIGTERM)
        plugin.wait(timeout=10)
        kubelet.stop()
        floor.send_signal(signal.SIGTERM)
        floor.wait(timeout=10)
    report(args, len(uuids), counts, results)
    print(
        f"serving plugin RSS: {rss_start:.1f} MB before the load, {rss:.1f} MB after "
        f"(peak {hwm:.1f} MB; {'ok' if rss < 120 else 'OVER 120 MB'})"
    )
    print(f"plugin log: {log_path} ({log_path.stat().st_size} bytes)")
    return 0


def report(
    args: argparse.Namespace, gpus: int, counts: list[int], results: dict[tuple[int, str, str], Run]
) -> None:
    """The table and the ratios."""
    print(
        f"{args.node}: {gpus} GPUs; per client count {args.calls} Allocate and {args.calls} "
        f"GetPreferredAllocation calls taking turns; plugin --log-level {args.log_level}; "
        f"cpu count {os.cpu_count()}"
    )
    print(f"{'clients':>7}  {'method':<24}{'target':<8}{'calls/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'max ms':>9}{'errors':>7}")  # fmt: skip
    for (clients, method, target), run in results.items():
        print(
            f"{clients:>7}  {method:<24}{target:<8}{run.rate:>9.0f}"
            f"{percentile(run.latencies, 0.5):>9.2f}{percentile(run.latencies, 0.99):>9.2f}"
            f"{max(run.latencies):>9.2f}{run.errors:>7}"
        )
    print("ratios (plugin/floor at p99 and calls/s; plugin p99 against its own 1-client p99):")
    methods = dict.fromkeys(m for _, m, _ in results)
    for method in methods:
        one = percentile(results[(counts[0], method, "plugin")].latencies, 0.99)
        for clients in counts:
            mine, base = results[(clients, method, "plugin")], results[(clients, method, "floor")]
            p99 = percentile(mine.latencies, 0.99)
            print(
                f"  {method} x{clients}: p99 {p99 / percentile(base.latencies, 0.99):.2f}x floor, "
                f"calls/s {mine.rate / base.rate:.2f}x floor, p99 {p99 / one:.1f}x its "
                f"{counts[0]}-client p99"
            )
    print(f"errors: {sum(r.errors for r in results.values())}")


if __name__ == "__main__":
    sys.exit(main())
