"""The process that answers a node agent's HTTP scrapers, apart from the plugin's own interpreter.

Why a process of its own: 64 scrapers served by threads inside the plugin took the interpreter
from the kubelet's gRPC calls and made Allocate's p99 22 times worse (benchmarks/
bench_scrape_load.py). Here the HTTP work (accepting, parsing, timeouts, slow clients) costs the
plugin nothing; the plugin is asked only for the answers themselves, at most once per
``--min-interval`` per path however many scrapers wait, and this process runs at a lower CPU
priority than the plugin. It serves in one thread (:mod:`cdigen.plugin.agent.http_loop`).

The plugin binds the listening socket (so that a port in use is its own error at start) and
starts this module with two inherited descriptors: the listening socket and one end of a socket
pair, the *feed* (:mod:`cdigen.plugin.agent.http_feed`). When the feed closes (the plugin
stopped or died) this process exits. Standard library only: it starts in tens of milliseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence

from cdigen.plugin.agent.http_loop import Worker, log

NICENESS = 10  # scrapers wait a little; the kubelet's calls do not


class FeedLogHandler(logging.Handler):
    """Sends this process's log lines to the plugin, which logs them in its own format."""

    def __init__(self, worker: Worker, level: int) -> None:
        super().__init__(level)
        self._worker = worker

    def emit(self, record: logging.LogRecord) -> None:
        self._worker.send_log(record.levelno, record.getMessage())


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until the feed closes."""
    parser = argparse.ArgumentParser(prog="cdigen-http-worker")
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--feed-fd", type=int, required=True)
    parser.add_argument("--path", action="append", required=True)
    parser.add_argument("--max-connections", type=int, required=True)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--min-interval", type=float, required=True)
    parser.add_argument("--deadline", type=float, required=True)
    parser.add_argument("--log-level", type=int, required=True)
    args = parser.parse_args(argv)
    # It goes when the plugin goes (the feed's end), never before it: a Ctrl-C to the terminal's
    # process group or systemd's SIGTERM to every process of the unit is the plugin's to handle.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(NICENESS)
    worker = Worker(
        socket.socket(fileno=args.listen_fd),
        socket.socket(fileno=args.feed_fd),
        args.path,
        max_connections=args.max_connections,
        timeout_s=args.timeout,
        min_interval_s=args.min_interval,
        deadline_s=args.deadline,
    )
    log.addHandler(FeedLogHandler(worker, args.log_level))
    log.setLevel(args.log_level)
    log.propagate = False
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
