"""One device-plugin servicer on a real socket with the kubelet simulator, for unit tests."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from cdigen.model import Gpu, Node
from cdigen.plugin.agent.health import HealthBoard
from cdigen.plugin.deviceplugin.kubelet_requests import PreferenceRequest
from cdigen.plugin.deviceplugin.registration import register
from cdigen.plugin.deviceplugin.runner import ResourceServer
from cdigen.plugin.deviceplugin.servicer import (
    DevicePluginService,
    Preference,
    Preferrer,
    advertised_devices,
)
from tests.kubelet_sim import KubeletSimulator

RESOURCE = "nvidia.com/gpu"
NUMA = (3, 3, 1, 1, 7, 7, None, 0)


def make_node() -> Node:
    """Eight GPUs; GPU 6 has no known NUMA node and GPU 7 is on NUMA node 0."""
    gpus = tuple(
        Gpu(
            index=i,
            minor=i,
            uuid=f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd",
            name="NVIDIA A100-SXM4-80GB",
            architecture="Ampere",
            cuda_compute_capability="8.0",
            memory_bytes=80 * 2**30,
            pci_bus_id=f"0000:0{i}:00.0",
            numa_node=NUMA[i],
        )
        for i in range(8)
    )
    return Node(gpus=gpus, driver_version="550.54.15", name="test-8gpu")


NODE = make_node()
UUIDS = [g.uuid for g in NODE.gpus]


def last_two(request: PreferenceRequest) -> Preference:
    """A stand-in policy with a visible preference: must-include, then the last available."""
    must = request.must_ids
    rest = [d for d in reversed(request.ids) if d not in must]
    return Preference(tuple(list(must) + rest)[: request.size], link_score=0)


def first(request: PreferenceRequest) -> Preference:
    """A stand-in policy: the first ``size`` candidates."""
    return Preference(request.ids[: request.size])


class Harness:
    """A servicer on a real socket plus a kubelet simulator in one temp plugin dir."""

    def __init__(
        self,
        plugin_dir: Path,
        *,
        strategy: str = "cdi-cri",
        edits: object = None,
        **service_options: Any,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.board = HealthBoard(UUIDS)
        self.prefer: Preferrer = last_two

        def make(stop: threading.Event) -> DevicePluginService:
            return DevicePluginService(
                resource=RESOURCE,
                devices=advertised_devices(NODE),
                board=self.board,
                cdi_kind="nvidia.com/gpu",
                strategy=strategy,
                prefer=lambda: self.prefer,
                edits=edits,  # type: ignore[arg-type]
                stop=stop,
                watch_tick_s=0.05,
                **service_options,
            )

        self.server = ResourceServer(plugin_dir, make)
        self.kubelet = KubeletSimulator(plugin_dir)

    def __enter__(self) -> Harness:
        self.kubelet.start()
        self.server.start()
        register(self.plugin_dir, endpoint=self.server.socket_path.name, resource_name=RESOURCE)
        self.kubelet.wait_registered(RESOURCE)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()
        self.kubelet.stop()
