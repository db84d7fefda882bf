"""API objects as the tests of ``dra why`` put them into the fake API server: claims, allocated
or not, and the pods that use them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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
