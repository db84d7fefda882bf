"""The feed between a node agent and its HTTP worker: the one wire format both sides speak.

The plugin (:mod:`cdigen.plugin.agent.http`) and its worker process
(:mod:`cdigen.plugin.agent.http_worker`) share one end each of a socket pair. The worker sends
an ask (``R`` + path) or a log line (``L`` + JSON); the plugin sends answers (``A``: a JSON head
line, then the body). Every message is a frame: one kind byte, a 4-byte big-endian size, then
the payload.
"""

from __future__ import annotations

import json
import struct
from typing import Any

ASK = b"R"  # the worker asks for the answer of one path
LOG = b"L"  # the worker reports a log line: {"level": int, "msg": str}
ANSWER = b"A"  # the plugin answers: a JSON head line, then the body
HEAD = struct.Struct("!cI")
MAX_FRAME = 64 << 20  # a rendered /metrics is kilobytes; anything near this is a broken peer
TEXT = "text/plain; charset=utf-8"

Answer = tuple[int, bytes, str]  # status, body, content type


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


def take_frames(buffer: bytearray) -> tuple[list[tuple[bytes, bytes]], bool]:
    """The whole frames at the start of ``buffer`` (removed from it; a partial one stays for
    the next read) and whether the stream is still sound (False: a frame over
    :data:`MAX_FRAME`, a broken peer)."""
    frames: list[tuple[bytes, bytes]] = []
    at = 0
    while len(buffer) - at >= HEAD.size:
        kind, size = HEAD.unpack_from(buffer, at)
        if size > MAX_FRAME:
            return frames, False
        end = at + HEAD.size + size
        if len(buffer) < end:
            break
        frames.append((kind, bytes(buffer[at + HEAD.size : end])))
        at = end
    del buffer[:at]
    return frames, True
