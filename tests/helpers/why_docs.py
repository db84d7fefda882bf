"""API objects as the tests of ``dra why`` put them into the fake API server: the DeviceClasses
we ship, ResourceSlices, claims (allocated or not) and the pods that use them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.fake_apiserver import FakeApiServer

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def api_with_classes() -> Iterator[FakeApiServer]:
    """A fake API server on loopback holding the DeviceClasses we ship, stopped on exit."""
    server = FakeApiServer().start()
    try:
        for doc in shipped_classes():
            server.add_class(doc)
        yield server
    finally:
        server.stop()


def shipped_classes() -> list[dict[str, Any]]:
    """The DeviceClasses deploy/dra/deviceclasses.yaml ships."""
    return list(yaml.safe_load_all((ROOT / "deploy/dra/deviceclasses.yaml").read_text()))


def slice_doc(
    name: str, driver: str, node: str, pool: str, devices: Sequence[dict[str, Any]], *,
    generation: int = 1, count: int = 1,
) -> dict[str, Any]:  # fmt: skip
    """A ResourceSlice of ``node``: ``devices`` of ``driver``'s ``pool``, one of ``count``
    slices of its ``generation``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            "devices": list(devices),
        },
    }


def claim_doc(
    name: str,
    cls: str,
    count: int = 1,
    held: Sequence[tuple[str, str, str]] = (),
    constraints: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """A claim asking ``count`` devices of class ``cls``; allocated when ``held`` names
    (driver, pool, device) results."""
    exactly = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": count}
    devices: dict[str, Any] = {"requests": [{"name": "gpus", "exactly": exactly}]}
    if constraints:
        devices["constraints"] = list(constraints)
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"{name}-uid"},
        "spec": {"devices": devices},
    }
    if held:
        results = [
            {"request": "gpus", "driver": driver, "pool": pool, "device": device}
            for driver, pool, device in held
        ]
        claim["status"] = {"allocation": {"devices": {"results": results}}}
    return claim


def pod_doc(name: str, claim: str, node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
        "containers": [{"name": "main", "image": "cuda"}],
    }
    if node:
        spec["nodeName"] = node
    status = {"phase": "Running" if node else "Pending"}
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec, "status": status}
