"""Allocate latency with and without 64 concurrent /metrics scrapers (issue 36, point 6).

    python benchmarks/bench_scrape_load.py [--rounds 8] [--calls 300] [--scrapers 64]
        [--interval 10] [--node builtin:dgx2-v100] [--baseline DIR] [--scraper-nice N]
        [--keep-alive] [--pin]

Starts ``cdigen plugin serve`` on the node (16 GPUs by default, a CDI spec generated for it, a
kubelet simulator it registers with, /metrics on a loopback port) and then, in one sitting,
alternates two modes round by round (ABBA order, so neither always goes first): ``quiet``, where
one client (as the kubelet is one) sends ``--calls`` Allocate calls, one per ``--interval`` ms
on a fixed schedule, and ``scraped``, where the same client sends the same number while
``--scrapers`` threads in another process GET /metrics in a loop, each on a new connection per
scrape (``--keep-alive``: on one kept, as Prometheus 2 keeps it). Allocate asks for random GPU
sets of 1..16 (seeded, new for each round). ``--baseline DIR``: the same for the tree in DIR
(run by DIR/.venv's Python where it has one), the trees alternating round by round. Prints, per
tree and mode over all rounds: Allocate p50 and p99, the plugin's CPU time per Allocate call
(user+system from /proc, all its threads) and its HTTP worker's (the child process serving
/metrics, where there is one), the scrapes answered and the scrapers' own CPU, the scraped/quiet
ratios, and, as the noise floor, quiet against quiet (the odd rounds' p99 over the even
rounds'). ``--scraper-nice N``: the scrapers' process at niceness N; -1: under SCHED_IDLE, as
stand-ins for scrapers on other machines. ``--pin``: the plugin and the client on CPU 0, the
plugin's HTTP worker and the scrapers on CPU 1, as on a node with cores to spare and scrapers
elsewhere. Every call has a 30 s deadline.

Why paced calls: back to back, 300 calls took 0.15 s, shorter than one /metrics answer cycle
(about 0.85 s), so whether a burst of answers fell inside a round was a matter of phase, and the
same tree measured 1.0x in one sitting and 2.2x in another. One call per 10 ms samples every
phase; a paced call is slower than a back-to-back one (a colder CPU: p99 about 1.5 ms quiet
against 0.7), in both modes alike.

Figures (2026-12-05, the shared 2-vCPU build machine, dgx2-v100, 8 rounds of 300 calls per
mode and tree, one sitting per line; ours: the HTTP worker's one selector loop; edd4052: the
worker with a thread per connection; f8de378: scrapes answered by threads in the plugin)::

    python benchmarks/bench_scrape_load.py --rounds 8 --calls 300 --scrapers 64 --baseline DIR

    scrapers (64 unless said)      p99 scraped/quiet          quiet/quiet   worker ms/call
                                   ours    baseline           ours          ours  baseline
    new connection each, nice 0    1.11x   8.91x (f8de378)    1.12x         0.05  -
    new connection each, nice 0    1.07x   1.96x (edd4052)    0.81x         0.05  0.25
    the same, another sitting      1.10x   2.46x (edd4052)    0.89x         0.05  0.27
    --scraper-nice -1 (SCHED_IDLE) 1.21x   1.13x (edd4052)    1.00x         0.04  0.28
    the same, another sitting      0.96x   1.59x (edd4052)    0.97x         0.03  0.26
    --keep-alive                   1.14x   1.41x (edd4052)    1.13x         0.06  0.13
    the same, another sitting      1.17x   0.81x (edd4052)    1.20x         0.05  0.13
    the same, another sitting      1.13x   1.15x (edd4052)    1.03x         0.05  0.11
    --pin                          1.04x   1.11x (edd4052)    1.24x         0.05  0.16
    --scrapers 8                   1.00x   1.25x (edd4052)    0.96x         0.02  0.06

Over these 10 sittings ours is 0.96-1.21x (mean 1.09x) while quiet against quiet spans 0.81-1.24x
(mean 1.04x): the difference is within what this box resolves, so the goal (p99 no worse under
64 scrapers) is met as far as it can be measured here; p50 0.88-1.06x. The worker's CPU per call
fell 4-6x against edd4052's thread per connection, whose fresh answer woke 32 threads at once;
against f8de378 the plugin's own CPU per call under scrapers fell from 10.5 ms to 0.66 (quiet
0.62). In keep-alive sittings edd4052 served only 32 of the 64 scrapers (the rest waited in the
listen queue behind connections never idle), so its load there was half. The scrapers' own
CPU on the box (0.5-0.8 ms per Allocate call, stand-ins for scrapers on other machines) is in
every scraped figure.

Earlier figures, back to back (before pacing; phase-bound, see above), against f8de378: the
first worker (threads) p99 2.18x against 20.7x; with --pin 0.88-1.39x against 24-29x. Steps
that got there, each with 64 scrapers: the worker process (29x -> 2.7x, but 11,405 refused
connections retried), new connections left in the listen queue (0 refused), one render per
0.25 s per route, then a render budget of 0.2 % of the plugin's time (a /metrics of 16 GPUs,
1.7 ms of CPU: once per 0.85 s).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
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
)
from cdigen.plugin.deviceplugin.api import deviceplugin_pb2 as pb  # noqa: E402
from cdigen.plugin.deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc  # noqa: E402


def scrape_forever(url: str, scrapers: int, keep_alive: bool) -> None:
    """The scrapers' process: ``scrapers`` threads GET ``url`` until SIGTERM, each on a new
    connection per scrape or (``keep_alive``) on one kept between scrapes as Prometheus 2
    does; on exit prints the number of answers and of failures and its CPU seconds."""
    stop = threading.Event()
    counts = [0] * scrapers
    failures = [0] * scrapers
    host_port, path = url.removeprefix("http://").split("/", 1)

    def scraper(k: int) -> None:
        conn = http.client.HTTPConnection(host_port, timeout=DEADLINE_S)
        while not stop.is_set():
            try:
                if keep_alive:  # reconnects by itself after a "Connection: close"
                    conn.request("GET", "/" + path)
                    conn.getresponse().read()
                else:
                    with urllib.request.urlopen(url, timeout=DEADLINE_S) as answer:
                        answer.read()
                counts[k] += 1
            except (OSError, http.client.HTTPException):
                conn.close()
                failures[k] += 1

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threads = [threading.Thread(target=scraper, args=(k,)) for k in range(scrapers)]
    for thread in threads:
        thread.start()
    print("ready", flush=True)
    for thread in threads:
        thread.join()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{sum(counts)} {sum(failures)} {usage.ru_utime + usage.ru_stime}", flush=True)


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` so far (all threads); 0 once gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s(pid: int) -> float:
    """CPU seconds of the live children of ``pid`` (the HTTP worker, where there is one)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue  # a thread that ended meanwhile
        total += sum(cpu_s(int(child)) for child in children)
    return total


PLUGIN_CPU, SCRAPE_CPU = 0, 1  # --pin


def move_children(pid: int, cpu: int) -> None:
    """Every thread of every child of ``pid`` (the HTTP worker) onto ``cpu``."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            for thread in Path(f"/proc/{child}/task").iterdir():
                with contextlib.suppress(OSError):  # a thread that ended meanwhile
                    os.sched_setaffinity(int(thread.name), {cpu})


def allocate_run(stub: object, messages: list[object], interval_s: float = 0.0) -> list[float]:
    """Send the Allocate ``messages`` one after another, one per ``interval_s`` on a fixed
    schedule (0: back to back); latencies in ms."""
    out = []
    start = time.perf_counter()
    for k, message in enumerate(messages):
        time.sleep(max(0.0, start + k * interval_s - time.perf_counter()))
        t0 = time.perf_counter()
        stub.Allocate(message, timeout=DEADLINE_S)  # type: ignore[attr-defined]
        out.append((time.perf_counter() - t0) * 1000)
    return out


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def tree_python(tree: Path) -> str:
    """The Python to run ``tree`` with: its own venv's where it has one (the entry points of
    ``cdigen plugin`` are read from the installed metadata, so another tree needs its own
    install), else this one."""
    own = tree / ".venv" / "bin" / "python"
    return str(own) if tree != REPO and own.exists() else sys.executable


class Served:
    """One tree's ``cdigen plugin serve`` on the node, its kubelet simulator and its samples."""

    def __init__(self, name: str, tree: Path, node: str, tmp: Path) -> None:
        from tests.kubelet_sim import KubeletSimulator

        self.name, self.tree = name, tree
        python = tree_python(tree)
        plugin_dir, spec_dir = tmp / name / "plugins", tmp / name / "cdi"
        self.url = f"http://127.0.0.1:{free_port()}/metrics"
        subprocess.run(
            [python, "-m", "cdigen.cli", "generate", "--node", node,
             "--output-dir", str(spec_dir)],
            check=True, capture_output=True, cwd=tree,
        )  # fmt: skip
        self.kubelet = KubeletSimulator(plugin_dir).start()
        with (tmp / f"{name}.log").open("wb") as log_file:
            self.plugin = subprocess.Popen(
                [python, "-m", "cdigen.cli", "plugin", "serve", "--node", node,
                 "--plugin-dir", str(plugin_dir), "--spec-dir", str(spec_dir),
                 "--metrics-address", self.url.split("/")[2], "--log-level", "warning"],
                stderr=log_file, cwd=tree,
            )  # fmt: skip
        self.plugin_dir = plugin_dir
        self.latencies: dict[str, list[float]] = {"quiet": [], "scraped": []}
        self.by_round: dict[str, list[list[float]]] = {"quiet": [], "scraped": []}
        self.cpu: dict[str, float] = {"quiet": 0.0, "scraped": 0.0}
        self.worker_cpu: dict[str, float] = {"quiet": 0.0, "scraped": 0.0}
        self.scrapes = [0, 0]  # answered, failed
        self.scraper_cpu = 0.0  # the scrapers' process, all scraped rounds

    def connect(self, gpus: int) -> Any:
        self.kubelet.wait_registered(RESOURCE, timeout_s=30)
        self.kubelet.wait_devices(RESOURCE, lambda d: len(d) == gpus, timeout_s=30)
        self.channel = grpc.insecure_channel(
            f"unix:{self.plugin_dir / self.kubelet.registrations[0].endpoint}",
            options=CHANNEL_OPTIONS,
        )
        stub = pb_grpc.DevicePluginStub(self.channel)
        stub.GetDevicePluginOptions(pb.Empty(), timeout=DEADLINE_S)
        urllib.request.urlopen(self.url, timeout=DEADLINE_S).read()  # /metrics answers
        return stub

    def measure(self, stub: Any, mode: str, messages: list[Any], args: argparse.Namespace) -> None:
        allocate_run(stub, messages[:10])  # warm
        scrapers = None
        if mode == "scraped":
            scrapers = subprocess.Popen(
                [sys.executable, __file__, "--scrape", self.url, str(args.scrapers),
                 "--scraper-nice", str(args.scraper_nice), *(["--pin"] if args.pin else []),
                 *(["--keep-alive"] if args.keep_alive else [])],
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert scrapers.stdout is not None
            scrapers.stdout.readline()  # ready
            time.sleep(0.5)  # all scraping
        if args.pin:
            move_children(self.plugin.pid, SCRAPE_CPU)
        before, before_worker = cpu_s(self.plugin.pid), children_cpu_s(self.plugin.pid)
        samples = allocate_run(stub, messages, args.interval / 1000)
        self.latencies[mode] += samples
        self.by_round[mode].append(samples)
        self.cpu[mode] += cpu_s(self.plugin.pid) - before
        self.worker_cpu[mode] += children_cpu_s(self.plugin.pid) - before_worker
        if scrapers is not None:
            scrapers.send_signal(signal.SIGTERM)
            try:
                out, _ = scrapers.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                scrapers.kill()
                raise SystemExit("bench: the scrapers did not stop within 60 s") from None
            answered, failed, cpu = out.split()
            self.scrapes[0] += int(answered)
            self.scrapes[1] += int(failed)
            self.scraper_cpu += float(cpu)

    def stop(self) -> None:
        self.plugin.send_signal(signal.SIGTERM)
        self.plugin.wait(timeout=10)
        self.kubelet.stop()


def main() -> int:
    """Long: argument parsing, then the rounds of the sitting, alternating trees and modes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="rounds of each mode")
    parser.add_argument("--calls", type=int, default=300, help="Allocate calls per round")
    parser.add_argument("--scrapers", type=int, default=64)
    parser.add_argument(
        "--interval",
        type=float,
        default=10.0,
        help="ms from one Allocate call's start to the next (0: back to back)",
    )
    parser.add_argument("--node", default="builtin:dgx2-v100")
    parser.add_argument("--baseline", type=Path, help="a checkout of the tree to compare with")
    parser.add_argument(
        "--scraper-nice",
        type=int,
        default=0,
        help="niceness of the scrapers' process; -1: SCHED_IDLE (they run on idle CPU only, as "
        "scrapers on other machines would)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help=f"the plugin and the client on CPU {PLUGIN_CPU}, the HTTP worker and the scrapers "
        f"on CPU {SCRAPE_CPU}",
    )
    parser.add_argument(
        "--keep-alive",
        action="store_true",
        help="each scraper keeps its connection between scrapes (Prometheus 2 does)",
    )
    parser.add_argument("--scrape", nargs=2, metavar=("URL", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pin and not args.scrape:
        os.sched_setaffinity(0, {PLUGIN_CPU})  # the plugins started from here inherit it
    if args.scrape:
        if args.pin:
            os.sched_setaffinity(0, {SCRAPE_CPU})
        if args.scraper_nice < 0:  # stand-ins for scrapers on other machines: idle CPU only
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        else:
            os.nice(args.scraper_nice)
        scrape_forever(args.scrape[0], int(args.scrape[1]), args.keep_alive)
        return 0

    from cdigen.discover import load_node

    uuids = [g.uuid for g in sorted(load_node(args.node).gpus, key=lambda g: g.index)]
    tmp = Path(tempfile.mkdtemp(prefix="bench-scrape-"))
    trees = ([("baseline", args.baseline.resolve())] if args.baseline else []) + [("ours", REPO)]
    served = [Served(name, tree, args.node, tmp) for name, tree in trees]
    try:
        stubs = [s.connect(len(uuids)) for s in served]
        for r in range(args.rounds):
            order = list(zip(served, stubs, strict=True))
            for one, stub in order if r % 2 == 0 else order[::-1]:
                for mode in ("quiet", "scraped") if r % 2 == 0 else ("scraped", "quiet"):
                    pairs = requests_for(uuids, args.calls, seed=2 * r + (mode == "scraped"))
                    messages = [m for method, m in pairs if method == "Allocate"]
                    one.measure(stub, mode, messages, args)
        for one in served:
            one.channel.close()
    finally:
        for one in served:
            one.stop()
    report(args, served)
    return 0


def report(args: argparse.Namespace, served: list[Served]) -> None:
    print(
        f"{args.node}: {args.rounds} rounds of each mode (ABBA, trees alternating), "
        f"{args.calls} Allocate calls each from one client, one per {args.interval:g} ms; "
        f"{args.scrapers} scrapers of /metrics "
        f"at nice {args.scraper_nice}{', keep-alive' if args.keep_alive else ''}; "
        f"cpu count {os.cpu_count()}"
    )
    print(
        f"{'tree':<10}{'mode':<8}{'calls':>7}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"{'cpu ms/call':>13}{'worker ms/call':>16}"
    )
    for one in served:
        for mode, samples in one.latencies.items():
            print(
                f"{one.name:<10}{mode:<8}{len(samples):>7}{percentile(samples, 0.5):>9.2f}"
                f"{percentile(samples, 0.99):>9.2f}{max(samples):>9.2f}"
                f"{1000 * one.cpu[mode] / len(samples):>13.2f}"
                f"{1000 * one.worker_cpu[mode] / len(samples):>16.2f}"
            )
    for one in served:
        quiet, scraped = one.latencies["quiet"], one.latencies["scraped"]
        p50 = percentile(scraped, 0.5) / percentile(quiet, 0.5)
        p99 = percentile(scraped, 0.99) / percentile(quiet, 0.99)
        halves = [[x for r in one.by_round["quiet"][k::2] for x in r] for k in (0, 1)]
        noise = percentile(halves[1], 0.99) / percentile(halves[0], 0.99) if halves[1] else 1.0
        print(
            f"{one.name}: scraped/quiet p50 {p50:.2f}x, p99 {p99:.2f}x (quiet against quiet, odd "
            f"rounds/even: p99 {noise:.2f}x); "
            f"scrapes answered {one.scrapes[0]}, failed {one.scrapes[1]}; the scrapers' CPU "
            f"{1000 * one.scraper_cpu / len(scraped):.2f} ms/call"
        )


if __name__ == "__main__":
    sys.exit(main())
