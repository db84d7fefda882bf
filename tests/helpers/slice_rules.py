"""Strict checks of one node's ResourceSlices as a given Kubernetes version takes them: the
OpenAPI schema (kubernetes_validate, strict) and the API server's own rules on counters
(pkg/apis/resource/validation of that version), which no schema states, plus what the scheduler
needs of a pool (one generation, every slice there, every counter reference resolvable).

Facts (validation of resource.k8s.io/v1):
* 1.34: a device consumes only from a counter set of its own slice, naming counters of that
  set; at most 32 counters in all sets of a slice, 32 counters consumed per device, 1024 in the
  devices of a slice; 128 devices per slice.
* every version: a capacity's ``requestPolicy`` needs ``allowMultipleAllocations: true``; with
  ``validRange`` it needs ``default`` and ``min``; min, max and min + step at most the capacity,
  min <= max, min <= default <= max, default and max whole steps above min; ``validValues``
  sorted, at most the capacity, holding ``default`` (validateRequestPolicy).
* 1.35 and later: ``sharedCounters`` and ``devices`` never in one slice; at most 8 counter
  sets per slice, 32 counters per set, 2 consumptions per device, 32 counters per consumption;
  64 devices in a slice where a device consumes counters or has taints; counter set names
  unique in the pool.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cdigen.policies.cel import parse_quantity

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def validate_pool(slices: Sequence[Mapping[str, Any]], version: str) -> None:
    """AssertionError (listing every problem) unless ``slices`` pass as Kubernetes ``version``
    ("1.34") takes them; kubernetes_validate's ValidationError for a schema failure."""
    import kubernetes_validate

    for body in slices:
        clean = json.loads(json.dumps(body))
        for key in ("resourceVersion", "uid"):
            clean["metadata"].pop(key, None)
        kubernetes_validate.validate(clean, version, strict=True)
    problems = pool_problems(slices, int(version.split(".")[1]))
    assert not problems, "\n".join(problems)


def pool_problems(slices: Sequence[Mapping[str, Any]], minor: int) -> list[str]:
    """What Kubernetes 1.``minor`` would refuse in ``slices`` (one node's pool), or []."""
    problems = _pool_shape(slices)
    sets: dict[str, dict[str, int]] = {}
    for n, body in enumerate(slices):
        spec = body["spec"]
        own = _counter_sets(spec.get("sharedCounters") or [], f"slice {n}", problems)
        check = _slice_rules_1_34 if minor < 35 else _slice_rules_1_35
        problems += [f"slice {n}: {p}" for p in check(spec, own)]
        for name in own:
            if name in sets:
                problems.append(f"slice {n}: counter set {name} is already in the pool")
        sets.update(own)
    for n, body in enumerate(slices):
        for device in body["spec"].get("devices") or []:
            problems += [
                f"slice {n} device {device['name']}: {p}"
                for p in [*_references(device, sets), *capacity_problems(device)]
            ]
    return problems


def capacity_problems(device: Mapping[str, Any]) -> list[str]:
    """What the API server refuses in one device's capacities (validateRequestPolicy of
    pkg/apis/resource/validation), or []."""
    problems = []
    for name, capacity in (device.get("capacity") or {}).items():
        policy = capacity.get("requestPolicy")
        if policy is None:
            continue
        where = f"capacity {name} requestPolicy"
        if not device.get("allowMultipleAllocations"):
            problems.append(f"{where}: allowMultipleAllocations must be true")
        total = _amount(capacity["value"])
        default = _amount(policy["default"]) if "default" in policy else None
        values = [_amount(v) for v in policy.get("validValues") or []]
        rng = policy.get("validRange")
        if values and rng is not None:
            problems.append(f"{where}: validValues and validRange together")
        elif values:
            if default is None or default not in values:
                problems.append(f"{where}: default is not one of validValues")
            if values != sorted(values) or max(values) > total:
                problems.append(f"{where}: validValues unsorted or above the capacity")
        elif rng is not None:
            problems += [f"{where}: {p}" for p in _range_problems(rng, default, total)]
    return problems


def _range_problems(rng: Mapping[str, Any], default: int | None, total: int) -> list[str]:
    if default is None:
        return ["default is required with validRange"]
    if "min" not in rng:
        return ["validRange.min is required"]
    low = _amount(rng["min"])
    high = _amount(rng["max"]) if "max" in rng else None
    step = _amount(rng["step"]) if "step" in rng else None
    problems = []
    if low > total:
        problems.append("min is larger than the capacity")
    if default < low:
        problems.append("default is less than min")
    if high is not None and (low > high or high > total or default > high):
        problems.append("max below min, above the capacity, or below default")
    if step is not None:
        if low + step > total:
            problems.append("one step above min is larger than the capacity")
        for what, value in (("default", default), ("max", high)):
            if value is not None and (value - low) % step:
                problems.append(f"{what} is not a whole number of steps above min")
    return problems


def _amount(text: Any) -> int:
    return int(parse_quantity(str(text)))


def _pool_shape(slices: Sequence[Mapping[str, Any]]) -> list[str]:
    problems = []
    pools = {(s["spec"]["pool"]["name"], s["spec"]["pool"]["generation"]) for s in slices}
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
    if len(pools) != 1 or counts != {len(slices)}:
        problems.append(f"not one complete pool: {sorted(pools)}, counts {sorted(counts)}")
    names = [d["name"] for s in slices for d in s["spec"].get("devices") or []]
    if len(names) != len(set(names)):
        problems.append("device names repeat in the pool")
    return problems


def _counter_sets(
    docs: Iterable[Mapping[str, Any]], where: str, problems: list[str]
) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for doc in docs:
        name = doc["name"]
        if not DNS_LABEL.fullmatch(name) or name in out:
            problems.append(f"{where}: counter set name {name!r} is not a new DNS label")
        for counter in doc["counters"]:
            if not DNS_LABEL.fullmatch(counter):
                problems.append(f"{where}: counter {counter!r} is not a DNS label")
        out[name] = {k: _amount(v["value"]) for k, v in doc["counters"].items()}
    return out


def _devices_consuming(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [d for d in spec.get("devices") or [] if d.get("consumesCounters")]


def _slice_rules_1_34(spec: Mapping[str, Any], own: Mapping[str, Mapping[str, int]]) -> list[str]:
    problems = []
    if sum(len(c) for c in own.values()) > 32:
        problems.append("more than 32 counters in all its counter sets")
    if len(spec.get("devices") or []) > 128:
        problems.append("more than 128 devices")
    total = 0
    for device in _devices_consuming(spec):
        consumed = sum(len(c["counters"]) for c in device["consumesCounters"])
        total += consumed
        if consumed > 32:
            problems.append(f"device {device['name']} consumes more than 32 counters")
        problems += [f"device {device['name']}: {p}" for p in _references(device, own)]
    if total > 1024:
        problems.append("its devices consume more than 1024 counters")
    return problems


def _slice_rules_1_35(spec: Mapping[str, Any], own: Mapping[str, Mapping[str, int]]) -> list[str]:
    problems = []
    devices = spec.get("devices") or []
    if spec.get("sharedCounters") is not None and spec.get("devices") is not None:
        problems.append("only one of `sharedCounters` or `devices` is allowed")
    if len(own) > 8:
        problems.append("more than 8 counter sets")
    if any(len(c) > 32 for c in own.values()):
        problems.append("a counter set of more than 32 counters")
    tainted = any(d.get("taints") for d in devices)
    if len(devices) > (64 if tainted or _devices_consuming(spec) else 128):
        problems.append(f"{len(devices)} devices, over the limit")
    for device in _devices_consuming(spec):
        entries = device["consumesCounters"]
        if len(entries) > 2 or len({e["counterSet"] for e in entries}) != len(entries):
            problems.append(f"device {device['name']}: more than 2 or repeated consumptions")
        if any(len(e["counters"]) > 32 for e in entries):
            problems.append(f"device {device['name']}: a consumption of more than 32 counters")
    return problems


def _references(device: Mapping[str, Any], sets: Mapping[str, Mapping[str, int]]) -> list[str]:
    """A consumption must name a known set, counters of that set, and no more than it has."""
    problems = []
    for entry in device.get("consumesCounters") or []:
        have = sets.get(entry["counterSet"])
        if have is None:
            problems.append(f"counter set {entry['counterSet']} is not defined")
            continue
        for counter, amount in entry["counters"].items():
            if counter not in have:
                problems.append(f"counter {counter} is not in set {entry['counterSet']}")
            elif _amount(amount["value"]) > have[counter]:
                problems.append(f"consumes more {counter} than set {entry['counterSet']} has")
    return problems
