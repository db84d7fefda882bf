"""``cdigen dra serve``: the DRA kubelet plugin, composed from discovery, the device view, the
CDI generator, the health board and the API server.

Start order: discover the node, build the device view, listen on the DRA socket, publish the
ResourceSlices, and only then offer the registration socket, so that the kubelet never calls a
plugin that is not ready.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from cdigen.cdi.host import HostFS, scan_driver
from cdigen.cdi.spec import SpecOptions
from cdigen.model import Node
from plugin.dra.claims import ClaimReader
from plugin.dra.kube import SliceApi, SlicePublisher
from plugin.dra.mps import MpsSettings
from plugin.dra.prepare import Preparer
from plugin.dra.service import (
    HealthService,
    RegistrationService,
    RegistrationState,
    UnixServer,
    dra_services,
    registration_service,
    socket_paths,
)
from plugin.dra.slices import MemoryShares, TaintDoc
from plugin.health import HealthBoard, node_reasons
from plugin.xid import XidHealth
from policies.device_view import DRA_DRIVER, DeviceView, device_views
from policies.dra_order import ordered_views

log = logging.getLogger(__name__)

DEFAULT_DRIVER = DRA_DRIVER
DEFAULT_KUBELET_DIR = "/var/lib/kubelet"
DEFAULT_CDI_DIR = "/var/run/cdi"
SOURCE_NODE = "node"
TAINT_EFFECTS = ("NoSchedule", "NoExecute")
# Xids that taint a device by default: 48 (double-bit ECC), 79 (fallen off the bus) and 95
# (uncontained ECC) evict (NoExecute); 64 and 94 (row remapping, contained ECC) stop new claims.
DEFAULT_TAINT_XIDS: Mapping[int, str] = {
    48: "NoExecute",
    79: "NoExecute",
    95: "NoExecute",
    64: "NoSchedule",
    94: "NoSchedule",
}
_XID_RE = re.compile(r"critical Xid (\d+)")


@dataclass(frozen=True)
class DraOptions:
    """Everything ``cdigen dra serve`` was told."""

    node_name: str
    driver: str = DEFAULT_DRIVER
    kubelet_dir: Path = Path(DEFAULT_KUBELET_DIR)
    cdi_dir: Path = Path(DEFAULT_CDI_DIR)
    state_dir: Path | None = None  # default: <kubelet dir>/plugins/<driver>
    mig_strategy: str = "mixed"
    driver_root: str = "/"
    dev_root: str = "/"
    sysfs_root: str = "/sys"
    host_root: str = "/"
    delete_slices_on_exit: bool = False
    ignored_xids: tuple[int, ...] = (13, 31, 43, 45, 68, 109)
    recover_after_s: float = 60.0
    memory_shares: MemoryShares | None = None  # publish whole GPUs as consumable capacity
    mps: MpsSettings = field(default_factory=MpsSettings)
    taint_xids: Mapping[int, str] = field(default_factory=lambda: dict(DEFAULT_TAINT_XIDS))
    # driver capabilities claims may ask for beyond the node-wide ones (GpuConfig, docs/dra.md)
    capability_devices: tuple[str, ...] = ()

    @property
    def checkpoint(self) -> Path:
        """Where the prepared claims are kept across restarts."""
        base = self.state_dir or self.kubelet_dir / "plugins" / self.driver
        return base / "checkpoint.json"


class DraPlugin:
    """One DRA driver on one node: sockets, slices, prepared claims and health."""

    def __init__(
        self,
        options: DraOptions,
        node: Node,
        *,
        slices: SliceApi,
        claims: ClaimReader,
        owner: dict[str, str] | None = None,
        nvml: Any = None,
    ) -> None:
        self.options = options
        self.node = node
        self._nvml = nvml
        self.views = self._views(node)
        self.board = HealthBoard(
            [v.name for v in self.views], parents={v.name: [v.gpu.uuid] for v in self.views}
        )
        self.board.set_reasons(SOURCE_NODE, node_reasons(node))
        fs = HostFS(options.host_root)
        spec_options = SpecOptions(
            driver_root=options.driver_root,
            dev_root=options.dev_root,
            sysfs_root=options.sysfs_root,
            host_root=options.host_root,
            capability_devices=options.capability_devices,
        )
        self.preparer = Preparer(
            driver=options.driver,
            pool=options.node_name,
            node=node,
            views=self.views,
            reader=claims,
            spec_dir=options.cdi_dir,
            checkpoint=options.checkpoint,
            options=spec_options,
            driver_files=scan_driver(options.driver_root, node.driver_version, fs),
            fs=fs,
            mps=options.mps,
        )
        self.publisher = SlicePublisher(
            slices, driver=options.driver, node_name=options.node_name, owner=owner
        )
        self.registration = RegistrationState()
        self._stop = threading.Event()
        reg_path, dra_path = socket_paths(options.kubelet_dir, options.driver)
        self._dra_server = UnixServer(
            dra_path,
            dra_services(self.preparer, HealthService(self.board, options.node_name, self._stop)),
        )
        self._reg_server = UnixServer(
            reg_path,
            registration_service(RegistrationService(options.driver, dra_path, self.registration)),
            workers=2,
        )
        self._xid: XidHealth | None = None
        self._taint_lock = threading.Lock()
        self.taints: dict[str, list[TaintDoc]] = {}
        self._published = False
        self.board.subscribe(self._on_health)

    def _views(self, node: Node) -> list[DeviceView]:
        views = device_views(
            node, mig_strategy=self.options.mig_strategy, sysfs_root=self.options.sysfs_root
        )
        return ordered_views(views, node)

    @property
    def socket_paths(self) -> tuple[Path, Path]:
        """``(registration socket, DRA socket)``."""
        return socket_paths(self.options.kubelet_dir, self.options.driver)

    def start(self) -> None:
        """Serve DRA, publish the slices, then offer registration to the kubelet."""
        self._dra_server.start()
        with self._taint_lock:
            self._publish()
            self._published = True
        if self._nvml is not None:
            self._xid = XidHealth(
                self._nvml,
                self.board,
                [g.uuid for g in self.node.gpus],
                ignored_xids=self.options.ignored_xids,
                recover_after_s=self.options.recover_after_s,
            )
            self._xid.open()
            self._xid.start()
        self._reg_server.start()
        log.info(
            "DRA driver %s ready: %d devices in pool %s",
            self.options.driver,
            len(self.views),
            self.options.node_name,
        )

    def apply_node(self, node: Node) -> bool:
        """A re-discovered node: when the devices changed, republish the slices (a new
        generation) and prepare against the new devices. True if anything changed."""
        views = self._views(node)
        self.board.set_reasons(SOURCE_NODE, node_reasons(node))
        if [(v.name, v.attributes, v.capacity) for v in views] == [
            (v.name, v.attributes, v.capacity) for v in self.views
        ]:
            self.node = node
            return False
        self.node, self.views = node, views
        self.board.reset_devices(
            [v.name for v in views], parents={v.name: [v.gpu.uuid] for v in views}
        )
        self.preparer.set_devices(node, views)
        with self._taint_lock:
            self._publish()
        return True

    def _publish(self) -> None:
        """Publish the slices with the current taints (the caller holds the taint lock); tainted
        GPUs move to the end of the order, so that first fit meets the best usable set first."""
        views = self.views
        tainted = frozenset(v.gpu.index for v in views if v.name in self.taints)
        if tainted:
            views = ordered_views(views, self.node, tainted)
        self.publisher.publish(views, shares=self.options.memory_shares, taints=self.taints)

    def device_taints(self, reasons: Mapping[str, tuple[str, ...]]) -> dict[str, list[TaintDoc]]:
        """The taints the health reasons call for: one per device whose reasons name a
        configured Xid (key ``<driver>/xid``, the Xid as value; NoExecute wins)."""
        out: dict[str, list[TaintDoc]] = {}
        for device, held in sorted(reasons.items()):
            worst: tuple[int, int] | None = None  # (effect rank, xid)
            for reason in held:
                match = _XID_RE.search(reason)
                if not match:
                    continue
                xid = int(match.group(1))
                effect = self.options.taint_xids.get(xid)
                if effect is None:
                    continue
                rank = TAINT_EFFECTS.index(effect)
                if worst is None or rank > worst[0]:
                    worst = (rank, xid)
            if worst is not None:
                out[device] = [
                    {
                        "key": f"{self.options.driver}/xid",
                        "value": str(worst[1]),
                        "effect": TAINT_EFFECTS[worst[0]],
                    }
                ]
        return out

    def _on_health(self, reasons: dict[str, tuple[str, ...]]) -> None:
        """A health change: republish the slices when the device taints change."""
        with self._taint_lock:
            taints = self.device_taints(reasons)
            if taints == self.taints:
                return
            self.taints = taints
            if not self._published:
                return
            try:
                self._publish()
            except Exception as exc:  # the API server may be away: the next change retries
                log.error("could not republish the ResourceSlices with new taints: %s", exc)
                return
        log.info("device taints now: %s", {d: t[0]["effect"] for d, t in taints.items()} or "none")

    def stop(self) -> None:
        """Stop serving; delete the slices when configured to (a clean uninstall)."""
        self._stop.set()
        self.board.wake_waiters()
        self._reg_server.stop()
        if self._xid is not None:
            self._xid.stop()
        self._dra_server.stop()
        if self.options.delete_slices_on_exit:
            try:
                self.publisher.delete_all()
            except Exception as exc:  # the API server may be gone at shutdown: say so, go on
                log.error("could not delete the ResourceSlices: %s", exc)


def serve_until_signalled(plugin: DraPlugin) -> int:
    """Run ``plugin`` until SIGTERM/SIGINT; exit 0."""
    stop = threading.Event()

    def on_stop(signum: int, frame: FrameType | None) -> None:
        log.info("signal %s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    try:
        plugin.start()
        log.info("cdigen DRA plugin ready (pid %d)", os.getpid())
        stop.wait()
    finally:
        plugin.stop()
    return 0
