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

The manifests are read by :mod:`cdigen.policies.dra.claim_docs`, the slices' devices by
:mod:`cdigen.policies.dra.slice_devices`: import their names from there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import product
from typing import Any

from cdigen.errors import InputError
from cdigen.policies.cel import CelCompileError, CelEvaluationError, CelProgram, compile_expression
from cdigen.policies.dra.claim_docs import Claim, DeviceClass, Request, Selector
from cdigen.policies.dra.slice_devices import CapacityPolicy, DeviceKey, SliceDevice, qualify
from cdigen.sizes import quantity_text

STANDARD_DOMAIN = "resource.kubernetes.io"
DEVICE_VARIABLES = frozenset({"device"})
CEL_ERROR = ": CEL runtime error: "


class _CelFailure(Exception):
    """A selector erred on a device the search evaluated: the whole claim fails."""


def _cel_failure_message(request: Request, device: str, reason: str) -> str:
    return (
        f"request {request.name!r}: {reason} (on device {device}; a CEL error on a device "
        "the scheduler evaluates fails the whole claim, as in Kubernetes)"
    )


@dataclass(frozen=True)
class Pick:
    """One allocated device: the request, the device (driver, pool and name, as an
    allocation result names it) and the capacity it consumes."""

    request: str
    key: DeviceKey
    consumed: Mapping[str, int] = field(default_factory=dict)

    @property
    def device(self) -> str:
        """The device's name (unique only with its driver and pool: :attr:`key`)."""
        return self.key.name


@dataclass
class NodeState:
    """What earlier claims hold: exclusive devices, and consumed capacity of shared ones."""

    exclusive: set[DeviceKey] = field(default_factory=set)
    consumed: dict[DeviceKey, dict[str, int]] = field(default_factory=dict)

    def add(self, picks: Iterable[Pick], devices: Mapping[DeviceKey, SliceDevice]) -> None:
        """Record an allocation."""
        for pick in picks:
            if devices[pick.key].allow_multiple:
                held = self.consumed.setdefault(pick.key, {})
                for name, amount in pick.consumed.items():
                    held[name] = held.get(name, 0) + amount
            else:
                self.exclusive.add(pick.key)


@dataclass(frozen=True)
class Allocation:
    """The picks of one claim, or why it cannot be allocated."""

    picks: tuple[Pick, ...] = ()
    error: str = ""

    @property
    def devices(self) -> tuple[str, ...]:
        """The picked device names, in order (:attr:`keys` tells them apart)."""
        return tuple(p.device for p in self.picks)

    @property
    def keys(self) -> tuple[DeviceKey, ...]:
        """The picked devices, in order."""
        return tuple(p.key for p in self.picks)


def shared_names(devices: Iterable[SliceDevice]) -> set[str]:
    """The names that more than one of ``devices`` has (in different drivers or pools)."""
    seen: set[str] = set()
    shared: set[str] = set()
    for device in devices:
        (shared if device.name in seen else seen).add(device.name)
    return shared


class FirstFit:
    """The scheduler's first fit over one node's devices."""

    def __init__(
        self,
        devices: Sequence[SliceDevice],
        classes: Mapping[str, DeviceClass] | None = None,
        *,
        programs: dict[str, CelProgram] | None = None,
    ) -> None:
        """``programs``: compiled selectors by expression, shared by the fits of many nodes
        (``dra why`` over a cluster compiles each expression once, not once per node)."""
        self.devices = list(devices)
        # by driver, pool and name: two drivers (or pools) of one node may each have a gpu-0
        self.by_key = {d.key: d for d in self.devices}
        self._position = {d.key: n for n, d in enumerate(self.devices)}
        self._shared_names = shared_names(self.devices)
        self.classes = dict(classes or {})
        self._programs: dict[str, CelProgram] = {} if programs is None else programs
        self._values = {d.key: d.cel_value() for d in self.devices}
        self._matches: dict[tuple[Any, ...], str] = {}

    def label(self, key: DeviceKey) -> str:
        """How a device is named to the user: its name, or ``driver/pool/name`` when another
        device of the node has the same name."""
        return str(key) if key.name in self._shared_names else key.name

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
            device.key,
        )
        cached = self._matches.get(key)
        if cached is not None:
            return cached
        reason = ""
        for label, selector in self.selectors_of(request):
            try:
                ok = self._program(selector).evaluate({"device": self._values[device.key]})
            except CelEvaluationError as exc:
                reason = f"{label}{CEL_ERROR}{exc}"
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

    def cel_failure(self, request: Request) -> str:
        """The error that fails the whole claim when a selector of ``request`` errs on any device
        (as the scheduler does for an ``All`` request, which it evaluates on every device:
        ``selector #0: CEL runtime error: ...``, the pod stays Pending), or ""."""
        for device in self.devices:
            reason = self.mismatch(request, device)
            if CEL_ERROR in reason:
                return _cel_failure_message(request, self.label(device.key), reason)
        return ""

    def consumption(
        self, request: Request, device: SliceDevice, state: NodeState, taken: Sequence[Pick]
    ) -> tuple[dict[str, int], str]:
        """What ``request`` consumes on ``device``, or why it does not fit."""
        held_here = [p for p in taken if p.key == device.key]
        if not device.allow_multiple:
            if device.key in state.exclusive or held_here:
                return {}, "held by another claim" if not held_here else "already picked"
            if request.capacity:
                for name, amount in request.capacity.items():
                    total = device.capacity.get(qualify(name, device.driver))
                    if total is None or amount > total:
                        return {}, (
                            f"needs {name} {quantity_text(amount)}, has {quantity_text(total or 0)}"
                        )
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
                return {}, policy.refusal(short, requested.get(name))
            amount = wanted
            left = total - state.consumed.get(device.key, {}).get(name, 0)
            if amount > left:
                return {}, f"needs {short} {quantity_text(amount)}, {quantity_text(left)} left"
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
                other = self.by_key[pick.key].attributes.get(attribute)
                if c.distinct and other == value:
                    return f"distinctAttribute {c.attribute}: {value!r} already used"
                if not c.distinct and other != value:
                    return f"matchAttribute {c.attribute}: {value!r} != {other!r}"
        return ""

    # -- the search

    def allocate(self, claim: Claim, state: NodeState | None = None) -> Allocation:
        """First fit with backtracking; an Allocation with ``error`` when nothing fits."""
        return self.resolve(claim, state)[1]

    def resolve(self, claim: Claim, state: NodeState | None = None) -> tuple[Claim, Allocation]:
        """:meth:`allocate`, trying the subrequests of ``firstAvailable`` requests in order (the
        first request's first, then its second, ...), as the scheduler does: the claim as it
        was resolved (each such request replaced by the subrequest used) and its allocation.
        When nothing fits, the first combination and why it failed."""
        state = state or NodeState()
        choices = [r.alternatives or (r,) for r in claim.requests]
        # The scheduler first counts the devices of every "All" request and subrequest, each
        # device evaluated: an error there fails the claim whichever choice would fit.
        for choice in (c for alternatives in choices for c in alternatives):
            failed = self.cel_failure(choice) if choice.mode == "All" else ""
            if failed:
                return replace(claim, requests=tuple(c[0] for c in choices)), Allocation(
                    error=failed
                )
        first: tuple[Claim, Allocation] | None = None
        for combination in product(*choices):
            variant = replace(claim, requests=tuple(combination))
            allocation = self._allocate_exact(variant, state)
            if not allocation.error or CEL_ERROR in allocation.error:
                return variant, allocation  # an error fails the claim: no other choice is tried
            first = first or (variant, allocation)
        assert first is not None  # a claim with no request has one (empty) combination
        variant, allocation = first
        if any(r.alternatives for r in claim.requests):
            error = f"{allocation.error} (the first firstAvailable choices; every choice failed)"
            allocation = replace(allocation, error=error)
        return variant, allocation

    def _allocate_exact(self, claim: Claim, state: NodeState) -> Allocation:
        """:meth:`allocate` for a claim whose requests are all ``exactly``."""
        slots: list[Request] = []
        for request in claim.requests:
            if request.mode == "All":  # its CEL errors were counted first, in allocate()
                matching = [d for d in self.devices if not self.mismatch(request, d)]
                if not matching:
                    return Allocation(error=f"request {request.name!r}: no device matches")
                slots += [request] * len(matching)
            else:
                slots += [request] * request.count
        picks: list[Pick] = []
        try:
            if self._search(claim, slots, 0, state, picks):
                return Allocation(tuple(picks))
        except _CelFailure as exc:
            return Allocation(error=str(exc))
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
            start = self._position[picks[-1].key] + 1
        for device in self.devices[start:]:
            mismatch = self.mismatch(request, device)
            if CEL_ERROR in mismatch:  # the scheduler stops at the first device that errs
                raise _CelFailure(_cel_failure_message(request, self.label(device.key), mismatch))
            if mismatch:
                continue
            consumed, why = self.consumption(request, device, state, picks)
            if why or self.constraint_violation(claim, request, device, picks):
                continue
            picks.append(Pick(request.name, device.key, consumed))
            if self._search(claim, slots, n + 1, state, picks):
                return True
            picks.pop()
        return False

    def _failure(self, claim: Claim, state: NodeState) -> str:
        for request in claim.requests:
            matching = [d for d in self.devices if not self.mismatch(request, d)]
            fits = [d for d in matching if not self.consumption(request, d, state, [])[1]]
            # All needs every matching device, a held one included (as the scheduler: the
            # claim waits for it), so the count is of those matching, not of those free
            need = len(matching) if request.mode == "All" else request.count
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
        claim, allocation = self.resolve(claim, state)
        picked = set(allocation.keys)
        reasons: list[tuple[str, str]] = []
        for device in self.devices:
            if device.key in picked:
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
            reasons.append((self.label(device.key), "; ".join(whys)))
        return allocation, reasons
