"""``cdigen dra serve``: the DRA kubelet plugin, composed from discovery, the device view, the
CDI generator, the health board and the API server.

Start order: discover the node, build the device view, listen on the DRA socket, offer the
registration socket (prepare and unprepare of checkpointed claims need no API server), then keep
the ResourceSlices published from a background thread: retried with capped backoff, checked
every few seconds, and republished at every (re-)registration by the kubelet, which deletes the
node's slices when it starts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from cdigen.cdi.driverfiles import scan_driver
from cdigen.cdi.hostfs import HostFS
from cdigen.cdi.spec import SpecOptions
from cdigen.model import Node
from cdigen.plugin.agent.feature_file import FeatureFile
from cdigen.plugin.agent.health import HealthBoard, node_reasons
from cdigen.plugin.agent.kubeapi import api_error
from cdigen.plugin.agent.xid import XidHealth
from cdigen.plugin.dra.checkpoint import read_boot_id
from cdigen.plugin.dra.claims import ClaimReader
from cdigen.plugin.dra.cli_args import shares_problem
from cdigen.plugin.dra.dynamic_mig import MigMaker
from cdigen.plugin.dra.grpc_services import (
    DRA_WORKERS,
    HealthService,
    RegistrationService,
    RegistrationState,
    UnixServer,
    dra_services,
    registration_service,
    socket_paths,
)
from cdigen.plugin.dra.labels import dra_labels
from cdigen.plugin.dra.metrics import DraMetrics
from cdigen.plugin.dra.options import DraOptions
from cdigen.plugin.dra.prepare import Preparer
from cdigen.plugin.dra.slice_publisher import SliceApi, SlicePublisher
from cdigen.plugin.dra.slices import TaintDoc
from cdigen.plugin.dra.status import StatusApi, StatusWriter
from cdigen.plugin.dra.taints import xid_taints
from cdigen.policies.device_view import DeviceView, device_views
from cdigen.policies.dra.order import ordered_views

log = logging.getLogger(__name__)

SOURCE_NODE = "node"
SLICE_RESYNC_S = 2.0  # how often the published slices are compared with what we want
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0


def _preparer(
    options: DraOptions, node: Node, claims: ClaimReader, mig: MigMaker | None
) -> Preparer:
    """The claims' preparer: the driver's files scanned once, specs made like generate's."""
    fs = HostFS(options.host_root)
    spec_options = SpecOptions(
        driver_root=options.driver_root,
        dev_root=options.dev_root,
        sysfs_root=options.sysfs_root,
        host_root=options.host_root,
        capability_devices=options.capability_devices,
    )
    return Preparer(
        driver=options.driver,
        pool=options.node_name,
        node=node,
        views=(),
        reader=claims,
        spec_dir=options.cdi_dir,
        checkpoint=options.checkpoint,
        options=spec_options,
        driver_files=scan_driver(options.driver_root, node.driver_version, fs),
        fs=fs,
        mps=replace(options.mps, memory_step=options.memory_shares.step)
        if options.memory_shares
        else options.mps,
        mig=mig,
        boot_id=read_boot_id(options.proc_root),
    )


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
        node_owner: Callable[[str], dict[str, str] | None] | None = None,
        nvml: Any = None,
        resync_s: float = SLICE_RESYNC_S,
        mig: MigMaker | None = None,
        stale_check: Callable[[], object] | None = None,
    ) -> None:
        self.options = options
        # at start, in the background: does the Node still advertise what our classes serve?
        self._stale_check = stale_check
        self.node = node
        self._nvml = nvml
        self._mig = mig or self._mig_maker()  # --mig-strategy dynamic: MIG devices per claim
        self.preparer = _preparer(options, node, claims, self._mig)
        # after the checkpoint: with dynamic MIG it says which MIG devices are ours
        self.views = self._views(node)
        shares_problem(options.memory_shares, self.views)  # the API server would refuse it
        self.preparer.set_devices(node, self.views)
        self.board = HealthBoard(
            [v.name for v in self.views], parents={v.name: [v.gpu.uuid] for v in self.views}
        )
        self.board.set_reasons(SOURCE_NODE, node_reasons(node))
        self.publisher = SlicePublisher(
            slices, driver=options.driver, node_name=options.node_name, owner=owner
        )
        self._node_owner = node_owner  # read in the background: the API may be away at start
        self._resync_s = resync_s
        self._republish = threading.Event()
        self._published_event = threading.Event()
        self._keeper: threading.Thread | None = None
        self.slices_published = False
        self.slice_problem = "not published yet"
        self.registration = RegistrationState()
        self.metrics = DraMetrics(
            prepared=lambda: len(self.preparer.prepared()),
            health=lambda: self.board.snapshot()[1],
            registered=lambda: self.registration.registered,
        )
        from cdigen.plugin.dra.attribution import attach_dra

        attach_dra(self)  # who holds which GPU, on /metrics (docs/attribution.md)
        self._stop = threading.Event()
        self.status = self._status_writer(claims)
        self._dra_server, self._reg_server = self._servers()
        self._xid: XidHealth | None = None
        self._taint_lock = threading.Lock()
        self.taints: dict[str, list[TaintDoc]] = {}
        self._published = False
        self.features = FeatureFile(options.features_file)  # node labels for NFD
        self.board.subscribe(self._on_health)

    def _status_writer(self, claims: ClaimReader) -> StatusWriter | None:
        """The writer of prepared claims' device status (KEP-4817), where the claim reader can
        write it."""
        if not isinstance(claims, StatusApi):
            return None
        options = self.options
        return StatusWriter(
            claims, driver=options.driver, pool=options.node_name, device_data=self._device_data
        )

    def _servers(self) -> tuple[UnixServer, UnixServer]:
        """The DRA socket's server (claims, health stream) and the registration socket's."""
        options = self.options
        reg_path, dra_path = socket_paths(options.kubelet_dir, options.driver)
        dra = UnixServer(
            dra_path,
            dra_services(
                self.preparer,
                HealthService(self.board, options.node_name, self._stop),
                self.metrics,
                self.status,
            ),
            workers=DRA_WORKERS,
        )
        registration = UnixServer(
            reg_path,
            registration_service(
                RegistrationService(
                    options.driver, dra_path, self.registration, self._republish.set
                )
            ),
            workers=2,
        )
        return dra, registration

    def _mig_maker(self) -> MigMaker | None:
        """What makes MIG devices at prepare: with --mig-strategy dynamic and NVML."""
        if self._nvml is None or self.options.mig_strategy != "dynamic":
            return None
        return MigMaker(self._nvml, self.options.proc_root)

    def _device_data(self, name: str) -> dict[str, str]:
        """What a claim's device status says of device ``name`` (its UUID and PCI bus)."""
        view = next((v for v in self.views if v.name == name), None)
        if view is None:
            return {}
        uuid = view.uuid
        if view.placement is not None:  # the MIG device made for the claim holding it
            made = [
                m["uuid"]
                for claim in self.preparer.prepared().values()
                for m in claim.get("migDevices", [])
                if m["device"] == name
            ]
            uuid = made[0] if made else uuid
        return {"uuid": uuid, "pciBusId": view.gpu.pci_bus_id}

    def _views(self, node: Node) -> list[DeviceView]:
        geometries, taken = None, None
        if self._mig is not None:  # how GPUs partition, and what others made on them
            geometries = self._mig.geometries(node.gpus)
            taken = self._mig.taken(node.gpus, self.preparer.made_migs())
        views = device_views(
            node,
            mig_strategy=self.options.mig_strategy,
            sysfs_root=self.options.sysfs_root,
            geometries=geometries,
            taken=taken,
            numa_form=self.options.numa_form,
        )
        return ordered_views(views, node)

    @property
    def socket_paths(self) -> tuple[Path, Path]:
        """``(registration socket, DRA socket)``."""
        return socket_paths(self.options.kubelet_dir, self.options.driver)

    def start(self) -> None:
        """Serve DRA, offer registration to the kubelet, and keep the slices published in the
        background (the API server may be away: nothing here waits for it)."""
        if self.status is not None:
            self.status.start()
        self._dra_server.start()
        if self._nvml is not None:
            self._xid = XidHealth(
                self._nvml,
                self.board,
                [g.uuid for g in self.node.gpus],
                ignored_xids=self.options.ignored_xids,
                recover_after_s=self.options.recover_after_s,
            )
            self._xid.open()
            self._xid.start(self.options.health_poll_interval_s)  # polls: quiet GPUs recover
        self._reg_server.start()
        self._keeper = threading.Thread(target=self._keep_slices, name="dra-slices", daemon=True)
        self._keeper.start()
        if self._stale_check is not None:
            threading.Thread(target=self._stale_check, name="dra-stale", daemon=True).start()
        log.info(
            "DRA driver %s ready: %d devices in pool %s",
            self.options.driver,
            len(self.views),
            self.options.node_name,
        )

    def _publish_now(self, what: str) -> None:
        """Publish at once (bounded by the API timeout); on failure the keeper retries."""
        with self._taint_lock:
            if not self._published and not self.slices_published:
                self._republish.set()  # never published yet: the keeper's first round does it
                return
            try:
                self._publish()
                self._published = True
                self.metrics.observe_publish(ok=True)
            except Exception as exc:  # the API server may be away: the keeper retries
                self.metrics.observe_publish(ok=False)
                self._published = False
                self._republish.set()
                log.error(
                    "cannot republish the ResourceSlices with %s (retrying): %s",
                    what,
                    api_error(exc),
                )

    def wait_published(self, timeout_s: float) -> bool:
        """Block until the slices are published (tests and start-up logs), or the timeout."""
        return self._published_event.wait(timeout_s)

    def _keep_slices(self) -> None:
        """Publish until it works, then check every ``resync_s`` (and at each registration)
        that the slices are still ours; put them back when deleted or changed. Failures are
        retried with capped backoff and logged once per kind of failure."""
        backoff = BACKOFF_FIRST_S
        last_problem = ""
        owner_known = self._node_owner is None
        while not self._stop.is_set():
            wait = self._resync_s
            try:
                if not owner_known and self._node_owner is not None:
                    self.publisher.set_owner(self._node_owner(self.options.node_name))
                    owner_known = True
                self._republish.clear()
                with self._taint_lock:
                    if not self._published or not self.publisher.in_step():
                        if self._published:
                            log.warning(
                                "the ResourceSlices of pool %s were deleted or changed: "
                                "publishing them again",
                                self.options.node_name,
                            )
                        self._publish()
                        self._published = True
                        self.metrics.observe_publish(ok=True)
                self.slices_published, self.slice_problem = True, ""
                self._published_event.set()
                if last_problem:
                    log.info("the API server answers again")
                last_problem, backoff = "", BACKOFF_FIRST_S
            except Exception as exc:  # the API server may be away or refuse: retry, one line
                self.metrics.observe_publish(ok=False)
                problem = api_error(exc)
                self.slices_published = False
                self.slice_problem = problem
                kind = problem.split(":", 1)[0]
                if kind != last_problem.split(":", 1)[0]:
                    log.error(
                        "cannot publish the ResourceSlices (retrying, at most every %gs): %s",
                        BACKOFF_MAX_S,
                        problem,
                    )
                last_problem = problem
                wait, backoff = backoff, min(backoff * 2, BACKOFF_MAX_S)
            self._republish.wait(wait)

    def health_problem(self) -> str | None:
        """What is pending, for ``/healthz``: None once registered with the kubelet."""
        if not self.registration.registered:
            return "not registered with the kubelet yet"
        return None

    def health_report(self) -> dict[str, Any]:
        """``/healthz``'s body: registration and slice publication."""
        return {
            "registered": self.registration.registered,
            "slicesPublished": self.slices_published,
            "slicesProblem": self.slice_problem or None,
        }

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
        self._publish_now("the new devices")
        return True

    def _publish(self) -> None:
        """Publish the slices with the current taints (the caller holds the taint lock); tainted
        GPUs move to the end of the order, so that first fit meets the best usable set first."""
        views = self.views
        tainted = frozenset(v.gpu.index for v in views if v.name in self.taints)
        if tainted:
            views = ordered_views(views, self.node, tainted)
        self.publisher.publish(views, shares=self.options.memory_shares, taints=self.taints)

    def _on_health(self, reasons: dict[str, tuple[str, ...]]) -> None:
        """A health change: republish the slices when the device taints change."""
        views, strategy = self.views, self.options.mig_strategy
        if strategy == "dynamic":  # the labels describe the MIG devices there are now
            strategy = "mixed"
        shares = self.options.memory_shares
        self.features.update(lambda: dra_labels(self.node, views, reasons, strategy, shares))
        with self._taint_lock:
            taints = xid_taints(reasons, self.options.taint_xids, self.options.driver)
            if taints == self.taints:
                return
            self.taints = taints
        self._publish_now("new taints")
        log.info("device taints now: %s", {d: t[0]["effect"] for d, t in taints.items()} or "none")

    def stop(self) -> None:
        """Stop serving; delete the slices when configured to (a clean uninstall)."""
        self._stop.set()
        self._republish.set()
        self.board.wake_waiters()
        self._reg_server.stop()
        if self._xid is not None:
            self._xid.stop()
        self._dra_server.stop()
        if self.status is not None:
            self.status.stop()
        if self.options.delete_slices_on_exit:
            try:
                self.publisher.delete_all()
            except Exception as exc:  # the API server may be gone at shutdown: say so, go on
                log.error("could not delete the ResourceSlices: %s", api_error(exc))
