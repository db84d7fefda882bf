"""The HTTP worker's one thread: every connection, the feed to the plugin and every timer.

Why one thread: served by a thread per connection (Python's http.server), a fresh answer woke
32 threads at once, each taking the interpreter in turn, and on a node's shared CPUs that burst
of switches delayed the kubelet's calls. Here one selector loop holds every connection, the feed
and every timer, and writes the waiting answers in one pass; a connection costs a socket and a
few hundred bytes, never a thread.

An answer is fresh: a request that arrives at time t is answered from an ask sent at t or later,
so whatever the plugin did before the scrape began shows in it.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cdigen.plugin.agent.http_feed import (
    ANSWER,
    ASK,
    TEXT,
    Answer,
    decode_answer,
    encode,
    encode_log,
    take_frames,
)
from cdigen.plugin.agent.http_messages import (
    MAX_HEAD,
    HttpRequest,
    Refusal,
    head_end,
    parse_head,
    response,
    skip_blank_lines,
)

# At the connection limit, one idle this long between requests makes room for a connection
# waiting in the listen queue: keep-alive scrapers beyond the limit are served in turn instead
# of waiting for an idle timeout that a busy one never reaches.
EVICT_IDLE_S = 1.0
LISTEN_RETRY_S = 0.2  # at the limit with none to evict: when to look at the listen queue again
RECV_SIZE = 64 << 10
ACCEPTS_PER_WAKE = 16
READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE

log = logging.getLogger("cdigen.plugin.http")


@dataclass(eq=False, slots=True)
class Connection:
    """One client's socket and what is under way on it."""

    sock: socket.socket
    peer: object
    last_io: float  # when a byte last went either way
    fd: int = field(init=False)
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    writing: bool = False  # registered for EVENT_WRITE: outbuf waits for room
    request: HttpRequest | None = None  # waiting for the plugin's answer to it
    arrived: float = 0.0  # when that request arrived
    last: bool = False  # close once the answer is written
    head_since: float = 0.0  # when the first byte of the head in inbuf arrived

    def __post_init__(self) -> None:
        self.fd = self.sock.fileno()

    def expires(self, timeout_s: float) -> float:
        """When to close it while no answer of the plugin is awaited: ``timeout_s`` after its
        last byte, or after the first byte of a request head still unfinished, so that a client
        sending a byte at a time cannot hold a slot for good."""
        if self.inbuf and not self.outbuf:
            return self.head_since + timeout_s
        return self.last_io + timeout_s

    def between_requests(self) -> bool:
        return self.request is None and not self.outbuf and not self.inbuf


class Worker:
    """Serves ``paths`` on ``listener`` with the plugin's answers from ``feed``: at most
    ``max_connections`` connections at once (the next wait in the listen queue), each closed
    after ``timeout_s`` without a byte while the worker is not waiting for the plugin."""

    def __init__(
        self, listener: socket.socket, feed: socket.socket, paths: Sequence[str], *,
        max_connections: int, timeout_s: float, min_interval_s: float, deadline_s: float,
    ) -> None:  # fmt: skip
        self._listener, self._feed = listener, feed
        listener.setblocking(False)
        feed.setblocking(False)
        self._paths = frozenset(paths)
        self._max, self._timeout_s = max_connections, timeout_s
        self._min_interval_s, self._deadline_s = min_interval_s, deadline_s
        self._sel = selectors.DefaultSelector()
        self._conns: dict[int, Connection] = {}
        self._ready: set[Connection] = set()  # an answer written, more requests in its buffer
        self._feed_in, self._feed_out = bytearray(), bytearray()
        self._feed_writing = False
        self._latest: dict[str, tuple[float, Answer]] = {}  # path -> (when asked, answer)
        self._asked: dict[str, float] = {}  # path -> when the ask in flight was sent
        self._due: dict[str, float] = {}  # path -> when it may be asked for again
        self._listening, self._listen_again = False, 0.0
        # At the limit with connections waiting in the listen queue: each answer then closes
        # its connection, so that busy keep-alive clients cannot hold every slot for good.
        self._crowded = False
        self.closed = False
        self._sel.register(feed, READ)
        self._listen(True)

    def run(self) -> None:
        """Serve until the feed closes, then close every connection."""
        while not self.closed:
            for key, mask in self._sel.select(self._wait_s(time.monotonic())):
                if key.fileobj is self._feed:
                    self._on_feed(mask)
                elif key.fileobj is self._listener:
                    self._accept(time.monotonic())
                else:
                    self._guarded(self._on_conn, key.data, mask)
            self._tick(time.monotonic())
        for conn in list(self._conns.values()):
            if conn.request is not None:
                with contextlib.suppress(OSError):
                    conn.sock.send(response(503, b"the plugin is stopping\n", TEXT))
            self._close(conn)
        self._sel.close()

    def send_log(self, level: int, message: str) -> None:
        """Report one log line to the plugin."""
        self._send_feed(encode_log(level, message))

    def _guarded(self, step: Callable[..., None], conn: Connection, *args: object) -> None:
        """``step(conn, *args)``; a fault in it ends that connection, never the others."""
        try:
            step(conn, *args)
        except Exception as exc:
            log.error("a connection ended on an internal error: %s", type(exc).__name__)
            self._close(conn)

    def _listen(self, on: bool) -> None:
        if on and not self._listening:
            self._sel.register(self._listener, READ)
        elif not on and self._listening:
            self._sel.unregister(self._listener)
        self._listening = on

    def _accept(self, now: float) -> None:
        for k in range(ACCEPTS_PER_WAKE):
            if len(self._conns) >= self._max and k > 0:
                return  # full now; whether more wait, the selector tells
            if len(self._conns) >= self._max and not self._evict(now):
                self._listen(False)  # the rest wait in the kernel's queue, costing nothing
                self._listen_again = now + LISTEN_RETRY_S
                self._crowded = True
                return
            try:
                sock, peer = self._listener.accept()
            except BlockingIOError:
                self._crowded = False  # the queue is empty
                return
            except OSError as exc:  # aborted before accepted, or out of descriptors
                log.debug("accepting a connection failed: %s", exc)
                return
            sock.setblocking(False)
            conn = Connection(sock, peer, now)
            self._conns[conn.fd] = conn
            self._sel.register(sock, READ, conn)

    def _evict(self, now: float) -> bool:
        """Close the connection idle longest between requests, if idle over EVICT_IDLE_S."""
        idle = [c for c in self._conns.values() if c.between_requests()]
        oldest = min(idle, key=lambda c: c.last_io, default=None)
        if oldest is None or now - oldest.last_io < EVICT_IDLE_S:
            return False
        self._close(oldest)
        return True

    def _on_conn(self, conn: Connection, mask: int) -> None:
        if mask & WRITE:
            self._flush(conn)
        if mask & READ and conn.fd in self._conns:
            self._read(conn)

    def _read(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(RECV_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:
            self._close(conn, str(exc))
            return
        if not data:  # hung up; if it was waiting for an answer, nobody is now
            self._close(conn, "the client hung up" if conn.request else None)
            return
        conn.last_io = time.monotonic()
        if not conn.inbuf:
            conn.head_since = conn.last_io
        conn.inbuf += data
        if conn.request is None and not conn.outbuf:
            self._next_request(conn)
        elif len(conn.inbuf) > MAX_HEAD:  # requests piled up behind one being answered
            self._close(conn, "too many requests sent ahead")

    def _next_request(self, conn: Connection) -> None:
        skip_blank_lines(conn.inbuf)
        end = head_end(conn.inbuf)
        if end < 0:
            if len(conn.inbuf) > MAX_HEAD:
                self._refuse(conn, Refusal(431, f"a request head over {MAX_HEAD} bytes"))
            return
        parsed = parse_head(bytes(conn.inbuf[:end]))
        del conn.inbuf[:end]
        conn.head_since = time.monotonic()  # of a pipelined request behind it
        if isinstance(parsed, Refusal):
            self._refuse(conn, parsed)
        elif parsed.path not in self._paths:
            paths = " or ".join(sorted(self._paths))
            self._answer(conn, parsed, (404, f"not found: try {paths}\n".encode(), TEXT))
        else:
            conn.request, conn.arrived = parsed, time.monotonic()
            self._ask_if_due(parsed.path, conn.arrived)

    def _ask_if_due(self, path: str, now: float) -> None:
        """Ask the plugin for ``path`` unless an ask is in flight or it was asked too lately."""
        if path not in self._asked and now >= self._due.get(path, now):
            self._asked[path] = now
            self._send_feed(encode(ASK, path.encode()))

    def _refuse(self, conn: Connection, refusal: Refusal) -> None:
        log.debug("refused a request from %s: %d %s", conn.peer, refusal.status, refusal.why)
        body = f"{refusal.why}\n".encode()
        conn.outbuf += response(refusal.status, body, TEXT, allow=refusal.allow)
        conn.last = True
        self._flush(conn)

    def _answer(self, conn: Connection, request: HttpRequest, answer: Answer) -> None:
        status, body, content_type = answer
        keep_alive = request.keep_alive and not self._crowded
        conn.outbuf += response(
            status, body, content_type, head_only=request.method == "HEAD",
            keep_alive=keep_alive, http_10=request.http_10,
        )  # fmt: skip
        conn.request, conn.last = None, not keep_alive
        self._flush(conn)

    def _flush(self, conn: Connection) -> None:
        try:
            sent = conn.sock.send(conn.outbuf)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._close(conn, str(exc))
            return
        if sent:
            del conn.outbuf[:sent]
            conn.last_io = time.monotonic()
        if conn.writing != bool(conn.outbuf):
            conn.writing = bool(conn.outbuf)
            self._sel.modify(conn.sock, READ | WRITE if conn.writing else READ, conn)
        if conn.outbuf:
            return
        if conn.last:
            self._close(conn)
        elif conn.inbuf:
            self._ready.add(conn)  # the next request, on the next pass (no deep recursion)

    def _close(self, conn: Connection, why: str | None = None) -> None:
        if self._conns.pop(conn.fd, None) is None:
            return
        if why:
            log.debug("connection from %s ended: %s", conn.peer, why)
        self._sel.unregister(conn.sock)
        conn.sock.close()
        self._ready.discard(conn)
        self._crowded = False  # a slot is free: whoever waits is taken next, none closed for it

    def _tick(self, now: float) -> None:
        """Answer what can be answered, ask for what is due, close what idled too long."""
        waiting = set()
        for conn in list(self._conns.values()):
            request = conn.request
            if request is None:
                if now >= conn.expires(self._timeout_s):
                    self._close(conn, "timed out" if conn.outbuf or conn.inbuf else None)
                continue
            latest = self._latest.get(request.path)
            if latest is not None and latest[0] >= conn.arrived:
                self._guarded(self._answer, conn, request, latest[1])
            elif now - conn.arrived >= self._deadline_s:
                why = f"the plugin did not answer within {self._deadline_s:g} s\n"
                self._guarded(self._answer, conn, request, (503, why.encode(), TEXT))
            else:
                waiting.add(request.path)
        for path in waiting:
            self._ask_if_due(path, now)
        for conn in list(self._ready):
            self._ready.discard(conn)
            if conn.fd in self._conns and conn.request is None and not conn.outbuf:
                self._guarded(self._next_request, conn)
        if not self._listening and (len(self._conns) < self._max or now >= self._listen_again):
            self._listen(True)

    def _wait_s(self, now: float) -> float:
        """How long the selector may sleep: until the next deadline, due ask or idle timeout."""
        if self._ready:
            return 0.0
        wake = now + 1.0
        if not self._listening:
            wake = min(wake, self._listen_again)
        for conn in self._conns.values():
            if conn.request is None:
                wake = min(wake, conn.expires(self._timeout_s))
                continue
            wake = min(wake, conn.arrived + self._deadline_s)
            if conn.request.path not in self._asked:
                wake = min(wake, self._due.get(conn.request.path, now))
        return max(0.0, wake - now)

    def _on_feed(self, mask: int) -> None:
        if mask & WRITE:
            self._flush_feed()
        if not mask & READ:
            return
        try:
            data = self._feed.recv(RECV_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        self._feed_in += data
        frames, sound = take_frames(self._feed_in)
        now = time.monotonic()
        for kind, payload in frames:
            decoded = decode_answer(payload) if kind == ANSWER else None
            if decoded is None:
                sound = False  # not the plugin's answer: stop, as at the feed's end
                break
            path, answer, pause = decoded
            asked = self._asked.pop(path, now)
            self._latest[path] = (asked, answer)
            self._due[path] = asked + max(self._min_interval_s, pause)
        if not data or not sound:
            self.closed = True

    def _send_feed(self, frame: bytes) -> None:
        self._feed_out += frame
        self._flush_feed()

    def _flush_feed(self) -> None:
        try:
            sent = self._feed.send(self._feed_out)
        except BlockingIOError:
            sent = 0
        except OSError:  # the plugin is gone: its end of the feed reads as closed next
            self._feed_out.clear()
            sent = 0
        del self._feed_out[:sent]
        if self._feed_writing != bool(self._feed_out):
            self._feed_writing = bool(self._feed_out)
            self._sel.modify(self._feed, READ | WRITE if self._feed_writing else READ)
