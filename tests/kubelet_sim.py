"""A kubelet simulator for device plugin tests: the Registration side of the v1beta1 API.

It serves ``Registration`` on ``<plugin_dir>/kubelet.sock`` over a real unix socket and checks
each request as the kubelet's device manager does: the version must be ``v1beta1``, the resource
an extended resource name, and the endpoint a socket in the plugin directory that answers
``GetDevicePluginOptions`` *before* ``Register`` returns. Then, like the kubelet, it keeps a
``ListAndWatch`` stream open per resource and records every device list, and it calls
``GetPreferredAllocation`` and ``Allocate`` on request.

Usage::

    with KubeletSimulator(plugin_dir) as kubelet:
        reg = kubelet.wait_registered("nvidia.com/gpu")
        devices = kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
        response = kubelet.allocate("nvidia.com/gpu", [["GPU-..."]])
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from cdigen.plugin.deviceplugin.api import deviceplugin_pb2 as pb
from cdigen.plugin.deviceplugin.api import deviceplugin_pb2_grpc as pb_grpc

SUPPORTED_VERSIONS = ("v1beta1",)
CHECKPOINT = "kubelet_internal_checkpoint"  # the device manager's own file in the plugin dir
_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def extended_resource_problem(name: str) -> str | None:
    """The kubelet's ``IsExtendedResourceName`` check, as an error message or None."""
    if "/" not in name or "kubernetes.io/" in name:
        return f"resource name {name} is not an extended resource name"
    prefixed = "requests." + name
    prefix, _, short = prefixed.partition("/")
    if not _SUBDOMAIN.match(prefix) or len(prefix) > 253:
        return f"invalid resource name prefix in {name}"
    if len(short) > 63 or not _NAME.match(short):
        return f"invalid resource name {name}"
    return None


@dataclass
class Registration:
    """One accepted registration."""

    resource: str
    endpoint: str
    options: pb.DevicePluginOptions
    at: float  # time.monotonic() when Register returned


@dataclass
class _Plugin:
    registration: Registration
    channel: grpc.Channel
    stub: pb_grpc.DevicePluginStub
    lists: list[list[pb.Device]] = field(default_factory=list)
    stream: Any = None
    ended: bool = False


class KubeletSimulator(pb_grpc.RegistrationServicer):  # type: ignore[misc]
    """A Registration server on ``plugin_dir/kubelet.sock`` that behaves like the kubelet."""

    def __init__(
        self, plugin_dir: Path, *, dial_timeout_s: float = 2.0, clean_start: bool = False
    ) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.clean_start = clean_start
        self.socket = self.plugin_dir / "kubelet.sock"
        self.dial_timeout_s = dial_timeout_s
        self.registrations: list[Registration] = []
        self.rejections: list[str] = []
        self._plugins: dict[str, _Plugin] = {}
        self._changed = threading.Condition()
        self._server: grpc.Server | None = None

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> KubeletSimulator:
        """Remove a stale kubelet.sock and start serving Registration on a new one. With
        ``clean_start``, first remove everything in the plugin dir but folders and the kubelet's
        checkpoint, as the device manager does when the kubelet starts (its ``removeContents``):
        plugins see their sockets go and register again."""
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        if self.clean_start:
            for entry in self.plugin_dir.iterdir():
                if entry.name != CHECKPOINT and not entry.is_dir():
                    entry.unlink()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port("unix:" + str(self.socket))
        server.start()
        self._server = server
        return self

    def stop(self, *, remove_socket: bool = True) -> None:
        """Stop serving, close plugin connections, and remove kubelet.sock."""
        for plugin in list(self._plugins.values()):
            if plugin.stream is not None:
                plugin.stream.cancel()
            plugin.channel.close()
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None
        if remove_socket:
            with contextlib.suppress(FileNotFoundError):
                self.socket.unlink()

    def __enter__(self) -> KubeletSimulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the Registration service ---------------------------------------------------------------

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        """Validate, dial back, fetch options, then start ListAndWatch, like the kubelet."""
        problem = None
        if request.version not in SUPPORTED_VERSIONS:
            problem = (
                f"requested device plugin version {request.version} is not supported; "
                f"supported: {list(SUPPORTED_VERSIONS)}"
            )
        else:
            problem = extended_resource_problem(request.resource_name)
        endpoint = self.plugin_dir / request.endpoint
        if problem is None and ("/" in request.endpoint or not request.endpoint):
            problem = f"endpoint {request.endpoint!r} is not a file name in the plugin dir"
        options = None
        channel = None
        if problem is None:
            channel = grpc.insecure_channel("unix:" + str(endpoint))
            stub = pb_grpc.DevicePluginStub(channel)
            try:
                grpc.channel_ready_future(channel).result(timeout=self.dial_timeout_s)
                options = stub.GetDevicePluginOptions(pb.Empty(), timeout=self.dial_timeout_s)
            except (grpc.FutureTimeoutError, grpc.RpcError) as exc:
                problem = f"failed to dial device plugin at {endpoint}: {exc}"
        if problem is not None:
            if channel is not None:
                channel.close()
            with self._changed:
                self.rejections.append(problem)
                self._changed.notify_all()
            context.abort(grpc.StatusCode.UNKNOWN, problem)
        assert channel is not None and options is not None
        registration = Registration(
            request.resource_name, request.endpoint, options, time.monotonic()
        )
        plugin = _Plugin(registration, channel, stub)
        with self._changed:
            old = self._plugins.get(request.resource_name)
            self._plugins[request.resource_name] = plugin
            self.registrations.append(registration)
            self._changed.notify_all()
        if old is not None:  # a plugin re-registering replaces its predecessor
            if old.stream is not None:
                old.stream.cancel()
            old.channel.close()
        threading.Thread(target=self._watch, args=(plugin,), daemon=True).start()
        return pb.Empty()

    def _watch(self, plugin: _Plugin) -> None:
        try:
            stream = plugin.stub.ListAndWatch(pb.Empty())
            plugin.stream = stream
            for response in stream:
                with self._changed:
                    plugin.lists.append(list(response.devices))
                    self._changed.notify_all()
        except (grpc.RpcError, ValueError):  # cancelled, or the channel closed before we started
            pass
        finally:
            with self._changed:
                plugin.ended = True
                self._changed.notify_all()

    # --- what tests ask -------------------------------------------------------------------------

    def _wait(self, predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
        with self._changed:
            result = self._changed.wait_for(predicate, timeout=timeout_s)
        if not result:
            raise TimeoutError(f"kubelet simulator: {what} within {timeout_s} s")
        return result

    def wait_registered(
        self, resource: str, timeout_s: float = 5.0, *, count: int = 1
    ) -> Registration:
        """The ``count``-th registration of ``resource`` (waiting for it)."""

        def found() -> Registration | None:
            regs = [r for r in self.registrations if r.resource == resource]
            return regs[count - 1] if len(regs) >= count else None

        result: Registration = self._wait(
            found, timeout_s, f"no registration #{count} of {resource}"
        )
        return result

    def wait_devices(
        self,
        resource: str,
        predicate: Callable[[list[pb.Device]], bool] = lambda devices: True,
        timeout_s: float = 5.0,
    ) -> list[pb.Device]:
        """The newest device list of ``resource`` for which ``predicate`` holds (waiting for it)."""

        def found() -> list[pb.Device] | None:
            plugin = self._plugins.get(resource)
            if plugin is None or not plugin.lists:
                return None
            latest = plugin.lists[-1]
            return latest if predicate(latest) else None

        result: list[pb.Device] = self._wait(
            found, timeout_s, f"no matching device list of {resource}"
        )
        return result

    def registration_count(self, resource: str) -> int:
        """How many times ``resource`` registered with this kubelet."""
        with self._changed:
            return sum(1 for r in self.registrations if r.resource == resource)

    def device_lists(self, resource: str) -> list[list[pb.Device]]:
        """Every device list received from the current plugin of ``resource``."""
        with self._changed:
            plugin = self._plugins.get(resource)
            return list(plugin.lists) if plugin else []

    def stub(self, resource: str) -> pb_grpc.DevicePluginStub:
        """The DevicePlugin client of the registered plugin of ``resource``."""
        return self._plugins[resource].stub

    def allocate(self, resource: str, containers: Sequence[Sequence[str]]) -> pb.AllocateResponse:
        """Call Allocate with one container request per entry of ``containers``."""
        request = pb.AllocateRequest(
            container_requests=[
                pb.ContainerAllocateRequest(devices_ids=list(c)) for c in containers
            ]
        )
        response: pb.AllocateResponse = self.stub(resource).Allocate(request, timeout=5)
        return response

    def preferred(
        self,
        resource: str,
        available: Sequence[str],
        size: int,
        must_include: Sequence[str] = (),
    ) -> list[str]:
        """Call GetPreferredAllocation for one container; the IDs the plugin prefers."""
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        response = self.stub(resource).GetPreferredAllocation(request, timeout=5)
        return list(response.container_responses[0].deviceIDs)
