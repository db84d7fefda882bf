"""The CEL values policies read: ``device`` (one GPU) and ``allocation`` (one candidate set)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any

from celpy import celtypes

from cdigen.constants import DRA_DRIVER
from cdigen.model import Gpu, Node
from cdigen.policies.cel.quantity import Quantity
from cdigen.policies.cel.semver import Semver, parse_semver
from cdigen.policies.device_view import STANDARD_DOMAIN, Attribute, DeviceView, gpu_view

DRIVER = "gpu.nvidia.com"
KUBERNETES_DOMAIN = STANDARD_DOMAIN
CDIGEN_DOMAIN = "cdigen.dev"  # cdigen's topology facts, for device-plugin policies


class DomainMap(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain is an empty map."""

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str) and not dict.__contains__(self, key):
            return celtypes.MapType({})
        return super().__getitem__(key)


def _attribute(attribute: Attribute) -> Any:
    """The CEL value of one typed DRA attribute (a version is a Semver, as in Kubernetes)."""
    value = attribute.value
    if attribute.kind == "version":
        return _version(str(value))
    if isinstance(value, tuple):  # a list attribute (KEP-5491)
        return celtypes.ListType([celtypes.IntType(v) for v in value])
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    return celtypes.StringType(value)


@lru_cache(maxsize=256)
def _version(text: str) -> Semver:
    """A version attribute as a Semver (immutable, so one per text is shared)."""
    return parse_semver(text, normalize=True)


def view_value(view: DeviceView, driver_domains: Sequence[str] = (DRIVER, DRA_DRIVER)) -> Any:
    """The CEL ``device`` map of one DRA view: a qualified name (``<domain>/<name>``) in its
    domain, a plain name in each of ``driver_domains`` (one map, shared); capacities likewise,
    as Quantities."""
    attributes: dict[str, dict[Any, Any]] = {}
    for qualified, attribute in view.attributes.items():
        domain, _, name = qualified.rpartition("/")
        attributes.setdefault(domain, {})[celtypes.StringType(name)] = _attribute(attribute)
    capacity: dict[str, dict[Any, Any]] = {}
    for qualified, amount in view.capacity.items():
        domain, _, name = qualified.rpartition("/")
        capacity.setdefault(domain, {})[celtypes.StringType(name)] = Quantity(Fraction(amount))
    return celtypes.MapType(
        {
            celtypes.StringType("driver"): celtypes.StringType(driver_domains[0]),
            celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(False),
            celtypes.StringType("attributes"): _domains(attributes, driver_domains),
            celtypes.StringType("capacity"): _domains(capacity, driver_domains),
        }
    )


def _domains(by_domain: Mapping[str, Mapping[Any, Any]], driver_domains: Sequence[str]) -> Any:
    """A DomainMap of ``by_domain``, whose plain names (domain ``""``) go to each driver domain."""
    domains = DomainMap()
    for domain, values in by_domain.items():
        value = celtypes.MapType(values)
        for each in (domain,) if domain else driver_domains:
            domains[celtypes.StringType(each)] = value
    return domains


def _cdigen_domain(gpu: Gpu) -> Any:
    """cdigen's topology domain: what device-plugin policies read besides the DRA view."""
    values: dict[str, Any] = {
        "index": celtypes.IntType(gpu.index),
        "minor": celtypes.IntType(gpu.minor),
        "pciBusId": celtypes.StringType(gpu.pci_bus_id),
        "migEnabled": celtypes.BoolType(gpu.mig_enabled),
    }
    if gpu.numa_node is not None:
        values["numaNode"] = celtypes.IntType(gpu.numa_node)
    return celtypes.MapType({celtypes.StringType(k): v for k, v in values.items()})


def device_value(gpu: Gpu, node: Node) -> Any:
    """The CEL ``device`` map of one full GPU: its DRA view
    (:func:`cdigen.policies.device_view.gpu_view`) under ``gpu.nvidia.com`` and the DRA driver's
    domain, plus cdigen's topology domain."""
    value = view_value(gpu_view(node, gpu))
    value[celtypes.StringType("attributes")][celtypes.StringType(CDIGEN_DOMAIN)] = _cdigen_domain(
        gpu
    )
    return value


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
