"""The process that answers a node agent's HTTP scrapers, apart from the plugin's own interpreter.

Why a process of its own: 64 scrapers served by threads inside the plugin took the interpreter
from the kubelet's gRPC calls and made Allocate's p99 22 times worse (benchmarks/
bench_scrape_load.py). Here the HTTP work (accepting, parsing, timeouts, slow clients) costs the
plugin nothing; the plugin is asked only for the answers themselves, at most once per
``--min-interval`` per path however many scrapers wait, and this process runs at a lower CPU
priority than the plugin.

The plugin binds the listening socket (so that a port in use is its own error at start) and
starts this module with two inherited descriptors: the listening socket and one end of a
socket pair, the *feed*. On the feed this process sends an ask (``R`` + path) or a log line
(``L`` + JSON), and the plugin sends answers (:func:`encode_answer`). An answer is fresh: a
scrape that arrives at time t is answered from an ask sent at t or later, so whatever the
plugin did before the scrape began shows in it. When the feed closes (the plugin stopped or
died) this process exits. Standard library only: it starts in tens of milliseconds.

Wire format, both ways a frame: one kind byte, a 4-byte big-endian size, then the payload.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ASK = b"R"  # the worker asks for the answer of one path
LOG = b"L"  # the worker reports a log line: {"level": int, "msg": str}
ANSWER = b"A"  # the plugin answers: a JSON head line, then the body
HEAD = struct.Struct("!cI")
MAX_FRAME = 64 << 20  # a rendered /metrics is kilobytes; anything near this is a broken peer
TEXT = "text/plain; charset=utf-8"
NICENESS = 10  # scrapers wait a little; the kubelet's calls do not
SLOT_WAIT_S = 0.2  # how long the accept loop waits for a free slot before looking again

Answer = tuple[int, bytes, str]  # status, body, content type

log = logging.getLogger("cdigen.plugin.http")


def encode(kind: bytes, payload: bytes) -> bytes:
    """One frame of the feed."""
    return HEAD.pack(kind, len(payload)) + payload


def encode_answer(path: str, answer: Answer, pause_s: float) -> bytes:
    """The plugin's answer for ``path`` as one frame; ``pause_s``: how long after this ask the
    worker must wait before asking for ``path`` again."""
    status, body, content_type = answer
    head = {"path": path, "status": status, "type": content_type, "pause": pause_s}
    return encode(ANSWER, json.dumps(head).encode() + b"\n" + body)


def decode_answer(payload: bytes) -> tuple[str, Answer, float] | None:
    """``(path, answer, pause_s)`` of an answer frame's payload; None if it is not one."""
    head, _, body = payload.partition(b"\n")
    try:
        doc = json.loads(head)
        return str(doc["path"]), (int(doc["status"]), body, str(doc["type"])), float(doc["pause"])
    except (ValueError, KeyError, TypeError):
        return None


def encode_log(level: int, message: str) -> bytes:
    """A log line of the worker as one frame."""
    return encode(LOG, json.dumps({"level": level, "msg": message}).encode())


def decode_log(payload: bytes) -> tuple[int, str] | None:
    """``(level, message)`` of a log frame's payload; None if it is not one."""
    try:
        doc = json.loads(payload)
        return int(doc["level"]), str(doc["msg"])
    except (ValueError, KeyError, TypeError):
        return None


def read_frame(stream: Any) -> tuple[bytes, bytes] | None:
    """The next frame from ``stream`` (a binary file), or None at its end or on a broken one."""
    head = stream.read(HEAD.size)
    if len(head) < HEAD.size:
        return None
    kind, size = HEAD.unpack(head)
    if size > MAX_FRAME:
        return None
    payload = stream.read(size)
    return (kind, payload) if len(payload) == size else None


class Feed:
    """This process's side of the feed: asks the plugin for answers and keeps the latest."""

    def __init__(self, sock: socket.socket, *, min_interval_s: float, deadline_s: float) -> None:
        self._sock = sock
        self._min_interval_s = min_interval_s
        self._deadline_s = deadline_s
        self._cond = threading.Condition()
        self._latest: dict[str, tuple[float, Answer]] = {}  # path -> (when asked, answer)
        self._asked: dict[str, float] = {}  # path -> when the ask in flight was sent
        self._due: dict[str, float] = {}  # path -> when it may be asked for again
        self._closed = False
        self._send_lock = threading.Lock()

    def answer(self, path: str) -> Answer:
        """The plugin's answer for ``path``, asked for after this call began; 503 when the
        plugin does not answer within the deadline."""
        arrived = time.monotonic()
        deadline = arrived + self._deadline_s
        with self._cond:
            while not self._closed:
                latest = self._latest.get(path)
                if latest is not None and latest[0] >= arrived:
                    return latest[1]
                now = time.monotonic()
                if now >= deadline:
                    break
                due = self._due.get(path, now)
                if path in self._asked:
                    self._cond.wait(deadline - now)
                elif now < due:
                    self._cond.wait(min(due, deadline) - now)
                else:
                    self._asked[path] = now
                    self.send(encode(ASK, path.encode()))
        reason = "stopping" if self._closed else f"did not answer within {self._deadline_s:g} s"
        return 503, f"the plugin {reason}\n".encode(), TEXT

    def send(self, frame: bytes) -> None:
        """Send one frame to the plugin (a closed feed is noticed by the reader)."""
        with self._send_lock, contextlib.suppress(OSError):
            self._sock.sendall(frame)

    def read_answers(self) -> None:
        """Take the plugin's answers until the feed closes."""
        stream = self._sock.makefile("rb")
        while (frame := read_frame(stream)) is not None:
            kind, payload = frame
            decoded = decode_answer(payload) if kind == ANSWER else None
            if decoded is None:
                break  # not the plugin's answer: stop, as at the feed's end
            path, answer, pause = decoded
            with self._cond:
                asked = self._asked.pop(path, time.monotonic())
                self._latest[path] = (asked, answer)
                self._due[path] = asked + max(self._min_interval_s, pause)
                self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class FeedLogHandler(logging.Handler):
    """Sends this process's log lines to the plugin, which logs them in its own format."""

    def __init__(self, feed: Feed, level: int) -> None:
        super().__init__(level)
        self._feed = feed

    def emit(self, record: logging.LogRecord) -> None:
        self._feed.send(encode_log(record.levelno, record.getMessage()))


class WorkerServer(ThreadingHTTPServer):
    """Answers on an inherited listening socket: at most ``max_connections`` at once (one
    thread each; the next waits in the listen queue until one ends), each closed after
    ``timeout_s`` without a byte."""

    daemon_threads = True

    def __init__(
        self, listen_fd: int, feed: Feed, paths: Sequence[str], *, max_connections: int,
        timeout_s: float,
    ) -> None:  # fmt: skip
        super().__init__(("", 0), _Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = socket.socket(fileno=listen_fd)
        self.server_address = self.socket.getsockname()
        self.feed = feed
        self.paths = tuple(paths)
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)

    def get_request(self) -> tuple[socket.socket, Any]:
        """Accept the next connection once a slot is free. While all are taken, connections
        wait in the kernel's listen queue (costing this process nothing), instead of being
        accepted and closed, which had scrapers retry in a storm of connections."""
        if not self._slots.acquire(timeout=SLOT_WAIT_S):
            raise OSError("every connection slot is taken")  # the serve loop tries again
        try:
            return self.socket.accept()
        except BaseException:
            self._slots.release()
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed (the client hung up mid-answer): one DEBUG line."""
        log.debug("connection from %s ended: %s", client_address, sys.exc_info()[1])

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _Handler(BaseHTTPRequestHandler):
    server: WorkerServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.timeout_s)  # each read and write of it

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in self.server.paths:
            paths = " or ".join(sorted(self.server.paths))
            self._send((404, f"not found: try {paths}\n".encode(), TEXT))
            return
        self._send(self.server.feed.answer(path))

    def do_HEAD(self) -> None:
        self.do_GET()

    def _send(self, answer: Answer) -> None:
        status, body, content_type = answer
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug(format, *args)


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
    feed = Feed(
        socket.socket(fileno=args.feed_fd),
        min_interval_s=args.min_interval,
        deadline_s=args.deadline,
    )
    log.addHandler(FeedLogHandler(feed, args.log_level))
    log.setLevel(args.log_level)
    log.propagate = False
    server = WorkerServer(
        args.listen_fd,
        feed,
        args.path,
        max_connections=args.max_connections,
        timeout_s=args.timeout,
    )
    # A daemon thread: however the main thread ends (the feed's end, or an error), the process
    # ends with it and never holds the port without a plugin behind it.
    serving = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
    )
    serving.start()
    try:
        feed.read_answers()  # until the plugin closes the feed
    finally:
        server.shutdown()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
