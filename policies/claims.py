"""The DRA scheduler's side, offline: ResourceClaims and DeviceClasses read from YAML, devices
read from our ResourceSlices, and a first-fit allocator shaped like the kube-scheduler's
structured allocator.

The allocator walks the slices' devices in order for each request, evaluates the class's and the
request's CEL selectors with cdigen's CEL engine (DRA dialect: ``device.driver``,
``device.attributes["<domain>"].<name>``, ``device.capacity["<domain>"].<name>``), checks
``matchAttribute``/``distinctAttribute`` constraints and consumable capacity (KEP-5075), skips
devices with a ``NoSchedule``/``NoExecute`` taint, and backtracks when a later pick fails, as
the real one does. It is a simulator for tests and ``cdigen dra explain``: it answers what the
scheduler's first fit would pick on a free (or given) node, not where pods go in a cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from celpy import celtypes

from cdigen.errors import InputError
from cdigen.fileio import read_text
from policies.cel import (
    CelCompileError,
    CelEvaluationError,
    CelProgram,
    DomainMap,
    Quantity,
    compile_expression,
    parse_quantity,
    parse_semver,
)

STANDARD_DOMAIN = "resource.kubernetes.io"
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")
DEVICE_VARIABLES = frozenset({"device"})

# --------------------------------------------------------------------------- devices


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


@dataclass(frozen=True)
class SliceDevice:
    """One device of a ResourceSlice, as the allocator reads it; attribute and capacity names
    are qualified (``<domain>/<name>``)."""

    name: str
    driver: str
    pool: str
    attributes: Mapping[str, str | int | bool]
    versions: frozenset[str]  # the attributes of kind version
    capacity: Mapping[str, int]
    policies: Mapping[str, CapacityPolicy]
    allow_multiple: bool = False
    taints: tuple[Taint, ...] = ()

    def cel_value(self) -> Any:
        """The CEL ``device`` map, as the scheduler builds it."""
        attrs: dict[str, dict[Any, Any]] = {}
        for qualified, value in self.attributes.items():
            domain, _, name = qualified.rpartition("/")
            if qualified in self.versions:
                cel: Any = parse_semver(str(value), normalize=True)
            elif isinstance(value, bool):
                cel = celtypes.BoolType(value)
            elif isinstance(value, int):
                cel = celtypes.IntType(value)
            else:
                cel = celtypes.StringType(value)
            attrs.setdefault(domain, {})[celtypes.StringType(name)] = cel
        caps: dict[str, dict[Any, Any]] = {}
        for qualified, amount in self.capacity.items():
            domain, _, name = qualified.rpartition("/")
            caps.setdefault(domain, {})[celtypes.StringType(name)] = Quantity(Fraction(amount))
        return celtypes.MapType(
            {
                celtypes.StringType("driver"): celtypes.StringType(self.driver),
                celtypes.StringType("attributes"): DomainMap(
                    {celtypes.StringType(d): celtypes.MapType(v) for d, v in attrs.items()}
                ),
                celtypes.StringType("capacity"): DomainMap(
                    {celtypes.StringType(d): celtypes.MapType(v) for d, v in caps.items()}
                ),
            }
        )


def qualify(name: str, driver: str) -> str:
    """``index`` -> ``<driver>/index``; qualified names stay as they are."""
    return name if "/" in name else f"{driver}/{name}"


def _quantity(text: Any, where: str) -> int:
    try:
        return int(parse_quantity(str(text)))
    except ValueError:
        raise InputError(f"{text!r} is not a quantity", where=where) from None


def _policy(doc: Mapping[str, Any], where: str) -> CapacityPolicy:
    rng = doc.get("validRange") or {}
    return CapacityPolicy(
        default=_quantity(doc["default"], where) if "default" in doc else None,
        min=_quantity(rng["min"], where) if "min" in rng else None,
        max=_quantity(rng["max"], where) if "max" in rng else None,
        step=_quantity(rng["step"], where) if "step" in rng else None,
        values=tuple(_quantity(v, where) for v in doc.get("validValues") or ()),
    )


def slice_devices(slices: Iterable[Mapping[str, Any]]) -> list[SliceDevice]:
    """Every device of ``slices`` (v1 ResourceSlice dicts) in slice order, then device order."""
    out: list[SliceDevice] = []
    for n, body in enumerate(slices):
        spec = body.get("spec") or {}
        driver = str(spec.get("driver", ""))
        pool = str((spec.get("pool") or {}).get("name", ""))
        for k, dev in enumerate(spec.get("devices") or []):
            where = f"ResourceSlice {n} spec.devices[{k}]"
            attrs: dict[str, str | int | bool] = {}
            versions = set()
            for name, typed in (dev.get("attributes") or {}).items():
                ((kind, value),) = typed.items()
                attrs[qualify(name, driver)] = value
                if kind == "version":
                    versions.add(qualify(name, driver))
            capacity: dict[str, int] = {}
            policies: dict[str, CapacityPolicy] = {}
            for name, cap in (dev.get("capacity") or {}).items():
                capacity[qualify(name, driver)] = _quantity(cap["value"], where)
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


# --------------------------------------------------------------------------- claims and classes


@dataclass(frozen=True)
class Selector:
    """One CEL selector and where it was written (file and field)."""

    expression: str
    source: str
    field: str


@dataclass(frozen=True)
class Toleration:
    """A request's toleration of device taints (``Exists`` or ``Equal``)."""

    key: str | None
    operator: str
    value: str
    effect: str | None

    def tolerates(self, taint: Taint) -> bool:
        """True when this toleration covers ``taint``."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key is None:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True)
class Request:
    """One ``exactly`` request of a claim."""

    name: str
    class_name: str
    selectors: tuple[Selector, ...]
    mode: str = "ExactCount"
    count: int = 1
    capacity: Mapping[str, int] = field(default_factory=dict)  # plain or qualified names
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True)
class Constraint:
    """A claim constraint: ``matchAttribute`` or ``distinctAttribute`` over some requests."""

    requests: tuple[str, ...]  # empty: all requests
    attribute: str
    distinct: bool = False

    def covers(self, request: str) -> bool:
        """True when the constraint applies to ``request``."""
        return not self.requests or request in self.requests


@dataclass(frozen=True)
class Claim:
    """A ResourceClaim (or the claim of a ResourceClaimTemplate)."""

    name: str
    source: str
    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...]


@dataclass(frozen=True)
class DeviceClass:
    """A DeviceClass: its name and selectors."""

    name: str
    source: str
    selectors: tuple[Selector, ...]


def read_documents(path: str | Path) -> list[Mapping[str, Any]]:
    """The YAML documents of a file (``---`` separated); one-line InputError on bad YAML."""
    import yaml

    text = read_text(path, what="manifest")
    try:
        docs = list(yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        pos = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise InputError(f"{pos}invalid YAML: {exc.problem}", where=str(path)) from None
    except yaml.YAMLError as exc:
        raise InputError(f"invalid YAML: {exc}", where=str(path)) from None
    out = [d for d in docs if d is not None]
    for n, doc in enumerate(out):
        if not isinstance(doc, Mapping) or "kind" not in doc:
            raise InputError(
                f"document {n + 1} is not a Kubernetes object (no kind)", where=str(path)
            )
    return out


def _selectors(items: Any, source: str, prefix: str) -> tuple[Selector, ...]:
    out = []
    for n, item in enumerate(items or ()):
        expression = ((item or {}).get("cel") or {}).get("expression")
        if not isinstance(expression, str):
            raise InputError(
                "a selector needs cel.expression (a string)",
                where=f"{source}: {prefix}[{n}]",
            )
        out.append(Selector(expression, source, f"{prefix}[{n}].cel.expression"))
    return tuple(out)


def device_class(doc: Mapping[str, Any], source: str) -> DeviceClass:
    """A DeviceClass from its manifest."""
    name = str((doc.get("metadata") or {}).get("name", ""))
    spec = doc.get("spec") or {}
    return DeviceClass(name, source, _selectors(spec.get("selectors"), source, "spec.selectors"))


def claim_from_doc(doc: Mapping[str, Any], source: str) -> Claim:
    """A Claim from a ResourceClaim or ResourceClaimTemplate manifest (resource.k8s.io/v1)."""
    kind = doc.get("kind")
    name = str((doc.get("metadata") or {}).get("name", ""))
    spec = doc.get("spec") or {}
    base = "spec"
    if kind == "ResourceClaimTemplate":
        spec, base = spec.get("spec") or {}, "spec.spec"
    elif kind != "ResourceClaim":
        raise InputError(
            f"kind {kind!r} is not a ResourceClaim or ResourceClaimTemplate", where=source
        )
    devices = spec.get("devices") or {}
    requests: list[Request] = []
    for n, req in enumerate(devices.get("requests") or ()):
        where = f"{base}.devices.requests[{n}]"
        exactly = (req or {}).get("exactly")
        if not isinstance(exactly, Mapping):
            raise InputError(
                "only requests with exactly are simulated (firstAvailable is not)",
                where=f"{source}: {where}",
                hint="write the request as exactly: {deviceClassName: ..., ...}",
            )
        mode = str(exactly.get("allocationMode", "ExactCount"))
        if mode not in ("ExactCount", "All"):
            raise InputError(f"unknown allocationMode {mode!r}", where=f"{source}: {where}")
        count = exactly.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise InputError(
                f"count must be a positive integer, got {count!r}",
                where=f"{source}: {where}.exactly.count",
            )
        caps = ((exactly.get("capacity") or {}).get("requests")) or {}
        requests.append(
            Request(
                name=str(req.get("name", "")),
                class_name=str(exactly.get("deviceClassName", "")),
                selectors=_selectors(
                    exactly.get("selectors"), source, f"{where}.exactly.selectors"
                ),
                mode=mode,
                count=count,
                capacity={
                    str(k): _quantity(v, f"{source}: {where}.exactly.capacity.requests.{k}")
                    for k, v in caps.items()
                },
                tolerations=tuple(
                    Toleration(
                        t.get("key"),
                        str(t.get("operator", "Equal")),
                        str(t.get("value", "")),
                        t.get("effect"),
                    )
                    for t in exactly.get("tolerations") or ()
                ),
            )
        )
    constraints: list[Constraint] = []
    for c in devices.get("constraints") or ():
        names = tuple(str(r) for r in c.get("requests") or ())
        if c.get("matchAttribute"):
            constraints.append(Constraint(names, str(c["matchAttribute"])))
        if c.get("distinctAttribute"):
            constraints.append(Constraint(names, str(c["distinctAttribute"]), distinct=True))
    return Claim(name, source, tuple(requests), tuple(constraints))


def load_manifests(paths: Sequence[str | Path]) -> tuple[list[Claim], dict[str, DeviceClass]]:
    """The claims (and templates) and device classes in ``paths``; other kinds are ignored."""
    claims: list[Claim] = []
    classes: dict[str, DeviceClass] = {}
    for path in paths:
        for doc in read_documents(path):
            if doc["kind"] == "DeviceClass":
                cls = device_class(doc, str(path))
                classes[cls.name] = cls
            elif doc["kind"] in ("ResourceClaim", "ResourceClaimTemplate"):
                claims.append(claim_from_doc(doc, str(path)))
    return claims, classes


# --------------------------------------------------------------------------- first fit


@dataclass(frozen=True)
class Pick:
    """One allocated device: the request, the device and the capacity it consumes."""

    request: str
    device: str
    consumed: Mapping[str, int] = field(default_factory=dict)


@dataclass
class NodeState:
    """What earlier claims hold: exclusive devices, and consumed capacity of shared ones."""

    exclusive: set[str] = field(default_factory=set)
    consumed: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, picks: Iterable[Pick], devices: Mapping[str, SliceDevice]) -> None:
        """Record an allocation."""
        for pick in picks:
            if devices[pick.device].allow_multiple:
                held = self.consumed.setdefault(pick.device, {})
                for name, amount in pick.consumed.items():
                    held[name] = held.get(name, 0) + amount
            else:
                self.exclusive.add(pick.device)


@dataclass(frozen=True)
class Allocation:
    """The picks of one claim, or why it cannot be allocated."""

    picks: tuple[Pick, ...] = ()
    error: str = ""

    @property
    def devices(self) -> tuple[str, ...]:
        """The picked device names, in order."""
        return tuple(p.device for p in self.picks)


class FirstFit:
    """The scheduler's first fit over one node's devices."""

    def __init__(
        self, devices: Sequence[SliceDevice], classes: Mapping[str, DeviceClass] | None = None
    ) -> None:
        self.devices = list(devices)
        self.by_name = {d.name: d for d in self.devices}
        self.classes = dict(classes or {})
        self._programs: dict[str, CelProgram] = {}
        self._values = {d.name: d.cel_value() for d in self.devices}
        self._matches: dict[tuple[Any, ...], str] = {}

    # -- single-device checks

    def _program(self, selector: Selector) -> CelProgram:
        program = self._programs.get(selector.expression)
        if program is None:
            try:
                program = compile_expression(selector.expression, DEVICE_VARIABLES)
            except CelCompileError as exc:
                raise InputError(
                    f"CEL line {exc.line}, column {exc.column}: {exc}",
                    where=f"{selector.source}: {selector.field}",
                ) from None
            self._programs[selector.expression] = program
        return program

    def selectors_of(self, request: Request) -> list[tuple[str, Selector]]:
        """The class's then the request's selectors, each with a label for explanations."""
        cls = self.classes.get(request.class_name)
        if cls is None:
            raise InputError(
                f"request {request.name!r} names DeviceClass {request.class_name!r}, which was "
                "not given",
                where="--class",
                hint="pass the DeviceClass manifest with --class",
            )
        out = [(f"class {cls.name} selector {n}", s) for n, s in enumerate(cls.selectors)]
        out += [(f"selector {n}", s) for n, s in enumerate(request.selectors)]
        return out

    def mismatch(self, request: Request, device: SliceDevice) -> str:
        """Why ``device`` does not match ``request`` on its own ("" when it does)."""
        key = (
            request.class_name,
            tuple(s.expression for s in request.selectors),
            request.tolerations,
            device.name,
        )
        cached = self._matches.get(key)
        if cached is not None:
            return cached
        reason = ""
        for label, selector in self.selectors_of(request):
            try:
                ok = self._program(selector).evaluate({"device": self._values[device.name]})
            except CelEvaluationError as exc:
                reason = f"{label}: CEL error: {exc}"
                break
            if not ok:
                reason = f"{label} is false"
                break
        if not reason:
            for taint in device.taints:
                if taint.effect in ("NoSchedule", "NoExecute") and not any(
                    t.tolerates(taint) for t in request.tolerations
                ):
                    reason = f"tainted {taint}"
                    break
        self._matches[key] = reason
        return reason

    def consumption(
        self, request: Request, device: SliceDevice, state: NodeState, taken: Sequence[Pick]
    ) -> tuple[dict[str, int], str]:
        """What ``request`` consumes on ``device``, or why it does not fit."""
        held_here = [p for p in taken if p.device == device.name]
        if not device.allow_multiple:
            if device.name in state.exclusive or held_here:
                return {}, "held by another claim" if not held_here else "already picked"
            if request.capacity:
                for name, amount in request.capacity.items():
                    total = device.capacity.get(qualify(name, device.driver))
                    if total is None or amount > total:
                        return {}, f"needs {name} {amount}, has {total or 0}"
            return {}, ""
        if held_here:
            return {}, "already picked"
        consumed: dict[str, int] = {}
        requested = {qualify(k, device.driver): v for k, v in request.capacity.items()}
        for name, total in device.capacity.items():
            policy = device.policies.get(name, CapacityPolicy())
            wanted = policy.consumed(requested.get(name), total)
            short = name.rpartition("/")[2]
            if wanted is None:
                return {}, f"{short} request {requested.get(name)} is outside its request policy"
            amount = wanted
            left = total - state.consumed.get(device.name, {}).get(name, 0)
            if amount > left:
                return {}, f"needs {short} {_bytes(amount)}, {_bytes(left)} left"
            consumed[name] = amount
        for name in requested:
            if name not in device.capacity:
                return {}, f"has no capacity {name}"
        return consumed, ""

    def constraint_violation(
        self, claim: Claim, request: Request, device: SliceDevice, taken: Sequence[Pick]
    ) -> str:
        """Why ``device`` breaks a constraint given the devices ``taken`` so far ("" if none)."""
        for c in claim.constraints:
            if not c.covers(request.name):
                continue
            attribute = qualify(c.attribute, device.driver)
            value = device.attributes.get(attribute)
            if value is None:
                return f"has no attribute {c.attribute}"
            for pick in taken:
                if not c.covers(pick.request):
                    continue
                other = self.by_name[pick.device].attributes.get(attribute)
                if c.distinct and other == value:
                    return f"distinctAttribute {c.attribute}: {value!r} already used"
                if not c.distinct and other != value:
                    return f"matchAttribute {c.attribute}: {value!r} != {other!r}"
        return ""

    # -- the search

    def allocate(self, claim: Claim, state: NodeState | None = None) -> Allocation:
        """First fit with backtracking; an Allocation with ``error`` when nothing fits."""
        state = state or NodeState()
        slots: list[Request] = []
        for request in claim.requests:
            if request.mode == "All":
                matching = [d for d in self.devices if not self.mismatch(request, d)]
                if not matching:
                    return Allocation(error=f"request {request.name!r}: no device matches")
                slots += [request] * len(matching)
            else:
                slots += [request] * request.count
        picks: list[Pick] = []
        if self._search(claim, slots, 0, state, picks):
            return Allocation(tuple(picks))
        return Allocation(error=self._failure(claim, state))

    def _search(
        self,
        claim: Claim,
        slots: Sequence[Request],
        n: int,
        state: NodeState,
        picks: list[Pick],
    ) -> bool:
        if n == len(slots):
            return True
        request = slots[n]
        # devices of one request are picked in slice order (no permutations of one set)
        start = 0
        if n > 0 and slots[n - 1] is request:
            last = picks[-1].device
            start = next(i for i, d in enumerate(self.devices) if d.name == last) + 1
        for device in self.devices[start:]:
            if self.mismatch(request, device):
                continue
            consumed, why = self.consumption(request, device, state, picks)
            if why or self.constraint_violation(claim, request, device, picks):
                continue
            picks.append(Pick(request.name, device.name, consumed))
            if self._search(claim, slots, n + 1, state, picks):
                return True
            picks.pop()
        return False

    def _failure(self, claim: Claim, state: NodeState) -> str:
        for request in claim.requests:
            fits = [
                d
                for d in self.devices
                if not self.mismatch(request, d) and not self.consumption(request, d, state, [])[1]
            ]
            need = len(fits) if request.mode == "All" else request.count
            if len(fits) < need or not fits:
                return (
                    f"request {request.name!r}: {len(fits)} device(s) match and fit, {need} needed"
                )
        return "no set of devices satisfies the claim's constraints"

    def explain(
        self, claim: Claim, state: NodeState | None = None
    ) -> tuple[Allocation, list[tuple[str, str]]]:
        """The allocation, and for every device not picked, why (per request)."""
        state = state or NodeState()
        allocation = self.allocate(claim, state)
        picked = set(allocation.devices)
        reasons: list[tuple[str, str]] = []
        for device in self.devices:
            if device.name in picked:
                continue
            whys = []
            for request in claim.requests:
                why = self.mismatch(request, device)
                if not why:
                    why = self.consumption(request, device, state, [])[1]
                if not why and allocation.picks:
                    why = self.constraint_violation(claim, request, device, allocation.picks)
                if not why:
                    why = (
                        "first fit had enough devices before it"
                        if allocation.picks
                        else "no complete set with it"
                    )
                whys.append(f"{request.name}: {why}" if len(claim.requests) > 1 else why)
            reasons.append((device.name, "; ".join(whys)))
        return allocation, reasons


def _bytes(amount: int) -> str:
    for suffix, shift in (("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if amount >= 1 << shift and amount % (1 << shift) == 0:
            return f"{amount >> shift}{suffix}"
    return str(amount)


def render_explanation(
    claim: Claim,
    allocation: Allocation,
    reasons: Sequence[tuple[str, str]],
    *,
    node: str,
    link_score: int | None = None,
) -> list[str]:
    """``cdigen dra explain`` output: the picks (or the failure), then every other device and
    why it lost."""
    lines = []
    if allocation.error:
        lines.append(f"claim {claim.name} ({claim.source}) on {node}: not allocatable")
        lines.append(f"  {allocation.error}")
    else:
        picked = ", ".join(allocation.devices)
        lines.append(f"claim {claim.name} ({claim.source}) on {node}: first fit picks {picked}")
        for pick in allocation.picks:
            consumed = ", ".join(
                f"{name.rpartition('/')[2]} {_bytes(amount)}"
                for name, amount in sorted(pick.consumed.items())
            )
            lines.append(
                f"  {pick.request}: {pick.device}" + (f" (consumes {consumed})" if consumed else "")
            )
        if link_score is not None:
            lines.append(f"  link score of the set: {link_score}")
    if reasons:
        lines.append("not picked:")
        width = max(len(name) for name, _ in reasons)
        lines += [f"  {name:<{width}}  {why}" for name, why in reasons]
    return lines
