"""A client of the kubelet's PodResources API (v1 ``PodResourcesLister``: ``List`` and ``Get``).

The kubelet serves it on ``<kubelet dir>/pod-resources/kubelet.sock``. Every call carries a
deadline for the whole call (connecting included). The answer is turned into frozen records
holding only what attribution reads: per container, the device IDs per extended resource and the
ResourceClaims with their devices. Names are kept as the kubelet sent them; whoever prints them
escapes them (:func:`cdigen.errors.printable`).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdigen.errors import CdigenError, InputError

POD_RESOURCES_DIR = "pod-resources"
SOCKET_NAME = "kubelet.sock"
DEFAULT_TIMEOUT_S = 5.0
# The kubelet's own clients accept answers up to 16 MiB (a node with many pods and devices).
MAX_MESSAGE_BYTES = 16 << 20


def socket_path(kubelet_dir: Path) -> Path:
    """Where the kubelet serves PodResources: ``<kubelet dir>/pod-resources/kubelet.sock``."""
    return kubelet_dir / POD_RESOURCES_DIR / SOCKET_NAME


@dataclass(frozen=True)
class ClaimDevice:
    """One device of a container's ResourceClaim, as the kubelet reports it."""

    driver: str
    pool: str
    device: str
    share_id: str | None = None


@dataclass(frozen=True)
class ContainerClaim:
    """One ResourceClaim a container uses."""

    namespace: str
    name: str
    devices: tuple[ClaimDevice, ...] = ()


@dataclass(frozen=True)
class ContainerResources:
    """What one container of one pod holds: device IDs by extended resource, and claims."""

    namespace: str
    pod: str
    container: str
    devices: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (resource, device IDs)
    claims: tuple[ContainerClaim, ...] = ()


class PodResourcesError(CdigenError):
    """The kubelet's PodResources API did not answer (no socket, refused, deadline)."""


def list_resources(
    socket: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[ContainerResources]:
    """Every container the kubelet reports, with what it holds (``List``)."""
    from cdigen.plugin.agent.api import podresources_v1_pb2 as pb

    response = _call(socket, "List", pb.ListPodResourcesRequest(), timeout_s)
    return [c for pod in response.pod_resources for c in _containers(pod)]


def get_resources(
    socket: Path, namespace: str, pod: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[ContainerResources]:
    """The containers of one pod (``Get``; GA since Kubernetes 1.36, beta and on since 1.34)."""
    from cdigen.plugin.agent.api import podresources_v1_pb2 as pb

    request = pb.GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace)
    response = _call(socket, "Get", request, timeout_s)
    return _containers(response.pod_resources)


def _call(socket: Path, method: str, request: Any, timeout_s: float) -> Any:
    import grpc

    from cdigen.plugin.agent.api import podresources_v1_pb2_grpc as pb_grpc

    problem = _socket_problem(socket)
    if problem:
        raise PodResourcesError(
            problem,
            where=str(socket),
            hint="run this on the node (the kubelet's pod-resources dir mounted), or pass "
            "--pod-resources-socket",
        )
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(f"unix://{socket}", options=options) as channel:
        stub = pb_grpc.PodResourcesListerStub(channel)
        try:
            # timeout: one deadline for the whole call, the connection included
            return getattr(stub, method)(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            code = exc.code().name if exc.code() is not None else "UNKNOWN"
            details = " ".join(str(exc.details() or "").split())[:200]
            raise PodResourcesError(
                f"PodResources {method} failed: {code}: {details}",
                where=str(socket),
                hint="is the kubelet running? (DEADLINE_EXCEEDED: it did not answer within "
                f"{timeout_s:g} s)",
            ) from None


def _socket_problem(socket: Path) -> str | None:
    try:
        mode = os.stat(socket).st_mode
    except FileNotFoundError:
        return "no such socket"
    except OSError as exc:
        return f"cannot reach the socket: {exc.strerror}"
    if not stat.S_ISSOCK(mode):
        return "not a unix socket"
    return None


def _containers(pod: Any) -> list[ContainerResources]:
    out = []
    for container in pod.containers:
        devices = tuple(
            (d.resource_name, tuple(d.device_ids)) for d in container.devices if d.device_ids
        )
        claims = tuple(
            ContainerClaim(
                r.claim_namespace,
                r.claim_name,
                tuple(
                    ClaimDevice(
                        c.driver_name,
                        c.pool_name,
                        c.device_name,
                        c.share_id if c.HasField("share_id") else None,
                    )
                    for c in r.claim_resources
                ),
            )
            for r in container.dynamic_resources
        )
        out.append(ContainerResources(pod.namespace, pod.name, container.name, devices, claims))
    return out


def check_timeout(seconds: float, flag: str = "--timeout") -> float:
    """``seconds`` if it is a usable deadline; InputError naming ``flag`` otherwise."""
    if not 0 < seconds <= 300:
        raise InputError(
            f"{seconds:g} is not a timeout", where=flag, hint="pass seconds in (0, 300]"
        )
    return seconds
