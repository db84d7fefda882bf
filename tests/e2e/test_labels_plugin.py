"""The plugins keep the node labels current in a Node Feature Discovery feature file.

The device plugin serves a node file to the kubelet simulator (real gRPC, real unix sockets);
a health flip and a MIG repartition in that file must reach the feature file, each as one atomic
replacement, read back as NFD's local source reads it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cdigen.discover import load_node
from cdigen.labels import node_labels
from cdigen.nodefile import dump_node
from cdigen.plugin.agent.xid import xid_reason
from cdigen.plugin.deviceplugin.config import HealthConfig, PluginConfig
from cdigen.plugin.deviceplugin.runner import Plugin
from tests.cdihost import FakeHost, build_host, make_node
from tests.helpers.dra import Harness
from tests.helpers.mig import repartition
from tests.helpers.served import ServedPlugin, cdigen
from tests.kubelet_sim import KubeletSimulator

MIXED = "builtin:dgx-a100-mig-mixed"


def nfd_read(directory: Path) -> dict[str, str]:
    """The labels NFD's local source takes from ``directory``: every file not starting with
    ``.``, lines ``key=value`` (``key`` alone means ``true``), ``#`` lines skipped."""
    labels: dict[str, str] = {}
    for path in sorted(directory.iterdir()):
        if path.name.startswith("."):
            continue
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                labels[key] = value if "=" in line else "true"
    return labels


def wait_for(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_feature_file_follows_health_and_mig_changes(tmp_path: Path) -> None:
    node = load_node(MIXED)
    node_file = tmp_path / "node.yaml"
    node_file.write_text(dump_node(node))
    features = tmp_path / "features.d"
    feature_file = features / "cdigen-device-plugin"
    config = PluginConfig(
        node=str(node_file),
        plugin_dir=tmp_path / "plugins",
        spec_dirs=(tmp_path / "cdi",),
        mig_strategy="mixed",
        device_list_strategy="envvar",  # no spec needed: the labels are under test
        health=HealthConfig(poll_interval_s=0.05, recover_after_s=60),
        features_file=feature_file,
    )
    plugin = Plugin(config)
    with KubeletSimulator(config.plugin_dir) as kubelet:
        plugin.start()
        try:
            kubelet.wait_registered("nvidia.com/mig-7g.80gb")
            labels = nfd_read(features)
            assert labels == node_labels(node, mig_strategy="mixed")
            assert labels["nvidia.com/gpu.present"] == "true"
            assert labels["cdigen.dev/gpu.healthy"] == "8"
            assert labels["nvidia.com/mig-7g.80gb.count"] == "1"
            writes, inode = plugin.features.writes, feature_file.stat().st_ino

            # health: GPU 5 (no MIG) goes down in the node file
            sick = dataclasses.replace(
                node,
                gpus=tuple(dataclasses.replace(g, healthy=g.index != 5) for g in node.gpus),
            )
            node_file.write_text(dump_node(sick))
            kubelet.wait_devices(
                "nvidia.com/gpu", lambda d: any(x.health == "Unhealthy" for x in d)
            )
            wait_for(lambda: nfd_read(features)["cdigen.dev/gpu.healthy"] == "7")
            assert plugin.features.writes == writes + 1  # one rewrite for one change
            assert feature_file.stat().st_ino != inode  # replaced (renamed over), not edited
            assert nfd_read(features)["nvidia.com/gpu.count"] == "8"  # GFD counts every GPU

            # MIG: a repartition (GPU 3: 7g.80gb -> 2x 3g.40gb; GPU 4 gets a 4g.40gb)
            new = repartition(sick)
            node_file.write_text(dump_node(new))
            kubelet.wait_registered("nvidia.com/mig-4g.40gb")
            wait_for(lambda: "nvidia.com/mig-4g.40gb.count" in nfd_read(features))
            labels = nfd_read(features)
            assert labels["nvidia.com/mig-4g.40gb.count"] == "1"
            assert labels["nvidia.com/mig-3g.40gb.count"] == "5"
            assert not any(k.startswith("nvidia.com/mig-7g.80gb.") for k in labels)
            assert labels["cdigen.dev/gpu.healthy"] == "7"
            assert labels == node_labels(new, mig_strategy="mixed")
            # only the file itself in the directory: no temporary file left behind
            assert os.listdir(features) == ["cdigen-device-plugin"]
        finally:
            plugin.stop()
    # kept when the plugin stops: nvidia.com/gpu.present selects the DaemonSet (docs/labels.md)
    assert nfd_read(features)["nvidia.com/gpu.present"] == "true"


def test_without_features_file_nothing_is_written(tmp_path: Path) -> None:
    config = PluginConfig(
        node="builtin:rtx4090",
        plugin_dir=tmp_path / "plugins",
        spec_dirs=(tmp_path / "cdi",),
        device_list_strategy="envvar",
    )
    plugin = Plugin(config)
    with KubeletSimulator(config.plugin_dir) as kubelet:
        plugin.start()
        try:
            kubelet.wait_registered("nvidia.com/gpu")
            assert plugin.features.writes == 0
        finally:
            plugin.stop()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plugins"]


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return build_host(tmp_path / "host", make_node(3, mig_gpu=2))


def test_dra_plugin_rewrites_the_feature_file_on_health_and_mig_changes(
    harness: Harness, tmp_path: Path
) -> None:
    features = tmp_path / "features.d"
    plugin = harness.start(features_file=features / "cdigen-dra-plugin")
    labels = nfd_read(features)
    assert labels == node_labels(plugin.node, mig_strategy="mixed")
    assert labels["cdigen.dev/gpu.healthy"] == "3"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    mig_counts = {k: v for k, v in labels.items() if k.endswith(".count") and "/mig-" in k}
    assert mig_counts  # GPU 2's MIG devices

    gpu1 = plugin.node.gpus[1].uuid
    plugin.board.set_reasons("xid", {gpu1: xid_reason(79)})
    assert nfd_read(features)["cdigen.dev/gpu.healthy"] == "2"
    plugin.board.set_reasons("xid", {gpu1: None})
    assert nfd_read(features)["cdigen.dev/gpu.healthy"] == "3"

    node = plugin.node
    gpus = list(node.gpus)
    gpus[2] = dataclasses.replace(gpus[2], mig_enabled=False, mig_devices=())
    assert plugin.apply_node(dataclasses.replace(node, gpus=tuple(gpus)))
    labels = nfd_read(features)
    assert not any("/mig-" in k for k in labels)
    assert labels["cdigen.dev/gpu.healthy"] == "3"
    assert os.listdir(features) == ["cdigen-dra-plugin"]


def test_plugin_serve_writes_the_feature_file_and_keeps_it_at_exit(tmp_path: Path) -> None:
    features = tmp_path / "features.d"
    served = ServedPlugin(
        tmp_path,
        "--node",
        "builtin:dgx-h100",
        "--device-list-strategy",
        "envvar",
        "--features-file",
        str(features / "cdigen-device-plugin"),
    )
    with KubeletSimulator(served.plugin_dir) as kubelet:
        try:
            kubelet.wait_registered("nvidia.com/gpu")
            wait_for(lambda: features.is_dir() and bool(os.listdir(features)))
            labels = nfd_read(features)
            assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
            assert labels == node_labels(load_node("builtin:dgx-h100"))
        finally:
            assert served.stop() == 0
    assert nfd_read(features) == labels  # kept: see docs/labels.md, "When the plugin stops"
    assert "node labels written to" in served.logs() and "Traceback" not in served.logs()


def test_an_empty_features_file_path_is_one_line_exit_2() -> None:
    result = cdigen(
        "plugin", "serve", "--node", "builtin:rtx4090", "--features-file", "", check=False
    )
    assert result.returncode == 2
    assert "--features-file" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
