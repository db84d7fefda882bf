"""``--api-timeout`` is a deadline for the whole API call, body included (issue 36, finding 6):
an API server on loopback that sends its headers at once and then trickles the body a byte at a
time, each byte well inside any per-read timeout."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from cdigen.plugin.agent.kubeapi import api_client
from cdigen.plugin.deviceplugin.node_config import NodeLabels


class TricklingServer:
    """Accepts connections; answers each request with a 200 whose 4 KiB body comes one byte
    every ``gap_s`` (until the client hangs up)."""

    def __init__(self, gap_s: float = 0.1) -> None:
        self.gap_s = gap_s
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            head = (
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n"
            )
            try:
                conn.sendall(head)
                for _ in range(4096):
                    if self._stop.wait(self.gap_s):
                        return
                    conn.sendall(b" ")
            except OSError:
                return

    def kubeconfig(self, path: Path) -> Path:
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "t", "cluster": {"server": self.url}}],
            "users": [{"name": "t", "user": {"token": "t"}}],
            "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
            "current-context": "t",
        }
        path.write_text(json.dumps(doc))
        return path

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()


def test_dra_why_gives_up_on_a_trickling_api_server_at_its_timeout(tmp_path: Path) -> None:
    server = TricklingServer()
    try:
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "cdigen.cli", "dra", "why", "p", "--api-timeout", "1",
             "--kubeconfig", str(server.kubeconfig(tmp_path / "kubeconfig"))],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        took = time.monotonic() - started
    finally:
        server.stop()
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "no whole answer within 1 s" in result.stderr
    assert took < 10  # interpreter start and imports beside the 1 s; trickled to the end: 400 s


def test_node_labels_give_up_at_the_timeout_and_keep_the_config(tmp_path: Path) -> None:
    server = TricklingServer()
    try:
        labels = NodeLabels(
            api_client(str(server.kubeconfig(tmp_path / "kubeconfig"))), "n1", timeout_s=0.5
        )
        started = time.monotonic()
        assert labels.labels() is None
        assert time.monotonic() - started < 3
    finally:
        server.stop()


def test_an_api_error_quoting_a_hostile_name_is_escaped() -> None:
    """The API server's Status message quotes the name asked for: escaped in our one line."""
    from kubernetes.client.exceptions import ApiException

    from cdigen.plugin.agent.kubeapi import api_error

    exc = ApiException(status=404, reason="Not Found")
    exc.body = json.dumps(
        {"kind": "Status", "reason": "NotFound", "message": 'pods "x\x1b[2J\x07" not found'}
    )
    line = api_error(exc)
    assert "\x1b" not in line and "\x07" not in line
    assert 'pods "x\\x1b[2J\\x07" not found' in line
