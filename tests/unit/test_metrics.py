"""The plugin's metrics endpoint, scraped over real HTTP on loopback."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdigen.errors import InputError
from cdigen.plugin.agent.sockets import parse_address
from cdigen.plugin.deviceplugin.metrics import PluginMetrics

GPU = "nvidia.com/gpu"


@pytest.fixture
def served() -> Iterator[tuple[PluginMetrics, str]]:
    metrics = PluginMetrics()
    server, port = metrics.start_http_server("127.0.0.1:0")
    try:
        yield metrics, f"http://127.0.0.1:{port}"
    finally:
        server.close()


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


def scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample on /metrics as {(name, sorted labels): value}."""
    status, content_type, text = get(base + "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_healthz_is_503_until_registered_then_200(served: tuple[PluginMetrics, str]) -> None:
    metrics, base = served
    metrics.declare_resource(GPU)
    status, _, body = get(base + "/healthz")
    assert status == 503
    assert GPU in body

    metrics.observe_registration(GPU, ok=False)
    assert get(base + "/healthz")[0] == 503

    metrics.observe_registration(GPU, ok=True)
    assert get(base + "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")

    metrics.mark_unregistered(GPU)  # the kubelet restarted and wiped our socket
    assert get(base + "/healthz")[0] == 503
    samples = scrape(base)
    assert value(samples, "cdigen_plugin_registrations_total", resource=GPU, result="failure") == 1
    assert value(samples, "cdigen_plugin_registrations_total", resource=GPU, result="success") == 1
    assert value(samples, "cdigen_plugin_registered", resource=GPU) == 0


def test_mark_registered_without_a_resource_makes_healthz_ready(
    served: tuple[PluginMetrics, str],
) -> None:
    metrics, base = served
    assert get(base + "/healthz")[0] == 503
    metrics.mark_registered()
    assert get(base + "/healthz")[0] == 200


def test_every_declared_resource_must_be_registered(served: tuple[PluginMetrics, str]) -> None:
    metrics, base = served
    metrics.declare_resource(GPU)
    metrics.declare_resource("nvidia.com/mig-1g.10gb")
    metrics.mark_registered(GPU)
    status, _, body = get(base + "/healthz")
    assert (status, body) == (503, "not registered with the kubelet: nvidia.com/mig-1g.10gb\n")
    metrics.mark_registered()  # all of them
    assert get(base + "/healthz")[0] == 200


def test_declared_series_start_at_zero(served: tuple[PluginMetrics, str]) -> None:
    metrics, base = served
    metrics.declare_resource(GPU)
    samples = scrape(base)
    for method in ("Allocate", "GetPreferredAllocation"):
        labels = {"method": method, "resource": GPU}
        assert value(samples, "cdigen_plugin_requests_total", **labels) == 0
        assert value(samples, "cdigen_plugin_request_errors_total", **labels) == 0
        assert value(samples, "cdigen_plugin_request_duration_seconds_count", **labels) == 0
    assert value(samples, "cdigen_plugin_devices", resource=GPU, health="Healthy") == 0


def test_calls_errors_and_latency_are_counted(served: tuple[PluginMetrics, str]) -> None:
    metrics, base = served
    metrics.declare_resource(GPU)
    for _ in range(2):
        with metrics.observe_request("Allocate", GPU):
            pass
    with metrics.observe_request("GetPreferredAllocation", GPU):
        pass
    with pytest.raises(RuntimeError), metrics.observe_request("Allocate", GPU):
        raise RuntimeError("unknown device id")
    metrics.observe_request_failed("GetPreferredAllocation", GPU)

    samples = scrape(base)
    alloc = {"method": "Allocate", "resource": GPU}
    pref = {"method": "GetPreferredAllocation", "resource": GPU}
    assert value(samples, "cdigen_plugin_requests_total", **alloc) == 3
    assert value(samples, "cdigen_plugin_request_errors_total", **alloc) == 1
    assert value(samples, "cdigen_plugin_requests_total", **pref) == 1
    assert value(samples, "cdigen_plugin_request_errors_total", **pref) == 1
    assert value(samples, "cdigen_plugin_request_duration_seconds_count", **alloc) == 3
    assert value(samples, "cdigen_plugin_request_duration_seconds_sum", **alloc) >= 0
    # a trivial call lands in the smallest bucket, and buckets are cumulative
    assert value(samples, "cdigen_plugin_request_duration_seconds_bucket", le="+Inf", **alloc) == 3


def test_devices_by_health(served: tuple[PluginMetrics, str]) -> None:
    metrics, base = served
    metrics.set_devices(GPU, healthy=7, unhealthy=1)
    samples = scrape(base)
    assert value(samples, "cdigen_plugin_devices", resource=GPU, health="Healthy") == 7
    assert value(samples, "cdigen_plugin_devices", resource=GPU, health="Unhealthy") == 1
    metrics.set_devices(GPU, healthy=8, unhealthy=0)
    samples = scrape(base)
    assert value(samples, "cdigen_plugin_devices", resource=GPU, health="Unhealthy") == 0


def test_link_scores_land_in_buckets(served: tuple[PluginMetrics, str]) -> None:
    metrics, base = served
    metrics.observe_link_score(GPU, 40)  # two PCIe GPUs behind one switch
    metrics.observe_link_score(GPU, 33600, fallback=True)  # 8 GPUs, NV12 every pair
    samples = scrape(base)
    name = "cdigen_plugin_preferred_allocation_link_score"
    assert value(samples, name + "_count", resource=GPU) == 2
    assert value(samples, name + "_sum", resource=GPU) == 33640
    assert value(samples, name + "_bucket", resource=GPU, le="50.0") == 1
    assert value(samples, name + "_bucket", resource=GPU, le="25000.0") == 1
    assert value(samples, name + "_bucket", resource=GPU, le="50000.0") == 2
    assert value(samples, "cdigen_plugin_preferred_allocation_fallbacks_total", resource=GPU) == 1


def test_policy_reloads_and_loaded_policy_names(served: tuple[PluginMetrics, str]) -> None:
    metrics, base = served
    metrics.observe_policy_reload(ok=True)
    metrics.set_policies({GPU: "default"})
    metrics.observe_policy_reload(ok=False)  # a broken file: the old policies stay
    metrics.observe_policy_reload(ok=True)
    metrics.set_policies({GPU: "single-numa"})

    samples = scrape(base)
    assert value(samples, "cdigen_plugin_policy_reloads_total") == 3
    assert value(samples, "cdigen_plugin_policy_reload_failures_total") == 1
    loaded = {
        dict(labels)["policy"]
        for (name, labels), v in samples.items()
        if name == "cdigen_plugin_policy_info" and v == 1
    }
    assert loaded == {"single-numa"}  # the replaced policy's series is gone, not left at 1


def test_each_metrics_object_has_its_own_registry() -> None:
    first, second = PluginMetrics(), PluginMetrics()
    with first.observe_request("Allocate", GPU):
        pass
    assert b'cdigen_plugin_requests_total{method="Allocate"' in first.exposition()
    assert b'cdigen_plugin_requests_total{method="Allocate"' not in second.exposition()


def test_unknown_path_is_404(served: tuple[PluginMetrics, str]) -> None:
    _, base = served
    status, _, body = get(base + "/")
    assert status == 404
    assert "/metrics" in body


def test_close_releases_the_port() -> None:
    metrics = PluginMetrics()
    server, port = metrics.start_http_server("127.0.0.1:0")
    assert get(f"http://127.0.0.1:{port}/healthz")[0] == 503
    server.close()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass
    # and the same port can be bound again at once
    again, again_port = PluginMetrics().start_http_server(f"127.0.0.1:{port}")
    assert again_port == port
    again.close()


def test_busy_port_is_a_one_line_input_error() -> None:
    metrics = PluginMetrics()
    server, port = metrics.start_http_server("127.0.0.1:0")
    try:
        with pytest.raises(
            InputError, match=rf"--metrics-address: cannot listen on 127.0.0.1:{port}"
        ):
            PluginMetrics().start_http_server(f"127.0.0.1:{port}")
    finally:
        server.close()


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:9465", ("127.0.0.1", 9465)),
        (":0", ("0.0.0.0", 0)),
        ("[::1]:9465", ("::1", 9465)),
        ("localhost:80", ("localhost", 80)),
    ],
)
def test_parse_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize("address", ["9465", "127.0.0.1", "host:port", "127.0.0.1:70000", ""])
def test_bad_address_is_a_clear_error(address: str) -> None:
    with pytest.raises(InputError, match=r"is not HOST:PORT.*e\.g\. 127\.0\.0\.1:9465"):
        parse_address(address)


# -- the acceptance check: a real `cdigen plugin serve` behind the kubelet simulator ----------


def _serve_has_metrics_flag() -> bool:
    result = subprocess.run(
        [sys.executable, "-m", "cdigen.cli", "plugin", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return "--metrics-address" in result.stdout


def _bound_url(process: subprocess.Popen[str], lines: list[str], timeout_s: float) -> str:
    """The metrics URL the plugin logs at start ('metrics and /healthz on http://HOST:PORT')."""
    deadline = time.monotonic() + timeout_s
    assert process.stderr is not None
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(r"metrics and /healthz on (http://[\d.]+:\d+)", line)
        if found:
            return found.group(1)
    raise AssertionError("the plugin never logged its metrics address:\n" + "".join(lines))


def test_served_plugin_counts_two_allocates_and_turns_healthy(tmp_path: Path) -> None:
    from tests.kubelet_sim import KubeletSimulator

    if not _serve_has_metrics_flag():
        pytest.skip("`cdigen plugin serve` has no --metrics-address flag yet")
    from cdigen.cli import main

    spec_dir, plugin_dir, empty = tmp_path / "cdi", tmp_path / "plugins", tmp_path / "empty"
    node = "builtin:dgx-a100"
    empty.mkdir()  # a root that points at nothing is refused
    root = ["--driver-root", str(empty), "--dev-root", str(empty)]
    assert main(["generate", "--node", node, *root, "--output-dir", str(spec_dir)]) == 0

    with KubeletSimulator(plugin_dir) as kubelet:
        # the simulator's socket exists before the plugin starts, as on a node
        command = [sys.executable, "-m", "cdigen.cli", "--log-level", "info", "plugin", "serve"]
        options = ["--node", node, "--plugin-dir", str(plugin_dir), "--spec-dir", str(spec_dir)]
        process = subprocess.Popen(
            [*command, *options, "--metrics-address", "127.0.0.1:0"],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        lines: list[str] = []
        try:
            base = _bound_url(process, lines, timeout_s=30)
            kubelet.wait_registered(GPU, timeout_s=30)
            devices = kubelet.wait_devices(GPU, lambda d: len(d) == 8, timeout_s=30)
            ids = sorted(d.ID for d in devices)
            assert len(kubelet.preferred(GPU, ids, 2)) == 2
            for device in ids[:2]:
                answer = kubelet.allocate(GPU, [[device]])
                cdi = answer.container_responses[0].cdi_devices
                assert [c.name for c in cdi] == [f"nvidia.com/gpu={device}"]

            deadline = time.monotonic() + 10
            while get(base + "/healthz")[0] != 200 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert get(base + "/healthz")[0] == 200
            samples = scrape(base)
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            finally:
                if process.poll() is None:
                    process.kill()

    alloc = {"method": "Allocate", "resource": GPU}
    pref = {"method": "GetPreferredAllocation", "resource": GPU}
    assert value(samples, "cdigen_plugin_requests_total", **alloc) == 2
    assert value(samples, "cdigen_plugin_request_errors_total", **alloc) == 0
    assert value(samples, "cdigen_plugin_request_duration_seconds_count", **alloc) == 2
    assert value(samples, "cdigen_plugin_requests_total", **pref) == 1
    # two GPUs of a DGX A100 share 12 NVLinks: one preferred answer with score >= 1200
    assert value(samples, "cdigen_plugin_preferred_allocation_link_score_count", resource=GPU) == 1
    assert value(samples, "cdigen_plugin_preferred_allocation_link_score_sum", resource=GPU) >= 1200
    assert value(samples, "cdigen_plugin_devices", resource=GPU, health="Healthy") == 8
    assert value(samples, "cdigen_plugin_registrations_total", resource=GPU, result="success") >= 1
    assert value(samples, "cdigen_plugin_policy_info", resource=GPU, policy="default") == 1
