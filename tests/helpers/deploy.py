"""The shipped manifests as kustomize renders them, and the DeviceClasses with what the
extended-resource component adds: shared by the deploy tests and the DRA wing's story tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DRA_DIR = REPO / "deploy" / "dra"
DEVICE_PLUGIN_DIR = REPO / "deploy" / "kubernetes"


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize DIRECTORY`` renders (skips where kubectl is missing)."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl is not installed: cannot render a kustomization")
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_with_component(tmp_path_factory: pytest.TempPathFactory, component: str) -> str:
    """deploy/dra with one of its components, from an overlay of the kind the docs show
    (kustomize wants relative paths, and no overlay inside deploy/dra: that is a cycle)."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl is not installed: cannot render a kustomize component")
    overlay = tmp_path_factory.mktemp(f"{component}-overlay")
    base = Path(os.path.relpath(DRA_DIR, overlay))
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [str(base)],
                "components": [str(base / "components" / component)],
            }
        ),
        encoding="utf-8",
    )
    result = subprocess.run(
        [kubectl, "kustomize", str(overlay)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def extended_resource_classes() -> list[dict[str, Any]]:
    """deploy/dra's DeviceClasses with what components/extended-resource adds (its patches, each
    an ``add`` of ``/spec/extendedResourceName``, applied here: no kubectl needed)."""
    docs = [d for d in yaml.safe_load_all((DRA_DIR / "deviceclasses.yaml").read_text()) if d]
    component = yaml.safe_load(
        (DRA_DIR / "components" / "extended-resource" / "kustomization.yaml").read_text()
    )
    by_name = {d["metadata"]["name"]: d for d in docs}
    for patch in component["patches"]:
        (op,) = yaml.safe_load(patch["patch"])
        assert op["op"] == "add" and op["path"] == "/spec/extendedResourceName"
        by_name[patch["target"]["name"]]["spec"]["extendedResourceName"] = op["value"]
    return docs


def node_advertising(name: str, gpus: str | None) -> dict[str, Any]:
    """A Node whose status carries ``nvidia.com/gpu: gpus`` (None: not at all), as a kubelet
    leaves it after a device plugin."""
    status: dict[str, Any] = {"capacity": {"cpu": "8"}, "allocatable": {"cpu": "8"}}
    if gpus is not None:
        status["capacity"]["nvidia.com/gpu"] = gpus
        status["allocatable"]["nvidia.com/gpu"] = gpus
    return {"metadata": {"name": name, "uid": f"uid-{name}"}, "status": status}
