"""The device-status WARNING says what to do for the answer the API server gave: RBAC for a
403, never the 403 advice for another (issue 36); a 404 (the claim is gone) is no warning at all,
one DEBUG line (issue 37)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from cdigen.plugin.dra.status import StatusWriter


class RefusingApi:
    def __init__(self, status: int) -> None:
        self.status = status

    def apply_claim_status(
        self,
        namespace: str,
        name: str,
        uid: str,
        devices: Sequence[Mapping[str, Any]],
        manager: str,
    ) -> None:
        raise ApiException(status=self.status, reason="Refused")


def _lines(
    status: int, caplog: pytest.LogCaptureFixture, name: str = "c"
) -> list[logging.LogRecord]:
    writer = StatusWriter(
        RefusingApi(status), driver="gpu.cdigen.dev", pool="n1", device_data=lambda _: {}
    )
    writer.start()
    with caplog.at_level(logging.DEBUG):
        writer.prepared(
            "default",
            name,
            "uid-1",
            [{"poolName": "n1", "deviceName": "gpu-0", "cdiDeviceIds": ["x"]}],
        )
        assert writer.wait_idle(5)
    writer.stop()
    return [r for r in caplog.records if "device status" in r.getMessage()]


def _warning(status: int, caplog: pytest.LogCaptureFixture, name: str = "c") -> str:
    (line,) = [r.getMessage() for r in _lines(status, caplog, name) if r.levelno == logging.WARNING]
    return line


def test_a_404_is_one_debug_line_saying_the_claim_is_gone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    (record,) = _lines(404, caplog)
    assert record.levelno == logging.DEBUG
    assert "the claim is gone" in record.getMessage()
    assert "rbac" not in record.getMessage().lower()


def test_a_403_points_at_rbac(caplog: pytest.LogCaptureFixture) -> None:
    assert "deploy/dra/rbac.yaml" in _warning(403, caplog)


def test_a_claim_name_with_escapes_is_printed_escaped(caplog: pytest.LogCaptureFixture) -> None:
    line = _warning(500, caplog, name="c\n\x1b[2Jforged")
    assert "\x1b" not in line and "\n" not in line and "c\\n\\x1b[2Jforged" in line
    assert "rbac" not in line.lower()
