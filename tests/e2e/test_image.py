"""The cdigen image, built here without a registry (deploy/image/build.sh: mmdebstrap + podman),
run as a user would: ``--help``, ``generate --dry-run``, and the plugin container against the
kubelet's own device-plugin code (``../shared/tools/bin/kubeletsim``) through a mounted plugin dir.

The image is built once per session into a private podman store under /var/tmp, tagged with a hash
of everything that goes into it, so a rerun with unchanged sources reuses it.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.helpers.podman import CONTAINERS_CONF
from tests.helpers.shared import require_shared_tool

REPO = Path(__file__).resolve().parents[2]
STORE = Path("/var/tmp/cdigen-image-test")  # podman wants short --root/--runroot paths


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

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.prefix = [
            "podman", "--root", str(STORE / "root"), "--runroot", str(STORE / "run"),
            "--storage-driver", "vfs",
        ]  # fmt: skip
        self.env = {**os.environ, "CONTAINERS_CONF": str(STORE / "containers.conf")}

    def podman(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.prefix, *args], capture_output=True, text=True, env=self.env, timeout=timeout
        )

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``podman run --rm`` of the image with ``args`` after the entrypoint (cdigen)."""
        return self.podman("run", "--rm", "--network", "none", self.tag, *args)


@pytest.fixture(scope="session")
def image() -> Iterator[Image]:
    reason = _missing_tools()
    if reason:
        pytest.skip(reason)
    STORE.mkdir(parents=True, exist_ok=True)
    (STORE / "containers.conf").write_text(CONTAINERS_CONF)
    found = Image(f"localhost/cdigen:test-{_source_hash()}")
    smoke = found.podman("info", timeout=60)
    if smoke.returncode != 0:
        pytest.skip(f"podman does not work on this machine: {smoke.stderr.strip()[-300:]}")
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
        print(f"image {found.tag} built in {time.monotonic() - start:.0f} s")
    yield found


def test_help_runs_in_the_image(image: Image) -> None:
    result = image.run("--help")
    assert result.returncode == 0, result.stderr
    assert "generate" in result.stdout and "plugin" in result.stdout


def test_every_dependency_imports_in_the_image(image: Image) -> None:
    """The compiled ones too (grpcio needs libstdc++ from the Debian root)."""
    modules = "grpc, google.protobuf, yaml, jsonschema, networkx, celpy, prometheus_client, pynvml"
    result = image.podman(
        "run", "--rm", "--network", "none", "--entrypoint", "python3", image.tag,
        "-c", f"import {modules}; import plugin.serve, policies, cdigen.cli",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]


def test_generate_dry_run_in_the_image(image: Image) -> None:
    result = image.run("generate", "--node", "builtin:rtx4090", "--dry-run")
    assert result.returncode == 0, result.stderr
    spec = yaml.safe_load(result.stdout)
    assert spec["kind"] == "nvidia.com/gpu"
    assert {"0", "all"} <= {d["name"] for d in spec["devices"]}


def test_image_runs_as_non_root_by_default(image: Image) -> None:
    result = image.podman("run", "--rm", "--network", "none", "--entrypoint", "id", image.tag)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("uid=65532")


def test_plugin_container_passes_kubeletsim(image: Image, tmp_path: Path) -> None:
    kubeletsim = require_shared_tool("kubeletsim")
    from cdigen.nodefile import dump_node
    from tests.cdihost import build_host, make_node

    plugin_dir = tmp_path / "device-plugins"
    spec_dir = tmp_path / "cdi"
    plugin_dir.mkdir()
    spec_dir.mkdir()
    # The simulator injects the returned names as a runtime does, stat'ing every device node and
    # mount source on this host: a fake host with real (mknod) nodes, mounted at the same path.
    host = build_host(tmp_path / "host", make_node(2))
    if not host.real_nodes:
        pytest.skip("mknod is not permitted here, so no device nodes for the runtime check")
    node_file = tmp_path / "node.yaml"
    node_file.write_text(dump_node(host.node, "yaml"))
    name = f"cdigen-test-{uuid.uuid4().hex[:8]}"
    # kubelet first: the simulator owns kubelet.sock before the plugin container starts
    sim = subprocess.Popen(
        [str(kubeletsim), "-dir", str(plugin_dir), "-spec-dir", str(spec_dir),
         "-expect", "nvidia.com/gpu", "-count", "1", "-once", "-wait", "60s"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
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
        out, _ = sim.communicate(timeout=120)
    finally:
        if sim.poll() is None:
            sim.kill()
        logs = image.podman("logs", name).stderr
        image.podman("rm", "-f", name)
    assert sim.returncode == 0, out[-3000:] + "\n--- plugin container ---\n" + logs[-2000:]
    assert "failures=0" in out
    assert (spec_dir / "nvidia.com-gpu.yaml").exists()
