"""Discovery: every source of a :class:`cdigen.model.Node` behind one function, :func:`load_node`.

Sources: ``nvml`` (the driver, through pynvml), ``builtin:NAME`` (a shipped sample) or the path
of a node file (YAML/JSON). Imported ``nvidia-smi topo -m`` texts become node files through
``cdigen topo import``.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from cdigen.discover.sources import NVML, describes_hardware, from_hardware

if TYPE_CHECKING:  # the CLI imports this package to register commands: keep that cheap
    from cdigen.model import Node

__all__ = ["NVML", "describes_hardware", "from_hardware", "load_node"]


def load_node(
    source: str = NVML,
    *,
    sysfs_root: str | Path = "/sys",
    proc_root: str | Path = "/proc",
    nvml_module: ModuleType | object | None = None,
    driver_root: str = "/",
    host_root: str = "/",
) -> Node:
    """The Node that ``source`` describes: ``nvml``, ``builtin:NAME`` or a node-file path.

    The roots are read only by the NVML source: ``sysfs_root`` and ``proc_root`` (NUMA fallback,
    MIG capability minors) and ``driver_root`` (a host path under ``host_root``), where NVML's
    library is looked for first. ``nvml_module`` replaces ``pynvml`` (tests pass a double).
    """
    from cdigen.discover.builtin import PREFIX, load_builtin, suggest_builtin

    if source == NVML:
        from cdigen.discover.nvml import discover_nvml

        return discover_nvml(
            nvml_module,
            sysfs_root=Path(sysfs_root),
            proc_root=Path(proc_root),
            driver_root=driver_root,
            host_root=host_root,
        )
    if source.startswith(PREFIX):
        return load_builtin(source.removeprefix(PREFIX))
    suggest_builtin(source)
    from cdigen.nodefile import load_node_file

    return load_node_file(source)
