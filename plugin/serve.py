"""Running the plugin: one gRPC server per resource, registration, health and restarts.

Order matters to the kubelet: a server must be listening on its socket before we register,
because the kubelet dials back during ``Register``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from cdigen.cdi.cache import SpecCache
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
SERVER_THREADS = 64  # gRPC threads per resource server (created on demand)
SWITCH_INTERVAL_S = 0.0005  # the interpreter's thread switch interval while serving


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
        from policies.policy import BUILTIN_NAMES, builtin_policy, builtin_policy_name

        if resource.policy:
            if resource.policy in self.by_name:
                return self.by_name[resource.policy]
            builtin = builtin_policy_name(resource.policy)
            if builtin is None:
                known = sorted(self.by_name) + list(BUILTIN_NAMES)
                raise InputError(
                    f"no policy named {resource.policy!r} for {resource.name}",
                    where="resources[].policy",
                    hint=f"name a policy in the policy dir or a built-in: {', '.join(known)}",
                )
            return builtin_policy(builtin)
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


# --- one gRPC server per resource -------------------------------------------------------------


SOCKET_MODE = 0o600  # the kubelet runs as root; nobody else may talk to the plugin
PLUGIN_DIR_MODE = 0o755
BIND_DIR_PREFIX = ".cdigen-"  # private directory a socket is bound in before it is renamed
UNIX_PATH_MAX = 107  # sun_path holds 107 bytes and a NUL


def make_plugin_dir(plugin_dir: Path) -> None:
    """Create ``plugin_dir`` and its missing parents with mode 0755, whatever the umask, and
    remove our own bind directories left by a killed run."""
    missing: list[Path] = []
    for path in (plugin_dir, *plugin_dir.parents):
        if path.exists() or path.is_symlink():
            break
        missing.append(path)
    try:
        for path in reversed(missing):
            with contextlib.suppress(FileExistsError):  # made meanwhile by someone else
                path.mkdir()
                os.chmod(path, PLUGIN_DIR_MODE)
        if not plugin_dir.is_dir():
            raise NotADirectoryError(20, "not a directory")
        for leftover in plugin_dir.glob(BIND_DIR_PREFIX + "*"):
            shutil.rmtree(leftover, ignore_errors=True)
    except OSError as exc:
        raise InputError(
            f"cannot create the plugin directory: {exc.strerror}",
            where=str(plugin_dir),
            hint="pass --plugin-dir with a writable directory",
        ) from None


def bind_socket(server: Any, path: Path) -> tuple[int, int]:
    """Bind the gRPC ``server`` to the unix socket ``path`` with mode 0600 whatever the umask.

    The socket is bound in a private 0700 directory beside ``path``, made 0600 there and renamed
    into place, so it is never reachable with a looser mode. Returns its (device, inode).
    """
    if len(os.fsencode(path)) > UNIX_PATH_MAX:
        raise CdigenError(
            f"cannot listen on {path}",
            where=str(path.parent),
            hint=f"the socket path is too long for a unix socket ({UNIX_PATH_MAX} bytes at most)",
        )
    if path.is_dir() and not path.is_symlink():
        raise InputError(
            "the plugin's socket path is a directory",
            where=str(path),
            hint="remove that directory, or pass another --plugin-dir",
        )
    try:
        private = Path(tempfile.mkdtemp(prefix=BIND_DIR_PREFIX, dir=path.parent))
        os.chmod(private, 0o700)
    except OSError as exc:
        raise CdigenError(
            f"cannot listen on {path}: {exc.strerror}",
            where=str(path.parent),
            hint="is the directory writable?",
        ) from None
    temp = private / "s"
    try:
        try:
            bound = server.add_insecure_port("unix:" + str(temp))
        except RuntimeError:  # grpcio raises where older versions returned 0
            bound = 0
        if bound == 0:
            raise CdigenError(
                f"cannot listen on {path}",
                where=str(path.parent),
                hint="the socket path is too long for a unix socket"
                if len(os.fsencode(temp)) > UNIX_PATH_MAX
                else "is the directory writable?",
            )
        os.chmod(temp, SOCKET_MODE)
        os.replace(temp, path)  # atomically replaces a stale socket of ours
        st = os.stat(path)
    except OSError as exc:
        raise CdigenError(
            f"cannot put the socket in place: {exc.strerror}",
            where=str(path),
            hint="is the plugin directory writable?",
        ) from None
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return (st.st_dev, st.st_ino)


class ResourceServer:
    """A DevicePlugin gRPC server on ``<plugin-dir>/cdigen-<resource>.sock``."""

    def __init__(
        self, plugin_dir: Path, make_service: Callable[[threading.Event], DevicePluginService]
    ):
        self._make_service = make_service
        self.plugin_dir = plugin_dir
        self._server: Any = None
        self._stop_streams = threading.Event()
        self._socket_id: tuple[int, int] | None = None
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

    def socket_intact(self) -> bool:
        """Whether the file at :attr:`socket_path` is still the socket this server listens on
        (False once the kubelet, or anyone, removed or replaced it)."""
        if self._server is None or self._socket_id is None:
            return False
        try:
            st = os.stat(self.socket_path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._socket_id

    def start(self) -> None:
        """Listen on a fresh socket, mode 0600 (a stale file of ours is replaced)."""
        import grpc

        from plugin.api import deviceplugin_pb2_grpc as pb_grpc

        self._stop_streams = threading.Event()
        self.service = self._make_service(self._stop_streams)
        path = self.socket_path
        # a thread per concurrent call up to SERVER_THREADS: a call waiting for the policy
        # (one computation at a time) must not keep Allocate calls queued behind it
        pool = futures.ThreadPoolExecutor(max_workers=SERVER_THREADS, thread_name_prefix="grpc")
        # while a policy computes, gRPC's threads wait up to the switch interval for each turn
        # at the interpreter lock: 5 ms by default, several turns per call (benchmarks/bench_load)
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        server = grpc.server(pool)
        pb_grpc.add_DevicePluginServicer_to_server(self.service, server)
        self._socket_id = bind_socket(server, path)
        server.start()
        self._server = server
        log.info("serving %s on %s", self.resource, path)

    def halt(self) -> threading.Event | None:
        """Begin stopping: end open ListAndWatch streams, stop taking calls, remove our socket
        (only if it is still ours). Returns the event set once the server has stopped."""
        self._stop_streams.set()
        if self.service is not None:
            self.service.wake_streams()
            if self.socket_intact():
                with contextlib.suppress(FileNotFoundError):
                    self.socket_path.unlink()
        self._socket_id = None
        server, self._server = self._server, None
        if server is None:
            return None
        done: threading.Event = server.stop(grace=0.2)
        return done

    def stop(self) -> None:
        """Stop serving (ending open ListAndWatch streams) and remove the socket."""
        stop_servers([self])


def stop_servers(servers: Sequence[ResourceServer], timeout_s: float = 1.0) -> None:
    """Stop ``servers`` together, not one after another: ``timeout_s`` at most in all."""
    stopping = [server.halt() for server in servers]
    deadline = time.monotonic() + timeout_s
    for done in stopping:
        if done is not None:
            done.wait(max(0.0, deadline - time.monotonic()))


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

            edits = SpecEdits(self.spec_cache)

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
            spec = SpecDirWatcher(self.spec_cache, names, self.board)
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
        make_plugin_dir(config.plugin_dir)
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

    def _restart_servers(self, resources: Sequence[str]) -> None:
        """Restart the servers of ``resources`` on fresh sockets (theirs were removed)."""
        with self._layout_lock:  # not while a layout change starts or stops servers
            chosen = [s for s in self.servers if s.resource in resources]
            stop_servers(chosen)
            for server in chosen:
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
        stop_servers(self.servers)
        if self._xid is not None:
            self._xid.stop()
        if self._metrics_server is not None:
            self._metrics_server.close()


def open_nvml(source: str, driver_root: str = "/") -> Any:
    """The initialised ``pynvml`` module when serving real GPUs, else None; its library is
    loaded from ``driver_root`` first (discovery's loader, with its errors)."""
    if source != "nvml":
        return None
    import pynvml

    from cdigen.discover.nvml import start_nvml

    start_nvml(pynvml, driver_root=driver_root)
    return pynvml


STOP_DEADLINE_S = 1.5  # SIGTERM ends the process within 2 s, whatever hangs


def _exit_after(deadline_s: float) -> None:
    """End the process ``deadline_s`` from now unless it has ended by itself (a daemon thread:
    an orderly exit, atexit joins included, simply ends it)."""

    def run() -> None:
        time.sleep(deadline_s)
        log.warning("stopping took more than %.1f s: exiting without waiting further", deadline_s)
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(0)

    threading.Thread(target=run, name="stop-deadline", daemon=True).start()


def serve_until_signalled(plugin: Plugin) -> int:
    """Run ``plugin`` until SIGTERM/SIGINT (exit 0); SIGHUP reloads the policies.

    It owns the process: from the stop signal on, the process ends within
    :data:`STOP_DEADLINE_S` even if a thread hangs (a stuck call in a gRPC worker, say).
    """
    stop = threading.Event()
    reload = threading.Event()

    def on_stop(signum: int, frame: FrameType | None) -> None:
        if not stop.is_set():
            log.info("signal %s: stopping", signal.Signals(signum).name)
            _exit_after(STOP_DEADLINE_S)
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
