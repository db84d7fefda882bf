"""Running the plugin: the composition root. One gRPC server per resource, registration,
health watchers, and the layout (:mod:`.layout`) swapped whole on every change.

Order matters to the kubelet: a server must be listening on its socket before we register,
because the kubelet dials back during ``Register``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdigen.cdi.cache import SpecCache
from cdigen.errors import CdigenError
from cdigen.model import Node
from cdigen.plugin.agent.feature_file import FeatureFile
from cdigen.plugin.agent.health import SOURCE_NODE, HealthBoard, node_reasons, with_board_health
from cdigen.plugin.agent.health_watchers import Poller, SpecDirWatcher
from cdigen.plugin.agent.lifecycle import HTTP_WAIT_S, open_nvml, serve_until_signalled
from cdigen.plugin.agent.sockets import make_plugin_dir
from cdigen.plugin.agent.xid import XidHealth
from cdigen.plugin.deviceplugin.call_records import RequestRecorder
from cdigen.plugin.deviceplugin.config import PluginConfig
from cdigen.plugin.deviceplugin.generate_specs import write_specs
from cdigen.plugin.deviceplugin.grpc_server import ResourceServer, stop_servers
from cdigen.plugin.deviceplugin.kubelet import Registrar
from cdigen.plugin.deviceplugin.kubelet_requests import (
    AllocateRefused,
)
from cdigen.plugin.deviceplugin.labels import plugin_labels
from cdigen.plugin.deviceplugin.layout import (
    AllocatorCache,
    Layout,
    gpus_down,
    plan_layout,
    plan_resources_for,
)
from cdigen.plugin.deviceplugin.resources import AdvertisedDevice, Resource
from cdigen.plugin.deviceplugin.servicer import DevicePluginService
from cdigen.plugin.deviceplugin.sharing import ShareAllocation, advisory_warning, no_slices_warnings
from cdigen.plugin.deviceplugin.watchers import plugin_watchers
from cdigen.policies.policy_set import PolicySet, load_policy_set

if TYPE_CHECKING:
    from cdigen.plugin.deviceplugin.metrics import MetricsServer, PluginMetrics

__all__ = [
    "Plugin",
    "PolicySet",
    "ResourceServer",
    "make_plugin_dir",
    "open_nvml",  # re-exported: the CLIs start here
    "serve_until_signalled",
]

log = logging.getLogger("cdigen.plugin")


# --- the whole plugin -------------------------------------------------------------------------


class Plugin:
    """Everything ``cdigen plugin serve`` runs, startable and stoppable in-process (tests)."""

    def __init__(
        self,
        config: PluginConfig,
        *,
        node: Node | None = None,
        nvml: Any = None,
        watch_interval_s: float = 0.1,
        rediscover: Callable[[], Node] | None = None,
        record_requests: str | Path | None = None,
    ) -> None:
        self.config = config
        # GetPreferredAllocation requests as 'cdigen policy replay' reads them (a bad path: exit 2)
        self.recorder = RequestRecorder(record_requests) if record_requests is not None else None
        self.node = node if node is not None else self._discover(config.node)  # as its source
        self._nvml = nvml
        self._rediscover = rediscover
        self._policies: PolicySet | None = None  # loaded at start
        self._allocators = AllocatorCache()  # engines by (node, policy); new with each policy set
        self.layout: Layout = plan_layout(self.node, config, None)  # swapped whole, never edited
        self.features = FeatureFile(config.features_file)  # node labels for NFD (--features-file)
        self.metrics: PluginMetrics | None = None
        self._metrics_server: MetricsServer | None = None
        if config.metrics_address is not None:
            from cdigen.plugin.deviceplugin.metrics import PluginMetrics

            self.metrics = PluginMetrics()
            for resource in self.resources:
                self.metrics.declare_resource(resource.name)
        self.board = HealthBoard((d.id for d in self.devices), self.layout.parents())
        self.board.set_reasons(SOURCE_NODE, node_reasons(self.node))
        if self.metrics is not None:  # who holds which GPU, on /metrics (docs/attribution.md)
            from cdigen.plugin.deviceplugin.attribution import attach_plugin

            attach_plugin(self)
        self.servers: list[ResourceServer] = []
        # layout changes, policy reloads, health rebuilds and server restarts, one at a time;
        # re-entrant: the board calls _on_health back while apply_node holds it
        self._layout_lock = threading.RLock()
        self._spec_watcher: SpecDirWatcher | None = None
        # The one view of the spec dirs: native edits and the spec-dir watcher share it.
        self.spec_cache = SpecCache(config.spec_dirs)
        self._poller: Poller | None = None
        self._xid: XidHealth | None = None
        self.registrar = Registrar(
            config.plugin_dir,
            lambda: list(self.servers),
            self._restart_servers,
            interval_s=watch_interval_s,
            observer=self.metrics,
        )

    def _discover(self, source: str) -> Node:
        """The node from ``nvml``, ``builtin:NAME`` or a node file (discovery's loader); the
        roots are read by NVML discovery only (NUMA fallback, MIG capability minors)."""
        from cdigen.discover import load_node

        config = self.config
        return load_node(
            source,
            sysfs_root=config.sysfs_root,
            proc_root=config.proc_root,
            driver_root=config.driver_root,
            host_root=config.host_root,
        )

    # --- the layout in force ------------------------------------------------------------------

    @property
    def resources(self) -> tuple[Resource, ...]:
        """The advertised resources of the layout in force."""
        return self.layout.resources

    @property
    def devices(self) -> tuple[AdvertisedDevice, ...]:
        """Every advertised device, over all resources."""
        return self.layout.devices

    def resource(self, name: str) -> Resource:
        """The planned resource ``name`` (KeyError if the layout has none)."""
        return self.layout.resource(name)

    def policy_for(self, resource: str) -> str | None:
        """The name of the policy in force for ``resource`` (None before policies load)."""
        engine = self.layout.engines.get(resource)
        return engine.policy.name if engine is not None else None

    def _effective(self, node: Node, devices: Sequence[AdvertisedDevice]) -> Node:
        """``node`` with the health the board holds (the board owns health); ``devices``: what
        ``node`` advertises."""
        return with_board_health(node, gpus_down(self.board.snapshot()[1], devices))

    def _swap(self, layout: Layout, *, announce: bool = False) -> None:
        """Put ``layout`` in force: one assignment, so gRPC threads see old or new, whole.
        ``announce``: log and export its policies (a reload or new resources)."""
        self.layout = layout
        self.features.update(lambda: plugin_labels(layout.node, self.config))  # if changed
        if announce:
            names = layout.policy_names()
            if self.metrics is not None:
                self.metrics.set_policies(names)
            log.info("policies in force: %s", names)

    def _on_health(self, reasons: dict[str, tuple[str, ...]]) -> None:
        """A health change: a new node (GPUs the board holds down), hence a new layout. The
        board calls it before the kubelet's streams hear of the change."""
        with self._layout_lock:
            if self._policies is None:
                return
            layout = self.layout  # of self.node's devices: both change under the lock
            node = self._effective(self.node, layout.devices)
            if node != layout.node:
                policies, cache = self._policies, self._allocators
                self._swap(plan_layout(node, self.config, policies, cache, layout.resources))

    def _share(
        self, resource: str
    ) -> Callable[[Sequence[AdvertisedDevice]], ShareAllocation] | None:
        """Allocate's hand-out for a sharing resource, from the layout in force; None else."""
        if self.resource(resource).sharing is None:
            return None

        def share(devices: Sequence[AdvertisedDevice]) -> ShareAllocation:
            engine = self.layout.engines.get(resource)
            if engine is None:  # a layout whose policies failed to load
                raise AllocateRefused(f"{resource} has no policy in force; see the plugin's log")
            if engine.share is None:
                raise AllocateRefused(f"{resource} is no longer a sharing resource")
            return engine.share(devices)

        return share

    def _service_factory(self, resource: str) -> Callable[[threading.Event], DevicePluginService]:
        config = self.config
        edits = None
        if config.device_list_strategy == "native":
            from cdigen.plugin.deviceplugin.native_edits import SpecEdits

            edits = SpecEdits(self.spec_cache)

        extra = config.extra_capabilities(resource)
        driver_capabilities = (*config.capabilities, *extra) if extra else ()

        def make(stop: threading.Event) -> DevicePluginService:
            return DevicePluginService(
                resource=resource,
                devices=self.resource(resource).devices,
                board=self.board,
                cdi_kind=config.cdi_kind,
                strategy=config.device_list_strategy,
                prefer=lambda: self.layout.engine(resource).prefer,
                edits=edits,
                stop=stop,
                metrics=self.metrics,
                share=self._share(resource),
                capability_names=self.resource(resource).capability_names,
                driver_capabilities=driver_capabilities,
                recorder=self.recorder,
            )

        return make

    def start(self) -> None:
        """Load policies, start the servers, register them, and start watching."""
        config = self.config
        if config.generate_specs:
            write_specs(self.node, config)
        if self.metrics is not None and config.metrics_address is not None:
            address = config.metrics_address  # bound now (a port in use fails the start)
            self._metrics_server, _ = self.metrics.start_http_server(address, serve=False)
            self.board.subscribe(self._report_devices)
        self._load_policies()
        self.board.subscribe(self._on_health)  # from now on health changes rebuild the layout
        watchers = plugin_watchers(
            config,
            self.node,
            self.layout,
            self.board,
            self.spec_cache,
            discover=self._discover,
            apply_node=self.apply_node,
            rediscover=self._rediscover,
            nvml=self._nvml,
        )
        self._spec_watcher, self._xid = watchers.spec, watchers.xid
        self._poller = Poller(watchers.all, config.health.poll_interval_s)
        make_plugin_dir(config.plugin_dir)
        for resource in self.resources:
            warning = (
                advisory_warning(resource.sharing, resource.name) if resource.sharing else None
            )
            if warning:
                log.warning("%s", warning)
            if resource.sharing is not None:
                for line in no_slices_warnings(self.node, resource.sharing, resource.name):
                    log.warning("%s", line)
            self._start_server(resource.name)
        self._poller.start()
        if self._xid is not None:
            self._xid.start()
        self.registrar.start()
        if self._metrics_server is not None:  # its worker once registered: never in the way
            self._metrics_server.start(after=self.registrar.registered, wait_s=HTTP_WAIT_S)

    def _start_server(self, name: str) -> None:
        server = ResourceServer(self.config.plugin_dir, self._service_factory(name))
        server.start()  # listening before the registrar can see it
        self.servers.append(server)

    def apply_node(self, node: Node) -> bool:
        """Take a re-discovered node: a new layout always (health included); on new devices
        (a new MIG layout) also regenerate the spec (when configured), re-advertise, start
        servers for new resources and stop those whose profile disappeared. True when the
        advertised devices changed."""
        with self._layout_lock:
            try:
                resources = plan_resources_for(node, self.config)
            except CdigenError as exc:
                log.error("new layout not applied, keeping the current one: %s", exc)
                return False
            changed = resources != self.resources
            if changed and self.config.generate_specs:
                try:
                    write_specs(node, self.config)
                except CdigenError as exc:
                    log.error("regenerating the CDI spec failed: %s", exc)
            old = self.layout
            with self.board.hold():  # published once the new layout is in force
                devices = [d for r in resources for d in r.devices]
                if changed:
                    self.board.reset_devices(
                        (d.id for d in devices), {d.id: d.parents for d in devices}
                    )
                self.node = node
                self.board.set_reasons(SOURCE_NODE, node_reasons(node))
                effective = self._effective(node, devices)
                try:
                    layout = plan_layout(
                        effective, self.config, self._policies, self._allocators, resources
                    )
                except Exception as exc:  # a new resource naming an unknown policy
                    log.error("policies for the new layout failed to load: %s", exc)
                    layout = plan_layout(effective, self.config, None, resources=resources)
                self._swap(layout, announce=changed)
                if changed:
                    self._react(old, layout)
            return changed

    def _react(self, old: Layout, new: Layout) -> None:
        """Servers and watchers follow a layout whose devices changed."""
        log.info(
            "new MIG layout: %s",
            ", ".join(f"{r.name} ({len(r.devices)})" for r in new.resources) or "no resources",
        )
        before = {r.name for r in old.resources}
        after = {r.name for r in new.resources}
        for server in list(self.servers):
            if server.resource in after and server.service is not None:
                server.service.set_devices(new.resource(server.resource).devices)
        if self._spec_watcher is not None:
            self._spec_watcher.set_names(new.cdi_names())
        for name in sorted(before - after):
            server = next(s for s in self.servers if s.resource == name)
            self.servers.remove(server)  # first: the registrar must not miss its socket
            server.stop()
            self.registrar.forget(name)
            if self.metrics is not None:
                self.metrics.retire_resource(name)
            log.info("stopped serving %s: its devices are gone", name)
        for name in sorted(after - before):
            if self.metrics is not None:
                self.metrics.declare_resource(name)
            self._start_server(name)
        self.board.touch()  # every open ListAndWatch stream sends its new list

    def _report_devices(self, reasons: dict[str, tuple[str, ...]]) -> None:
        if self.metrics is None:
            return
        for resource in self.resources:
            unhealthy = sum(1 for d in resource.devices if reasons.get(d.id))
            self.metrics.set_devices(
                resource.name, healthy=len(resource.devices) - unhealthy, unhealthy=unhealthy
            )

    def _restart_servers(self, resources: Sequence[str]) -> None:
        """Restart the servers of ``resources`` on fresh sockets (theirs were removed)."""
        with self._layout_lock:  # not while a layout change starts or stops servers
            chosen = [s for s in self.servers if s.resource in resources]
            stop_servers(chosen)
            for server in chosen:
                server.start()

    def _load_policies(self) -> None:
        """(Re)load the policy directory into a new layout; on any error the layout in force
        stays and the error is raised."""
        try:
            policies = load_policy_set(self.config.policy_dir)
            with self._layout_lock:  # not racing a layout change: the newer node wins
                allocators = AllocatorCache()
                old, config = self.layout, self.config  # of self.node's devices
                effective = self._effective(self.node, old.devices)
                layout = plan_layout(effective, config, policies, allocators, old.resources)
                self._policies, self._allocators = policies, allocators
                if self.metrics is not None:
                    self.metrics.observe_policy_reload(ok=True)
                self._swap(layout, announce=True)
        except Exception:
            if self.metrics is not None:
                self.metrics.observe_policy_reload(ok=False)
            raise

    def reload_policies(self) -> bool:
        """Reload the policy directory (SIGHUP); a bad file is reported and the old set stays."""
        try:
            self._load_policies()
        except Exception as exc:  # CdigenError or a policy-engine failure: keep serving
            log.error("policy reload failed, keeping the policies in force: %s", exc)
            return False
        return True

    def stop(self) -> None:
        """Stop everything and remove our sockets."""
        self.registrar.stop()  # first: no restart may race with the shutdown
        if self._poller is not None:
            self._poller.stop()  # no layout change may start a server after this
        stop_servers(self.servers)
        if self._xid is not None:
            self._xid.stop()
        if self._metrics_server is not None:
            self._metrics_server.close()
        if self.recorder is not None:
            self.recorder.close()
