"""The kubelet's side of a DRA plugin, as the tests need it.

Registration as the kubelet's plugin watcher and DRA handler do it: find the socket in
``<kubelet dir>/plugins_registry``, call GetInfo, check the type, the driver name and that the
endpoint exists, pick the newest supported DRA service from ``supported_versions`` (v1, then
v1beta1), and report the verdict with NotifyRegistrationStatus. Then NodePrepareResources and
NodeUnprepareResources on the chosen service, with the kubelet's retry on a transport error.

Given an API server, a starting simulator deletes every ResourceSlice of its node first, as the
kubelet's DRA plugin manager does when it starts (no driver has registered yet, so nothing it
advertised is served).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from cdigen.plugin.dra.api import (
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from tests.fake_apiserver import FakeApiServer

# The services the kubelet (1.34+) knows, newest first, as it matches them: exact strings.
KNOWN_SERVICES: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}


class RegistrationRefused(Exception):
    """The kubelet would refuse this plugin (and tells it so)."""


@dataclass
class Registered:
    """A registered DRA plugin: its name, endpoint and the service version chosen."""

    driver: str
    endpoint: str
    service: str
    info: Any


class DraKubeletSim:
    """Registers DRA plugins found under ``kubelet_dir`` and calls them."""

    def __init__(
        self,
        kubelet_dir: Path,
        *,
        timeout_s: float = 5.0,
        api: FakeApiServer | None = None,
        node_name: str | None = None,
    ) -> None:
        self.registry = kubelet_dir / "plugins_registry"
        self.timeout_s = timeout_s
        self.plugin: Registered | None = None
        self.wiped: list[str] = []
        if api is not None and node_name is not None:
            self.wiped = api.delete_slices(node_name)

    def wait_for_socket(self, timeout_s: float = 10.0) -> Path:
        """The first ``*.sock`` to appear in the registry dir."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = sorted(self.registry.glob("*.sock")) if self.registry.is_dir() else []
            if found:
                return found[0]
            time.sleep(0.02)
        raise TimeoutError(f"no registration socket appeared in {self.registry}")

    def register(self, socket: Path | None = None) -> Registered:
        """The handshake; RegistrationRefused (after telling the plugin) when it is invalid."""
        socket = socket or self.wait_for_socket()
        with grpc.insecure_channel(f"unix:{socket}") as channel:
            stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
            info = stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=self.timeout_s)
            problem = self._validate(info)
            stub.NotifyRegistrationStatus(
                pluginregistration_v1_pb2.RegistrationStatus(
                    plugin_registered=problem is None, error=problem or ""
                ),
                timeout=self.timeout_s,
            )
        if problem:
            raise RegistrationRefused(problem)
        service = next(v for v in KNOWN_SERVICES if v in info.supported_versions)
        self.plugin = Registered(info.name, info.endpoint, service, info)
        return self.plugin

    @staticmethod
    def _validate(info: Any) -> str | None:
        if info.type != "DRAPlugin":
            return f"unexpected plugin type {info.type!r}"
        if not info.name:
            return "empty driver name"
        if not info.endpoint.startswith("/") or not Path(info.endpoint).exists():
            return f"endpoint {info.endpoint!r} does not exist"
        if not any(v in KNOWN_SERVICES for v in info.supported_versions):
            return f"none of the supported versions {list(info.supported_versions)} is known"
        return None

    def _call(self, method: str, claims: list[tuple[str, str, str]], service: str | None) -> Any:
        assert self.plugin is not None, "register first"
        pb, pb_grpc = KNOWN_SERVICES[service or self.plugin.service]
        request_type = getattr(pb, f"{method}Request")
        request = request_type(
            claims=[pb.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
        )
        last: Exception | None = None
        for _ in range(3):  # the kubelet retries a call that failed on the transport
            try:
                with grpc.insecure_channel(f"unix:{self.plugin.endpoint}") as channel:
                    return getattr(pb_grpc.DRAPluginStub(channel), method)(
                        request, timeout=self.timeout_s
                    )
            except grpc.RpcError as exc:
                last = exc
                time.sleep(0.1)
        assert last is not None
        raise last

    def prepare(self, claims: list[tuple[str, str, str]], service: str | None = None) -> Any:
        """NodePrepareResources for ``(namespace, uid, name)`` claims."""
        return self._call("NodePrepareResources", claims, service)

    def unprepare(self, claims: list[tuple[str, str, str]], service: str | None = None) -> Any:
        """NodeUnprepareResources for ``(namespace, uid, name)`` claims."""
        return self._call("NodeUnprepareResources", claims, service)

    def watch_health(self, messages: int, out: list[Any] | None = None) -> list[Any]:
        """The first ``messages`` NodeWatchResources responses, appended to ``out`` as they
        arrive."""
        assert self.plugin is not None, "register first"
        out = [] if out is None else out
        with grpc.insecure_channel(f"unix:{self.plugin.endpoint}") as channel:
            stub = dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(channel)
            stream = stub.NodeWatchResources(
                dra_health_v1alpha1_pb2.NodeWatchResourcesRequest(), timeout=self.timeout_s
            )
            for message in stream:
                out.append(message)
                if len(out) == messages:
                    stream.cancel()
                    break
        return out
