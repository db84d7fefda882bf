"""``cdigen plugin serve`` against the kubelet's own device-plugin code (``kubeletsim -once``).

kubeletsim (../shared/tools/bin, README beside it) deletes every socket in the plugin dir before
it creates kubelet.sock, as the kubelet does, registers and allocates, restarts, and fails when a
resource registers or connects more than once in a round. Both boot orders run for whole GPUs,
MIG devices (mixed strategy) and memory slices with replicas; the spec dir holds what
``cdigen generate`` writes for a fake host with real device nodes, which kubeletsim resolves the
returned CDI names against. The registration times are printed (``pytest -s``) and recorded as
test properties.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from cdigen.discover import load_node
from plugin.resources import plan_resources
from tests.cdihost import build_host
from tests.helpers.shared import needs_shared_tool, shared_path

KUBELETSIM = shared_path("tools/bin/kubeletsim")
ROUND = re.compile(r"^ROUND ([12]): all of \[.*\] (?:re-)?registered in (\S+)$", re.M)
GO_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|us|µs|ns|m|s)")
GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}

SLICES_CONFIG = """\
resources:
  - name: nvidia.com/gpu
  - name: nvidia.com/gpu-memory
    sharing:
      memorySliceMiB: 4096
  - name: nvidia.com/gpu.shared
    sharing:
      replicas: 4
"""


@dataclass(frozen=True)
class Case:
    """A node and the plugin flags that serve it."""

    node: str
    mig_strategy: str = "none"
    config: str | None = None
    count: int = 2  # devices kubeletsim asks for per container


CASES = {
    "dgx-a100": Case("builtin:dgx-a100"),
    # one MIG profile has a single device: one per container
    "dgx-a100-mig-mixed": Case("builtin:dgx-a100-mig-mixed", mig_strategy="mixed", count=1),
    "memory-slices": Case("builtin:dgx-a100", config=SLICES_CONFIG),
}

pytestmark = needs_shared_tool("kubeletsim")


def go_duration(text: str) -> float:
    """Seconds in a Go ``time.Duration`` string (``248ms``, ``1.5s``, ``1m2.5s``)."""
    parts = GO_DURATION_PART.findall(text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a Go duration: {text!r}"
    return sum(float(number) * GO_UNITS[unit] for number, unit in parts)


def expected_resources(case: Case) -> list[str]:
    """Every resource the plugin serves for ``case``, as kubeletsim must see them register."""
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
            pytest.skip("mknod is not permitted here: kubeletsim needs real device nodes")
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


def run_kubeletsim(plugin_dir: Path, spec_dir: Path, case: Case) -> subprocess.Popen[str]:
    args = ["-dir", str(plugin_dir), "-spec-dir", str(spec_dir), "-once"]
    args += ["-expect", ",".join(expected_resources(case)), "-count", str(case.count)]
    return subprocess.Popen(
        [str(KUBELETSIM), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.mark.parametrize("order", ["kubelet-first", "plugin-first"])
@pytest.mark.parametrize("case_id", list(CASES))
def test_kubeletsim_once_passes(
    tmp_path: Path,
    spec_dirs: dict[str, Path],
    case_id: str,
    order: str,
    record_property: pytest.RecordProperty,
) -> None:
    case = CASES[case_id]
    spec_dir = spec_dirs[case.node]
    plugin_dir = tmp_path / "plugins"
    kubelet_sock = plugin_dir / "kubelet.sock"
    plugin: Plugin | None = None
    sim: subprocess.Popen[str] | None = None
    try:
        if order == "kubelet-first":
            plugin_dir.mkdir()
            sim = run_kubeletsim(plugin_dir, spec_dir, case)
            deadline = time.monotonic() + 10
            while not kubelet_sock.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            plugin = Plugin(tmp_path, case, spec_dir, plugin_dir)
        else:  # node boot: the plugin is up and waiting, the kubelet comes 3 s later
            plugin = Plugin(tmp_path, case, spec_dir, plugin_dir)
            plugin.wait_for(rf"waiting for the kubelet at {re.escape(str(kubelet_sock))}")
            assert plugin.healthz() == (503, f"waiting for kubelet at {kubelet_sock}\n")
            time.sleep(3)
            sim = run_kubeletsim(plugin_dir, spec_dir, case)
        output, _ = sim.communicate(timeout=120)
    finally:
        if sim is not None and sim.poll() is None:
            sim.kill()
        exit_code = plugin.stop() if plugin is not None else None
    assert plugin is not None
    log = plugin.text()
    tail = "\n".join(output.splitlines()[-15:])
    assert sim.returncode == 0, f"kubeletsim failed:\n{tail}\n--- plugin log:\n{log[-3000:]}"
    assert exit_code == 0 and "Traceback" not in log
    assert "refused registration" not in log and "registration attempt" not in log
    times = {int(n): go_duration(t) for n, t in ROUND.findall(output)}
    assert sorted(times) == [1, 2], tail
    own = re.search(r"registered .* with the kubelet in (\d+) ms", log)
    assert own is not None, log[-3000:]
    print(
        f"\nkubeletsim {case_id} {order}: round 1 registered in {times[1] * 1000:.0f} ms, "
        f"round 2 (kubelet restart) in {times[2] * 1000:.0f} ms; "
        f"the plugin's first Register calls took {own.group(1)} ms"
    )
    record_property("round1_registered_s", times[1])
    record_property("round2_registered_s", times[2])
    if order == "plugin-first":  # counted from kubelet.sock appearing (not from our own start)
        assert times[1] < 1.0
        before = log.split("registered ", 1)[0]  # one line while it waited, then no more
        assert len(re.findall(r"waiting for the kubelet at", before)) == 1
    assert times[2] < 1.0
