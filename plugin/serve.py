"""Running the plugin: one gRPC server per resource, registration, health and restarts.

Order matters to the kubelet: a server must be listening on its socket before we register,
because the kubelet dials back during ``Register``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from cdigen.errors import CdigenError, InputError
from cdigen.model import Node
from plugin.config import PluginConfig, ResourceConfig
from plugin.health import (
    SOURCE_NODE,
    HealthBoard,
    NodeWatcher,
    Pollable,
    Poller,
    SpecDirWatcher,
    XidHealth,
    node_reasons,
)
from plugin.kubelet import Registrar, socket_name
from plugin.resources import (
    AdvertisedDevice,
    Resource,
    cdi_names,
    device_parents,
    plan_resources,
    shared_resource,
)
from plugin.service import DevicePluginService, Preference, Preferrer, ShareAllocator
from plugin.sharing import ShareAllocation, advisory_warning, allocate_shares

if TYPE_CHECKING:
    from plugin.metrics import MetricsServer, PluginMetrics

log = logging.getLogger("cdigen.plugin")

POLICY_SUFFIXES = (".yaml", ".yml", ".json")


def is_node_file(source: str) -> bool:
    """True when the node source is a file the plugin can watch for health changes."""
    return source != "nvml" and not source.startswith("builtin:")


# --- policies ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicySet:
    """The policies loaded from the policy directory, by ``metadata.name``."""

    by_name: Mapping[str, Any]
    files: Mapping[str, Path]

    def for_resource(self, resource: ResourceConfig, default: str = "default") -> Any:
        """The policy ``resource`` asks for: by name (dir, then built-in), else one for its
        resource name in the dir, else the built-in ``default``."""
        from policies.policy import BUILTIN_NAMES, builtin_policy

        if resource.policy:
            if resource.policy in self.by_name:
                return self.by_name[resource.policy]
            if resource.policy not in BUILTIN_NAMES:
                known = sorted(self.by_name) + list(BUILTIN_NAMES)
                raise InputError(
                    f"no policy named {resource.policy!r} for {resource.name}",
                    where="resources[].policy",
                    hint=f"name a policy in the policy dir or a built-in: {', '.join(known)}",
                )
            return builtin_policy(resource.policy)
        for policy in self.by_name.values():
            if getattr(policy, "resource", None) == resource.name:
                return policy
        return builtin_policy(default)


def load_policy_set(policy_dir: Path | None) -> PolicySet:
    """Load every policy file in ``policy_dir``; the first bad file raises (nothing half-loaded)."""
    from policies.policy import load_policy

    by_name: dict[str, Any] = {}
    files: dict[str, Path] = {}
    if policy_dir is None:
        return PolicySet(by_name, files)
    if not policy_dir.is_dir():
        raise InputError(
            "policy directory not found", where=str(policy_dir), hint="check --policy-dir"
        )
    for path in sorted(policy_dir.iterdir()):
        if path.suffix not in POLICY_SUFFIXES or path.name.startswith("."):
            continue
        policy = load_policy(path)
        name = str(getattr(policy, "name", path.stem))
        if name in by_name:
            raise InputError(
                f"policy name {name!r} is also used by {files[name].name}",
                where=str(path),
                hint="give each policy its own metadata.name",
            )
        by_name[name] = policy
        files[name] = path
    return PolicySet(by_name, files)


class Preferences:
    """The preference functions in force, one per resource; swapped whole on a policy reload."""

    def __init__(
        self,
        node: Node,
        resources: Sequence[ResourceConfig],
        metrics: PluginMetrics | None = None,
        defaults: Mapping[str, str] | None = None,
    ) -> None:
        self._node = node
        self._metrics = metrics
        self._resources = tuple(resources)
        self._defaults = dict(defaults or {})
        self._policy_names: dict[str, str] = {}
        # one load (or layout update) at a time: a SIGHUP reload that started on the old layout
        # must not swap its allocators in after a layout change's load
        self._load_lock = threading.Lock()
        self._preferrers: dict[str, Preferrer] = {}

    def load(self, policy_dir: Path | None) -> None:
        """(Re)load the policy directory; on any error the allocators in force stay."""
        from policies.allocator import Allocator

        with self._load_lock:
            try:
                policy_set = load_policy_set(policy_dir)
                policies = {
                    r.name: policy_set.for_resource(r, self._defaults.get(r.name, "default"))
                    for r in self._resources
                }
                preferrers = {
                    name: _prefer_with(Allocator(self._node, p)) for name, p in policies.items()
                }
            except Exception:
                if self._metrics is not None:
                    self._metrics.observe_policy_reload(ok=False)
                raise
            self._preferrers = preferrers  # one assignment: gRPC threads see old or new, whole
            names = {r: str(getattr(p, "name", p)) for r, p in policies.items()}
            self._policy_names = names
            if self._metrics is not None:
                self._metrics.observe_policy_reload(ok=True)
                self._metrics.set_policies(names)
        log.info("policies in force: %s", names)

    def policy_for(self, resource: str) -> str | None:
        """The name of the policy in force for ``resource`` (None before the first load)."""
        return self._policy_names.get(resource)

    def update(
        self, node: Node, resources: Sequence[ResourceConfig], defaults: Mapping[str, str]
    ) -> None:
        """Use ``node`` and ``resources`` from the next :meth:`load` on (a new layout)."""
        with self._load_lock:
            self._node = node
            self._resources = tuple(resources)
            self._defaults = dict(defaults)

    def preferrer(self, resource: str) -> Callable[[], Preferrer]:
        """A getter for ``resource``'s current preference function."""

        def current() -> Preferrer:
            prefer = self._preferrers.get(resource)
            if prefer is None:
                raise RuntimeError(f"no allocator for {resource}")
            return prefer

        return current


def _prefer_with(allocator: Any) -> Preferrer:
    from policies.allocator import AllocationRequest

    def prefer(available: tuple[str, ...], must: tuple[str, ...], size: int) -> Preference:
        request = AllocationRequest(available=available, must_include=must, size=size)
        answer = allocator.prefer(request)
        if answer.fallback_reason:
            log.info("preferred allocation fell back: %s", answer.fallback_reason)
        return Preference(
            tuple(answer.devices), int(answer.link_score), fallback=bool(answer.fallback_reason)
        )

    return prefer


# --- CDI spec names ---------------------------------------------------------------------------


def spec_device_names(spec_dirs: Sequence[Path]) -> set[str]:
    """Fully-qualified CDI device names defined in ``spec_dirs`` (as ``cdigen list`` loads them)."""
    from cdigen.cdi.registry import load_registry

    registry = load_registry(list(spec_dirs))
    return set(registry.devices)


# --- one gRPC server per resource -------------------------------------------------------------


class ResourceServer:
    """A DevicePlugin gRPC server on ``<plugin-dir>/cdigen-<resource>.sock``."""

    def __init__(
        self, plugin_dir: Path, make_service: Callable[[threading.Event], DevicePluginService]
    ):
        self._make_service = make_service
        self.plugin_dir = plugin_dir
        self._server: Any = None
        self._stop_streams = threading.Event()
        self.service: DevicePluginService | None = None

    @property
    def resource(self) -> str:
        """The resource this server advertises."""
        assert self.service is not None
        return self.service.resource

    @property
    def socket_path(self) -> Path:
        """Where the server listens."""
        return self.plugin_dir / socket_name(self.resource)

    def start(self) -> None:
        """Listen on a fresh socket (a stale file of ours is removed first)."""
        import grpc

        from plugin.api import deviceplugin_pb2_grpc as pb_grpc

        self._stop_streams = threading.Event()
        self.service = self._make_service(self._stop_streams)
        path = self.socket_path
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="grpc"))
        pb_grpc.add_DevicePluginServicer_to_server(self.service, server)
        try:
            bound = server.add_insecure_port("unix:" + str(path))
        except RuntimeError:  # grpcio raises where older versions returned 0
            bound = 0
        if bound == 0:
            too_long = len(os.fsencode(path)) >= 108  # sun_path holds 107 bytes and a NUL
            raise CdigenError(
                f"cannot listen on {path}",
                where=str(self.plugin_dir),
                hint="the socket path is too long for a unix socket (107 bytes at most)"
                if too_long
                else "is the directory writable?",
            )
        server.start()
        self._server = server
        log.info("serving %s on %s", self.resource, path)

    def stop(self) -> None:
        """Stop serving (ending open ListAndWatch streams) and remove the socket."""
        self._stop_streams.set()
        if self.service is not None:
            self.service.wake_streams()
        if self._server is not None:
            self._server.stop(grace=0.2).wait(timeout=2)
            self._server = None
        if self.service is not None:
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()


# --- layout changes ---------------------------------------------------------------------------


def write_specs(node: Node, config: PluginConfig) -> Path:
    """Generate the CDI spec for ``node`` into the first spec dir (as ``cdigen generate``)."""
    from cdigen.cdi.host import HostFS, find_hook
    from cdigen.cdi.names import split_kind
    from cdigen.cdi.spec import SpecOptions
    from cdigen.cdi.write import generate_spec_file

    if not config.spec_dirs:
        raise InputError("generateSpecs needs a spec dir", where="specDir")
    vendor, cls = split_kind(config.cdi_kind)
    options = SpecOptions(
        vendor=vendor,
        cls=cls,
        driver_root=config.driver_root,
        dev_root=config.dev_root,
        host_root=config.host_root,
        hook_path=find_hook(config.driver_root, HostFS(config.host_root)),
    )
    spec, result = generate_spec_file(node, options, config.spec_dirs[0])
    log.info(
        "%s CDI spec %s (%d devices)",
        "wrote" if result.changed else "unchanged",
        result.path,
        len(spec["devices"]),
    )
    return result.path


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
    ) -> None:
        self.config = config
        self.node = node if node is not None else self._discover(config.node)
        self._nvml = nvml
        self._rediscover = rediscover
        self.resources: tuple[Resource, ...] = self._plan(self.node)
        self.metrics: PluginMetrics | None = None
        self._metrics_server: MetricsServer | None = None
        if config.metrics_address is not None:
            from plugin.metrics import PluginMetrics

            self.metrics = PluginMetrics()
            for resource in self.resources:
                self.metrics.declare_resource(resource.name)
        self.board = HealthBoard((d.id for d in self.devices), device_parents(self.resources))
        self.board.set_reasons(SOURCE_NODE, node_reasons(self.node))
        self.preferences = Preferences(
            self.node, self._resource_configs(), self.metrics, self._default_policies()
        )
        self.servers: list[ResourceServer] = []
        self._layout_lock = threading.Lock()
        self._spec_watcher: SpecDirWatcher | None = None
        self._poller: Poller | None = None
        self._xid: XidHealth | None = None
        self.registrar = Registrar(
            config.plugin_dir,
            lambda: [(s.resource, s.socket_path) for s in list(self.servers)],
            self._restart_servers,
            interval_s=watch_interval_s,
            observer=self.metrics,
        )

    def _discover(self, source: str) -> Node:
        """The node from ``nvml``, ``builtin:NAME`` or a node file (discovery's loader); the
        roots are read by NVML discovery only (NUMA fallback, MIG capability minors)."""
        from cdigen.discover import load_node

        config = self.config
        return load_node(source, sysfs_root=config.sysfs_root, proc_root=config.proc_root)

    # --- the resource model -------------------------------------------------------------------

    def _plan(self, node: Node) -> tuple[Resource, ...]:
        config = self.config
        planned = plan_resources(
            node, config.mig_strategy, gpu_resource=config.gpu_resource, cdi_kind=config.cdi_kind
        )
        if not config.advertises_whole_gpus:  # only shares of the whole GPUs go out
            planned = tuple(r for r in planned if r.mig_profile is not None)
        shared = tuple(
            shared_resource(node, r.name, r.sharing, config.cdi_kind)
            for r in config.sharing_resources
            if r.sharing is not None
        )
        return planned + shared

    @property
    def devices(self) -> tuple[AdvertisedDevice, ...]:
        """Every advertised device, over all resources."""
        return tuple(d for r in self.resources for d in r.devices)

    def resource(self, name: str) -> Resource:
        """The planned resource ``name`` (KeyError if the layout has none)."""
        for resource in self.resources:
            if resource.name == name:
                return resource
        raise KeyError(name)

    def _resource_configs(self) -> tuple[ResourceConfig, ...]:
        configured = {r.name: r for r in self.config.resources}
        return tuple(configured.get(r.name, ResourceConfig(r.name)) for r in self.resources)

    def _default_policies(self) -> dict[str, str]:
        # MIG devices are shares of their GPU: packing them keeps whole GPUs free. Replicas
        # spread: a pod gets the GPU with the most free replicas (slices are packed anyway).
        defaults = {r.name: "pack" for r in self.resources if r.mig_profile is not None}
        defaults.update(
            {r.name: "spread" for r in self.resources if r.sharing and r.sharing.replicas}
        )
        return defaults

    def _share_allocator(self, resource: str) -> ShareAllocator | None:
        """Allocate's hand-out for a sharing resource, on the node in force; None otherwise."""
        sharing = self.resource(resource).sharing
        if sharing is None:
            return None
        kind = self.config.cdi_kind

        def share(ids: Sequence[str]) -> ShareAllocation:
            return allocate_shares(ids, self.node, sharing, cdi_kind=kind, resource=resource)

        return share

    def _service_factory(self, resource: str) -> Callable[[threading.Event], DevicePluginService]:
        config = self.config
        edits = None
        if config.device_list_strategy == "native":
            from plugin.native import SpecEdits

            edits = SpecEdits(config.spec_dirs)

        def make(stop: threading.Event) -> DevicePluginService:
            return DevicePluginService(
                resource=resource,
                devices=self.resource(resource).devices,
                board=self.board,
                cdi_kind=config.cdi_kind,
                strategy=config.device_list_strategy,
                prefer=self.preferences.preferrer(resource),
                edits=edits,
                stop=stop,
                metrics=self.metrics,
                share=self._share_allocator(resource),
            )

        return make

    def _watchers(self) -> list[Pollable]:
        config = self.config
        watchers: list[Pollable] = []
        if config.device_list_strategy != "envvar":  # envvar hands out no CDI names
            names = cdi_names(self.resources, config.cdi_kind)
            spec = SpecDirWatcher(config.spec_dirs, names, spec_device_names, self.board)
            spec.poll()  # at startup, before the first device list goes out
            self._spec_watcher = spec
            watchers.append(spec)
        if is_node_file(config.node):
            path = Path(config.node)
            watchers.append(
                NodeWatcher(lambda: self._discover(str(path)), self.apply_node, path=path)
            )
        elif self._rediscover is not None or (config.node == "nvml" and self._nvml is not None):
            rediscover = self._rediscover or (lambda: self._discover(config.node))
            watchers.append(
                NodeWatcher(rediscover, self.apply_node, interval_s=config.rescan_interval_s)
            )
        if self._nvml is not None:
            self._xid = XidHealth(
                self._nvml,
                self.board,
                [g.uuid for g in sorted(self.node.gpus, key=lambda g: g.index)],
                ignored_xids=config.health.ignored_xids,
                recover_after_s=config.health.recover_after_s,
            )
            self._xid.open()
            watchers.append(self._xid)
        return watchers

    def start(self) -> None:
        """Load policies, start the servers, register them, and start watching."""
        config = self.config
        if config.generate_specs:
            write_specs(self.node, config)
        if self.metrics is not None and config.metrics_address is not None:
            self._metrics_server, _ = self.metrics.start_http_server(config.metrics_address)
            self.board.subscribe(self._report_devices)
        self.preferences.load(config.policy_dir)
        self._poller = Poller(self._watchers(), config.health.poll_interval_s)
        try:
            config.plugin_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(
                f"cannot create the plugin directory: {exc.strerror}",
                where=str(config.plugin_dir),
                hint="pass --plugin-dir with a writable directory",
            ) from None
        for resource in self.resources:
            warning = (
                advisory_warning(resource.sharing, resource.name) if resource.sharing else None
            )
            if warning:
                log.warning("%s", warning)
            self._start_server(resource.name)
        self._poller.start()
        if self._xid is not None:
            self._xid.start()
        self.registrar.start()

    def _start_server(self, name: str) -> None:
        server = ResourceServer(self.config.plugin_dir, self._service_factory(name))
        server.start()  # listening before the registrar can see it
        self.servers.append(server)

    def apply_node(self, node: Node) -> bool:
        """Take a re-discovered node: health always; on a new MIG layout, regenerate the spec
        (when configured), re-advertise, start servers for new resources and stop those whose
        profile disappeared. True when the layout changed."""
        with self._layout_lock:
            try:
                resources = self._plan(node)
            except CdigenError as exc:
                log.error("new layout not applied, keeping the current one: %s", exc)
                return False
            if resources == self.resources:
                self.node = node
                self.board.set_reasons(SOURCE_NODE, node_reasons(node))
                return False
            self._apply_layout(node, resources)
            return True

    def _apply_layout(self, node: Node, resources: tuple[Resource, ...]) -> None:
        config = self.config
        old = {r.name for r in self.resources}
        new = {r.name for r in resources}
        log.info(
            "new MIG layout: %s",
            ", ".join(f"{r.name} ({len(r.devices)})" for r in resources) or "no resources",
        )
        if config.generate_specs:
            try:
                write_specs(node, config)
            except CdigenError as exc:
                log.error("regenerating the CDI spec failed: %s", exc)
        self.node = node
        self.resources = resources
        self.preferences.update(node, self._resource_configs(), self._default_policies())
        try:
            self.preferences.load(config.policy_dir)
        except Exception as exc:
            log.error("policies for the new layout failed to load: %s", exc)
        self.board.reset_devices((d.id for d in self.devices), device_parents(resources))
        self.board.set_reasons(SOURCE_NODE, node_reasons(node))
        for server in list(self.servers):
            if server.resource in new and server.service is not None:
                server.service.set_devices(self.resource(server.resource).devices)
        if self._spec_watcher is not None:
            self._spec_watcher.set_names(cdi_names(resources, config.cdi_kind))
        for name in sorted(old - new):
            server = next(s for s in self.servers if s.resource == name)
            self.servers.remove(server)  # first: the registrar must not miss its socket
            server.stop()
            self.registrar.forget(name)
            if self.metrics is not None:
                self.metrics.retire_resource(name)
            log.info("stopped serving %s: its devices are gone", name)
        for name in sorted(new - old):
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

    def _restart_servers(self) -> None:
        """Restart every server on a fresh socket (the kubelet restarted)."""
        with self._layout_lock:  # not while a layout change starts or stops servers
            for server in list(self.servers):
                server.stop()
                server.start()

    def reload_policies(self) -> bool:
        """Reload the policy directory (SIGHUP); a bad file is reported and the old set stays."""
        try:
            self.preferences.load(self.config.policy_dir)
        except Exception as exc:  # CdigenError or a policy-engine failure: keep serving
            log.error("policy reload failed, keeping the policies in force: %s", exc)
            return False
        return True

    def stop(self) -> None:
        """Stop everything and remove our sockets."""
        self.registrar.stop()  # first: no restart may race with the shutdown
        if self._poller is not None:
            self._poller.stop()  # no layout change may start a server after this
        for server in self.servers:
            server.stop()
        if self._xid is not None:
            self._xid.stop()
        if self._metrics_server is not None:
            self._metrics_server.close()


def open_nvml(source: str) -> Any:
    """The initialised ``pynvml`` module when serving real GPUs, else None."""
    if source != "nvml":
        return None
    import pynvml

    from cdigen.errors import DiscoveryError

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise DiscoveryError(
            f"NVML unavailable: {exc}", hint="is the NVIDIA driver loaded?"
        ) from None
    return pynvml


def serve_until_signalled(plugin: Plugin) -> int:
    """Run ``plugin`` until SIGTERM/SIGINT (exit 0); SIGHUP reloads the policies."""
    stop = threading.Event()
    reload = threading.Event()

    def on_stop(signum: int, frame: FrameType | None) -> None:
        log.info("signal %s: stopping", signal.Signals(signum).name)
        stop.set()

    def on_hup(signum: int, frame: FrameType | None) -> None:
        reload.set()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, on_hup)
    try:
        plugin.start()
        log.info("cdigen device plugin ready (pid %d)", os.getpid())
        while not stop.wait(0.2):
            if reload.is_set():
                reload.clear()
                if plugin.reload_policies():
                    log.info("policies reloaded")
    finally:
        plugin.stop()
    return 0
