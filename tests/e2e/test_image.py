"""The cdigen image, built here without a registry (deploy/image/build.sh: mmdebstrap + podman),
run as a user would: ``--help``, ``generate --dry-run``, and the plugin container against the
kubelet simulator (tests/kubelet_sim.py, the device manager's rules) through a mounted plugin dir,
its CDI names resolved by podman's CDI library.

The image is built once per session into a private podman store under /var/tmp
(``CDIGEN_TEST_IMAGE_STORE`` overrides where), tagged with a hash of everything that goes into it,
so a rerun with unchanged sources reuses it. The store uses podman's overlay driver where this
kernel mounts overlays, else vfs (which copies the whole root for every container). The quick
checks run in one container as the image's default user; each test asserts on its part.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.helpers.cdi_runtime import CdiRuntime, cdi_runtime
from tests.helpers.podman import CONTAINERS_CONF
from tests.kubelet_sim import KubeletSimulator

REPO = Path(__file__).resolve().parents[2]
# podman wants short --root/--runroot paths
STORES = Path(os.environ.get("CDIGEN_TEST_IMAGE_STORE") or "/var/tmp/cdigen-image-test")
MODULES = "grpc, google.protobuf, yaml, jsonschema, networkx, celpy, prometheus_client, pynvml"
# The quick checks, each command's stdout, stderr and exit status written to /out/NAME.*
CHECKS = {
    "id": "id",
    "help": "cdigen --help",
    "generate": "cdigen generate --node builtin:rtx4090 --dry-run",
    "imports": f"python3 -c 'import {MODULES}; "
    "import cdigen.plugin.deviceplugin.runner, cdigen.policies, cdigen.cli'",
}


def _missing_tools() -> str | None:
    if os.geteuid() != 0:
        return "needs root (mmdebstrap and podman build a root file system)"
    for tool in ("podman", "runc", "mmdebstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install podman runc mmdebstrap)"
    return None


def _source_hash() -> str:
    """A hash of every file that goes into the image."""
    digest = hashlib.sha256()
    paths = [
        REPO / "pyproject.toml",
        REPO / "deploy/image/Containerfile",
        REPO / "deploy/image/build.sh",
    ]
    for top in ("cdigen", "plugin", "policies", "schemas"):
        paths += sorted(
            p for p in (REPO / top).rglob("*") if p.is_file() and "__pycache__" not in p.parts
        )
    for path in paths:
        digest.update(str(path.relative_to(REPO)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


class Image:
    """``podman`` on the private store, and the tag of the image built there."""

    def __init__(self, tag: str, store: Path, driver: str) -> None:
        self.tag = tag
        self.driver = driver
        self.prefix = [
            "podman", "--root", str(store / "root"), "--runroot", str(store / "run"),
            "--storage-driver", driver,
        ]  # fmt: skip
        self.env = {**os.environ, "CONTAINERS_CONF": str(STORES / "containers.conf")}

    def podman(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.prefix, *args], capture_output=True, text=True, env=self.env, timeout=timeout
        )


def _store() -> tuple[Path, str]:
    """The store and its driver: overlay if podman mounts one here (it tries at start), else vfs."""
    for driver in ("overlay", "vfs"):
        store = STORES / driver
        store.mkdir(parents=True, exist_ok=True)
        smoke = Image("", store, driver).podman("info", timeout=60)
        if smoke.returncode == 0:
            return store, driver
        reason = smoke.stderr.strip()[-300:]
    pytest.skip(f"podman does not work on this machine: {reason}")


@pytest.fixture(scope="session")
def image() -> Iterator[Image]:
    reason = _missing_tools()
    if reason:
        pytest.skip(reason)
    STORES.mkdir(parents=True, exist_ok=True)
    (STORES / "containers.conf").write_text(CONTAINERS_CONF)
    store, driver = _store()
    found = Image(f"localhost/cdigen:test-{_source_hash()}", store, driver)
    if found.podman("image", "exists", found.tag).returncode != 0:
        start = time.monotonic()
        result = subprocess.run(
            [str(REPO / "deploy/image/build.sh"), found.tag],
            capture_output=True,
            text=True,
            env={**found.env, "PODMAN": shlex.join(found.prefix)},
            timeout=1500,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        print(f"image {found.tag} built on {driver} in {time.monotonic() - start:.0f} s")
        _prune_test_images(found)
    yield found


KEEP_IMAGES = 3  # other checkouts may be testing their own tree's image at the same time


def _prune_test_images(image: Image) -> None:
    """Remove all but the newest ``KEEP_IMAGES`` test images and their unused layers: every
    source change builds one (~150 MB), and nothing else would ever remove them."""
    listed = image.podman("images", "--filter", "reference=localhost/cdigen", "--format", "json")
    if listed.returncode != 0:
        return
    tests = [
        (entry.get("Created", 0), name)
        for entry in json.loads(listed.stdout or "[]")
        for name in entry.get("Names") or ()
        if name.startswith("localhost/cdigen:test-") and name != image.tag
    ]
    old = [name for _, name in sorted(tests, reverse=True)[KEEP_IMAGES - 1 :]]
    if old:
        image.podman("rmi", *old)  # an image a running test still uses is refused, and kept
        image.podman("image", "prune", "-f")


@dataclass(frozen=True)
class Check:
    """One command of the quick checks: its exit status and output."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def checks(image: Image, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Check]:
    """Every command of ``CHECKS`` run in one container of the image, as its default user."""
    out = tmp_path_factory.mktemp("image-checks")
    out.chmod(0o777)  # the image's user (65532) writes here
    script = "".join(
        f"{command} >/out/{name}.out 2>/out/{name}.err; echo $? >/out/{name}.rc\n"
        for name, command in CHECKS.items()
    )
    result = image.podman(
        "run", "--rm", "--network", "none", "-v", f"{out}:/out",
        "--entrypoint", "/bin/sh", image.tag, "-c", script,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    found = {}
    for name in CHECKS:
        rc = (out / f"{name}.rc").read_text().strip()
        found[name] = Check(
            int(rc), (out / f"{name}.out").read_text(), (out / f"{name}.err").read_text()
        )
    return found


def test_image_starts_cdigen_help_by_default(image: Image) -> None:
    """``podman run IMAGE ARGS`` is ``cdigen ARGS``, and no ARGS is ``cdigen --help``."""
    result = image.podman("image", "inspect", "--format", "{{json .Config}}", image.tag)
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    assert config["Entrypoint"] == ["cdigen"]
    assert config["Cmd"] == ["--help"]
    assert config["User"] == "65532:65532"


def test_image_carries_oci_version_revision_and_source(image: Image) -> None:
    """build.sh fills the OCI labels: the version of pyproject.toml, this checkout's commit."""
    result = image.podman("image", "inspect", "--format", "{{json .Labels}}", image.tag)
    assert result.returncode == 0, result.stderr
    labels = json.loads(result.stdout)
    project = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    version = project.split('\nversion = "', 1)[1].split('"', 1)[0]
    assert labels["org.opencontainers.image.version"] == version
    # a commit of this checkout (the image is reused while the sources stay the same, so not
    # necessarily HEAD), or "unknown" outside git
    commit = labels["org.opencontainers.image.revision"].removesuffix("-dirty")
    if commit != "unknown":
        assert re.fullmatch(r"[0-9a-f]{40}", commit), commit
        known = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"])
        assert known.returncode == 0, f"{commit} is no commit of this checkout"
    assert labels["org.opencontainers.image.source"]


def test_saved_image_keeps_the_name_the_manifests_use(image: Image, tmp_path: Path) -> None:
    """``podman save`` (what docs/install.md loads with ``ctr -n k8s.io images import``) keeps
    the localhost/ name, so the runtime finds the image the DaemonSet names."""
    name = "localhost/cdigen:v" + image.tag.rsplit("-", 1)[-1]  # a v-tag of this build
    assert image.podman("tag", image.tag, name).returncode == 0
    try:
        archive = tmp_path / "cdigen.tar"
        result = image.podman("save", "-o", str(archive), name, timeout=300)
        assert result.returncode == 0, result.stderr
        import tarfile

        with tarfile.open(archive) as tar:
            manifest = tar.extractfile("manifest.json")
            assert manifest is not None
            (entry,) = json.load(manifest)
        assert entry["RepoTags"] == [name]
    finally:
        image.podman("untag", image.tag, name)


def test_help_runs_in_the_image(checks: dict[str, Check]) -> None:
    help_ = checks["help"]
    assert help_.returncode == 0, help_.stderr
    assert "generate" in help_.stdout and "plugin" in help_.stdout


def test_every_dependency_imports_in_the_image(checks: dict[str, Check]) -> None:
    """The compiled ones too (grpcio needs libstdc++ from the Debian root)."""
    imports = checks["imports"]
    assert imports.returncode == 0, imports.stderr[-2000:]


def test_generate_dry_run_in_the_image(checks: dict[str, Check]) -> None:
    generate = checks["generate"]
    assert generate.returncode == 0, generate.stderr
    spec = yaml.safe_load(generate.stdout)
    assert spec["kind"] == "nvidia.com/gpu"
    assert {"0", "all"} <= {d["name"] for d in spec["devices"]}


def test_image_runs_as_non_root_by_default(checks: dict[str, Check]) -> None:
    id_ = checks["id"]
    assert id_.returncode == 0, id_.stderr
    assert id_.stdout.startswith("uid=65532")


@pytest.fixture(scope="module")
def cdi_podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiRuntime]:
    yield from cdi_runtime(tmp_path_factory)


def test_plugin_container_registers_with_the_kubelet(
    image: Image, tmp_path: Path, cdi_podman: CdiRuntime
) -> None:
    """The plugin container, its plugin dir mounted, registers with the kubelet (simulator, in
    this process, started first), allocates a GPU whose CDI names podman resolves and injects
    from the spec the container generated, and registers again when the kubelet restarts and
    removes its socket."""
    from cdigen.nodefile import dump_node
    from tests.cdihost import build_host, make_node

    plugin_dir = tmp_path / "device-plugins"
    spec_dir = tmp_path / "cdi"
    plugin_dir.mkdir()
    spec_dir.mkdir()
    # podman injects the returned names as a runtime does, stat'ing every device node and mount
    # source on this host: a fake host with real (mknod) nodes, mounted at the same path.
    host = build_host(tmp_path / "host", make_node(2))
    if not host.real_nodes:
        pytest.skip("mknod is not permitted here, so no device nodes for the runtime check")
    node_file = tmp_path / "node.yaml"
    node_file.write_text(dump_node(host.node, "yaml"))
    name = f"cdigen-test-{uuid.uuid4().hex[:8]}"
    gpu = "nvidia.com/gpu"
    # kubelet first: the simulator owns kubelet.sock before the plugin container starts
    kubelet = KubeletSimulator(plugin_dir, clean_start=True).start()
    try:
        started = image.podman(
            "run", "-d", "--name", name, "--network", "none", "--user", "0",
            "-v", f"{plugin_dir}:/var/lib/kubelet/device-plugins",
            "-v", f"{spec_dir}:/var/run/cdi",
            "-v", f"{host.base}:{host.base}:ro",
            "-v", f"{node_file}:/etc/cdigen/node.yaml:ro",
            image.tag, "plugin", "serve", "--node", "/etc/cdigen/node.yaml",
            "--driver-root", str(host.driver_root), "--dev-root", str(host.dev_root),
            "--spec-dir", "/var/run/cdi", "--generate-specs",
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        kubelet.wait_registered(gpu, timeout_s=60)
        devices = kubelet.wait_devices(gpu, lambda d: len(d) == 2, timeout_s=30)
        assert all(d.health == "Healthy" for d in devices), devices
        allocated = devices[0].ID
        (container,) = kubelet.allocate(gpu, [[allocated]]).container_responses
        names = [d.name for d in container.cdi_devices]
        kubelet.stop()  # the kubelet restarts: the new one removes the plugin's socket
        kubelet = KubeletSimulator(plugin_dir, clean_start=True).start()
        kubelet.wait_registered(gpu, timeout_s=10)
        kubelet.wait_devices(gpu, lambda d: len(d) == 2)
        assert not kubelet.rejections, kubelet.rejections
    finally:
        kubelet.stop()
        logs = image.podman("logs", name).stderr
        image.podman("rm", "-f", name)
    assert "Traceback" not in logs, logs[-2000:]
    assert names, container
    seen = cdi_podman.run(spec_dir, names)
    assert seen.ok, seen.error
    (minor,) = [g.minor for g in host.node.gpus if g.uuid == allocated]
    assert f"/dev/nvidia{minor}" in seen.nodes, seen.nodes
    assert (spec_dir / "nvidia.com-gpu.yaml").exists()
