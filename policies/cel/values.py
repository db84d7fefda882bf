"""The CEL values policies read: ``device`` (one GPU) and ``allocation`` (one candidate set)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from celpy import celtypes

from cdigen.model import Gpu, Node
from policies.cel.quantity import Quantity
from policies.cel.semver import Semver, parse_semver

DRIVER = "gpu.nvidia.com"
KUBERNETES_DOMAIN = "resource.kubernetes.io"
CDIGEN_DOMAIN = "cdigen.dev"


class DomainMap(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain is an empty map."""

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str) and not dict.__contains__(self, key):
            return celtypes.MapType({})
        return super().__getitem__(key)


def _cel(value: Any) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    return value


def _domain(values: Mapping[str, Any]) -> Any:
    return celtypes.MapType(
        {celtypes.StringType(k): _cel(v) for k, v in values.items() if v is not None}
    )


def _version(text: str) -> Semver | str:
    try:
        return parse_semver(text, normalize=True)
    except ValueError:
        return text


def device_value(gpu: Gpu, node: Node) -> Any:
    """The CEL ``device`` map of one full GPU, with DRA names and cdigen's topology domain."""
    attrs: dict[str, Any] = {
        "type": "gpu",
        "uuid": gpu.uuid,
        "productName": gpu.name,
        "brand": gpu.brand,
        "architecture": gpu.architecture,
        "cudaComputeCapability": _version(gpu.cuda_compute_capability),
    }
    if node.driver_version:
        attrs["driverVersion"] = _version(node.driver_version)
    if node.cuda_driver_version:
        attrs["cudaDriverVersion"] = _version(node.cuda_driver_version)
    ours: dict[str, Any] = {
        "index": gpu.index,
        "minor": gpu.minor,
        "numaNode": gpu.numa_node,
        "pciBusId": gpu.pci_bus_id,
        "migEnabled": gpu.mig_enabled,
    }
    return celtypes.MapType(
        {
            celtypes.StringType("driver"): celtypes.StringType(DRIVER),
            celtypes.StringType("attributes"): DomainMap(
                {
                    celtypes.StringType(DRIVER): _domain(attrs),
                    celtypes.StringType(KUBERNETES_DOMAIN): _domain({"pciBusID": gpu.pci_bus_id}),
                    celtypes.StringType(CDIGEN_DOMAIN): _domain(ours),
                }
            ),
            celtypes.StringType("capacity"): DomainMap(
                {
                    celtypes.StringType(DRIVER): celtypes.MapType(
                        {celtypes.StringType("memory"): Quantity(Fraction(gpu.memory_bytes))}
                    )
                }
            ),
        }
    )


def allocation_value(
    devices: Sequence[Any],
    numa_nodes: Sequence[int],
    link_score: int,
    min_pair_nvlinks: int,
) -> Any:
    """The CEL ``allocation`` map of one candidate set."""
    return celtypes.MapType(
        {
            celtypes.StringType("devices"): celtypes.ListType(list(devices)),
            celtypes.StringType("numaNodes"): celtypes.ListType(
                [celtypes.IntType(n) for n in numa_nodes]
            ),
            celtypes.StringType("size"): celtypes.IntType(len(devices)),
            celtypes.StringType("linkScore"): celtypes.IntType(link_score),
            celtypes.StringType("minPairNVLinks"): celtypes.IntType(min_pair_nvlinks),
        }
    )
