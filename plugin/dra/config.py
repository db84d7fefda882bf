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

from cdigen.cdi.spec import CAPABILITIES
from cdigen.errors import InputError
from plugin.dra.claims import ClaimRef, allocation_of, field, quoted

API_VERSION = "gpu.cdigen.dev/v1alpha1"
KIND = "GpuConfig"
SCHEMA = "dra-gpu-config"
SOURCES = ("FromClass", "FromClaim")  # in rising precedence


@dataclass(frozen=True)
class GpuConfig:
    """Our driver's parameters: the driver capabilities asked for (empty: the node-wide ones).
    ``every``: ``all`` was asked, which means every capability the driver offers and finds
    files for, as NVIDIA_DRIVER_CAPABILITIES=all does."""

    capabilities: tuple[str, ...] = ()
    every: bool = False


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
    from cdigen.schemas import schema_errors

    problems = schema_errors(parameters, SCHEMA)
    if problems:
        first, _, why = problems[0].partition(": ")
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        field = "" if first == "<root>" else f".{first}" if not first.startswith("[") else first
        raise InputError(
            f"{why}{more}",
            where=f"{where}.opaque.parameters{field}",
            hint=f"use apiVersion: {API_VERSION}, kind: {KIND} and capabilities from "
            f"{', '.join(CAPABILITIES)} or all (docs/dra.md)",
        )
    caps = parameters.get("capabilities") or []
    if "all" in caps:
        return GpuConfig(CAPABILITIES, every=True)
    return GpuConfig(tuple(c for c in CAPABILITIES if c in caps))


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
