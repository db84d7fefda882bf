"""Discovery: every source of a :class:`cdigen.model.Node` behind one function, :func:`load_node`.

Sources: ``nvml`` (the driver, through pynvml), ``builtin:NAME`` (a shipped sample) or the path
of a node file (YAML/JSON). Imported ``nvidia-smi topo -m`` texts become node files through
``cdigen topo import``.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports this package to register commands: keep that cheap
    from cdigen.model import Node

NVML = "nvml"


def load_node(
    source: str = NVML,
    *,
    sysfs_root: str | Path = "/sys",
    proc_root: str | Path = "/proc",
    nvml_module: ModuleType | object | None = None,
) -> Node:
    """The Node that ``source`` describes: ``nvml``, ``builtin:NAME`` or a node-file path.

    ``sysfs_root`` and ``proc_root`` are read only by the NVML source (NUMA fallback, MIG
    capability minors); ``nvml_module`` replaces ``pynvml`` (tests pass a double).
    """
    from cdigen.discover.builtin import PREFIX, load_builtin

    if source == NVML:
        from cdigen.discover.nvml import discover_nvml

        return discover_nvml(nvml_module, sysfs_root=Path(sysfs_root), proc_root=Path(proc_root))
    if source.startswith(PREFIX):
        return load_builtin(source.removeprefix(PREFIX))
    from cdigen.nodefile import load_node_file

    return load_node_file(source)
