"""Clients that hang up early (issue 36, finding 12): a real ``plugin serve --log-format
json``; 20 scrapers of /metrics that reset their connection mid-answer and 20 gRPC clients that
drop a ListAndWatch stream. Every log line stays one JSON object; no traceback."""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import grpc

from cdigen.plugin.deviceplugin.api import deviceplugin_pb2 as pb
from cdigen.plugin.deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc
from tests.helpers.served import ServedPlugin

NODE = "builtin:dgx-a100"


def _wait(plugin: ServedPlugin, pattern: str) -> re.Match[str]:
    deadline = time.monotonic() + 30
    while True:
        found = re.search(pattern, plugin.logs())
        if found:
            return found
        assert time.monotonic() < deadline, plugin.logs()
        time.sleep(0.05)


def test_early_disconnects_leave_only_json_lines(tmp_path: Path) -> None:
    plugin = ServedPlugin(
        tmp_path, "--node", NODE, "--log-format", "json", "--log-level", "debug",
        "--metrics-address", "127.0.0.1:0", "--spec-dir", str(tmp_path / "cdi"),
    )  # fmt: skip
    try:
        port = int(_wait(plugin, r"metrics and /healthz on http://127\.0\.0\.1:(\d+)").group(1))
        _wait(plugin, "cdigen device plugin ready")
        for _ in range(20):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01" + b"\x00" * 7)
            sock.close()
        (sock_path,) = [p for p in plugin.plugin_dir.glob("*.sock") if "kubelet" not in p.name]
        for _ in range(20):
            channel = grpc.insecure_channel(f"unix:{sock_path}")
            stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty())
            next(stream)  # the first device list, then the client goes away
            channel.close()
        time.sleep(1.0)
        assert plugin.proc.poll() is None
    finally:
        assert plugin.stop() == 0
    lines = plugin.logs().splitlines()
    assert lines
    for line in lines:
        doc = json.loads(line)  # raises on a raw traceback line
        assert "exc" not in doc, doc
