"""The example manifests under deploy/*/examples parse, and every name they use exists: the
device plugin's resources in the shipped configs, DRA claim templates, claims and device classes
(issue 26: there was no pod for nvidia.com/gpu-memory: 3 nor for the memory-3gi template)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cdigen.plugin.deviceplugin.config import load_config

REPO = Path(__file__).resolve().parents[2]
PLUGIN_EXAMPLES = REPO / "deploy" / "kubernetes" / "examples"
DRA_EXAMPLES = REPO / "deploy" / "dra" / "examples"


def documents(*folders: Path) -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for folder in folders:
        for path in sorted(folder.glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
                assert isinstance(doc, dict), path
                assert doc.get("apiVersion") and doc.get("kind"), path
                if doc["kind"] in ("Kustomization", "Component"):
                    continue
                assert doc["metadata"]["name"], path
                out.append((path, doc))
    return out


def pods(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    return [(p, d) for p, d in documents(folder) if d["kind"] == "Pod"]


def plugin_resources() -> set[str]:
    """The resources the shipped plugin configs advertise (base and the mps overlay), plus the
    ones the base config shows commented out."""
    names = set()
    for config in sorted((REPO / "deploy" / "kubernetes").rglob("plugin-config.yaml")):
        names |= {r.name for r in load_config(config, env={}).resources}
        for line in config.read_text(encoding="utf-8").splitlines():
            if line.strip().startswith("# - name: nvidia.com/"):
                names.add(line.split("name:", 1)[1].strip())
    return names


def test_the_asked_for_examples_exist() -> None:
    limits = [
        c["resources"]["limits"]
        for _, pod in pods(PLUGIN_EXAMPLES)
        for c in pod["spec"]["containers"]
    ]
    assert {"nvidia.com/gpu-memory": 3} in limits
    templates = [
        claim["resourceClaimTemplateName"]
        for _, pod in pods(DRA_EXAMPLES)
        for claim in pod["spec"].get("resourceClaims", [])
        if "resourceClaimTemplateName" in claim
    ]
    assert "memory-3gi" in templates


@pytest.mark.parametrize("path", sorted(PLUGIN_EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_device_plugin_pods_ask_for_resources_the_shipped_configs_serve(path: Path) -> None:
    served = plugin_resources()
    assert {"nvidia.com/gpu", "nvidia.com/gpu-memory", "nvidia.com/gpu.shared"} <= served
    for _, pod in pods(path.parent):
        for container in pod["spec"]["containers"]:
            asked = set(container["resources"]["limits"])
            assert asked <= served, (path, asked - served)


def test_dra_pods_reference_templates_claims_and_classes_that_exist() -> None:
    docs = documents(DRA_EXAMPLES) + documents(REPO / "deploy" / "dra")
    by_kind: dict[str, set[str]] = {}
    for _, doc in docs:
        by_kind.setdefault(doc["kind"], set()).add(doc["metadata"]["name"])
    for path, doc in docs:
        if doc["kind"] == "ResourceClaimTemplate":
            requests = doc["spec"]["spec"]["devices"]["requests"]
        elif doc["kind"] == "ResourceClaim":
            requests = doc["spec"]["devices"]["requests"]
        else:
            requests = []
        for request in requests:
            assert request["exactly"]["deviceClassName"] in by_kind["DeviceClass"], path
    for path, pod in pods(DRA_EXAMPLES):
        claims = {c["name"]: c for c in pod["spec"]["resourceClaims"]}
        for claim in claims.values():
            if "resourceClaimTemplateName" in claim:
                assert claim["resourceClaimTemplateName"] in by_kind["ResourceClaimTemplate"], path
            else:
                assert claim["resourceClaimName"] in by_kind["ResourceClaim"], path
        for container in pod["spec"]["containers"]:
            for used in container["resources"]["claims"]:
                assert used["name"] in claims, path


def test_nvidia_com_gpu_itself_can_be_shared_as_documented(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("resources: [{name: nvidia.com/gpu, sharing: {replicas: 4}}]\n")
    (resource,) = load_config(config, env={}).resources
    assert resource.name == "nvidia.com/gpu" and resource.sharing is not None
    assert resource.sharing.replicas == 4
    doc = (REPO / "docs" / "sharing.md").read_text(encoding="utf-8")
    assert "`resources: [{name: nvidia.com/gpu, sharing: {replicas: 4}}]`" in doc
