"""Opaque device configuration for our driver: ``GpuConfig`` parameters in DeviceClasses and
ResourceClaims, as the scheduler copies them into ``status.allocation.devices.config``.

As in Kubernetes' dra-example-driver: entries for other drivers are skipped; ours are checked
strictly (apiVersion, kind, no unknown field; schemas/dra-gpu-config.schema.json); class
entries come first, then claim entries, and for each request the last entry that names it (or
names no request) wins whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdigen.cdi.capabilities import CAPABILITIES
from cdigen.constants import MIB
from cdigen.errors import InputError
from cdigen.plugin.dra.claims import ClaimRef, allocation_of, field, quoted

API_VERSION = "gpu.cdigen.dev/v1alpha1"
KIND = "GpuConfig"
SCHEMA = "dra-gpu-config"
SOURCES = ("FromClass", "FromClaim")  # in rising precedence


@dataclass(frozen=True)
class ClaimSharing:
    """A claim's own sharing settings (``sharing`` of GpuConfig, NVIDIA's names): ``MPS`` with
    an SM percentage and pinned-memory limits (bytes; per GPU keyed by in-container CUDA
    ordinal or UUID), or ``TimeSlicing``: no MPS limits for this claim."""

    strategy: str
    thread_percentage: int | None = None
    memory_limit: int | None = None
    per_device_limits: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class GpuConfig:
    """Our driver's parameters: the driver capabilities asked for (empty: the node-wide ones).
    ``every``: ``all`` was asked, which means every capability the driver offers and finds
    files for, as NVIDIA_DRIVER_CAPABILITIES=all does. ``sharing``: the claim's own, or None
    for the node-wide settings."""

    capabilities: tuple[str, ...] = ()
    every: bool = False
    sharing: ClaimSharing | None = None


@dataclass(frozen=True)
class RequestConfig:
    """One config entry for our driver: which requests it applies to (empty: all) and where it
    came from (``config[index]`` of the allocation, from a class or the claim)."""

    requests: tuple[str, ...]
    config: GpuConfig
    source: str
    index: int

    def applies_to(self, request: str) -> bool:
        """True for ``request`` (``main`` or ``main/subrequest``): no requests listed, the
        request listed, or its main request listed (which covers all its subrequests)."""
        if not self.requests:
            return True
        return request in self.requests or request.partition("/")[0] in self.requests


def parse_gpu_config(parameters: Any, where: str) -> GpuConfig:
    """``parameters`` of an opaque config for our driver -> GpuConfig; InputError naming the
    field at ``where`` on anything the schema refuses."""
    from cdigen.schemas import schema_problems

    problems = schema_problems(parameters, SCHEMA)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InputError(
            f"{problems[0].message}{more}",
            where=problems[0].field_under(f"{where}.opaque.parameters"),
            hint=f"use apiVersion: {API_VERSION}, kind: {KIND} and capabilities from "
            f"{', '.join(CAPABILITIES)} or all (docs/dra.md)",
        )
    sharing = _sharing(parameters.get("sharing"), f"{where}.opaque.parameters.sharing")
    caps = parameters.get("capabilities") or []
    if "all" in caps:
        return GpuConfig(CAPABILITIES, every=True, sharing=sharing)
    return GpuConfig(tuple(c for c in CAPABILITIES if c in caps), sharing=sharing)


def _sharing(doc: Mapping[str, Any] | None, where: str) -> ClaimSharing | None:
    """``sharing`` of a GpuConfig the schema passed -> ClaimSharing (quantities in bytes)."""
    if doc is None:
        return None
    mps = doc.get("mpsConfig") or {}
    default = mps.get("defaultPinnedDeviceMemoryLimit")
    per_device = mps.get("defaultPerDevicePinnedMemoryLimit") or {}
    return ClaimSharing(
        strategy=str(doc["strategy"]),
        thread_percentage=mps.get("defaultActiveThreadPercentage"),
        memory_limit=None
        if default is None
        else pinned_limit(default, f"{where}.mpsConfig.defaultPinnedDeviceMemoryLimit"),
        per_device_limits=tuple(
            (
                str(key),
                pinned_limit(value, f"{where}.mpsConfig.defaultPerDevicePinnedMemoryLimit.{key}"),
            )
            for key, value in per_device.items()
        ),
    )


def pinned_limit(
    text: str,
    where: str,
    *,
    quantity_hint: str = "give a quantity such as 4Gi",
    least_hint: str = "give at least 1Mi, e.g. 4Gi",
) -> int:
    """An MPS pinned-memory limit in bytes (a claim config's, or the memory a claim consumed):
    InputError unless ``text`` is a quantity of at least 1Mi, the unit of MPS's limit (0M would
    be no limit to the driver, a negative one nonsense)."""
    from cdigen.policies.cel import parse_quantity

    try:
        value = parse_quantity(text)
    except ValueError as exc:
        raise InputError(str(exc), where=where, hint=quantity_hint) from None
    if value < MIB:
        raise InputError(
            f"{quoted(text, 40)} is less than 1Mi, the least memory MPS can limit a client to",
            where=where,
            hint=least_hint,
        )
    return int(value)


def claim_configs(claim: Mapping[str, Any], ref: ClaimRef, *, driver: str) -> list[RequestConfig]:
    """Our driver's config entries of an allocated claim, lowest precedence first (class
    entries, then claim entries, each in their order); InputError on a bad entry of ours."""
    claim_where = f"ResourceClaim {ref.namespace}/{ref.name}"
    path = "status.allocation.devices.config"
    entries = field(allocation_of(claim, ref), "config", list, claim_where, path) or []
    out: list[RequestConfig] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            continue
        opaque = entry.get("opaque")
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue  # another driver's (a request may be met by several drivers)
        source = entry.get("source")
        where = (
            f"ResourceClaim {ref.namespace}/{ref.name} "
            f"status.allocation.devices.config[{index}] "
            f"({source if source in SOURCES else quoted(source, 40)})"
        )
        if source not in SOURCES:
            raise InputError(
                f"unknown config source {quoted(source, 40)}",
                where=where,
                hint=f"expected {' or '.join(SOURCES)}; upgrade cdigen for newer Kubernetes",
            )
        config = parse_gpu_config(opaque.get("parameters"), where)
        listed = field(entry, "requests", list, claim_where, f"{path}[{index}].requests")
        requests = tuple(str(r) for r in listed or ())
        out.append(RequestConfig(requests, config, str(source), index))
    return sorted(out, key=lambda c: SOURCES.index(c.source))


def config_for(configs: Sequence[RequestConfig], request: str) -> RequestConfig | None:
    """The entry that applies to ``request``: the last one naming it or naming no request."""
    for config in reversed(configs):
        if config.applies_to(request):
            return config
    return None


def claim_sharing(
    configs: Sequence[RequestConfig], requests: Sequence[str], where: str
) -> ClaimSharing | None:
    """The sharing setting of a claim's ``requests`` (None: the node-wide one); InputError when
    its requests' configs ask for different ones (the claim's containers share one set of MPS
    limits)."""
    chosen = {
        request: entry.config.sharing if entry is not None else None
        for request in dict.fromkeys(requests)
        for entry in [config_for(configs, request)]
    }
    settings = set(chosen.values())
    if len(settings) > 1:
        raise InputError(
            "its requests ask for different sharing settings ("
            + ", ".join(f"{r}: {s.strategy if s else 'node-wide'}" for r, s in chosen.items())
            + ")",
            where=where,
            hint="give the claim one GpuConfig sharing setting for all its requests",
        )
    return next(iter(settings), None)
