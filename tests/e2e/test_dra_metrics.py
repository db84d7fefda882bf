"""``/metrics`` of the DRA plugin (beside ``/healthz`` on ``--health-address``), read as
Prometheus reads it: the in-process plugin, the kubelet DRA simulator and the fake API server."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdigen.plugin.agent.xid import xid_reason
from cdigen.plugin.dra.healthz import HealthServer
from tests.cdihost import FakeHost, build_host, make_node
from tests.helpers.dra import Harness


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path / "host", make_node(3, mig_gpu=2))


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_count_calls_claim_errors_publishes_and_devices_by_health(
    harness: Harness,
) -> None:
    plugin = harness.start()
    server = HealthServer(("127.0.0.1", 0), plugin)
    server.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        before = _scrape(url)
        assert before[("cdigen_dra_registered", ())] == 1
        assert before[("cdigen_dra_prepared_claims", ())] == 0
        assert before[("cdigen_dra_slice_publishes_total", (("result", "ok"),))] >= 1
        devices = len(plugin.views)
        assert before[("cdigen_dra_devices", (("health", "Healthy"),))] == devices

        good = harness.claim("good", "uid-good", "gpu-0")
        missing = ("default", "uid-gone", "gone")  # not in the API server: that claim's error
        answer = harness.kubelet.prepare([good, missing])
        assert answer.claims["uid-good"].error == "" and answer.claims["uid-gone"].error
        plugin.board.set_reasons("xid", {plugin.node.gpus[1].uuid: xid_reason(79)})

        after = _scrape(url)
        prepare = (("method", "NodePrepareResources"),)
        assert after[("cdigen_dra_requests_total", prepare)] == 1
        assert after[("cdigen_dra_claim_errors_total", prepare)] == 1
        assert after[("cdigen_dra_request_duration_seconds_count", prepare)] == 1
        assert after[("cdigen_dra_prepared_claims", ())] == 1
        assert after[("cdigen_dra_devices", (("health", "Unhealthy"),))] >= 1
        healthy = after[("cdigen_dra_devices", (("health", "Healthy"),))]
        unhealthy = after[("cdigen_dra_devices", (("health", "Unhealthy"),))]
        assert healthy + unhealthy == devices

        assert harness.kubelet.unprepare([good]).claims["uid-good"].error == ""
        final = _scrape(url)
        unprepare = (("method", "NodeUnprepareResources"),)
        assert final[("cdigen_dra_requests_total", unprepare)] == 1
        assert final[("cdigen_dra_prepared_claims", ())] == 0
    finally:
        server.close()


def test_the_dra_wing_answers_head_on_http_1_1_as_the_device_plugin_does(
    harness: Harness,
) -> None:
    """One HTTP server for both wings (issue 36): HEAD answered, HTTP/1.1, no body."""
    import http.client

    plugin = harness.start()
    server = HealthServer(("127.0.0.1", 0), plugin)
    server.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
        conn.request("HEAD", "/healthz")
        response = conn.getresponse()
        assert (response.status, response.version, response.read()) == (200, 11, b"")
        conn.request("GET", "/healthz")  # the same connection: kept alive
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        server.close()
