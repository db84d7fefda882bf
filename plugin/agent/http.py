"""The one HTTP server of a node agent: ``/metrics`` and ``/healthz`` of both wings.

A DaemonSet binds it on the node's address (0.0.0.0:9465), where anything on the network may
connect, so it is bounded: at most :data:`MAX_CONNECTIONS` connections are served at once (the
next wait in the kernel's listen queue of :data:`BACKLOG`; beyond it the kernel drops their
handshakes and clients retry), and a connection that sends nothing for
:data:`CONNECTION_TIMEOUT_S` is closed. HTTP/1.1 with keep-alive, GET and HEAD; a client that
hangs up early is one DEBUG line, never a traceback.

The connections are served by a worker process (:mod:`cdigen.plugin.agent.http_worker`) so that
scrapers never compete with the kubelet's calls for this interpreter; this process binds the
port, starts the worker, renders each route's answer when the worker asks (at most once per
:data:`MIN_INTERVAL_S` per route however many scrapers wait, and less often for a route whose
render takes long: rendering keeps to :data:`RENDER_SHARE` of the plugin's time) and starts the
worker again if it dies. Each wing gives its routes: path -> a function answering (status, body,
content type).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import cdigen
from cdigen.plugin.agent.http_feed import (
    ASK,
    LOG,
    TEXT,
    Answer,
    decode_log,
    encode_answer,
    read_frame,
)

__all__ = ["TEXT", "AgentHttpServer", "Answer", "Route"]

log = logging.getLogger("cdigen.plugin.http")

MAX_CONNECTIONS = 32
CONNECTION_TIMEOUT_S = 10.0
BACKLOG = 64
# How often the plugin renders a route at most, however many scrapers wait (each waits at most
# this long for a fresh answer): Prometheus scrapes every 15-60 s and the kubelet probes every
# 10 s. And a route whose render takes longer is asked for less often, so that rendering takes
# at most RENDER_SHARE of the plugin's time: a /metrics of 16 GPUs takes about 1.7 ms of CPU, and
# at four a second it delayed about 1 % of Allocate calls by a render (their p99 doubled).
MIN_INTERVAL_S = 0.25
RENDER_SHARE = 0.002
MAX_PAUSE_S = 5.0
ANSWER_DEADLINE_S = 5.0  # a plugin that cannot render in this long is not healthy
RESTART_DELAY_S = 1.0  # doubled after each quick exit, up to:
MAX_RESTART_DELAY_S = 30.0
STOP_GRACE_S = 5.0

Route = Callable[[], Answer]


class AgentHttpServer:
    """Serves ``routes`` on ``address`` once :meth:`start` is called; :meth:`close` stops it
    and releases the port. Binding happens here, so a port in use is an ``OSError`` now."""

    def __init__(
        self,
        address: tuple[str, int],
        routes: Mapping[str, Route],
        *,
        name: str = "cdigen-http",
        max_connections: int = MAX_CONNECTIONS,
        timeout_s: float = CONNECTION_TIMEOUT_S,
        min_interval_s: float = MIN_INTERVAL_S,
        answer_deadline_s: float = ANSWER_DEADLINE_S,
    ) -> None:
        self.routes = dict(routes)
        self.name = name
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self.min_interval_s = min_interval_s
        self.answer_deadline_s = answer_deadline_s
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(address)
            self._listener.listen(BACKLOG)
        except OSError:
            self._listener.close()
            raise
        self.server_address: tuple[str, int] = self._listener.getsockname()[:2]
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._worker: subprocess.Popen[bytes] | None = None
        self._feed: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self, *, after: threading.Event | None = None, wait_s: float = 0.0) -> None:
        """Start the worker process, and the thread that answers it (not once closed).
        ``after``: start the worker once this is set, or ``wait_s`` later, so that starting a
        process takes no CPU from more urgent work (the kubelet's registration); connections
        wait in the listen queue meanwhile."""
        with self._lock:
            if self._stopping.is_set() or self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, args=(after, wait_s), name=self.name, daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        """Stop the worker, wait for it, and release the port."""
        with self._lock:
            self._stopping.set()
            feed, worker = self._feed, self._worker
        if feed is not None:
            with contextlib.suppress(OSError):  # the worker reads its end: it exits
                feed.shutdown(socket.SHUT_RDWR)
        if worker is not None:
            try:
                worker.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        if self._thread is not None:
            self._thread.join(timeout=STOP_GRACE_S)
            self._thread = None
        self._listener.close()

    def _run(self, after: threading.Event | None, wait_s: float) -> None:
        if after is not None:
            after.wait(wait_s)
        delay = RESTART_DELAY_S
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                code = self._serve_one_worker()
            except OSError as exc:
                if self._stopping.is_set():
                    return
                code = None
                log.error("%s: cannot start the HTTP worker: %s", self.name, exc.strerror or exc)
            if self._stopping.is_set():
                return
            if time.monotonic() - started > MAX_RESTART_DELAY_S:
                delay = RESTART_DELAY_S  # it had been serving: not a crash loop
            log.warning(
                "%s: the HTTP worker exited (%s); starting it again in %g s",
                self.name,
                "could not start" if code is None else f"code {code}",
                delay,
            )
            self._stopping.wait(delay)
            delay = min(2 * delay, MAX_RESTART_DELAY_S)

    def _serve_one_worker(self) -> int:
        """Start a worker and answer it until it exits; its exit code."""
        ours, theirs = socket.socketpair()
        with ours, theirs:
            worker = self._spawn(theirs)
            theirs.close()
            with self._lock:
                self._worker, self._feed = worker, ours
            if self._stopping.is_set():  # close() ran before the feed was known
                ours.shutdown(socket.SHUT_RDWR)
            self._answer(ours)
            return worker.wait()

    def _spawn(self, feed: socket.socket) -> subprocess.Popen[bytes]:
        package_root = str(Path(cdigen.__file__).parent.parent)
        path = os.environ.get("PYTHONPATH")
        env = dict(os.environ, PYTHONPATH=package_root + (os.pathsep + path if path else ""))
        argv = [
            sys.executable, "-m", "cdigen.plugin.agent.http_worker",
            "--listen-fd", str(self._listener.fileno()), "--feed-fd", str(feed.fileno()),
            "--max-connections", str(self.max_connections), "--timeout", str(self.timeout_s),
            "--min-interval", str(self.min_interval_s), "--deadline", str(self.answer_deadline_s),
            "--log-level", str(log.getEffectiveLevel()),
        ]  # fmt: skip
        for path_name in self.routes:
            argv += ["--path", path_name]
        return subprocess.Popen(
            argv,
            pass_fds=(self._listener.fileno(), feed.fileno()),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # a terminal's Ctrl-C reaches the plugin, not the worker
        )

    def _answer(self, feed: socket.socket) -> None:
        """Render what the worker asks for, and log what it reports, until it hangs up. Each
        ask is rendered in a thread of its own, so a slow route (``/metrics`` asking the
        kubelet's PodResources) never holds up another (``/healthz``); the worker asks at most
        once at a time per route."""
        stream = feed.makefile("rb")
        sending = threading.Lock()
        while (frame := read_frame(stream)) is not None:
            kind, payload = frame
            if kind == ASK:
                path = payload.decode("utf-8", "replace")
                threading.Thread(
                    target=self._render_and_send, args=(feed, sending, path),
                    name=f"{self.name} {path}", daemon=True,
                ).start()  # fmt: skip
            elif kind == LOG:
                self._log_worker_line(payload)

    def _render_and_send(self, feed: socket.socket, sending: threading.Lock, path: str) -> None:
        started = time.thread_time()
        answer = self._render(path)
        pause = min(MAX_PAUSE_S, (time.thread_time() - started) / RENDER_SHARE)
        frame = encode_answer(path, answer, pause)
        with sending, contextlib.suppress(OSError):  # a worker gone: the feed loop ends
            feed.sendall(frame)

    def _render(self, path: str) -> Answer:
        route = self.routes.get(path)
        if route is None:
            return 404, b"not found\n", TEXT
        try:
            return route()
        except Exception as exc:
            log.error(
                "%s: answering %s failed: %s", self.name, path, exc,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )  # fmt: skip
            return 500, b"internal error: see the plugin's log\n", TEXT

    def _log_worker_line(self, payload: bytes) -> None:
        line = decode_log(payload)
        if line is not None:
            log.log(line[0], "%s: %s", self.name, line[1])
