"""``cdigen plugin serve`` through two kubelet rounds, as the kubelet's device manager runs them.

The kubelet simulator (tests/kubelet_sim.py, ``clean_start``) removes every socket in the plugin
dir before it creates kubelet.sock, as the kubelet does when it starts, checks each registration
as the device manager does, and lists and allocates; then it restarts (round 2). Each round every
resource registers exactly once and within a second, and the CDI names Allocate returns resolve
in podman's CDI library (tests/helpers/cdi_runtime.py) against the spec dir ``cdigen generate``
wrote for a fake host with real device nodes. Both boot orders run for whole GPUs, MIG devices
(mixed strategy) and memory slices with replicas. (This replaces a check against a kubeletsim
tool in ../shared that no clone or CI has.)
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cdigen.discover import load_node
from cdigen.plugin.deviceplugin.resources import plan_resources
from tests.cdihost import build_host
from tests.helpers.cdi_runtime import CdiRuntime, cdi_runtime
from tests.kubelet_sim import KubeletSimulator

# One GPU, one owner: each resource its own GPUs of the eight
SLICES_CONFIG = """\
resources:
  - name: nvidia.com/gpu
    gpus: [0, 1, 2]
  - name: nvidia.com/gpu-memory
    gpus: [3, 4, 5]
    sharing:
      memorySliceMiB: 4096
  - name: nvidia.com/gpu.shared
    gpus: [6, 7]
    sharing:
      replicas: 4
"""


@dataclass(frozen=True)
class Case:
    """A node and the plugin flags that serve it."""

    node: str
    mig_strategy: str = "none"
    config: str | None = None
    count: int = 2  # devices the kubelet asks for per container


CASES = {
    "dgx-a100": Case("builtin:dgx-a100"),
    # one MIG profile has a single device: one per container
    "dgx-a100-mig-mixed": Case("builtin:dgx-a100-mig-mixed", mig_strategy="mixed", count=1),
    "memory-slices": Case("builtin:dgx-a100", config=SLICES_CONFIG),
}


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiRuntime]:
    yield from cdi_runtime(tmp_path_factory)


def expected_resources(case: Case) -> list[str]:
    """Every resource the plugin serves for ``case``, as the kubelet must see them register."""
    if case.config is not None:
        return re.findall(r"- name: (\S+)", case.config)
    node = load_node(case.node)
    planned = plan_resources(
        node, case.mig_strategy, gpu_resource="nvidia.com/gpu", cdi_kind="nvidia.com/gpu"
    )
    return [r.name for r in planned]


@pytest.fixture(scope="module")
def spec_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The CDI spec dir of each node, generated for a fake host with real device nodes."""
    out: dict[str, Path] = {}
    for node in sorted({c.node for c in CASES.values()}):
        base = tmp_path_factory.mktemp(node.replace(":", "-"))
        host = build_host(base / "host", load_node(node))
        if not host.real_nodes:
            pytest.skip("mknod is not permitted here: podman needs real device nodes")
        spec_dir = base / "cdi"
        args = ["generate", "--node", node, "--output-dir", str(spec_dir)]
        args += ["--driver-root", str(host.driver_root), "--dev-root", str(host.dev_root)]
        subprocess.run(
            [sys.executable, "-m", "cdigen.cli", *args],
            check=True,
            capture_output=True,
        )
        out[node] = spec_dir
    return out


class Plugin:
    """``cdigen plugin serve`` as a process, its log in a file."""

    def __init__(self, tmp: Path, case: Case, spec_dir: Path, plugin_dir: Path) -> None:
        self.log = tmp / "plugin.log"
        args = ["--node", case.node, "--plugin-dir", str(plugin_dir), "--spec-dir", str(spec_dir)]
        args += ["--mig-strategy", case.mig_strategy, "--metrics-address", "127.0.0.1:0"]
        if case.config is not None:
            config = tmp / "plugin.yaml"
            config.write_text(case.config)
            args += ["--config", str(config)]
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cdigen.cli", "plugin", "serve", *args],
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def text(self) -> str:
        return self.log.read_text()

    def wait_for(self, pattern: str, timeout_s: float = 60) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text(), re.M)
            if found:
                return found
            assert self.proc.poll() is None, f"the plugin exited:\n{self.text()}"
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in the plugin log:\n{self.text()}")

    def healthz(self) -> tuple[int, str]:
        port = self.wait_for(r"/healthz on http://127\.0\.0\.1:(\d+)").group(1)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()

    def stop(self) -> int:
        try:
            if self.proc.poll() is None:
                self.proc.terminate()
            return self.proc.wait(timeout=10)
        finally:
            self._out.close()


def run_round(kubelet: KubeletSimulator, case: Case, started: float) -> tuple[float, list[str]]:
    """Wait until every resource registered once, list and allocate ``case.count`` devices of
    each; the seconds from ``started`` to the last registration, and the CDI names returned."""
    resources = expected_resources(case)
    last = max(kubelet.wait_registered(r, timeout_s=10).at for r in resources)
    names: list[str] = []
    for resource in resources:
        devices = kubelet.wait_devices(resource, lambda d: len(d) >= case.count)
        healthy = [d.ID for d in devices if d.health == "Healthy"]
        assert len(healthy) >= case.count, (resource, devices)
        ids = kubelet.preferred(resource, healthy, case.count)
        response = kubelet.allocate(resource, [ids])
        (container,) = response.container_responses
        assert container.cdi_devices, (resource, container)
        names += [d.name for d in container.cdi_devices]
    time.sleep(0.3)  # a second registration or connection in the round would show by now
    assert {r: kubelet.registration_count(r) for r in resources} == dict.fromkeys(resources, 1)
    assert not kubelet.rejections, kubelet.rejections
    return last - started, names


@pytest.mark.parametrize("order", ["kubelet-first", "plugin-first"])
@pytest.mark.parametrize("case_id", list(CASES))
def test_two_kubelet_rounds(
    tmp_path: Path,
    spec_dirs: dict[str, Path],
    podman: CdiRuntime,
    case_id: str,
    order: str,
    record_property: pytest.RecordProperty,
) -> None:
    case = CASES[case_id]
    spec_dir = spec_dirs[case.node]
    plugin_dir = tmp_path / "plugins"
    kubelet_sock = plugin_dir / "kubelet.sock"
    plugin: Plugin | None = None
    kubelet: KubeletSimulator | None = None
    try:
        if order == "kubelet-first":
            started = time.monotonic()
            kubelet = KubeletSimulator(plugin_dir, clean_start=True).start()
            plugin = Plugin(tmp_path, case, spec_dir, plugin_dir)
        else:  # node boot: the plugin is up and waiting, the kubelet comes a second later
            plugin_dir.mkdir()
            plugin = Plugin(tmp_path, case, spec_dir, plugin_dir)
            plugin.wait_for(rf"waiting for the kubelet at {re.escape(str(kubelet_sock))}")
            assert plugin.healthz() == (503, f"waiting for kubelet at {kubelet_sock}\n")
            time.sleep(1)
            started = time.monotonic()
            kubelet = KubeletSimulator(plugin_dir, clean_start=True).start()
        first, names = run_round(kubelet, case, started)
        kubelet.stop()  # the kubelet restarts: a new one removes every socket in the dir
        started = time.monotonic()
        kubelet = KubeletSimulator(plugin_dir, clean_start=True).start()
        second, again = run_round(kubelet, case, started)
    finally:
        if kubelet is not None:
            kubelet.stop()
        exit_code = plugin.stop() if plugin is not None else None
    assert plugin is not None
    log = plugin.text()
    assert exit_code == 0 and "Traceback" not in log
    assert "refused registration" not in log and "registration attempt" not in log
    seen = podman.run(spec_dir, sorted(set(names + again)))
    assert seen.ok, seen.error
    own = re.search(r"registered .* with the kubelet in (\d+) ms", log)
    assert own is not None, log[-3000:]
    print(
        f"\n{case_id} {order}: round 1 registered in {first * 1000:.0f} ms, "
        f"round 2 (kubelet restart) in {second * 1000:.0f} ms; "
        f"the plugin's first Register calls took {own.group(1)} ms"
    )
    record_property("round1_registered_s", first)
    record_property("round2_registered_s", second)
    if order == "plugin-first":  # counted from kubelet.sock appearing (not from our own start)
        assert first < 1.0
        before = log.split("registered ", 1)[0]  # one line while it waited, then no more
        assert len(re.findall(r"waiting for the kubelet at", before)) == 1
    assert second < 1.0
