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
    FileWatcher,
    HealthBoard,
    Pollable,
    Poller,
    SpecDirWatcher,
    XidHealth,
    node_reasons,
)
from plugin.kubelet import Registrar, socket_name
from plugin.service import (
    AdvertisedDevice,
    DevicePluginService,
    Preference,
    Preferrer,
    advertised_devices,
)

if TYPE_CHECKING:
    from plugin.metrics import MetricsServer, PluginMetrics

log = logging.getLogger("cdigen.plugin")

POLICY_SUFFIXES = (".yaml", ".yml", ".json")


def load_node(source: str) -> Node:
    """The node from ``nvml``, ``builtin:NAME`` or a node file (discovery's loader)."""
    from cdigen.discover import load_node as discover

    return discover(source)


def is_node_file(source: str) -> bool:
    """True when the node source is a file the plugin can watch for health changes."""
    return source != "nvml" and not source.startswith("builtin:")


# --- policies ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicySet:
    """The policies loaded from the policy directory, by ``metadata.name``."""

    by_name: Mapping[str, Any]
    files: Mapping[str, Path]

    def for_resource(self, resource: ResourceConfig) -> Any:
        """The policy ``resource`` asks for: by name (dir, then built-in), else one for its
        resource name in the dir, else the built-in default."""
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
        return builtin_policy("default")


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
    """The allocators in force, one per resource; swapped whole on a policy reload."""

    def __init__(
        self,
        node: Node,
        resources: Sequence[ResourceConfig],
        metrics: PluginMetrics | None = None,
    ) -> None:
        self._node = node
        self._metrics = metrics
        self._resources = tuple(resources)
        self._lock = threading.Lock()
        self._allocators: dict[str, Any] = {}
        self.policy_set = PolicySet({}, {})

    def load(self, policy_dir: Path | None) -> None:
        """(Re)load the policy directory; on any error the allocators in force stay."""
        from policies.allocator import Allocator

        try:
            policy_set = load_policy_set(policy_dir)
            policies = {r.name: policy_set.for_resource(r) for r in self._resources}
            allocators = {name: Allocator(self._node, p) for name, p in policies.items()}
        except Exception:
            if self._metrics is not None:
                self._metrics.observe_policy_reload(ok=False)
            raise
        with self._lock:
            self._allocators = allocators
            self.policy_set = policy_set
        names = {r: str(getattr(p, "name", p)) for r, p in policies.items()}
        if self._metrics is not None:
            self._metrics.observe_policy_reload(ok=True)
            self._metrics.set_policies(names)
        log.info("policies in force: %s", names)

    def preferrer(self, resource: str) -> Callable[[], Preferrer]:
        """A getter for ``resource``'s current preference function."""

        def current() -> Preferrer:
            with self._lock:
                allocator = self._allocators.get(resource)
            if allocator is None:
                raise RuntimeError(f"no allocator for {resource}")
            return _prefer_with(allocator)

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
    ) -> None:
        self.config = config
        self.node = node if node is not None else load_node(config.node)
        self._nvml = nvml
        self.metrics: PluginMetrics | None = None
        self._metrics_server: MetricsServer | None = None
        if config.metrics_address is not None:
            from plugin.metrics import PluginMetrics

            self.metrics = PluginMetrics()
            for resource in config.resources:
                self.metrics.declare_resource(resource.name)
        self.devices: tuple[AdvertisedDevice, ...] = advertised_devices(self.node)
        self.board = HealthBoard(d.id for d in self.devices)
        self.board.set_reasons(SOURCE_NODE, node_reasons(self.node))
        self.preferences = Preferences(self.node, config.resources, self.metrics)
        self.servers: list[ResourceServer] = []
        self._poller: Poller | None = None
        self._xid: XidHealth | None = None
        self.registrar = Registrar(
            config.plugin_dir,
            lambda: [(s.resource, s.socket_path) for s in self.servers],
            self._restart_servers,
            interval_s=watch_interval_s,
            observer=self.metrics,
        )

    def _service_factory(self, resource: str) -> Callable[[threading.Event], DevicePluginService]:
        config = self.config
        edits = None
        if config.device_list_strategy == "native":
            from plugin.native import SpecEdits

            edits = SpecEdits(config.spec_dirs)

        def make(stop: threading.Event) -> DevicePluginService:
            return DevicePluginService(
                resource=resource,
                devices=self.devices,
                board=self.board,
                cdi_kind=config.cdi_kind,
                strategy=config.device_list_strategy,
                prefer=self.preferences.preferrer(resource),
                edits=edits,
                stop=stop,
                metrics=self.metrics,
            )

        return make

    def _watchers(self) -> list[Pollable]:
        config = self.config
        watchers: list[Pollable] = []
        if config.device_list_strategy != "envvar":  # envvar hands out no CDI names
            kind = config.cdi_kind
            names = {d.id: [f"{kind}={d.id}"] for d in self.devices}
            spec = SpecDirWatcher(config.spec_dirs, names, spec_device_names, self.board)
            spec.poll()  # at startup, before the first device list goes out
            watchers.append(spec)
        if is_node_file(config.node):
            watchers.append(FileWatcher(Path(config.node), lambda p: load_node(str(p)), self.board))
        if self._nvml is not None:
            self._xid = XidHealth(
                self._nvml,
                self.board,
                [d.id for d in self.devices],
                ignored_xids=config.health.ignored_xids,
                recover_after_s=config.health.recover_after_s,
            )
            self._xid.open()
            watchers.append(self._xid)
        return watchers

    def start(self) -> None:
        """Load policies, start the servers, register them, and start watching."""
        config = self.config
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
        for resource in config.resources:
            server = ResourceServer(config.plugin_dir, self._service_factory(resource.name))
            server.start()
            self.servers.append(server)
        self._poller.start()
        if self._xid is not None:
            self._xid.start()
        self.registrar.start()

    def _report_devices(self, reasons: dict[str, tuple[str, ...]]) -> None:
        if self.metrics is None:
            return
        unhealthy = sum(1 for d in self.devices if reasons.get(d.id))
        for resource in self.config.resources:
            self.metrics.set_devices(
                resource.name, healthy=len(self.devices) - unhealthy, unhealthy=unhealthy
            )

    def _restart_servers(self) -> None:
        """Restart every server on a fresh socket (the kubelet restarted)."""
        for server in self.servers:
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
        for server in self.servers:
            server.stop()
        if self._poller is not None:
            self._poller.stop()
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
