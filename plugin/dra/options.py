"""What ``cdigen dra serve`` was told, with its defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cdigen.cdi.specdir import DYNAMIC_SPEC_DIR
from cdigen.constants import DRA_DRIVER, KUBELET_DIR
from cdigen.discover.numa import NumaForm
from cdigen.memory_shares import MemoryShares
from cdigen.model import DRA_MIG_STRATEGY
from cdigen.plugin.agent.health_watchers import DEFAULT_POLL_INTERVAL_S
from cdigen.plugin.agent.xid import DEFAULT_IGNORED_XIDS, DEFAULT_RECOVER_AFTER_S
from cdigen.plugin.dra.mps import MpsSettings
from cdigen.plugin.dra.taints import DEFAULT_TAINT_XIDS

DEFAULT_DRIVER = DRA_DRIVER
DEFAULT_KUBELET_DIR = KUBELET_DIR
DEFAULT_CDI_DIR = str(DYNAMIC_SPEC_DIR)


@dataclass(frozen=True)
class DraOptions:
    """Everything ``cdigen dra serve`` was told."""

    node_name: str
    driver: str = DEFAULT_DRIVER
    kubelet_dir: Path = Path(DEFAULT_KUBELET_DIR)
    cdi_dir: Path = Path(DEFAULT_CDI_DIR)
    state_dir: Path | None = None  # default: <kubelet dir>/plugins/<driver>
    mig_strategy: str = DRA_MIG_STRATEGY
    driver_root: str = "/"
    dev_root: str = "/"
    sysfs_root: str = "/sys"
    host_root: str = "/"
    proc_root: str = "/proc"  # nvidia-caps minors of the MIG devices made (dynamic)
    delete_slices_on_exit: bool = False
    ignored_xids: tuple[int, ...] = DEFAULT_IGNORED_XIDS
    recover_after_s: float = DEFAULT_RECOVER_AFTER_S
    health_poll_interval_s: float = DEFAULT_POLL_INTERVAL_S  # NVML probes: Xid recovery
    memory_shares: MemoryShares | None = None  # publish whole GPUs as consumable capacity
    mps: MpsSettings = field(default_factory=MpsSettings)
    taint_xids: Mapping[int, str] = field(default_factory=lambda: dict(DEFAULT_TAINT_XIDS))
    # driver capabilities claims may ask for beyond the node-wide ones (GpuConfig, docs/dra.md)
    capability_devices: tuple[str, ...] = ()
    features_file: Path | None = None  # NFD feature file kept current with the node labels
    # resource.kubernetes.io/numaNode: one int, or the KEP-6072 list (DRAListTypeAttributes)
    numa_form: NumaForm = "scalar"

    @property
    def checkpoint(self) -> Path:
        """Where the prepared claims are kept across restarts."""
        base = self.state_dir or self.kubelet_dir / "plugins" / self.driver
        return base / "checkpoint.json"
