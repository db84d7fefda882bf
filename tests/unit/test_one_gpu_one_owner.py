"""One GPU, one owner: through the kubelet simulator, no GPU is ever allocated whole to one pod
and in shares to another, or in shares of two resources.

The configs are every plugin config the docs and deploy/kubernetes show (YAML blocks of
docs/*.md and README.md; NVIDIA-format ones converted first; the PluginConfig files), found
afresh on each run so that a new one is covered, plus overlapping ones written here: those must
be refused, naming both resources. A config that serves is driven the way the kubelet drives
it: each resource's every advertised device is allocated, one per container, and what Allocate
returns says which GPU each container got.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdigen.cli import main
from cdigen.discover import load_node
from cdigen.errors import InputError
from cdigen.model import Node
from cdigen.plugin.deviceplugin.config import (
    PluginConfig,
    config_from_document,
    load_config,
    validate_config,
)
from cdigen.plugin.deviceplugin.nvidia_config import convert, is_nvidia_config
from cdigen.plugin.deviceplugin.runner import Plugin
from tests.kubelet_sim import KubeletSimulator

ROOT = Path(__file__).resolve().parents[2]
NODES = ("builtin:rtx4090", "builtin:pcie-8x4090")
POLICIES = ROOT / "deploy" / "kubernetes" / "base" / "policies"


def _is_plugin_config(doc: Any) -> bool:
    if not isinstance(doc, dict):
        return False
    resources = doc.get("resources")
    return doc.get("kind") == "PluginConfig" or (
        isinstance(resources, list) and all(isinstance(r, dict) for r in resources)
    )


def shown_configs(*, refused: bool = False) -> dict[str, dict[str, Any]]:
    """Every plugin config the docs and the deploy tree show, by where it is; with
    ``refused``, those the docs show as refused instead (a first line saying "(refused)")."""
    found: dict[str, dict[str, Any]] = {}
    for page in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        text = page.read_text(encoding="utf-8")
        for n, block in enumerate(re.findall(r"```ya?ml\n(.*?)```", text, re.S)):
            if ("(refused)" in block.partition("\n")[0]) != refused:
                continue
            for doc in yaml.safe_load_all(block):
                where = f"{page.relative_to(ROOT)}#{n}"
                if is_nvidia_config(doc) and isinstance(doc, dict) and "version" in doc:
                    found[where] = convert(doc, where=where).document
                elif _is_plugin_config(doc):
                    found[where] = doc
    for path in sorted((ROOT / "deploy").rglob("*.yaml")) if not refused else ():
        # Helm templates are not YAML until rendered; the chart's render is held equal to the
        # kustomize layouts scanned here (tests/unit/test_helm_chart.py).
        if "templates" in path.relative_to(ROOT).parts:
            continue
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and doc.get("kind") == "PluginConfig":
                found[str(path.relative_to(ROOT))] = doc
    return found


SHOWN = shown_configs()
SHOWN_REFUSED = shown_configs(refused=True)

# Configs in which two resources would advertise one GPU (the issue's own first).
OVERLAPPING = {
    "whole and slices": "resources: [{name: nvidia.com/gpu}, "
    "{name: nvidia.com/gpu-memory, sharing: {memorySliceMiB: 1024}}]",
    "replicas and slices": "resources: [{name: a.com/r, sharing: {replicas: 4}}, "
    "{name: a.com/s, sharing: {memorySliceMiB: 1024}}]",
    "one selected, one not": "resources: [{name: nvidia.com/gpu, gpus: [0]}, "
    "{name: a.com/r, sharing: {replicas: 2}}]",
    "same index": "resources: [{name: nvidia.com/gpu, gpus: [0, 1]}, "
    "{name: a.com/r, gpus: [1], sharing: {replicas: 2}}]",
    "index and product": "resources: [{name: nvidia.com/gpu, gpus: [0]}, "
    "{name: a.com/r, gpus: ['*4090*'], sharing: {replicas: 2}}]",
    "uuid and index": "resources: [{name: nvidia.com/gpu, "
    "gpus: [GPU-ce6c85c1-512d-5e26-be74-920a86ee9732]}, "
    "{name: a.com/s, gpus: [0], sharing: {memorySliceMiB: 2048}}]",
}


@pytest.fixture(scope="module")
def spec_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for node in NODES:
        out[node] = tmp_path_factory.mktemp("cdi")
        assert main(["generate", "--node", node, "--output-dir", str(out[node])]) == 0
    return out


def served_config(doc: dict[str, Any], where: str, tmp_path: Path, spec_dir: Path) -> PluginConfig:
    """``doc`` loaded as ``plugin serve --config`` loads it, pointed at the test's dirs."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    config = load_config(
        path,
        env={},
        flags={
            "plugin_dir": tmp_path / "plugins",
            "spec_dirs": [str(spec_dir)],
            "policy_dir": POLICIES,
            "device_list_strategy": "cdi-cri",
        },
    )
    # the test's node, and no spec writing: the generated spec is in spec_dir
    return dataclasses.replace(config, generate_specs=False, features_file=None)


def owners_after_allocating_everything(config: PluginConfig, node: Node) -> dict[str, set[str]]:
    """GPU UUID -> the resources whose pods Allocate gave it, after the kubelet allocated every
    device of every resource, one per container."""
    plugin = Plugin(config, node=node)
    got: dict[str, set[str]] = {}
    with KubeletSimulator(config.plugin_dir) as kubelet:
        plugin.start()
        try:
            for resource in plugin.resources:
                if not resource.devices:  # its gpus are not on this node: nothing to allocate
                    continue
                kubelet.wait_registered(resource.name)
                devices = [d.ID for d in kubelet.wait_devices(resource.name)]
                response = kubelet.allocate(resource.name, [[d] for d in devices])
                for container in response.container_responses:
                    for name in container.cdi_devices:
                        uuid = name.name.partition("=")[2]
                        if not uuid.startswith("capability-"):
                            got.setdefault(uuid, set()).add(resource.name)
        finally:
            plugin.stop()
    return got


def test_the_docs_show_plugin_configs() -> None:
    assert any(w.startswith("docs/sharing.md") for w in SHOWN)
    assert any(w.startswith("docs/sharing.md") for w in SHOWN_REFUSED)
    assert any(w.startswith("docs/plugin.md") for w in SHOWN)
    assert any(w.startswith("deploy/kubernetes/components/mps") for w in SHOWN)


@pytest.mark.parametrize("node_source", NODES)
@pytest.mark.parametrize("where", sorted(SHOWN))
def test_every_config_shown_gives_each_gpu_one_owner(
    where: str, node_source: str, tmp_path: Path, spec_dirs: dict[str, Path]
) -> None:
    config = served_config(SHOWN[where], where, tmp_path, spec_dirs[node_source])
    node = load_node(node_source)
    owners = owners_after_allocating_everything(config, node)
    assert owners, f"{where}: nothing was allocated"
    shared = {uuid: sorted(names) for uuid, names in owners.items() if len(names) > 1}
    assert not shared, f"{where}: GPUs handed out by two resources: {shared}"


@pytest.mark.parametrize("where", sorted(SHOWN_REFUSED))
def test_configs_the_docs_show_as_refused_are(where: str, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(SHOWN_REFUSED[where]))
    with pytest.raises(InputError, match="would both advertise"):
        load_config(path, env={})


@pytest.mark.parametrize("case", sorted(OVERLAPPING))
def test_overlapping_configs_are_refused_naming_both_resources(
    case: str, tmp_path: Path, spec_dirs: dict[str, Path]
) -> None:
    doc = yaml.safe_load(OVERLAPPING[case])
    names = [r["name"] for r in doc["resources"]]
    # the UUID is the RTX 4090's: only that node shows the overlap
    for node_source in NODES[:1] if "uuid" in case else NODES:
        with pytest.raises(InputError) as caught:
            config = served_config(doc, case, tmp_path, spec_dirs[node_source])
            owners_after_allocating_everything(config, load_node(node_source))
        message = str(caught.value)
        assert f"resources {names[0]} and {names[1]} would both advertise" in message
        assert "\n" not in message


def test_a_config_built_without_loading_is_refused_at_planning_too(
    spec_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """The rule holds for a config that skipped load_config's checks (a library user)."""
    doc = yaml.safe_load(OVERLAPPING["whole and slices"])
    config = config_from_document(doc, where="inline")
    with pytest.raises(InputError, match="would both advertise GPU 0"):
        Plugin(config, node=load_node(NODES[0]))
    with pytest.raises(InputError, match="would both advertise every GPU"):
        validate_config(config)
