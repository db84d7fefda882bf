"""The first-fit simulator (cdigen.policies.dra.claims) for everything its docstring names, on
slices written by hand so that each rule decides alone: distinctAttribute and matchAttribute,
allocationMode All, taints and tolerations, capacity on exclusive devices, consumable capacity
and the ``consumed`` default of a capacity without a request policy."""

from __future__ import annotations

from typing import Any

from cdigen.policies.dra.claim_docs import DeviceClass, claim_from_doc
from cdigen.policies.dra.claims import FirstFit, NodeState
from cdigen.policies.dra.slice_devices import DeviceKey, slice_devices

DRIVER = "gpu.example.com"
GIB = 1 << 30


def _key(name: str) -> DeviceKey:
    """A device of :func:`_fit`'s slice (pool ``n``)."""
    return DeviceKey(DRIVER, "n", name)


def _device(name: str, numa: int, *, memory: str = "24Gi", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {"numa": {"int": numa}, "model": {"string": extra.pop("model", "L4")}},
        "capacity": {"memory": {"value": memory}},
        **extra,
    }


def _fit(*devices: dict[str, Any]) -> FirstFit:
    body = {"spec": {"driver": DRIVER, "pool": {"name": "n"}, "devices": list(devices)}}
    return FirstFit(slice_devices([body]), {"gpu": DeviceClass("gpu", "classes.yaml", ())})


def _claim(*requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None) -> Any:
    doc = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": r.pop("name", f"r{n}"), "exactly": {"deviceClassName": "gpu", **r}}
                    for n, r in enumerate(requests)
                ],
                "constraints": constraints or [],
            }
        },
    }
    return claim_from_doc(doc, "claim.yaml")


FOUR = (_device("g0", 0), _device("g1", 0), _device("g2", 1), _device("g3", 1))


# -- distinctAttribute / matchAttribute


def test_distinct_attribute_picks_devices_whose_values_differ() -> None:
    fit = _fit(*FOUR)
    claim = _claim({"count": 2}, constraints=[{"distinctAttribute": "numa"}])
    assert fit.allocate(claim).devices == ("g0", "g2")  # g1 shares g0's numa: skipped


def test_distinct_attribute_backtracks_and_fails_when_values_run_out() -> None:
    fit = _fit(*FOUR)
    three = _claim({"count": 3}, constraints=[{"distinctAttribute": "numa"}])
    assert fit.allocate(three).error == "no set of devices satisfies the claim's constraints"
    state = NodeState(exclusive={_key("g2"), _key("g3")})
    two = _claim({"count": 2}, constraints=[{"distinctAttribute": "numa"}])
    assert fit.allocate(two, state).error  # numa 1 is all held


def test_distinct_attribute_over_named_requests_only() -> None:
    fit = _fit(*FOUR)
    claim = _claim(
        {"name": "a"},
        {"name": "b"},
        {"name": "c"},
        constraints=[{"distinctAttribute": "numa", "requests": ["a", "b"]}],
    )
    picks = {p.request: p.device for p in fit.allocate(claim).picks}
    assert picks == {"a": "g0", "b": "g2", "c": "g1"}  # c is free to share a's numa


def test_match_attribute_keeps_one_value_and_a_missing_attribute_never_matches() -> None:
    fit = _fit(_device("g0", 0), _device("g1", 1), _device("g2", 1), _device("g3", 1))
    claim = _claim({"count": 2}, constraints=[{"matchAttribute": "numa"}])
    assert fit.allocate(claim).devices == ("g1", "g2")
    bare = _fit({"name": "x", "attributes": {}}, {"name": "y", "attributes": {}})
    assert bare.allocate(claim).error
    reasons = dict(bare.explain(_claim({}, constraints=[{"matchAttribute": "numa"}]))[1])
    assert reasons == {"x": "no complete set with it", "y": "no complete set with it"}
    assert bare.constraint_violation(claim, claim.requests[0], bare.by_key[_key("x")], []) == (
        "has no attribute numa"
    )


# -- allocationMode All


def test_allocation_mode_all_takes_every_matching_device() -> None:
    fit = _fit(*FOUR, _device("t4", 0, model="T4"))
    claim = _claim({"allocationMode": "All", "selectors": [_cel('.model == "L4"')]})
    assert fit.allocate(claim).devices == ("g0", "g1", "g2", "g3")


def test_allocation_mode_all_fails_when_one_matching_device_is_held() -> None:
    fit = _fit(*FOUR)
    claim = _claim({"allocationMode": "All"})
    allocation = fit.allocate(claim, NodeState(exclusive={_key("g1")}))
    assert allocation.error == "request 'r0': 3 device(s) match and fit, 4 needed"


def test_allocation_mode_all_with_nothing_matching_says_so() -> None:
    fit = _fit(*FOUR)
    claim = _claim({"allocationMode": "All", "selectors": [_cel('.model == "H100"')]})
    assert fit.allocate(claim).error == "request 'r0': no device matches"


def _cel(test: str) -> dict[str, Any]:
    return {"cel": {"expression": f'device.attributes["{DRIVER}"]{test}'}}


# -- taints and tolerations


TAINTED = (
    _device("g0", 0, taints=[{"key": "maint", "value": "yes", "effect": "NoSchedule"}]),
    _device("g1", 0, taints=[{"key": "xid", "value": "79", "effect": "NoExecute"}]),
    _device("g2", 1, taints=[{"key": "info", "value": "x", "effect": "None"}]),
)


def test_no_schedule_and_no_execute_taints_keep_a_device_out_and_none_does_not() -> None:
    fit = _fit(*TAINTED)
    assert fit.allocate(_claim({})).devices == ("g2",)
    reasons = dict(fit.explain(_claim({}))[1])
    assert reasons == {"g0": "tainted maint=yes:NoSchedule", "g1": "tainted xid=79:NoExecute"}


def test_tolerations_equal_exists_and_effect() -> None:
    fit = _fit(*TAINTED)

    def picks(*tolerations: dict[str, Any]) -> tuple[str, ...]:
        claim = _claim({"allocationMode": "All", "tolerations": list(tolerations)})
        return fit.allocate(claim).devices

    assert picks({"key": "maint", "operator": "Equal", "value": "yes"}) == ("g0", "g2")
    assert picks({"key": "maint", "value": "no"}) == ("g2",)  # Equal is the default
    assert picks({"key": "xid", "operator": "Exists"}) == ("g1", "g2")
    assert picks({"key": "xid", "operator": "Exists", "effect": "NoSchedule"}) == ("g2",)
    assert picks({"operator": "Exists"}) == ("g0", "g1", "g2")  # no key: every taint
    assert picks({"operator": "Exists", "effect": "NoExecute"}) == ("g1", "g2")
    assert picks({"operator": "Equal", "value": "yes"}) == ("g2",)  # no key needs Exists


# -- capacity


def test_capacity_on_an_exclusive_device_is_a_filter_not_consumed() -> None:
    fit = _fit(_device("small", 0, memory="16Gi"), _device("big", 0, memory="24Gi"))
    claim = _claim({"capacity": {"requests": {"memory": "20Gi"}}})
    allocation = fit.allocate(claim)
    assert allocation.devices == ("big",) and allocation.picks[0].consumed == {}
    reasons = dict(fit.explain(claim)[1])
    assert reasons == {"small": "needs memory 20Gi, has 16Gi"}
    exact = _claim({"capacity": {"requests": {"memory": "24Gi"}}})
    assert fit.allocate(exact).devices == ("big",)  # equal fits
    assert fit.allocate(exact, NodeState(exclusive={_key("big")})).error
    other = _claim({"capacity": {"requests": {"cores": "2"}}})
    assert fit.allocate(other).error  # a capacity the device does not have


def test_a_shared_capacity_without_a_request_policy_is_consumed_whole_by_default() -> None:
    shared = _device("s", 0, memory="24Gi", allowMultipleAllocations=True)
    fit = _fit(shared)
    state = NodeState()
    first = fit.allocate(_claim({}), state)
    assert first.picks[0].consumed == {f"{DRIVER}/memory": 24 * GIB}
    state.add(first.picks, fit.by_key)
    assert fit.allocate(_claim({}), state).error  # nothing left
    asked = _claim({"capacity": {"requests": {"memory": "4Gi"}}})
    state = NodeState()
    for _ in range(6):
        picks = fit.allocate(asked, state).picks
        assert picks[0].consumed == {f"{DRIVER}/memory": 4 * GIB}
        state.add(picks, fit.by_key)
    assert state.consumed == {_key("s"): {f"{DRIVER}/memory": 24 * GIB}}
    assert fit.allocate(asked, state).error == "request 'r0': 0 device(s) match and fit, 1 needed"


def test_a_shared_device_is_picked_once_per_claim_and_its_policy_bounds_requests() -> None:
    shared = _device(
        "s",
        0,
        memory="24Gi",
        allowMultipleAllocations=True,
    )
    shared["capacity"]["memory"]["requestPolicy"] = {
        "default": "1Gi",
        "validRange": {"min": "1Gi", "max": "8Gi", "step": "1Gi"},
    }
    fit = _fit(shared)
    assert fit.allocate(_claim({"count": 2})).error  # one device, never twice in a claim
    too_big = _claim({"capacity": {"requests": {"memory": "9Gi"}}})
    reasons = dict(fit.explain(too_big)[1])
    assert reasons == {
        "s": "memory request 9Gi is more than its request policy allows: at most 8Gi "
        "(1Gi to 8Gi in steps of 1Gi)"
    }
    assert fit.allocate(_claim({})).picks[0].consumed == {f"{DRIVER}/memory": GIB}
    state = NodeState(consumed={_key("s"): {f"{DRIVER}/memory": 20 * GIB}})
    five = _claim({"capacity": {"requests": {"memory": "5Gi"}}})
    assert dict(fit.explain(five, state)[1]) == {"s": "needs memory 5Gi, 4Gi left"}


def test_explain_tells_a_device_held_by_another_claim_from_one_already_picked() -> None:
    fit = _fit(*FOUR)
    state = NodeState(exclusive={_key("g0")})
    assert fit.consumption(_claim({}).requests[0], fit.by_key[_key("g0")], state, []) == (
        {},
        "held by another claim",
    )
    allocation = fit.allocate(_claim({}), state)
    assert allocation.devices == ("g1",)
    request = _claim({}).requests[0]
    assert fit.consumption(request, fit.by_key[_key("g1")], NodeState(), allocation.picks) == (
        {},
        "already picked",
    )
    assert dict(fit.explain(_claim({}), state)[1])["g0"] == "held by another claim"


def test_enough_devices_that_break_a_constraint_is_said_as_such() -> None:
    fit = _fit(_device("g0", 0), _device("g1", 0))
    claim = _claim({"count": 2}, constraints=[{"distinctAttribute": "numa"}])
    assert fit.allocate(claim).error == "no set of devices satisfies the claim's constraints"
