"""podman + runc run a busybox root with CDI devices from a private /etc/cdi (root only)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.cdihost import LIB_DIR

BUSYBOX = "/bin/busybox"
CONTAINERS_CONF = (
    '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
    '[engine]\nruntime = "runc"\n'
)


# What a container given the graphics capability sees of a ``build_host(graphics=True)`` host:
# the Vulkan ICD and glvnd EGL vendor JSON, the GLX library (also in the RHEL-family dir) and
# glvnd's libGLX_indirect link. Checked from inside the container with :func:`file_check`.
GRAPHICS_FILES = (
    "/usr/share/vulkan/icd.d/nvidia_icd.json",
    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    "/usr/lib64/libGLX_nvidia.so.0",
    f"{LIB_DIR}/libGLX_nvidia.so.0",
    f"{LIB_DIR}/libGLX_indirect.so.0",
)


def file_check(paths: tuple[str, ...]) -> str:
    """A shell script (busybox is enough) printing ``HAVE <path>`` and its content for each of
    ``paths`` that exists in the container, ``LINK <path> <target>`` for each link; exits 0."""
    return (
        f"for f in {' '.join(paths)}; do test -e $f && echo HAVE $f && cat $f; "
        "test -L $f && echo LINK $f $(readlink $f); done; true"
    )


def missing_tools() -> str | None:
    if os.geteuid() != 0:
        return "needs root (podman --rootfs with mknod'ed devices and private mounts)"
    for tool in ("podman", "runc", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install podman runc busybox-static)"
    if not os.path.exists(BUSYBOX):
        return f"{BUSYBOX} is missing (apt-get install busybox-static)"
    return None


class Podman:
    """Runs podman against a private /etc/cdi holding ``cdi`` (and an empty /var/run/cdi).

    ``rootfs``: the container's root (used through an overlay, so it stays as it is); default:
    a busybox root made in ``work``. ``etc_cdi``/``var_run_cdi``: the folders bind-mounted over
    /etc/cdi and /var/run/cdi for each run (a subclass or test may point them elsewhere).
    """

    def __init__(self, work: Path, store: Path, rootfs: Path | None = None) -> None:
        self.work = work
        self.store = store  # podman wants its runroot path under 50 characters
        self.rootfs = rootfs or work / "rootfs"
        self.overlay = rootfs is not None
        self.cdi = work / "cdi"
        self.etc_cdi = self.cdi
        self.var_run_cdi = work / "empty"
        work.mkdir(parents=True, exist_ok=True)
        self.cdi.mkdir()
        (work / "empty").mkdir()
        (work / "containers.conf").write_text(CONTAINERS_CONF)
        if rootfs is not None:
            return
        for d in ("bin", "dev", "proc", "sys", "etc", "tmp"):
            (self.rootfs / d).mkdir(parents=True)
        shutil.copy(BUSYBOX, self.rootfs / "bin/busybox")
        applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True)
        for applet in applets.stdout.split():
            if applet != "busybox":
                os.symlink("busybox", self.rootfs / "bin" / applet)

    def run(
        self, script: str, *devices: str, extra: str = "", global_args: str = ""
    ) -> subprocess.CompletedProcess[str]:
        """Run ``/bin/sh -c script`` in a container with the given CDI devices; ``extra``:
        more ``podman run`` options (e.g. ``-v HOST:CONTAINER:ro``); ``global_args``: podman's
        own options (e.g. ``--log-level=debug``)."""
        w = self.work
        rootfs = f"{self.rootfs}:O" if self.overlay else str(self.rootfs)
        device_args = " ".join([*(f"--device {d}" for d in devices), extra])
        inner = (
            f"mount --bind {self.etc_cdi} /etc/cdi && "
            f"mount --bind {self.var_run_cdi} /var/run/cdi && "
            f"podman {global_args} --root {self.store}/root --runroot {self.store}/run "
            "--storage-driver vfs "
            f"run --rm --network none {device_args} --rootfs {rootfs} /bin/sh -c '{script}'"
        )
        os.makedirs("/etc/cdi", exist_ok=True)
        os.makedirs("/var/run/cdi", exist_ok=True)
        env = {**os.environ, "CONTAINERS_CONF": str(w / "containers.conf")}
        return subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", inner],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
