"""Per-pod attribution on both wings: two pods share one RTX 4090, the kubelet's PodResources API
(our own server on a real unix socket) reports what the kubelet simulators were actually given,
and both the plugin's /metrics and ``cdigen plugin pods`` / ``cdigen dra pods`` show each pod
with its limit."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdigen.discover import load_node
from cdigen.plugin.dra.mps import MpsSettings
from cdigen.plugin.dra.slices import MemoryShares
from tests.cdihost import build_host
from tests.fake_apiserver import FakeApiServer, allocated_claim
from tests.helpers.dra import DRIVER, NODE_NAME, Harness
from tests.kubelet_sim import KubeletSimulator
from tests.podresources_sim import PodResourcesSim

SLICES = "nvidia.com/gpu-memory"
GIB = 1 << 30
CONFIG = f"""\
resources:
  - name: {SLICES}
    sharing:
      memorySliceMiB: 1024
"""
UUID = load_node("builtin:rtx4090").gpus[0].uuid


def cdigen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdigen.cli", *args], capture_output=True, text=True, timeout=60
    )


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of one metric: sorted labels -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def by(metric: dict[tuple[tuple[str, str], ...], float], **labels: str) -> list[float]:
    return [v for k, v in metric.items() if labels.items() <= dict(k).items()]


DOC = Path(__file__).resolve().parents[2] / "docs" / "attribution.md"


def doc_block(first_line: str) -> str:
    """The rest of the doc's ``text`` block that starts with ``first_line``."""
    for block in re.findall(r"```text\n(.*?)```", DOC.read_text(), re.S):
        if block.startswith(first_line + "\n"):
            return str(block[len(first_line) + 1 :])
    raise AssertionError(f"docs/attribution.md has no text block starting {first_line!r}")


def doc_promql() -> list[str]:
    """The doc's PromQL examples."""
    return [str(b) for b in re.findall(r"```promql\n(.*?)```", DOC.read_text(), re.S)]


def table_rows(stdout: str) -> list[list[str]]:
    lines = stdout.splitlines()
    assert lines[0].split() == [
        "NAMESPACE", "POD", "CONTAINER", "GPU", "GPU-UUID", "KIND", "FROM", "DEVICES", "MEMORY",
    ]  # fmt: skip
    return [line.split() for line in lines[1:]]


class ServedPlugin:
    """``cdigen plugin serve`` as a process with /metrics on a free port."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.log = tmp / "plugin.log"
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cdigen.cli", "plugin", "serve", *args],
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def port(self, timeout_s: float = 60) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(r"/healthz on http://127\.0\.0\.1:(\d+)", self.log.read_text())
            if found:
                return int(found.group(1))
            assert self.proc.poll() is None, self.log.read_text()
            time.sleep(0.05)
        raise AssertionError(f"no metrics address in the log:\n{self.log.read_text()}")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port()}/metrics", timeout=10) as r:
            return str(r.read().decode())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=10)
        self._out.close()


@pytest.fixture
def served(tmp_path: Path, kubelet_dir: Path) -> Iterator[dict[str, Any]]:
    """A device plugin sharing builtin:rtx4090 as 1 GiB slices, the kubelet simulator, and the
    PodResources API beside them (both under ``kubelet_dir``, as on a node)."""
    host = build_host(tmp_path / "host", load_node("builtin:rtx4090"))
    spec_dir = tmp_path / "cdi"
    generated = cdigen(
        "generate", "--node", "builtin:rtx4090", "--output-dir", str(spec_dir),
        "--driver-root", str(host.driver_root), "--dev-root", str(host.dev_root),
    )  # fmt: skip
    assert generated.returncode == 0, generated.stderr
    config = tmp_path / "plugin.yaml"
    config.write_text(CONFIG)
    plugin_dir = kubelet_dir / "device-plugins"
    plugin_dir.mkdir()
    with KubeletSimulator(plugin_dir) as kubelet, PodResourcesSim(kubelet_dir) as pods:
        plugin = ServedPlugin(
            tmp_path,
            "--node", "builtin:rtx4090", "--plugin-dir", str(plugin_dir),
            "--spec-dir", str(spec_dir), "--config", str(config),
            "--metrics-address", "127.0.0.1:0",
        )  # fmt: skip
        try:
            kubelet.wait_registered(SLICES, timeout_s=30)
            yield {"kubelet": kubelet, "pods": pods, "plugin": plugin, "config": config}
        finally:
            plugin.stop()


def test_two_pods_sharing_a_4090_through_the_device_plugin(
    served: dict[str, Any], kubelet_dir: Path
) -> None:
    kubelet, pods, plugin = served["kubelet"], served["pods"], served["plugin"]
    free = [d.ID for d in kubelet.wait_devices(SLICES, lambda d: len(d) == 23)]
    given = {}
    for pod, size in (("notebook-a", 3), ("notebook-b", 4)):
        chosen = kubelet.preferred(SLICES, free, size)
        free = [i for i in free if i not in chosen]
        answer = kubelet.allocate(SLICES, [chosen]).container_responses[0]
        given[pod] = answer.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]
        pods.admit("default", pod, "main", SLICES, chosen)
    pods.admit("default", "other", "main", "example.com/fpga", ["fpga-0"])  # not ours
    assert given == {"notebook-a": "0=3072M", "notebook-b": "0=4096M"}  # what Allocate set

    text = plugin.metrics()
    limits = samples(text, "cdigen_pod_gpu_memory_limit_bytes")
    assert by(limits, namespace="default", pod="notebook-a", container="main", gpu_uuid=UUID) == [
        3 * GIB
    ]
    assert by(limits, pod="notebook-b", gpu_uuid=UUID, kind="slice", source=SLICES) == [4 * GIB]
    assert len(limits) == 2  # the FPGA pod is another plugin's
    devices = samples(text, "cdigen_pod_gpu_devices")
    assert sorted(devices.values()) == [3, 4]
    shares = samples(text, "cdigen_gpu_shares")
    assert by(shares, gpu_uuid=UUID, resource=SLICES, state="used") == [7]
    assert by(shares, gpu_uuid=UUID, resource=SLICES, state="free") == [16]
    assert by(samples(text, "cdigen_gpu_memory_allocated_bytes"), gpu_uuid=UUID) == [7 * GIB]
    assert samples(text, "cdigen_pod_resources_up") == {(): 1.0}

    socket = str(kubelet_dir / "pod-resources" / "kubelet.sock")
    common = ["--node", "builtin:rtx4090", "--config", str(served["config"])]
    result = cdigen("plugin", "pods", *common, "--pod-resources-socket", socket)
    assert result.returncode == 0, result.stderr
    rows = table_rows(result.stdout)
    assert [(r[1], r[3], r[4], r[5], r[6], r[8]) for r in rows] == [
        ("notebook-a", "0", UUID, "slice", SLICES, "3072Mi"),
        ("notebook-b", "0", UUID, "slice", SLICES, "4096Mi"),
    ]
    assert result.stdout == doc_block("# cdigen plugin pods"), "docs/attribution.md's table"
    one = cdigen(
        "plugin", "pods", *common, "--pod-resources-socket", socket,
        "--pod", "default/notebook-b", "--format", "json",
    )  # fmt: skip
    assert one.returncode == 0, one.stderr
    (doc,) = json.loads(one.stdout)
    assert (doc["pod"], doc["memoryLimitBytes"], len(doc["devices"])) == ("notebook-b", 4 * GIB, 4)
    assert pods.calls[-1] == "Get"
    missing = cdigen(
        "plugin", "pods", *common, "--pod-resources-socket", socket, "--pod", "default/nope"
    )
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1
    assert "PodResources Get failed: UNKNOWN: pod nope in namespace default not found" in (
        missing.stderr
    )

    # a pod gone from the kubelet leaves the metrics and frees its shares
    pods.remove("default", "notebook-a")
    text = plugin.metrics()
    assert by(samples(text, "cdigen_gpu_shares"), state="used") == [4]
    assert len(samples(text, "cdigen_pod_gpu_memory_limit_bytes")) == 1


def test_names_from_outside_are_escaped_in_the_table_and_the_metrics(
    served: dict[str, Any], kubelet_dir: Path
) -> None:
    kubelet, pods, plugin = served["kubelet"], served["pods"], served["plugin"]
    free = [d.ID for d in kubelet.wait_devices(SLICES, lambda d: len(d) == 23)]
    kubelet.allocate(SLICES, [free[:1]])
    pods.admit("default", "evil\x1b[2J\npod", "c\tx", SLICES, free[:1])
    socket = str(kubelet_dir / "pod-resources" / "kubelet.sock")
    result = cdigen(
        "plugin", "pods", "--node", "builtin:rtx4090", "--config", str(served["config"]),
        "--pod-resources-socket", socket,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "\t" not in result.stdout
    assert "evil\\x1b[2J\\npod" in result.stdout and "c\\tx" in result.stdout
    assert len(result.stdout.splitlines()) == 2
    text = plugin.metrics()
    assert "\x1b" not in text
    assert by(samples(text, "cdigen_pod_gpu_devices"), pod="evil\\x1b[2J\\npod") == [1]


def test_no_kubelet_socket_is_one_line_and_the_metrics_say_so(tmp_path: Path) -> None:
    result = cdigen(
        "plugin", "pods", "--node", "builtin:rtx4090",
        "--pod-resources-socket", str(tmp_path / "nope.sock"),
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().endswith("--pod-resources-socket")
    assert "nope.sock: no such socket" in result.stderr
    assert result.stderr.count("\n") == 1


def test_a_kubelet_slow_or_gone_costs_one_deadline_and_leaves_the_gpu_series(
    served: dict[str, Any], kubelet_dir: Path
) -> None:
    pods, plugin = served["pods"], served["plugin"]
    socket = str(kubelet_dir / "pod-resources" / "kubelet.sock")
    pods.delay_s = 3.0
    start = time.monotonic()
    result = cdigen(
        "plugin", "pods", "--node", "builtin:rtx4090", "--config", str(served["config"]),
        "--pod-resources-socket", socket, "--timeout", "0.5",
    )  # fmt: skip
    assert result.returncode == 2
    assert "PodResources List failed: DEADLINE_EXCEEDED" in result.stderr
    assert result.stderr.count("\n") == 1
    assert time.monotonic() - start < 2.5 + 2  # the deadline, and the interpreter's start
    bad = cdigen("plugin", "pods", "--node", "builtin:rtx4090", "--timeout", "0")
    assert bad.returncode == 2 and "--timeout: 0 is not a timeout" in bad.stderr

    pods.stop()  # the kubelet is gone: the GPU's series stay, the pods' go
    text = plugin.metrics()
    assert samples(text, "cdigen_pod_resources_up") == {(): 0.0}
    assert samples(text, "cdigen_pod_gpu_devices") == {}
    assert by(samples(text, "cdigen_gpu_shares"), gpu_uuid=UUID, state="free") == [23]
    assert by(samples(text, "cdigen_gpu_healthy"), gpu_uuid=UUID) == [1]
    plugin.metrics()
    log = plugin.log.read_text()
    assert log.count("per-pod attribution:") == 1, log  # once per change of problem


# --------------------------------------------------------------------------- DRA


@pytest.fixture
def dra(api: FakeApiServer, kubelet_dir: Path, tmp_path: Path) -> Iterator[Harness]:
    host = build_host(tmp_path / "dra-host", load_node("builtin:rtx4090"))
    h = Harness(api, host, kubelet_dir, tmp_path)
    yield h
    h.stop()


def test_two_pods_sharing_a_4090_through_dra(
    dra: Harness, api: FakeApiServer, kubelet_dir: Path
) -> None:
    plugin = dra.start(
        memory_shares=MemoryShares(step=GIB),
        mps=MpsSettings(pipe_dir="/run/nvidia/mps", thread_percentage=0),
    )
    with PodResourcesSim(kubelet_dir) as pods:
        for n, (pod, amount) in enumerate((("notebook-a", "3Gi"), ("notebook-b", "5Gi"))):
            result = {
                "request": "share",
                "driver": DRIVER,
                "pool": NODE_NAME,
                "device": "gpu-0",
                "shareID": f"{n + 1}1111111-1111-1111-1111-111111111111",
                "consumedCapacity": {"memory": amount},
            }
            api.add_claim(allocated_claim(f"{pod}-gpu", f"uid-{n}", [result]))
            answer = dra.kubelet.prepare([("default", f"uid-{n}", f"{pod}-gpu")])
            prepared = answer.claims[f"uid-{n}"]
            assert prepared.error == ""
            pods.admit_claim("default", pod, "main", f"{pod}-gpu", DRIVER, prepared.devices)
        # a claim of another driver, and one this plugin never prepared
        pods.admit_claim("default", "other", "main", "fpga-claim", "fpga.example.com", [])

        text = plugin.metrics.exposition().decode()
        limits = samples(text, "cdigen_pod_gpu_memory_limit_bytes")
        assert by(limits, pod="notebook-a", gpu_uuid=UUID, kind="shared") == [3 * GIB]
        assert by(limits, pod="notebook-b", source="default/notebook-b-gpu") == [5 * GIB]
        assert len(limits) == 2
        assert by(samples(text, "cdigen_gpu_memory_allocated_bytes"), gpu_uuid=UUID) == [8 * GIB]
        assert by(samples(text, "cdigen_gpu_shares"), resource=DRIVER, state="used") == [1]

        options = plugin.options
        result = cdigen(
            "dra", "pods", "--node", "builtin:rtx4090", "--driver-name", DRIVER,
            "--kubelet-dir", str(kubelet_dir), "--cdi-dir", str(options.cdi_dir),
            "--pod-resources-socket", str(pods.socket),
            *(["--state-dir", str(options.state_dir)] if options.state_dir else []),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        rows = table_rows(result.stdout)
        assert [(r[1], r[4], r[5], r[6], r[7], r[8]) for r in rows] == [
            ("notebook-a", UUID, "shared", "default/notebook-a-gpu", "gpu-0", "3072Mi"),
            ("notebook-b", UUID, "shared", "default/notebook-b-gpu", "gpu-0", "5120Mi"),
        ]


# --------------------------------------------------------------------------- the dashboard

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "cdigen-dashboard.json"
# Grafana's own variables, as it would fill them in for a short range
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__range": "5m",
    "$__interval": "1s",
    "$instance": ".*",  # the dashboard's plugin filter at All
}


def dashboard_queries() -> list[tuple[str, str]]:
    """Every (panel title, PromQL) of the dashboard, Grafana's variables filled in."""
    doc = json.loads(DASHBOARD.read_text())
    out = []
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(name, value)
            assert "$" not in expr, f"{panel['title']}: unknown variable in {expr}"
            out.append((panel["title"], expr))
    return out


class Prometheus:
    """Debian's ``prometheus`` scraping ``targets`` (job -> port on 127.0.0.1) every second,
    with a temp config and storage and a free port of its own."""

    def __init__(self, binary: str, tmp: Path, targets: dict[str, int]) -> None:
        import socket

        import yaml

        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
                for job, port in targets.items()
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = (tmp / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def query(self, expr: str) -> list[dict[str, Any]]:
        from urllib.parse import urlencode

        url = f"http://127.0.0.1:{self.port}/api/v1/query?{urlencode({'query': expr})}"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                doc = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 503:  # starting: the API answers 503 until its storage is ready
                raise ConnectionError(f"{expr}: Prometheus is not ready yet") from None
            raise AssertionError(f"{expr}: {exc.read().decode()}") from None
        assert doc["status"] == "success", doc
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    def wait_up(self, jobs: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, Path(self.log.name).read_text()
            try:
                up = self.query("up == 1")
            except OSError:
                up = []
            if len(up) == jobs:
                return
            time.sleep(0.2)
        raise AssertionError(f"Prometheus scraped no {jobs} targets:\n{self.query('up')}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=20)
        self.log.close()


def test_every_dashboard_query_is_answered_by_a_real_prometheus(
    served: dict[str, Any], dra: Harness, api: FakeApiServer, tmp_path: Path
) -> None:
    import shutil

    from cdigen.plugin.agent.health import SOURCE_XID
    from cdigen.plugin.agent.xid import xid_reason
    from cdigen.plugin.dra.healthz import HealthServer

    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Debian's prometheus is not installed (apt-get install prometheus; CI does)")
    kubelet, pods, device_plugin = served["kubelet"], served["pods"], served["plugin"]
    plugin = dra.start(memory_shares=MemoryShares(step=GIB))
    health = HealthServer(("127.0.0.1", 0), plugin)
    health.start()
    (tmp_path / "prom").mkdir()
    prometheus = Prometheus(
        binary,
        tmp_path / "prom",
        {"cdigen-plugin": device_plugin.port(), "cdigen-dra": int(health.server_address[1])},
    )
    try:
        prometheus.wait_up(2)
        # what happens while Prometheus watches: two pods on each wing, an Xid on the card
        free = [d.ID for d in kubelet.wait_devices(SLICES, lambda d: len(d) == 23)]
        for pod, size in (("notebook-a", 3), ("notebook-b", 4)):
            chosen = kubelet.preferred(SLICES, free, size)
            free = [i for i in free if i not in chosen]
            kubelet.allocate(SLICES, [chosen])
            pods.admit("default", pod, "main", SLICES, chosen)
        for n, amount in enumerate(("3Gi", "5Gi")):
            result = {
                "request": "share",
                "driver": DRIVER,
                "pool": NODE_NAME,
                "device": "gpu-0",
                "shareID": f"{n + 1}1111111-1111-1111-1111-111111111111",
                "consumedCapacity": {"memory": amount},
            }
            api.add_claim(allocated_claim(f"dra-{n}", f"uid-{n}", [result]))
            answer = dra.kubelet.prepare([("default", f"uid-{n}", f"dra-{n}")])
            prepared = answer.claims[f"uid-{n}"].devices
            pods.admit_claim("default", f"dra-pod-{n}", "main", f"dra-{n}", DRIVER, prepared)
        plugin.board.set_reasons(SOURCE_XID, {UUID: xid_reason(79)})

        queries = dashboard_queries()
        assert len(queries) >= 15
        missing: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            missing = []
            for title, expr in queries:
                result = prometheus.query(expr)
                values = [sample["value"][1] for sample in result]
                # a quantile of a method never called is NaN (a gap in Grafana); the others
                # must be numbers
                if not values or all(v == "NaN" for v in values):
                    missing.append(f"{title}: {expr} -> {values}")
            if not missing:
                break
            time.sleep(0.5)
        assert not missing, "\n".join(missing)
        # the dashboard's plugin filter lists both plugins
        (variable,) = [
            v
            for v in json.loads(DASHBOARD.read_text())["templating"]["list"]
            if v["type"] == "query"
        ]
        assert variable["query"]["query"] == "label_values(cdigen_gpu_healthy, instance)"
        assert len(prometheus.query("group by (instance) (cdigen_gpu_healthy)")) == 2
        for expr in doc_promql():  # the doc's examples are PromQL Prometheus accepts
            prometheus.query(expr)
        # and the data is what happened
        (xids,) = prometheus.query('cdigen_gpu_xid_events_total{job="cdigen-dra"}')
        assert xids["value"][1] == "1"
        rows = prometheus.query("cdigen_pod_gpu_memory_limit_bytes")
        given = sorted((r["metric"]["pod"], int(r["value"][1]) // GIB) for r in rows)
        assert given == [("dra-pod-0", 3), ("dra-pod-1", 5), ("notebook-a", 3), ("notebook-b", 4)]
    finally:
        prometheus.stop()
        health.close()
