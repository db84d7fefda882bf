"""A Debian root file system for container tests, made with mmdebstrap and cached between runs.

``build_debian_root(dest, packages)`` makes one at ``dest``; :func:`cached_debian_root` keeps one
per package set under the temp dir (``CDIGEN_TEST_ROOTS`` overrides where), built once and
reused by later test sessions. The root is Debian's essential set (a shell, the dynamic loader,
``ldconfig``) and whatever ``packages`` add (``gcc,libc6-dev`` for link checks: about 300 MB and
35 s of CPU), without docs, man pages or locales, and without Recommends.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

SUITE = "bookworm"
VARIANT = "essential"
OPTIONS = (
    "--dpkgopt=force-unsafe-io",  # no fsync: a failed build is thrown away whole
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    '--aptopt=APT::Install-Recommends "false"',
)


def missing_tools() -> str | None:
    """Why no Debian root can be built here, or None."""
    if os.geteuid() != 0:
        return "needs root (mmdebstrap in root mode, podman --rootfs)"
    if shutil.which("mmdebstrap") is None:
        return "mmdebstrap is not installed (apt-get install mmdebstrap)"
    return None


def build_debian_root(
    dest: str | Path, packages: Sequence[str] = (), *, suite: str = SUITE, timeout: int = 900
) -> Path:
    """Make an essential Debian ``suite`` root with ``packages`` at ``dest`` (must not exist).

    Built beside ``dest`` and renamed into place, so ``dest`` is complete or absent. Raises
    RuntimeError with mmdebstrap's last lines if it fails (no network, no mirror).
    """
    target = Path(dest)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    root = work / "root"
    command = ["mmdebstrap", f"--variant={VARIANT}", "--mode=root", "--quiet", *OPTIONS]
    if packages:
        command.append(f"--include={','.join(packages)}")
    try:
        result = subprocess.run(
            [*command, suite, str(root)], capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0:
            tail = " | ".join((result.stderr or result.stdout).strip().splitlines()[-3:])
            raise RuntimeError(f"mmdebstrap failed ({result.returncode}): {tail}")
        os.rename(root, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def cached_debian_root(packages: Sequence[str] = (), *, suite: str = SUITE) -> Path:
    """A Debian root with ``packages``, built on first use and kept for later sessions."""
    key = hashlib.sha256(f"{suite} {VARIANT} {OPTIONS} {sorted(packages)}".encode()).hexdigest()[
        :12
    ]
    base = Path(os.environ.get("CDIGEN_TEST_ROOTS") or Path(tempfile.gettempdir()) / "cdigen-roots")
    base.mkdir(parents=True, exist_ok=True)
    dest = base / f"debian-{suite}-{key}"
    if not (dest / "usr/bin").is_dir():
        build_debian_root(dest, packages, suite=suite)
    return dest
