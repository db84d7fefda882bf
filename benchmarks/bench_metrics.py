"""What the plugin's metrics cost per call, and how fast /metrics answers.

Per call: ``PluginMetrics.observe_request`` (a counter, a histogram and the timing around it) plus
``observe_link_score``, the work the servicer adds to each GetPreferredAllocation, beside a
baseline measured in the same run (an empty ``with`` block around the same no-op). Scrape: one
HTTP GET of ``/metrics`` over loopback with one resource declared, beside a GET of ``/healthz``
from the same server. Prints medians, p99 and the ratios.

    python benchmarks/bench_metrics.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cdigen.plugin.deviceplugin.metrics import PluginMetrics

GPU = "nvidia.com/gpu"


def timings(action: Callable[[], object], rounds: int, batch: int) -> list[float]:
    """Seconds per call of ``action``, one figure per batch of ``batch`` calls."""
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(batch):
            action()
        out.append((time.perf_counter() - start) / batch)
    return out


def p99(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.99) - 1)]


def show(name: str, values: list[float], base: list[float] | None = None) -> None:
    median = statistics.median(values)
    line = f"{name:<44} median {median * 1e6:9.2f} µs   p99 {p99(values) * 1e6:9.2f} µs"
    if base is not None:
        line += f"   ratio {median / statistics.median(base):6.2f}x"
    print(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args()
    rounds, batch, scrapes = (50, 200, 100) if args.quick else (400, 500, 1000)

    metrics = PluginMetrics()
    metrics.declare_resource(GPU)
    metrics.set_devices(GPU, healthy=8, unhealthy=0)
    metrics.mark_registered(GPU)

    def bare() -> None:
        with contextlib.nullcontext():
            pass

    def observed() -> None:
        with metrics.observe_request("GetPreferredAllocation", GPU):
            pass
        metrics.observe_link_score(GPU, 1200)

    gc.disable()
    base, cost = [], []
    for _ in range(rounds):  # interleaved, so that drift hits both alike
        base += timings(bare, 1, batch)
        cost += timings(observed, 1, batch)
    gc.enable()
    print(f"per call ({rounds} rounds of {batch}):")
    show("baseline: empty with-block", base)
    show("observe_request + observe_link_score", cost, base)
    print(f"  added per call: {(statistics.median(cost) - statistics.median(base)) * 1e6:.2f} µs")

    server, port = metrics.start_http_server("127.0.0.1:0")
    try:
        url = f"http://127.0.0.1:{port}"

        def get(path: str) -> Callable[[], object]:
            def fetch() -> object:
                with urllib.request.urlopen(url + path, timeout=5) as resp:
                    return resp.read()

            return fetch

        health, scrape = [], []
        for _ in range(scrapes):
            health += timings(get("/healthz"), 1, 1)
            scrape += timings(get("/metrics"), 1, 1)
        size = len(get("/metrics")())
    finally:
        server.close()
    print(f"HTTP over loopback ({scrapes} requests each; /metrics is {size} bytes):")
    show("baseline: GET /healthz", health)
    show("GET /metrics", scrape, health)
    return 0


if __name__ == "__main__":
    sys.exit(main())
