"""One DRA plugin in-process, wired to the fake API server and the DRA kubelet simulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from cdigen.model import Node
from cdigen.plugin.agent.kubeapi import api_client
from cdigen.plugin.dra.config import API_VERSION, KIND
from cdigen.plugin.dra.kube import KubeApi
from cdigen.plugin.dra.kubelet_plugin import SLICE_RESYNC_S, DraPlugin
from cdigen.plugin.dra.options import DraOptions
from tests.cdihost import FakeHost
from tests.dra_kubelet_sim import DraKubeletSim
from tests.fake_apiserver import FakeApiServer, Identity, allocated_claim

DRIVER = "gpu.cdigen.dev"
NODE_NAME = "node-a"
RBAC = Path(__file__).resolve().parents[2] / "deploy" / "dra" / "rbac.yaml"
PLUGIN_TOKEN = "cdigen-dra-plugin-token"


def shipped_rbac() -> list[dict[str, Any]]:
    """deploy/dra/rbac.yaml's objects."""
    return [d for d in yaml.safe_load_all(RBAC.read_text(encoding="utf-8")) if d]


def plugin_identity(rbac: list[dict[str, Any]], node: str | None = NODE_NAME) -> Identity:
    """The plugin pod's ServiceAccount as the RBAC names it, with a node-bound token for
    ``node`` (what a pod's projected token carries; None: a token outside a pod)."""
    (account,) = [o for o in rbac if o["kind"] == "ServiceAccount"]
    meta = account["metadata"]
    return Identity(f"system:serviceaccount:{meta['namespace']}:{meta['name']}", node=node)


def dra_options(host: FakeHost, kubelet_dir: Path, cdi_dir: Path, **overrides: Any) -> DraOptions:
    """The plugin's options for ``host`` on node ``NODE_NAME``; ``overrides`` adds or replaces."""
    return DraOptions(
        node_name=NODE_NAME,
        driver=DRIVER,
        kubelet_dir=kubelet_dir,
        cdi_dir=cdi_dir,
        driver_root=str(host.driver_root),
        dev_root=str(host.dev_root),
        sysfs_root=str(host.sysfs_root),
        **overrides,
    )


class Harness:
    """One DRA plugin in-process, wired to the fake API server, and the kubelet simulator."""

    def __init__(
        self, api: FakeApiServer, host: FakeHost, kubelet_dir: Path, tmp_path: Path
    ) -> None:
        self.api = api
        self.host = host
        self.kubelet_dir = kubelet_dir
        self.cdi_dir = tmp_path / "run-cdi"
        # the plugin talks as its pod would: its ServiceAccount's node-bound token, authorized
        # by the RBAC that deploy/dra ships (a call it does not grant fails the test)
        rbac = shipped_rbac()
        api.authorize(rbac)
        api.identify(PLUGIN_TOKEN, plugin_identity(rbac))
        self.kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", token=PLUGIN_TOKEN)
        self.plugin: DraPlugin | None = None
        self.kubelet = DraKubeletSim(kubelet_dir)

    def start(
        self,
        node: Node | None = None,
        *,
        api_timeout_s: float = 5.0,
        resync_s: float = SLICE_RESYNC_S,
        mig: Any = None,
        **overrides: Any,
    ) -> DraPlugin:
        """Start, register with the kubelet simulator and wait for the slices."""
        plugin = self.start_unpublished(
            node, api_timeout_s=api_timeout_s, resync_s=resync_s, mig=mig, **overrides
        )
        assert plugin.wait_published(10), "the slices were not published"
        return plugin

    def start_unpublished(
        self,
        node: Node | None = None,
        *,
        api_timeout_s: float = 5.0,
        resync_s: float = SLICE_RESYNC_S,
        mig: Any = None,
        **overrides: Any,
    ) -> DraPlugin:
        """Start and register with the kubelet simulator (the slices may come later); ``mig``
        makes the MIG devices of placements (cdigen.plugin.dra.dynamic_mig.MigMaker)."""
        options = dra_options(self.host, self.kubelet_dir, self.cdi_dir, **overrides)
        kube = KubeApi(api_client(str(self.kubeconfig)), timeout_s=api_timeout_s)
        self.plugin = DraPlugin(
            options,
            node or self.host.node,
            slices=kube,
            claims=kube,
            node_owner=kube.node_owner,
            resync_s=resync_s,
            mig=mig,
        )
        self.plugin.start()
        self.kubelet.register()
        return self.plugin

    def stop(self) -> None:
        if self.plugin is not None:
            self.plugin.stop()
            self.plugin = None

    def claim(self, name: str, uid: str, *devices: str, **extra: Any) -> tuple[str, str, str]:
        results = [
            {"request": "gpu", "driver": DRIVER, "pool": NODE_NAME, "device": d, **extra}
            for d in devices
        ]
        self.api.add_claim(allocated_claim(name, uid, results, node=NODE_NAME))
        return ("default", uid, name)


def gpu_config(*capabilities: str, **extra: Any) -> dict[str, Any]:
    """Opaque parameters for our driver."""
    return {"apiVersion": API_VERSION, "kind": KIND, "capabilities": list(capabilities), **extra}


def entry(source: str, parameters: Any, *requests: str, driver: str = DRIVER) -> dict[str, Any]:
    """One status.allocation.devices.config entry, as the scheduler copies it."""
    doc: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": parameters}}
    if requests:
        doc["requests"] = list(requests)
    return doc


def add_claim(
    harness: Harness, name: str, uid: str, devices: dict[str, str], config: list[dict[str, Any]]
) -> tuple[str, str, str]:
    """An allocated claim with ``devices`` (device -> request) and ``config`` entries."""
    results = [
        {"request": request, "driver": DRIVER, "pool": NODE_NAME, "device": device}
        for device, request in devices.items()
    ]
    claim = allocated_claim(name, uid, results, node=NODE_NAME)
    claim["status"]["allocation"]["devices"]["config"] = config
    harness.api.add_claim(claim)
    return ("default", uid, name)
