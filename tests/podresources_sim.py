"""The kubelet's PodResources API for tests: ``v1.PodResourcesLister`` (``List``, ``Get``) served
over a real unix socket at ``<kubelet dir>/pod-resources/kubelet.sock``.

It answers as the kubelet's v1 server does: ``List`` gives every pod admitted with its
containers, the device IDs each got per extended resource and the devices of the ResourceClaims
it uses; ``Get`` of a pod that is not there fails with the kubelet's words
(``pod NAME in namespace NS not found``, gRPC code UNKNOWN, as a plain Go error becomes). A test
admits what the kubelet simulators actually allocated or prepared, so the answer holds the IDs the
plugin handed out, not made-up ones.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from cdigen.plugin.agent.api import podresources_v1_pb2 as pb
from cdigen.plugin.agent.api import podresources_v1_pb2_grpc as pb_grpc


@dataclass
class _Container:
    devices: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    claims: list[tuple[str, str, list[Any]]] = field(default_factory=list)  # (ns, name, devices)


class PodResourcesSim(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """``with PodResourcesSim(kubelet_dir) as kubelet: kubelet.admit(...)``."""

    def __init__(self, kubelet_dir: Path) -> None:
        self.socket = kubelet_dir / "pod-resources" / "kubelet.sock"
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], dict[str, _Container]] = {}
        self._server: grpc.Server | None = None
        self.calls: list[str] = []
        self.delay_s = 0.0  # a kubelet slow to answer

    def start(self) -> PodResourcesSim:
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
        self.socket.unlink(missing_ok=True)

    def __enter__(self) -> PodResourcesSim:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what the kubelet's managers recorded ---------------------------------------------

    def admit(
        self, namespace: str, pod: str, container: str, resource: str, device_ids: Sequence[str]
    ) -> None:
        """The device manager gave ``container`` these IDs of ``resource`` (after Allocate)."""
        with self._lock:
            held = self._pods.setdefault((namespace, pod), {}).setdefault(container, _Container())
            held.devices.append((resource, tuple(device_ids)))

    def admit_claim(
        self,
        namespace: str,
        pod: str,
        container: str,
        claim_name: str,
        driver: str,
        prepared: Iterable[Any],
    ) -> None:
        """The DRA manager gave ``container`` the claim, with the devices the driver's
        NodePrepareResources answered (``Device`` messages: pool, device, CDI IDs, share ID)."""
        devices = []
        for d in prepared:
            resource = pb.ClaimResource(
                cdi_devices=[pb.CDIDevice(name=n) for n in d.cdi_device_ids],
                driver_name=driver,
                pool_name=d.pool_name,
                device_name=d.device_name,
            )
            if d.HasField("share_id"):
                resource.share_id = d.share_id
            devices.append(resource)
        with self._lock:
            held = self._pods.setdefault((namespace, pod), {}).setdefault(container, _Container())
            held.claims.append((namespace, claim_name, devices))

    def remove(self, namespace: str, pod: str) -> None:
        """The pod is gone."""
        with self._lock:
            self._pods.pop((namespace, pod), None)

    # --- the API --------------------------------------------------------------------------

    def _pod(self, key: tuple[str, str], containers: dict[str, _Container]) -> pb.PodResources:
        return pb.PodResources(
            namespace=key[0],
            name=key[1],
            containers=[
                pb.ContainerResources(
                    name=name,
                    devices=[
                        pb.ContainerDevices(resource_name=r, device_ids=list(ids))
                        for r, ids in c.devices
                    ],
                    dynamic_resources=[
                        pb.DynamicResource(
                            claim_namespace=ns, claim_name=claim, claim_resources=devices
                        )
                        for ns, claim, devices in c.claims
                    ],
                )
                for name, c in containers.items()
            ],
        )

    def List(
        self, request: pb.ListPodResourcesRequest, context: Any
    ) -> pb.ListPodResourcesResponse:
        time.sleep(self.delay_s)
        with self._lock:
            self.calls.append("List")
            pods = [self._pod(k, v) for k, v in self._pods.items()]
        return pb.ListPodResourcesResponse(pod_resources=pods)

    def Get(self, request: pb.GetPodResourcesRequest, context: Any) -> pb.GetPodResourcesResponse:
        key = (request.pod_namespace, request.pod_name)
        with self._lock:
            self.calls.append("Get")
            containers = self._pods.get(key)
            if containers is None:
                context.abort(
                    grpc.StatusCode.UNKNOWN,
                    f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
                )
            return pb.GetPodResourcesResponse(pod_resources=self._pod(key, containers))
