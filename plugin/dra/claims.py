"""ResourceClaims as the DRA plugin reads them: the allocation results for one driver and pool."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cdigen.errors import InputError, shortened

# A claim UID names files (the claim's CDI spec) and CDI devices, so only UIDs that are one
# plain path component and a CDI device-name prefix are taken: the API server's UUIDs
# (8-4-4-4-12 hex) and the name-like ones of test clusters, at most 128 characters; never a
# path separator, "..", whitespace or a control character.
UID_MAX_CHARS = 128
_UID_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9])?")
# namespace: a DNS label; name: a DNS subdomain (both also go into the API server's URLs)
_NAMESPACE_RE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_NAME_RE = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?")
# a request: a DNS label, or <request>/<subrequest> (both go into the answer and the checkpoint)
_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_REQUEST_RE = re.compile(rf"{_LABEL}(?:/{_LABEL})?")


@dataclass(frozen=True)
class ClaimRef:
    """What the kubelet names in NodePrepareResources: namespace, UID and name."""

    namespace: str
    uid: str
    name: str

    def problem(self) -> str | None:
        """Why the kubelet's UID, namespace or name cannot be used (checked before any use:
        the UID names files), or None."""
        if not _UID_RE.fullmatch(self.uid) or ".." in self.uid:
            return (
                f"claim UID {quoted(self.uid)} is not a Kubernetes UID (letters, digits, '-', "
                f"'_' and '.', at most {UID_MAX_CHARS} characters, no '..')"
            )
        if not _NAMESPACE_RE.fullmatch(self.namespace):
            return f"claim namespace {quoted(self.namespace)} is not a DNS label"
        if not _NAME_RE.fullmatch(self.name):
            return f"claim name {quoted(self.name)} is not a DNS subdomain"
        return None

    @property
    def shown(self) -> str:
        """``namespace/name (uid)`` for logs and errors, each part quoted and cut short when
        it is not a valid one (a newline must not split a log line)."""
        if self.problem() is None:
            return f"{self.namespace}/{self.name} ({self.uid})"
        return f"{quoted(self.namespace)}/{quoted(self.name)} ({quoted(self.uid)})"


def quoted(value: object, limit: int = 60) -> str:
    """``value`` as a Python literal, cut to ``limit`` characters: a hostile value quoted in an
    error stays one short line (no newline, no control character, bounded)."""
    return shortened(repr(value), limit)


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


_KINDS = {"str": "a string", "int": "a number", "float": "a number", "bool": "a boolean"}


def kind_of(value: object) -> str:
    """``a string``, ``a list``, ``null``...: what a field holds, for an error."""
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return _KINDS.get(type(value).__name__, type(value).__name__)


def field(doc: Mapping[str, Any], key: str, kind: type, where: str, path: str) -> Any:
    """``doc[key]`` when it is a ``kind`` (None when absent or null); InputError naming the
    field at ``path`` otherwise (a claim object of the wrong shape fails that claim only)."""
    value = doc.get(key)
    if value is None or isinstance(value, kind):
        return value
    want = {Mapping: "a mapping", list: "a list", str: "a string", bool: "a boolean"}[kind]
    raise InputError(
        f"{path} is {kind_of(value)}, not {want}",
        where=where,
        hint="the API server sent a ResourceClaim of the wrong shape",
    )


def allocation_of(claim: Mapping[str, Any], ref: ClaimRef) -> Mapping[str, Any]:
    """``status.allocation.devices`` of ``claim`` ({} when absent); InputError naming the first
    level that is not a mapping."""
    where = f"ResourceClaim {ref.namespace}/{ref.name}"
    status = field(claim, "status", Mapping, where, "status") or {}
    allocation = field(status, "allocation", Mapping, where, "status.allocation") or {}
    devices = field(allocation, "devices", Mapping, where, "status.allocation.devices")
    return devices or {}


def allocated_devices(
    claim: Mapping[str, Any], ref: ClaimRef, *, driver: str, pool: str
) -> tuple[AllocatedDevice, ...]:
    """The results of ``claim`` that belong to ``driver`` and ``pool``.

    InputError when the claim is not the one the kubelet named (another UID: it was deleted and
    recreated), is not allocated, or has a field of ours of the wrong shape.
    """
    where = f"ResourceClaim {ref.namespace}/{ref.name}"
    meta = field(claim, "metadata", Mapping, where, "metadata") or {}
    if meta.get("uid") != ref.uid:
        raise InputError(
            f"ResourceClaim {ref.namespace}/{ref.name} has UID {quoted(meta.get('uid'))}, "
            f"not {quoted(ref.uid)}",
            where="NodePrepareResources",
            hint="the claim was deleted and recreated; the kubelet will retry with the new one",
        )
    results = field(allocation_of(claim, ref), "results", list, where, "status.allocation.devices")
    if results is None:
        raise InputError(
            f"ResourceClaim {ref.namespace}/{ref.name} is not allocated",
            where="NodePrepareResources",
            hint="the scheduler allocates claims before the kubelet prepares them",
        )
    devices: list[AllocatedDevice] = []
    for index, result in enumerate(results):
        if not isinstance(result, Mapping):
            continue
        if result.get("driver") == driver and result.get("pool") == pool:
            devices.append(
                _allocated_device(result, f"status.allocation.devices.results[{index}]", where)
            )
    return tuple(devices)


def _allocated_device(result: Mapping[str, Any], path: str, where: str) -> AllocatedDevice:
    """One allocation result of ours; InputError naming ``path`` for a field of the wrong shape."""
    request = field(result, "request", str, where, f"{path}.request") or ""
    device = field(result, "device", str, where, f"{path}.device") or ""
    share_id = field(result, "shareID", str, where, f"{path}.shareID") or None
    admin = field(result, "adminAccess", bool, where, f"{path}.adminAccess") or False
    if request and not _REQUEST_RE.fullmatch(request):
        raise InputError(
            f"{path}.request {quoted(request)} is not a request name (a DNS label, or "
            "request/subrequest)",
            where=where,
        )
    if share_id is not None and not _UID_RE.fullmatch(share_id):
        raise InputError(f"{path}.shareID {quoted(share_id)} is not a UID", where=where)
    consumed = field(result, "consumedCapacity", Mapping, where, f"{path}.consumedCapacity")
    for key, value in (consumed or {}).items():
        if not isinstance(value, str | int):
            raise InputError(
                f"{path}.consumedCapacity.{shortened(str(key), 40)} is {kind_of(value)}, "
                "not a quantity",
                where=where,
                hint="the API server sent a ResourceClaim of the wrong shape",
            )
    return AllocatedDevice(
        request=request,
        device=device,
        admin_access=admin,
        share_id=share_id,
        consumed={str(k): str(v) for k, v in consumed.items()} if consumed is not None else None,
    )
