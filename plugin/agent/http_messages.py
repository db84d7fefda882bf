"""HTTP/1.x as the HTTP worker speaks it: a request head read into a value, a response made.

Only what a scraper and a kubelet probe send is understood: GET and HEAD of a path, HTTP/1.0
and 1.1, keep-alive by the version's default and the ``Connection`` header (RFC 9112). Anything
else is answered with its status and the connection closed after it, so a request body the
worker never reads cannot be taken for the next request.
"""

from __future__ import annotations

import email.utils
import http
from dataclasses import dataclass

MAX_HEAD = 16 << 10  # a Prometheus scrape's head is about 300 bytes
MAX_HEADERS = 100  # as Python's http.server allows
METHODS = ("GET", "HEAD")


@dataclass(frozen=True)
class HttpRequest:
    """One request the worker will answer."""

    method: str
    path: str  # the target without its query
    keep_alive: bool  # the connection stays open after the answer
    http_10: bool  # an HTTP/1.0 client: keep-alive must be said in the answer


@dataclass(frozen=True)
class Refusal:
    """A request the worker will not serve: answered with ``status`` and then closed."""

    status: int
    why: str
    allow: bool = False  # 405: say which methods are allowed


def head_end(buffer: bytes | bytearray) -> int:
    """Where the request head at the start of ``buffer`` ends (just past its blank line), or
    -1 while it is incomplete. Lines may end in CRLF or LF, as Python's http.server accepts."""
    crlf, lf = buffer.find(b"\n\r\n"), buffer.find(b"\n\n")
    found = [at + size for at, size in ((crlf, 3), (lf, 2)) if at >= 0]
    return min(found) if found else -1


def skip_blank_lines(buffer: bytearray) -> None:
    """Drop the empty lines a client may send before a request line (RFC 9112, 2.2)."""
    kept = buffer.lstrip(b"\r\n")
    if len(kept) != len(buffer):
        del buffer[: len(buffer) - len(kept)]


def parse_head(head: bytes) -> HttpRequest | Refusal:
    """The request in ``head`` (its request line and header lines, up to the blank line)."""
    line, *fields = head.decode("latin-1").rstrip("\r\n").split("\n")
    parts = line.rstrip("\r").split(" ")
    if len(parts) != 3 or not parts[1]:
        return Refusal(400, "a request line is METHOD TARGET HTTP/1.1")
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        major = version.removeprefix("HTTP/").split(".", 1)[0]
        if version.startswith("HTTP/") and major.isdigit() and int(major) >= 2:
            return Refusal(505, "HTTP/1.0 and HTTP/1.1 only")
        return Refusal(400, "a request line ends in HTTP/1.0 or HTTP/1.1")
    if len(fields) > MAX_HEADERS:
        return Refusal(431, f"more than {MAX_HEADERS} header lines")
    headers: dict[str, str] = {}
    for field in fields:
        name, colon, value = field.rstrip("\r").partition(":")
        if not colon or not name or name != name.strip():
            return Refusal(400, "a header line is NAME: VALUE")
        headers[name.lower()] = value.strip()
    if method not in METHODS:
        return Refusal(405, "GET and HEAD only", allow=True)
    tokens = {token.strip().lower() for token in headers.get("connection", "").split(",")}
    http_10 = version == "HTTP/1.0"
    keep_alive = "keep-alive" in tokens if http_10 else "close" not in tokens
    if "transfer-encoding" in headers or headers.get("content-length", "0") != "0":
        keep_alive = False  # a body we do not read: never parse it as the next request
    return HttpRequest(method, target.split("?", 1)[0], keep_alive, http_10)


def response(
    status: int,
    body: bytes,
    content_type: str,
    *,
    head_only: bool = False,
    keep_alive: bool = False,
    http_10: bool = False,
    allow: bool = False,
) -> bytes:
    """The bytes of one answer: status line, headers and (unless ``head_only``) the body."""
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    lines = [
        f"HTTP/1.1 {status} {phrase}",
        f"Date: {email.utils.formatdate(usegmt=True)}",
        "Server: cdigen",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
    ]
    if allow:
        lines.append("Allow: " + ", ".join(METHODS))
    if not keep_alive:
        lines.append("Connection: close")
    elif http_10:
        lines.append("Connection: keep-alive")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body
