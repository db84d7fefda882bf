"""The device nodes a container needs: NVIDIA's control nodes under a dev root, a GPU's DRM
nodes from sysfs, each with what ``stat`` says of it on the host."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from cdigen.cdi.hostfs import HOST, HostFS, host_path
from cdigen.nodefile import normalize_bus_id

CONTROL_NODES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)


def gpu_node(minor: int) -> str:
    """The device node of the GPU with char minor ``minor``: ``/dev/nvidia<minor>``."""
    return f"/dev/nvidia{minor}"


def caps_node(minor: int) -> str:
    """The nvidia-caps node of a MIG capability with minor ``minor`` (a GI's or a CI's):
    ``/dev/nvidia-caps/nvidia-cap<minor>``."""
    return f"/dev/nvidia-caps/nvidia-cap{minor}"


@dataclass(frozen=True)
class DeviceNodeInfo:
    """A device node: its path in the container and on the host, and what ``stat`` says."""

    path: str
    host_path: str
    type: str | None = None  # "c" or "b"; None when the node is missing or not a device
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None  # permission bits only, as runc expects
    permissions: str | None = None  # cgroup access derived from the mode bits: "r", "w"


def device_node(dev_root: str | Path, path: str, fs: HostFS = HOST) -> DeviceNodeInfo:
    """The node ``path`` (e.g. ``/dev/nvidia0``) under ``dev_root``; stat fields None if absent."""
    where = host_path(dev_root, path)
    try:
        st = fs.stat(where)
    except OSError:
        return DeviceNodeInfo(path=path, host_path=where)
    if stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISBLK(st.st_mode):
        kind = "b"
    else:  # a plain file where a node should be: emit the path, let the runtime report it
        return DeviceNodeInfo(path=path, host_path=where)
    mode = stat.S_IMODE(st.st_mode)
    access = ("r" if mode & 0o444 else "") + ("w" if mode & 0o222 else "")
    return DeviceNodeInfo(
        path=path,
        host_path=where,
        type=kind,
        major=os.major(st.st_rdev),
        minor=os.minor(st.st_rdev),
        file_mode=mode,
        permissions=access or None,
    )


def node_exists(dev_root: str | Path, path: str, fs: HostFS = HOST) -> bool:
    """Whether ``path`` exists under ``dev_root`` (as anything)."""
    return fs.lexists(host_path(dev_root, path))


def control_nodes(dev_root: str | Path, fs: HostFS = HOST) -> tuple[DeviceNodeInfo, ...]:
    """The NVIDIA control nodes that exist under ``dev_root``."""
    return tuple(
        device_node(dev_root, p, fs) for p in CONTROL_NODES if node_exists(dev_root, p, fs)
    )


def drm_nodes(sysfs_root: str | Path, pci_bus_id: str, fs: HostFS = HOST) -> tuple[str, ...]:
    """``/dev/dri/cardN`` and ``renderDN`` of a GPU, from ``<sysfs>/bus/pci/devices/<bdf>/drm``."""
    drm = Path(sysfs_root) / "bus" / "pci" / "devices" / normalize_bus_id(pci_bus_id) / "drm"
    try:
        names = fs.listdir(str(drm))
    except OSError:
        return ()
    found = [n for n in names if re.fullmatch(r"card\d+|renderD\d+", n)]
    # cards before render nodes, each in numeric order
    found.sort(key=lambda n: (n.startswith("render"), int(re.sub(r"\D", "", n))))
    return tuple(f"/dev/dri/{n}" for n in found)
