"""ResourceClaims as the DRA plugin reads them: the allocation results for one driver and pool."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cdigen.errors import InputError


@dataclass(frozen=True)
class ClaimRef:
    """What the kubelet names in NodePrepareResources: namespace, UID and name."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result of a claim for our driver and pool."""

    request: str
    device: str
    admin_access: bool = False
    share_id: str | None = None
    consumed: Mapping[str, str] | None = None  # consumedCapacity, as quantities

    @property
    def shareable(self) -> bool:
        """True when the scheduler allocated this device to be shared with other claims."""
        return self.admin_access or self.share_id is not None


class ClaimReader(Protocol):
    """Reads a ResourceClaim from the API server as a plain dict."""

    def read_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The claim object; raises on an API error."""
        ...


def allocated_devices(
    claim: Mapping[str, Any], ref: ClaimRef, *, driver: str, pool: str
) -> tuple[AllocatedDevice, ...]:
    """The results of ``claim`` that belong to ``driver`` and ``pool``.

    InputError when the claim is not the one the kubelet named (another UID: it was deleted and
    recreated) or is not allocated.
    """
    meta = claim.get("metadata") or {}
    if meta.get("uid") != ref.uid:
        raise InputError(
            f"ResourceClaim {ref.namespace}/{ref.name} has UID {meta.get('uid')!r}, "
            f"not {ref.uid!r}",
            where="NodePrepareResources",
            hint="the claim was deleted and recreated; the kubelet will retry with the new one",
        )
    allocation = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
    results = allocation.get("results")
    if not isinstance(results, list):
        raise InputError(
            f"ResourceClaim {ref.namespace}/{ref.name} is not allocated",
            where="NodePrepareResources",
            hint="the scheduler allocates claims before the kubelet prepares them",
        )
    devices: list[AllocatedDevice] = []
    for result in results:
        if not isinstance(result, Mapping):
            continue
        if result.get("driver") != driver or result.get("pool") != pool:
            continue
        consumed = result.get("consumedCapacity")
        devices.append(
            AllocatedDevice(
                request=str(result.get("request", "")),
                device=str(result.get("device", "")),
                admin_access=bool(result.get("adminAccess", False)),
                share_id=str(result["shareID"]) if result.get("shareID") else None,
                consumed={str(k): str(v) for k, v in consumed.items()}
                if isinstance(consumed, Mapping)
                else None,
            )
        )
    return tuple(devices)
