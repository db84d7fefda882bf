"""deploy/dra: the DRA DaemonSet, DeviceClasses and RBAC, rendered, validated for 1.34 and 1.35,
and checked against the code (the CLI that parses the command, the CEL that evaluates the class
selectors over the published device view, the API calls the plugin really makes)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from cdigen.cli import build_parser
from tests.helpers.deploy import DEVICE_PLUGIN_DIR, kustomize, render_with_component

REPO = Path(__file__).resolve().parents[2]
DRA_DIR = REPO / "deploy" / "dra"
DEVICE_PLUGIN_BASE = REPO / "deploy" / "kubernetes" / "base"
KUBERNETES_VERSIONS = ("1.34", "1.35", "1.36", "1.37")
DRIVER = "gpu.cdigen.dev"
KUBELET_DIR = "/var/lib/kubelet"
NFD_FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _tool(name: str) -> str:
    """A command-line tool: beside this Python first (the venv), then on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else (shutil.which(name) or "")


def render_per_file() -> str:
    """deploy/dra applied file by file, for machines without kubectl (resources, labels, images:
    what the kustomization uses)."""
    kustomization = yaml.safe_load((DRA_DIR / "kustomization.yaml").read_text("utf-8"))
    assert "namespace" not in kustomization, "objects name their namespace (see the comment)"
    docs: list[dict[str, Any]] = []
    for resource in kustomization["resources"]:
        text = (DRA_DIR / resource).read_text(encoding="utf-8")
        docs += [d for d in yaml.safe_load_all(text) if d]
    images = {i["name"]: i for i in kustomization.get("images", [])}
    for doc in docs:
        for entry in kustomization.get("labels", []):
            doc["metadata"].setdefault("labels", {}).update(entry["pairs"])
        for container in _pod_containers(doc):
            image = images.get(container["image"])
            if image:
                name = image.get("newName", container["image"])
                container["image"] = f"{name}:{image['newTag']}" if "newTag" in image else name
    return yaml.safe_dump_all(docs, sort_keys=False)


def _pod_containers(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


@pytest.fixture(scope="module")
def rendered() -> str:
    kubectl = shutil.which("kubectl")
    if not kubectl:
        return render_per_file()
    result = subprocess.run(
        [kubectl, "kustomize", str(DRA_DIR)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def objects(rendered: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = of_kind(objects, kind)
    return found


@pytest.fixture(scope="module")
def pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    return spec


@pytest.fixture(scope="module")
def plugin(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["containers"]
    assert "initContainers" not in pod
    return dict(container)


@pytest.fixture(scope="module")
def argv(plugin: dict[str, Any]) -> list[str]:
    """The `cdigen ...` arguments of the plugin container (no shell in between)."""
    command = [*plugin["command"], *plugin.get("args", [])]
    assert command[0] == "cdigen", command
    return command[1:]


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


def volumes(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod["volumes"]}


def flag(argv: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in argv if a.startswith(f"{name}=")]
    return value


# -- rendering and validation -----------------------------------------------------------------


def test_per_file_rendering_matches_kustomize(rendered: str) -> None:
    if not shutil.which("kubectl"):
        pytest.skip("kubectl is not installed: nothing to compare the per-file rendering with")

    def key(doc: dict[str, Any]) -> tuple[str, str]:
        return (doc["kind"], doc["metadata"]["name"])

    mine = sorted((d for d in yaml.safe_load_all(render_per_file()) if d), key=key)
    theirs = sorted((d for d in yaml.safe_load_all(rendered) if d), key=key)
    assert mine == theirs


def test_renders_the_expected_objects(objects: list[dict[str, Any]]) -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] != "DeviceClass"}
    assert kinds == {
        ("Namespace", "cdigen-dra"),
        ("ServiceAccount", "cdigen-dra-plugin"),
        ("ClusterRole", "cdigen-dra-plugin"),
        ("ClusterRoleBinding", "cdigen-dra-plugin"),
        ("DaemonSet", "cdigen-dra-plugin"),
    }
    for obj in objects:
        scoped = obj["kind"] in ("ServiceAccount", "DaemonSet")
        assert (obj["metadata"].get("namespace") == "cdigen-dra") == scoped, obj["metadata"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "cdigen"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_passes_strict_validation(rendered: str, version: str) -> None:
    validator = _tool("kubernetes-validate")
    if not validator:
        pytest.skip("kubernetes-validate is not installed (pip install kubernetes-validate)")
    result = subprocess.run(
        [validator, "--strict", "--quiet", "-k", version, "-"],
        input=rendered,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_strict_validation_catches_a_misspelt_device_class_field(
    objects: list[dict[str, Any]],
) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    device_class = of_kind(objects, "DeviceClass")[0]
    kubernetes_validate.validate(device_class, "1.34", strict=True)
    broken = yaml.safe_load(yaml.safe_dump(device_class))
    broken["spec"]["selectors"][0]["cel"]["expresion"] = "true"
    with pytest.raises(kubernetes_validate.ValidationError, match="expresion"):
        kubernetes_validate.validate(broken, "1.34", strict=True)


# -- the DaemonSet ----------------------------------------------------------------------------


def test_uses_the_device_plugins_image(plugin: dict[str, Any]) -> None:
    daemonset = (DEVICE_PLUGIN_BASE / "daemonset.yaml").read_text(encoding="utf-8")
    names = {c["image"] for c in _pod_containers(yaml.safe_load(daemonset))}
    theirs = yaml.safe_load((DEVICE_PLUGIN_BASE / "kustomization.yaml").read_text("utf-8"))
    ours = yaml.safe_load((DRA_DIR / "kustomization.yaml").read_text("utf-8"))
    assert ours["images"] == theirs["images"]
    (image,) = ours["images"]
    assert image["name"] in names
    assert plugin["image"] == f"{image['newName']}:{image['newTag']}"


def test_command_parses_with_the_real_cli(argv: list[str]) -> None:
    assert argv[:2] == ["dra", "serve"]
    args = build_parser().parse_args(argv)
    assert args.func is not None
    assert args.driver_name == DRIVER
    assert args.node == "nvml"
    assert not args.delete_slices_on_exit, "an upgrade must keep the slices"


def test_node_name_comes_from_the_pod_spec(plugin: dict[str, Any], argv: list[str]) -> None:
    env = {e["name"]: e for e in plugin["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert not any(a.startswith("--node-name") for a in argv), "NODE_NAME is the one source"


def test_startup_and_readiness_probes_ask_healthz_on_the_pod_ip(
    plugin: dict[str, Any], argv: list[str]
) -> None:
    args = build_parser().parse_args(argv)
    port = int(args.health_address.rpartition(":")[2])
    ports = {p["name"]: p["containerPort"] for p in plugin["ports"]}
    for probe in ("startupProbe", "readinessProbe"):
        get = plugin[probe]["httpGet"]
        assert "host" not in get, probe  # the kubelet probes the pod IP
        assert get["path"] == "/healthz" and ports[get["port"]] == port, probe
    startup = plugin["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60, "time to discover"
    assert "livenessProbe" not in plugin, "an API outage must not restart the plugin"


def test_no_host_network(pod: dict[str, Any]) -> None:
    assert not pod.get("hostNetwork", False)
    assert not pod.get("hostPID", False)


def test_every_mount_names_a_volume(pod: dict[str, Any]) -> None:
    defined = volumes(pod)
    assert len(defined) == len(pod["volumes"]), "duplicate volume names"
    for container in _pod_containers({"spec": {"template": {"spec": pod}}}):
        for path, mount in mounts(container).items():
            assert mount["name"] in defined, f"{path} mounts undefined volume {mount['name']}"


def test_kubelet_dirs_are_mounted_at_their_host_paths(
    pod: dict[str, Any], plugin: dict[str, Any], argv: list[str]
) -> None:
    # the DRA socket path GetInfo returns is dialled by the kubelet on the host: same path inside
    assert flag(argv, "--kubelet-dir") == KUBELET_DIR
    defined = volumes(pod)
    for sub in ("plugins", "plugins_registry"):
        path = f"{KUBELET_DIR}/{sub}"
        mount = mounts(plugin)[path]
        assert defined[mount["name"]]["hostPath"]["path"] == path
        assert not mount.get("readOnly", False), f"{path} must be writable (sockets)"


def test_the_cdi_dir_is_the_hosts_var_run_cdi_writable(
    pod: dict[str, Any], plugin: dict[str, Any], argv: list[str]
) -> None:
    cdi_dir = flag(argv, "--cdi-dir")
    assert cdi_dir == "/var/run/cdi"
    mount = mounts(plugin)[cdi_dir]
    assert not mount.get("readOnly", False)
    host = volumes(pod)[mount["name"]]["hostPath"]
    assert host == {"path": "/var/run/cdi", "type": "DirectoryOrCreate"}


def test_the_host_installed_driver_is_read_through_host_root(
    pod: dict[str, Any], plugin: dict[str, Any], argv: list[str]
) -> None:
    host_root = flag(argv, "--host-root")
    mount = mounts(plugin)[host_root]
    assert (mount["readOnly"], mount["recursiveReadOnly"]) == (True, "IfPossible")
    assert volumes(pod)[mount["name"]]["hostPath"]["path"] == "/"
    assert (flag(argv, "--driver-root"), flag(argv, "--dev-root")) == ("/", "/")
    # NVML's library comes from --driver-root under --host-root (cdigen loads it): no preload
    assert "LD_PRELOAD" not in yaml.safe_dump(plugin)
    assert {e["name"] for e in plugin["env"]} == {"NODE_NAME"}
    # nothing of the host is writable except the kubelet's plugin dirs, the CDI dir and NFD's
    # feature files (the node labels, docs/labels.md)
    writable = {p for p, m in mounts(plugin).items() if not m.get("readOnly", False)}
    assert writable == {
        f"{KUBELET_DIR}/plugins",
        f"{KUBELET_DIR}/plugins_registry",
        "/var/run/cdi",
        NFD_FEATURES_DIR,
    }


def test_the_checkpoint_survives_a_pod_restart(plugin: dict[str, Any], argv: list[str]) -> None:
    from cdigen.plugin.dra.options import DraOptions

    options = DraOptions(
        node_name="n", driver=DRIVER, kubelet_dir=Path(flag(argv, "--kubelet-dir"))
    )
    assert any(options.checkpoint.is_relative_to(p) for p in mounts(plugin) if p != "/host")


def test_runs_on_opted_in_gpu_nodes_as_a_node_critical_pod(pod: dict[str, Any]) -> None:
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {f"{DRIVER}/dra": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["automountServiceAccountToken"] is True  # the in-cluster config needs the token


def test_requests_and_limits(plugin: dict[str, Any]) -> None:
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(plugin["resources"][kind]), kind
    assert plugin["securityContext"]["readOnlyRootFilesystem"] is True


# -- RBAC -------------------------------------------------------------------------------------


def test_the_binding_grants_the_role_to_the_pods_service_account(
    objects: list[dict[str, Any]], pod: dict[str, Any]
) -> None:
    binding = only(objects, "ClusterRoleBinding")
    daemonset = only(objects, "DaemonSet")
    account = only(objects, "ServiceAccount")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": only(objects, "ClusterRole")["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": pod["serviceAccountName"],
            "namespace": daemonset["metadata"]["namespace"],
        }
    ]
    assert account["metadata"]["name"] == pod["serviceAccountName"]


def granted(objects: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """``(apiGroup, resource, verb)`` triples the ClusterRole allows."""
    out = set()
    for rule in only(objects, "ClusterRole")["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out |= {(group, resource, verb) for verb in rule["verbs"]}
    return out


def test_the_role_is_what_the_issue_asks_and_no_more(objects: list[dict[str, Any]]) -> None:
    slices = {
        ("resource.k8s.io", "resourceslices", v)
        for v in ("create", "update", "delete", "get", "list", "watch")
    }
    assert granted(objects) == slices | {
        ("resource.k8s.io", "resourceclaims", "get"),
        ("resource.k8s.io", "resourceclaims/status", "patch"),
        ("resource.k8s.io", "resourceclaims/driver", "associated-node:patch"),
        ("resource.k8s.io", "resourceclaims/driver", "associated-node:update"),
        ("", "nodes", "get"),
        ("resource.k8s.io", "deviceclasses", "list"),
    }


def test_the_driver_status_grant_names_only_the_plugins_driver(
    objects: list[dict[str, Any]], argv: list[str]
) -> None:
    """1.36's resourceclaims/driver rule is limited to the driver the DaemonSet serves."""
    (rule,) = [
        r
        for r in only(objects, "ClusterRole")["rules"]
        if "resourceclaims/driver" in r["resources"]
    ]
    names = [a.split("=", 1)[1] for a in argv if a.startswith("--driver-name=")]
    assert rule["resourceNames"] == names == [DRIVER]


def _verb(method: str, path: str) -> tuple[str, str, str]:
    """The RBAC ``(apiGroup, resource, verb)`` of one request to the fake API server."""
    parts = urlparse(path).path.strip("/").split("/")
    if parts[0] == "api":  # /api/v1/nodes/NAME
        group, rest = "", parts[2:]
    else:  # /apis/GROUP/VERSION/...
        group, rest = parts[1], parts[3:]
    if rest[0] == "namespaces":
        rest = rest[2:]
    resource, named = rest[0], len(rest) > 1
    if len(rest) > 2:  # a subresource: resourceclaims/NAME/status
        resource = f"{resource}/{rest[2]}"
    verb = {"POST": "create", "PUT": "update", "DELETE": "delete", "PATCH": "patch"}.get(method)
    return (group, resource, verb or ("get" if named else "list"))


@pytest.fixture
def fake_api() -> Iterator[Any]:
    from tests.fake_apiserver import FakeApiServer

    server = FakeApiServer().start()
    server.nodes["node-a"] = {"metadata": {"name": "node-a", "uid": "node-uid-1"}}
    yield server
    server.stop()


def test_the_role_allows_every_call_the_plugin_makes(
    objects: list[dict[str, Any]], fake_api: Any, tmp_path: Path
) -> None:
    """Publish, republish, delete on exit and read a claim through the official client against
    the fake API server; every request it logged must be allowed by the ClusterRole."""
    from cdigen.discover import load_node
    from cdigen.plugin.agent.kubeapi import api_client
    from cdigen.plugin.dra.kube import KubeApi
    from cdigen.plugin.dra.slice_publisher import SlicePublisher
    from cdigen.policies.device_view import device_views
    from tests.fake_apiserver import allocated_claim
    from tests.helpers.dra import plugin_identity

    fake_api.authorize(objects)
    fake_api.identify("sa-token", plugin_identity(objects, node="node-a"))
    kubeconfig = fake_api.kubeconfig(tmp_path / "kubeconfig", token="sa-token")
    api = KubeApi(api_client(str(kubeconfig)))
    owner = api.node_owner("node-a")
    views = device_views(load_node("builtin:dgx-a100-mig-mixed"))
    publisher = SlicePublisher(api, driver=DRIVER, node_name="node-a", owner=owner)
    publisher.publish(views)
    publisher.publish(views[:3])
    fake_api.add_claim(allocated_claim("c", "uid-c", [], node="node-a"))
    api.read_claim("default", "c")
    device = {"driver": DRIVER, "pool": "node-a", "device": "gpu-0", "data": {}}
    api.apply_claim_status("default", "c", "uid-c", [device], DRIVER)  # the fake checks the role
    assert fake_api.claims[("default", "c")]["status"]["devices"] == [device]
    publisher.delete_all()
    made = {_verb(method, path) for method, path in fake_api.requests}
    assert {v for _, _, v in made} == {"get", "list", "create", "update", "delete", "patch"}
    assert made <= granted(objects), made - granted(objects)


# -- DeviceClasses ----------------------------------------------------------------------------


def classes(objects: list[dict[str, Any]]) -> dict[str, str]:
    """``{class name: its one CEL expression}``."""
    out = {}
    for obj in of_kind(objects, "DeviceClass"):
        (selector,) = obj["spec"]["selectors"]
        out[obj["metadata"]["name"]] = " ".join(selector["cel"]["expression"].split())
    return out


def test_class_names_are_dns_subdomains_in_the_drivers_name(
    objects: list[dict[str, Any]],
) -> None:
    for name in classes(objects):
        assert DNS_SUBDOMAIN.fullmatch(name) and len(name) <= 253, name
        assert name == DRIVER or name.endswith(f".{DRIVER}"), name


def test_the_whole_gpu_class_is_the_issues_selector(objects: list[dict[str, Any]]) -> None:
    assert classes(objects)[DRIVER] == (
        f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"'
    )
    for expression in classes(objects).values():
        assert "gpu.nvidia.com" not in expression


def _builtin_views() -> dict[str, Any]:
    from cdigen.discover import load_node
    from cdigen.discover.builtin import names
    from cdigen.policies.device_view import device_views

    return {n: device_views(load_node(f"builtin:{n}")) for n in names()}


def test_every_mig_profile_of_the_builtin_samples_has_a_class(
    objects: list[dict[str, Any]],
) -> None:
    profiles = {
        v.mig.profile for views in _builtin_views().values() for v in views if v.mig is not None
    }
    assert profiles, "the samples have MIG devices"
    for profile in profiles:
        assert f"mig-{profile}.{DRIVER}" in classes(objects), profile


def cel_device(view: Any, driver: str) -> Any:
    """The CEL ``device`` a kube-scheduler evaluates for one published device: attributes and
    capacities grouped by domain, plain names in the driver's."""
    import celpy.celtypes as ct

    from cdigen.policies.cel import DomainMap, Quantity, parse_semver

    def typed(kind: str, value: Any) -> Any:
        if kind == "version":
            return parse_semver(str(value))
        return {"string": ct.StringType, "int": ct.IntType, "bool": ct.BoolType}[kind](value)

    attributes: dict[str, dict[str, Any]] = {}
    for name, attribute in view.attributes.items():
        domain, _, short = name.rpartition("/")
        attributes.setdefault(domain or driver, {})[short] = typed(attribute.kind, attribute.value)
    capacity = {
        driver: ct.MapType(
            {ct.StringType(k): Quantity(Fraction(v)) for k, v in view.capacity.items()}
        )
    }
    return ct.MapType(
        {
            ct.StringType("driver"): ct.StringType(driver),
            ct.StringType("attributes"): DomainMap(
                {
                    ct.StringType(d): ct.MapType({ct.StringType(k): v for k, v in a.items()})
                    for d, a in attributes.items()
                }
            ),
            ct.StringType("capacity"): DomainMap(
                {ct.StringType(d): c for d, c in capacity.items()}
            ),
        }
    )


def test_each_class_selects_exactly_its_devices(objects: list[dict[str, Any]]) -> None:
    """Every selector, compiled by cdigen's CEL (the Kubernetes dialect) and evaluated over the
    device view the slices publish for every built-in sample, picks exactly the devices its name
    promises, and nothing of another driver."""
    from cdigen.policies.cel import compile_expression

    programs = {
        n: compile_expression(e, frozenset({"device"})) for n, e in classes(objects).items()
    }
    checked = 0
    every = _builtin_views()
    # whole GPUs beside MIG devices of every profile in the samples (the rest repeat these)
    for sample in ("rtx4090", "dgx-a100-mig-mixed"):
        for view in every[sample]:
            chosen = {
                n for n, p in programs.items() if p.evaluate({"device": cel_device(view, DRIVER)})
            }
            if view.mig is None:
                nvlink = {f"nvlink.{DRIVER}"} if "nvlinkClique" in view.attributes else set()
                assert chosen == {DRIVER, *nvlink}, (sample, view.name, chosen)
            else:
                assert chosen == {f"mig.{DRIVER}", f"mig-{view.mig.profile}.{DRIVER}"}, (
                    sample,
                    view.name,
                    chosen,
                )
            foreign = cel_device(view, "gpu.nvidia.com")
            assert not any(p.evaluate({"device": foreign}) for p in programs.values())
            checked += 1
    assert checked == 19


def test_slices_sent_past_the_clients_models_arrive_as_built_and_refusals_raise(
    fake_api: Any, tmp_path: Path
) -> None:
    """Slice bodies skip the client's model validation (plugin/dra/kube.py): the API server
    still gets the dict as built, and its refusals still raise the client's ApiException."""
    from kubernetes.client.exceptions import ApiException

    from cdigen.discover import load_node
    from cdigen.plugin.agent.kubeapi import api_client
    from cdigen.plugin.dra.kube import KubeApi
    from cdigen.plugin.dra.slices import build_slices
    from cdigen.policies.device_view import device_views

    api = KubeApi(api_client(str(fake_api.kubeconfig(tmp_path / "kubeconfig"))))
    views = device_views(load_node("builtin:h100-mig-single"))
    (body,) = build_slices(views, driver=DRIVER, node_name="node-a", generation=1)
    name = body["metadata"]["name"]
    api.create_slice(body)
    stored = fake_api.slices[name]
    assert stored["spec"] == body["spec"]
    with pytest.raises(ApiException, match="already exists") as created_twice:
        api.create_slice(body)
    assert created_twice.value.status == 409
    stale = {**body, "metadata": {**body["metadata"], "resourceVersion": "0"}}
    with pytest.raises(ApiException, match="modified") as conflict:
        api.replace_slice(name, stale)
    assert conflict.value.status == 409
    fresh = {**body, "metadata": {**body["metadata"], **stored["metadata"]}}
    fresh["spec"] = {**body["spec"], "pool": {**body["spec"]["pool"], "generation": 2}}
    api.replace_slice(name, fresh)
    assert fake_api.slices[name]["spec"]["pool"]["generation"] == 2


# -- the MPS component (deploy/dra/components/mps) --------------------------------------------


@pytest.fixture(scope="module")
def mps_rendered(tmp_path_factory: pytest.TempPathFactory) -> str:
    """deploy/dra with the MPS component (docs/dra-sharing.md)."""
    return render_with_component(tmp_path_factory, "mps")


@pytest.fixture(scope="module")
def mps_pod(mps_rendered: str) -> dict[str, Any]:
    objects = [doc for doc in yaml.safe_load_all(mps_rendered) if doc]
    spec: dict[str, Any] = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_mps_component_passes_strict_validation(mps_rendered: str, version: str) -> None:
    validator = _tool("kubernetes-validate")
    if not validator:
        pytest.skip("kubernetes-validate is not installed (pip install kubernetes-validate)")
    result = subprocess.run(
        [validator, "--strict", "--quiet", "-k", version, "-"],
        input=mps_rendered,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mps_component_mounts_only_defined_volumes_without_host_network(
    mps_pod: dict[str, Any],
) -> None:
    test_no_host_network(mps_pod)
    test_every_mount_names_a_volume(mps_pod)
    assert [c["name"] for c in mps_pod["containers"]] == ["plugin", "mps-control"]


def test_mps_daemon_pipes_where_the_plugin_mounts_them_into_claims(
    mps_pod: dict[str, Any],
) -> None:
    from cdigen.plugin.dra.serve_cli import _sharing_options

    plugin_container, daemon = mps_pod["containers"]
    args = build_parser().parse_args(plugin_container["command"][1:])
    pipe_dir = _sharing_options(args)["mps"].pipe_dir  # type: ignore[attr-defined]
    assert pipe_dir == "/run/nvidia/mps"
    # the daemon runs the host's driver tools in the host's /, pipes at that same host path
    assert daemon["command"][:2] == ["chroot", "/host"]
    assert daemon["command"][-1].endswith("&& exec nvidia-cuda-mps-control -f")
    env = {e["name"]: e["value"] for e in daemon["env"]}
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == pipe_dir
    defined = volumes(mps_pod)
    assert defined[mounts(daemon)["/host"]["name"]]["hostPath"]["path"] == "/"
    for variable in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        mount = mounts(daemon)["/host" + env[variable]]
        assert not mount.get("readOnly", False), variable
        assert defined[mount["name"]]["hostPath"]["path"] == env[variable]
    assert env["CUDA_MPS_LOG_DIRECTORY"] != pipe_dir, "claims would see the daemon's logs"
    assert daemon["image"] == plugin_container["image"]  # the tag the base's images: set


def test_mps_daemon_has_at_dev_shm_the_directory_the_plugin_mounts_there_in_claims(
    mps_pod: dict[str, Any],
) -> None:
    """MPS clients reach the daemon's shared memory: the claims' /dev/shm is the daemon's."""
    from cdigen.discover import load_node
    from cdigen.plugin.dra.claims import AllocatedDevice
    from cdigen.plugin.dra.mps import claim_limits
    from cdigen.plugin.dra.serve_cli import _sharing_options
    from cdigen.policies.device_view import device_views

    plugin_container, daemon = mps_pod["containers"]
    args = build_parser().parse_args(plugin_container["command"][1:])
    settings = _sharing_options(args)["mps"]
    shm_dir = settings.shm_dir  # type: ignore[attr-defined]
    assert shm_dir and shm_dir != settings.pipe_dir  # type: ignore[attr-defined]
    # the daemon, chrooted into /host, has the hostPath at /dev/shm, writable
    mount = mounts(daemon)["/host/dev/shm"]
    assert not mount.get("readOnly", False)
    assert volumes(mps_pod)[mount["name"]]["hostPath"]["path"] == shm_dir
    assert "chmod 1777 /dev/shm" in daemon["command"][-1]
    # the plugin mounts that same host directory at /dev/shm in a limited claim
    node = load_node("builtin:rtx4090")
    views = {v.name: v for v in device_views(node)}
    device = AllocatedDevice(request="r", device="gpu-0", consumed={"memory": "3Gi"})
    _, claim_mounts = claim_limits([device], views, settings)  # type: ignore[arg-type]
    shm = [m for m in claim_mounts if m["containerPath"] == "/dev/shm"]
    assert [m["hostPath"] for m in shm] == [shm_dir] and "rw" in shm[0]["options"]


# -- the capabilities component (deploy/dra/components/capabilities) ----------------------------


def test_capabilities_component_offers_what_the_graphics_example_asks_for(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    rendered = render_with_component(tmp_path_factory, "capabilities")
    objects = [doc for doc in yaml.safe_load_all(rendered) if doc]
    (plugin_container,) = only(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(plugin_container["command"][1:])
    offered = set(args.capability_devices.split(","))
    example = [
        doc
        for doc in yaml.safe_load_all((DRA_DIR / "examples" / "graphics-gpu.yaml").read_text())
        if doc and doc["kind"] == "DeviceClass"
    ]
    asked = {
        cap
        for doc in example
        for entry in doc["spec"]["config"]
        for cap in entry["opaque"]["parameters"]["capabilities"]
    }
    assert asked and asked <= offered


# -- the extended-resource component (deploy/dra/components/extended-resource) --------------------


def test_extended_resource_component_names_the_device_plugins_resources(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Every class a device plugin resource maps to gets that name (nvidia.com/gpu, and
    nvidia.com/mig-<profile> as --mig-strategy mixed advertises them); the others none."""
    rendered = render_with_component(tmp_path_factory, "extended-resource")
    classes = {
        doc["metadata"]["name"]: doc["spec"].get("extendedResourceName")
        for doc in yaml.safe_load_all(rendered)
        if doc and doc["kind"] == "DeviceClass"
    }
    assert classes["gpu.cdigen.dev"] == "nvidia.com/gpu"
    assert classes["nvlink.gpu.cdigen.dev"] is None and classes["mig.gpu.cdigen.dev"] is None
    migs = {k: v for k, v in classes.items() if k.startswith("mig-")}
    assert migs and all(
        v == f"nvidia.com/{k.removesuffix('.gpu.cdigen.dev')}" for k, v in migs.items()
    )
    assert len(set(classes.values()) - {None}) == len(migs) + 1  # each name once
    validator = _tool("kubernetes-validate")
    for version in KUBERNETES_VERSIONS if validator else ():
        result = subprocess.run(
            [validator, "--strict", "--quiet", "-k", version, "-"],
            input=rendered,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr


# -- the wings: which nodes each DaemonSet runs on (docs/dra.md, moving a node) ---------------


def _runs_on(pod_spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether the DaemonSet controller places the pod on a node with ``labels``: every
    nodeSelector pair, and one required nodeAffinity term (In, NotIn, Exists, DoesNotExist:
    NotIn and DoesNotExist hold for a node without the key, as in Kubernetes)."""
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = (
        ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms")
    if not required:
        return True

    def holds(expr: Mapping[str, Any]) -> bool:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        return {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]

    return any(all(holds(e) for e in term.get("matchExpressions") or ()) for term in required)


def test_the_wings_never_select_one_node(pod: dict[str, Any]) -> None:
    """Every mix of the two labels: at most one DaemonSet; a GPU node gets the device plugin
    until it is labelled for DRA, then DRA alone, whatever NFD says of gpu.present."""
    device_plugin = only(kustomize(DEVICE_PLUGIN_DIR), "DaemonSet")["spec"]["template"]["spec"]
    present, dra = "nvidia.com/gpu.present", f"{DRIVER}/dra"
    for a in (None, "true", "false"):
        for b in (None, "true", "false"):
            labels = {k: v for k, v in ((present, a), (dra, b)) if v is not None}
            wings = [_runs_on(device_plugin, labels), _runs_on(pod, labels)]
            assert sum(wings) <= 1, labels
    assert _runs_on(device_plugin, {present: "true"}) and not _runs_on(pod, {present: "true"})
    migrated = {present: "true", dra: "true"}  # NFD keeps gpu.present on a GPU node
    assert _runs_on(pod, migrated) and not _runs_on(device_plugin, migrated)


def test_the_seed_overlay_in_dra_md_renders_and_serves_unchanged_pods_a_share(
    tmp_path: Path,
) -> None:
    """docs/dra.md's overlay (extended-resource + MPS + --memory-step 1Gi --shares-per-gpu 4),
    rendered by kustomize from a checkout beside it as the doc lays it out: the plugin's command
    parses with the real CLI into 1/4 of each GPU for a claim naming no memory, and
    gpu.cdigen.dev carries nvidia.com/gpu."""
    from cdigen.memory_shares import memory_shares

    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl is not installed: cannot render a kustomize overlay")
    doc = (REPO / "docs" / "dra.md").read_text(encoding="utf-8")
    block = re.search(r"```yaml\n# my-dra/kustomization\.yaml\n(.*?)```", doc, re.S)
    assert block and "--shares-per-gpu=4" in block.group(1)
    shutil.copytree(DRA_DIR, tmp_path / "cdigen" / "deploy" / "dra")  # a checkout beside it
    (tmp_path / "my-dra").mkdir()
    (tmp_path / "my-dra" / "kustomization.yaml").write_text(block.group(1), encoding="utf-8")
    result = subprocess.run(
        [kubectl, "kustomize", str(tmp_path / "my-dra")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    extended = {
        d["metadata"]["name"]: d["spec"].get("extendedResourceName")
        for d in docs
        if d["kind"] == "DeviceClass"
    }
    assert extended["gpu.cdigen.dev"] == "nvidia.com/gpu"
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    command = daemonset["spec"]["template"]["spec"]["containers"][0]["command"]
    args = build_parser().parse_args(command[1:])
    shares = memory_shares(args)
    assert shares is not None and shares.step == 1 << 30 and shares.per_gpu == 4
    assert args.mps_pipe_dir == "/run/nvidia/mps"
