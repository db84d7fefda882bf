"""What the manifests need of the image and of the node: deploy/image/images.txt against what
every shipped kustomization renders, the image's name and tag, its OCI labels, and the NFD
feature file (node labels, docs/labels.md) in both DaemonSets."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdigen.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
IMAGES_TXT = DEPLOY / "image" / "images.txt"
NFD_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
OCI_LABELS = ("version", "revision", "source")


def kustomizations() -> list[Path]:
    """Every kustomization under deploy/ that renders on its own (components need a base)."""
    found = []
    for path in sorted(DEPLOY.rglob("kustomization.yaml")):
        if yaml.safe_load(path.read_text(encoding="utf-8")).get("kind") != "Component":
            found.append(path.parent)
    return found


def render(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl is not installed: cannot render deploy/ with kustomize")
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def with_component(tmp_path: Path, base: Path, component: Path) -> Path:
    """An overlay of ``base`` with ``component``, as the docs show one."""
    tmp_path.mkdir(parents=True)
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(base, tmp_path)],
                "components": [os.path.relpath(component, tmp_path)],
            }
        ),
        encoding="utf-8",
    )
    return tmp_path


def images(objects: list[dict[str, Any]]) -> set[str]:
    found = set()
    for obj in objects:
        spec = obj.get("spec", {}).get("template", {}).get("spec", {})
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            found.add(container["image"])
    return found


def listed() -> list[str]:
    lines = IMAGES_TXT.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def version() -> str:
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(r'^version = "([^"]+)"', text, re.MULTILINE)
    assert found
    return found.group(1)


def test_images_txt_lists_every_image_the_manifests_render(tmp_path: Path) -> None:
    rendered: set[str] = set()
    for directory in kustomizations():
        rendered |= images(render(directory))
    for component in sorted((DEPLOY / "dra" / "components").iterdir()):  # DRA's opt-in parts
        overlay = with_component(tmp_path / component.name, DEPLOY / "dra", component)
        rendered |= images(render(overlay))
    assert rendered, "no image found in the rendered manifests"
    assert sorted(rendered) == listed()
    assert len(listed()) == len(set(listed()))


def test_the_image_is_named_localhost_cdigen_v_version() -> None:
    """A name without a registry host is docker.io's to containerd and CRI-O: the image
    build.sh makes (and ctr imports) is localhost/cdigen, tagged v<version>."""
    assert f"localhost/cdigen:v{version()}" in listed()
    build = (DEPLOY / "image" / "build.sh").read_text(encoding="utf-8")
    assert 'tag="${1:-localhost/cdigen:v$version}"' in build


def test_the_install_docs_overlay_renames_the_image(tmp_path: Path) -> None:
    """The ``images:`` override docs/install.md shows, in an overlay of deploy/kubernetes."""
    doc = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    block = doc.split("```yaml\nresources: [<path>/deploy/kubernetes]\n", 1)[1].split("```")[0]
    overlay = yaml.safe_load(block)
    overlay["resources"] = [os.path.relpath(DEPLOY / "kubernetes", tmp_path)]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay), encoding="utf-8")
    assert images(render(tmp_path)) == {"mirror.example.com/cdigen:v0.1.0"}


@pytest.mark.parametrize("path", ["Dockerfile", "deploy/image/Containerfile"])
def test_image_builds_carry_oci_version_revision_and_source(path: str) -> None:
    text = (REPO / path).read_text(encoding="utf-8")
    for name in OCI_LABELS:
        arg = name.upper()
        assert re.search(rf"^ARG {arg}=", text, re.MULTILINE), f"{path}: no ARG {arg}"
        assert f'org.opencontainers.image.{name}="${{{arg}}}"' in text
    build = (DEPLOY / "image" / "build.sh").read_text(encoding="utf-8")
    for name in OCI_LABELS:
        assert f'--build-arg "{name.upper()}=$' in build


@pytest.mark.parametrize("directory", ["kubernetes", "dra"])
def test_daemonsets_keep_the_node_labels_in_an_nfd_feature_file(directory: str) -> None:
    (daemonset,) = [o for o in render(DEPLOY / directory) if o["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    # each wing on its own nodes: GPU nodes for the device plugin, the nodes labelled for DRA
    # for the DRA plugin (docs/dra.md, "Moving a node from the device plugin to DRA")
    selected = {"kubernetes": "nvidia.com/gpu.present", "dra": "gpu.cdigen.dev/dra"}[directory]
    assert pod["nodeSelector"][selected] == "true"
    plugin = pod["containers"][0]
    argv = [*plugin["command"], *plugin.get("args", [])]
    (path,) = [a.split("=", 1)[1] for a in argv if a.startswith("--features-file=")]
    assert path == f"{NFD_DIR}/{daemonset['metadata']['name']}"
    mount = next(m for m in plugin["volumeMounts"] if m["mountPath"] == NFD_DIR)
    assert not mount.get("readOnly", False)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"] == {"path": NFD_DIR, "type": "DirectoryOrCreate"}
    # the flag is one the command takes
    args = build_parser().parse_args(argv[1:])
    assert str(getattr(args, "features_file", "")) == path


def test_the_nfd_rule_sets_the_label_the_daemonsets_select_on() -> None:
    (rule,) = render(DEPLOY / "nfd")
    assert (rule["apiVersion"], rule["kind"]) == ("nfd.k8s-sigs.io/v1alpha1", "NodeFeatureRule")
    (only_rule,) = rule["spec"]["rules"]
    assert only_rule["labels"] == {"nvidia.com/gpu.present": "true"}
    (match,) = only_rule["matchFeatures"]
    assert match["feature"] == "pci.device"
    assert match["matchExpressions"]["vendor"] == {"op": "In", "value": ["10de"]}
    assert match["matchExpressions"]["class"] == {"op": "In", "value": ["0300", "0302"]}
    # the device plugin's DaemonSet selects it; the DRA wing is opted into per node by a label of
    # its own (docs/dra.md), which NFD never sets
    (daemonset,) = [o for o in render(DEPLOY / "kubernetes") if o["kind"] == "DaemonSet"]
    selector = daemonset["spec"]["template"]["spec"]["nodeSelector"]
    assert selector["nvidia.com/gpu.present"] == "true"
    (daemonset,) = [o for o in render(DEPLOY / "dra") if o["kind"] == "DaemonSet"]
    assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == {"gpu.cdigen.dev/dra": "true"}
