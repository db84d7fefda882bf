"""The devices of our ResourceSlices as the DRA scheduler reads them: attributes, capacities
(with their KEP-5075 request policies) and taints, qualified by driver domain.

Part of the offline scheduler simulator (:mod:`cdigen.policies.dra.claims`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, NamedTuple

from celpy import celtypes

from cdigen.errors import InputError
from cdigen.policies.cel import DomainMap, Quantity, parse_quantity, parse_semver
from cdigen.sizes import quantity_text

TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")


@dataclass(frozen=True)
class Taint:
    """A device taint: ``key=value:effect``."""

    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}"


@dataclass(frozen=True)
class CapacityPolicy:
    """A capacity's ``requestPolicy`` (KEP-5075): ``default``, ``validRange`` or ``validValues``."""

    default: int | None = None
    min: int | None = None
    max: int | None = None
    step: int | None = None
    values: tuple[int, ...] = ()

    def consumed(self, requested: int | None, total: int) -> int | None:
        """How much a request for ``requested`` (None: unnamed) consumes; None if the policy
        refuses it."""
        amount = requested if requested is not None else self.default
        if amount is None:
            return total
        if self.values:
            fits = [v for v in self.values if v >= amount]
            return fits[0] if fits else None
        if self.min is not None:
            amount = max(amount, self.min)
            if self.step:
                steps = -(-(amount - self.min) // self.step)
                amount = self.min + steps * self.step
        if self.max is not None and amount > self.max:
            return None
        return amount

    def allowed(self) -> str:
        """What the policy takes, in quantities: ``1Gi to 23Gi in steps of 1Gi``."""
        if self.values:
            return "one of " + ", ".join(quantity_text(v) for v in self.values)
        low = quantity_text(self.min) if self.min is not None else None
        high = quantity_text(self.max) if self.max is not None else None
        text = f"{low} to {high}" if low and high else f"at least {low}" if low else ""
        text = text or (f"at most {high}" if high else "any amount")
        return f"{text} in steps of {quantity_text(self.step)}" if self.step else text

    def refusal(self, name: str, requested: int | None) -> str:
        """Why a request for ``requested`` of capacity ``name`` is refused (it is above every
        amount the policy takes), in quantities."""
        asked = "the default" if requested is None else quantity_text(requested)
        top = self.values[-1] if self.values else self.max
        most = f"at most {quantity_text(top)}" if top is not None else "less"
        return (
            f"{name} request {asked} is more than its request policy allows: {most} "
            f"({self.allowed()})"
        )


class DeviceKey(NamedTuple):
    """Which device: its driver, pool and name. A name is unique only within its pool, a
    pool's only within its driver ("The unique identifier for a device is the tuple <driver
    name>, <pool name>, <device name>", ResourceSlice in the resource.k8s.io/v1 API reference,
    kubernetes.io/docs/reference/kubernetes-api/workload-resources/resource-slice-v1/): a
    node where NVIDIA's driver runs beside ours has two ``gpu-0``. An allocation result names
    a device by the same three fields."""

    driver: str
    pool: str
    name: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.name}"  # as the scheduler writes a device ID


@dataclass(frozen=True)
class SliceDevice:
    """One device of a ResourceSlice, as the allocator reads it; attribute and capacity names
    are qualified (``<domain>/<name>``). Devices are told apart by :attr:`key`, never by
    name alone."""

    name: str
    driver: str
    pool: str
    attributes: Mapping[str, str | int | bool | list[str | int | bool]]
    versions: frozenset[str]  # the attributes of kind version
    capacity: Mapping[str, int]
    policies: Mapping[str, CapacityPolicy]
    allow_multiple: bool = False
    taints: tuple[Taint, ...] = ()
    key: DeviceKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", DeviceKey(self.driver, self.pool, self.name))

    def cel_value(self) -> Any:
        """The CEL ``device`` map, as the scheduler builds it."""
        attrs: dict[str, dict[Any, Any]] = {}
        for qualified, value in self.attributes.items():
            domain, _, name = qualified.rpartition("/")
            if qualified in self.versions:
                cel: Any = parse_semver(str(value), normalize=True)
            elif isinstance(value, list):  # a list attribute (ints, strings, bools; KEP-5491)
                cel = celtypes.ListType([_scalar(v) for v in value])
            else:
                cel = _scalar(value)
            attrs.setdefault(domain, {})[celtypes.StringType(name)] = cel
        caps: dict[str, dict[Any, Any]] = {}
        for qualified, amount in self.capacity.items():
            domain, _, name = qualified.rpartition("/")
            caps.setdefault(domain, {})[celtypes.StringType(name)] = Quantity(Fraction(amount))
        return celtypes.MapType(
            {
                celtypes.StringType("driver"): celtypes.StringType(self.driver),
                celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
                    self.allow_multiple
                ),
                celtypes.StringType("attributes"): DomainMap(
                    {celtypes.StringType(d): celtypes.MapType(v) for d, v in attrs.items()}
                ),
                celtypes.StringType("capacity"): DomainMap(
                    {celtypes.StringType(d): celtypes.MapType(v) for d, v in caps.items()}
                ),
            }
        )


@functools.lru_cache(maxsize=4096)
def qualify(name: str, driver: str) -> str:
    """``index`` -> ``<driver>/index``; qualified names stay as they are (each made once: the
    devices of a cluster share a few names)."""
    return name if "/" in name else f"{driver}/{name}"


def quantity(text: Any, where: str) -> int:
    """A Kubernetes quantity as an integer; one-line InputError naming ``where``."""
    try:
        return _quantity(str(text))
    except ValueError:
        raise InputError(f"{text!r} is not a quantity", where=where) from None


@functools.lru_cache(maxsize=4096)
def _quantity(text: str) -> int:
    # The slices of a cluster repeat a few quantities (each GPU model's memory, the request
    # policy's bounds) tens of thousands of times: parse each once.
    return int(parse_quantity(text))


def _policy(doc: Mapping[str, Any], where: str) -> CapacityPolicy:
    rng = doc.get("validRange") or {}
    return CapacityPolicy(
        default=quantity(doc["default"], where) if "default" in doc else None,
        min=quantity(rng["min"], where) if "min" in rng else None,
        max=quantity(rng["max"], where) if "max" in rng else None,
        step=quantity(rng["step"], where) if "step" in rng else None,
        values=tuple(quantity(v, where) for v in doc.get("validValues") or ()),
    )


def _scalar(value: Any) -> Any:
    """The CEL value of one bool, int or string attribute value."""
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    return celtypes.StringType(value)


def slice_devices(slices: Iterable[Mapping[str, Any]]) -> list[SliceDevice]:
    """Every device of ``slices`` (v1 ResourceSlice dicts) in slice order, then device order."""
    out: list[SliceDevice] = []
    for n, body in enumerate(slices):
        spec = body.get("spec") or {}
        driver = str(spec.get("driver", ""))
        pool = str((spec.get("pool") or {}).get("name", ""))
        for k, dev in enumerate(spec.get("devices") or []):
            where = f"ResourceSlice {n} spec.devices[{k}]"
            attrs: dict[str, str | int | bool | list[str | int | bool]] = {}
            versions = set()
            for name, typed in (dev.get("attributes") or {}).items():
                ((kind, value),) = typed.items()
                attrs[qualify(name, driver)] = value
                if kind == "version":
                    versions.add(qualify(name, driver))
            capacity: dict[str, int] = {}
            policies: dict[str, CapacityPolicy] = {}
            for name, cap in (dev.get("capacity") or {}).items():
                capacity[qualify(name, driver)] = quantity(cap["value"], where)
                if cap.get("requestPolicy"):
                    policies[qualify(name, driver)] = _policy(cap["requestPolicy"], where)
            out.append(
                SliceDevice(
                    name=str(dev["name"]),
                    driver=driver,
                    pool=pool,
                    attributes=attrs,
                    versions=frozenset(versions),
                    capacity=capacity,
                    policies=policies,
                    allow_multiple=bool(dev.get("allowMultipleAllocations", False)),
                    taints=tuple(
                        Taint(str(t["key"]), str(t.get("value", "")), str(t["effect"]))
                        for t in dev.get("taints") or ()
                    ),
                )
            )
    return out
