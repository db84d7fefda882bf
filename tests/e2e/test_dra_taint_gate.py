"""Device taints against API servers with and without the DRADeviceTaints gate (alpha and off by
default in 1.34-1.35, on by default in 1.36, GA in 1.37): the publisher says once, as an error,
when the server dropped the taints it sent; a server that keeps them hears nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdigen.plugin.agent.xid import xid_reason
from tests.cdihost import FakeHost, build_host, make_node
from tests.helpers.dra import DRIVER, Harness
from tests.helpers.slice_rules import validate_pool


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path / "host", make_node(2))


def _taint_gpu_0(harness: Harness) -> None:
    plugin = harness.start()
    gpu = next(g for g in plugin.node.gpus if g.index == 0)
    plugin.board.set_reasons("xid", {gpu.uuid: xid_reason(79)})


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "dropped the device taints" in r.getMessage()]


@pytest.mark.parametrize("version", ["1.34", "1.35"])
def test_a_server_with_the_gate_off_drops_the_taints_and_is_said_once(
    harness: Harness, version: str, caplog: pytest.LogCaptureFixture
) -> None:
    harness.api.version = tuple(version.split("."))  # type: ignore[assignment]
    harness.api.device_taints = False
    _taint_gpu_0(harness)
    (stored,) = harness.api.slices.values()
    assert not any(d.get("taints") for d in stored["spec"]["devices"])
    (said,) = _said(caplog)
    assert "DRADeviceTaints" in said


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_a_server_that_keeps_them_stores_them_and_hears_nothing(
    harness: Harness, version: str, caplog: pytest.LogCaptureFixture
) -> None:
    harness.api.version = tuple(version.split("."))  # type: ignore[assignment]
    _taint_gpu_0(harness)
    (stored,) = harness.api.slices.values()
    taints = {d["name"]: d.get("taints") for d in stored["spec"]["devices"]}
    assert taints["gpu-0"] == [{"key": f"{DRIVER}/xid", "value": "79", "effect": "NoSchedule"}]
    validate_pool([stored], version)
    assert _said(caplog) == []
