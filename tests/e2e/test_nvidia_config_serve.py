"""NVIDIA's documented configs, converted, served: the kubelet sees the resources NVIDIA's
plugin advertises for them (names and device counts), through a real ``plugin serve``."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdigen.discover import load_node
from tests.helpers.nvidia_configs import MIG_MIXED, MPS, RENAMED, TIME_SLICING
from tests.helpers.served import ServedPlugin, cdigen
from tests.kubelet_sim import KubeletSimulator


def _expected(node: str, case: str) -> dict[str, int]:
    """What NVIDIA's plugin advertises for ``case`` on ``node``: resource -> device count."""
    gpus = load_node(node).gpus
    if case == "time-slicing":
        return {"nvidia.com/gpu": 10 * len(gpus)}
    if case == "renameByDefault":
        return {"nvidia.com/gpu.shared": 4 * len(gpus)}
    if case == "mps":
        return {"nvidia.com/gpu": 10 * len(gpus)}
    counts: dict[str, int] = {}  # mig-mixed: one resource per profile, whole GPUs without MIG
    for gpu in gpus:
        if not gpu.mig_enabled:
            counts["nvidia.com/gpu"] = counts.get("nvidia.com/gpu", 0) + 1
        for mig in gpu.mig_devices:
            name = f"nvidia.com/mig-{mig.profile}"
            counts[name] = counts.get(name, 0) + 1
    return counts


@pytest.mark.parametrize(
    ("case", "text", "node"),
    [
        ("time-slicing", TIME_SLICING, "builtin:dgx-a100"),
        ("renameByDefault", RENAMED, "builtin:pcie-8x4090"),
        ("mps", MPS, "builtin:rtx4090"),
        ("mig-mixed", MIG_MIXED, "builtin:dgx-a100-mig-mixed"),
    ],
)
def test_converted_nvidia_configs_advertise_what_nvidias_plugin_does(
    case: str, text: str, node: str, tmp_path: Path
) -> None:
    source = tmp_path / "nvidia.yaml"
    source.write_text(text)
    config = tmp_path / "cdigen.yaml"
    cdigen("plugin", "config", "convert", str(source), "--output", str(config))
    expected = _expected(node, case)
    kubelet = KubeletSimulator(tmp_path / "plugins").start()
    plugin = ServedPlugin(tmp_path, "--node", node, "--config", str(config))
    try:
        for resource, count in expected.items():
            kubelet.wait_registered(resource, timeout_s=20)
            devices = kubelet.wait_devices(resource, lambda d, n=count: len(d) == n)
            assert len(devices) == count, resource
        assert sorted({r.resource for r in kubelet.registrations}) == sorted(expected)
    finally:
        assert plugin.stop() == 0
        kubelet.stop()
    assert "Traceback" not in plugin.logs()
