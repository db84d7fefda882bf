"""`dra why` remembers verdicts across nodes (cdigen.plugin.dra.why_memo): on a mixed cluster every
node's story is the one it gets when it is explained alone, and a selector's memoized verdict
is the one evaluated afresh, for devices that differ in one attribute's value or only its type
(the bool ``true`` and the int ``1`` are equal in Python, not in CEL)."""

from __future__ import annotations

import json
from typing import Any

from cdigen.plugin.dra.why import Cluster, explain_pod
from cdigen.plugin.dra.why_memo import MemoPrograms, loads
from cdigen.policies.cel import CelEvaluationError, compile_expression
from cdigen.policies.dra.claim_docs import claim_from_doc, device_class
from cdigen.policies.dra.claims import DEVICE_VARIABLES, FirstFit
from cdigen.policies.dra.slice_devices import slice_devices

DRIVER = "gpu.cdigen.dev"
SELECTOR = (
    f'device.attributes["{DRIVER}"].model == "H100" && '
    f'device.attributes["{DRIVER}"].flag == 1 && '
    f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0'
)
CLASS = {
    "metadata": {"name": DRIVER},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
}
# Each node: (its name, the devices' model, flag attribute, memory); the first and last agree.
NODES = [
    ("node-a", "H100", {"int": 1}, "80Gi"),
    ("node-b", "H100", {"bool": True}, "80Gi"),  # true == 1 in Python, not in CEL
    ("node-c", "A100", {"int": 1}, "80Gi"),
    ("node-d", "H100", {"int": 2}, "80Gi"),
    ("node-e", "H100", {"int": 1}, "20Gi"),
    ("node-f", "H100", {"string": "1"}, "80Gi"),
    ("node-g", "H100", {"int": 1}, "80Gi"),
]


def _slice(node: str, model: str, flag: dict[str, Any], memory: str) -> dict[str, Any]:
    devices = [
        {
            "name": f"gpu-{k}",
            "attributes": {"model": {"string": model}, "flag": flag, "index": {"int": k}},
            "capacity": {"memory": {"value": memory}},
        }
        for k in range(2)
    ]
    return {
        "metadata": {"name": f"{node}-slice"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _claim(selector: str = SELECTOR) -> dict[str, Any]:
    request = {
        "name": "gpu",
        "exactly": {
            "deviceClassName": DRIVER,
            "allocationMode": "ExactCount",
            "count": 1,
            "selectors": [{"cel": {"expression": selector}}],
        },
    }
    return {
        "kind": "ResourceClaim",
        "metadata": {"name": "wanted", "namespace": "default", "uid": "u-1"},
        "spec": {"devices": {"requests": [request]}},
    }


def _holding(node: str, devices: list[str]) -> dict[str, Any]:
    """An allocated claim holding ``devices`` of ``node``, as the scheduler writes it."""
    doc = _claim('device.driver == "gpu.cdigen.dev"')
    doc["metadata"] = {"name": f"held-{node}", "namespace": "default", "uid": f"u-{node}"}
    results = [{"request": "gpu", "driver": DRIVER, "pool": node, "device": d} for d in devices]
    doc["status"] = {"allocation": {"devices": {"results": results}}}
    return doc


def _why(slices: list[dict[str, Any]], *held: dict[str, Any]) -> list[str]:
    pod = {
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "wanted"}]},
        "status": {"phase": "Pending"},
    }
    claims = {("default", "wanted"): _claim()}
    claims.update({("default", h["metadata"]["name"]): h for h in held})
    return explain_pod(Cluster(pod, claims, slices, [CLASS]), driver=DRIVER)


def _stories(lines: list[str]) -> dict[str, list[str]]:
    """Each node's story: its group's header (without the node names) and lines."""
    out: dict[str, list[str]] = {}
    current: list[str] = []
    for line in lines:
        if line.startswith("on "):
            names, _, rest = line[3:].partition(" (")
            current = ["(" + rest.replace(" each)", ")")]
            for name in names.split(", "):
                out[name] = current
        elif current:
            current.append(line)
    return out


def test_every_node_of_a_mixed_cluster_gets_the_story_it_gets_alone() -> None:
    slices = [_slice(*node) for node in NODES]
    alone = {name: _stories(_why([s]))[name] for (name, *_), s in zip(NODES, slices, strict=True)}
    fits = [name for name, story in alone.items() if "would get" in " ".join(story)]
    assert fits == ["node-a", "node-g"]
    for other in slices[1:]:  # node-a's verdicts remembered first, then one that differs
        together = _stories(_why([slices[0], other]))
        assert together == {name: alone[name] for name in together}
        assert len(together) == 2
    whole = _stories(_why(slices))
    assert whole["node-a"] is whole["node-g"] and "would get" in " ".join(whole["node-a"])


def test_nodes_of_equal_devices_in_other_states_get_their_own_story() -> None:
    first, second, third = (_slice(name, "H100", {"int": 1}, "80Gi") for name in "xyz")
    held = [_holding("y", ["gpu-0", "gpu-1"]), _holding("z", ["gpu-0"])]
    together = _stories(_why([first, second, third], *held))
    alone = {
        "x": _stories(_why([first]))["x"],
        "y": _stories(_why([second], held[0]))["y"],
        "z": _stories(_why([third], held[1]))["z"],
    }
    assert together == alone
    assert "would get gpu-0" in " ".join(together["x"])
    assert "not allocatable" in " ".join(together["y"])
    assert "would get gpu-1" in " ".join(together["z"])


def test_a_memoized_verdict_is_the_one_evaluated_afresh() -> None:
    devices = slice_devices([_slice(*node) for node in NODES])
    program = compile_expression(SELECTOR, DEVICE_VARIABLES)
    memo = MemoPrograms()
    memo[SELECTOR] = program

    def verdict(evaluate: Any, device: Any) -> bool | str:
        try:
            return bool(evaluate({"device": device.cel_value()}))
        except CelEvaluationError as exc:
            return f"error: {exc}"

    for _ in range(2):  # the second pass reads what the first remembered
        for device in devices:
            assert verdict(memo[SELECTOR].evaluate, device) == verdict(program.evaluate, device), (
                device
            )
    assert [verdict(memo[SELECTOR].evaluate, d) for d in devices[::2]] == [
        True, False, False, False, False, False, True,
    ]  # fmt: skip


def test_a_shared_fit_and_a_fresh_fit_agree_on_every_node() -> None:
    classes = {DRIVER: device_class(CLASS, "class")}
    claim = claim_from_doc(_claim(), "claim")
    memo = MemoPrograms()
    for node in NODES:
        devices = slice_devices([_slice(*node)])
        shared = FirstFit(devices, classes, programs=memo).explain(claim)
        fresh = FirstFit(devices, classes).explain(claim)
        assert shared == fresh, node[0]


def test_the_api_answer_is_read_as_json_reads_it_with_equal_objects_shared() -> None:
    text = (
        '{"items": [{"a": {"int": 1}, "b": [1, {"x": "y"}]}, {"a": {"int": 1}, "b": [1]},'
        ' {"a": {"int": true}}, {"a": {"int": 1.0}}, {"a": {"int": "1"}}, {"a": {"int": 1}}]}'
    )
    doc = loads(text.encode())
    assert doc == json.loads(text)
    items = doc["items"]
    assert items[0]["a"] is items[1]["a"] is items[5]["a"]  # equal objects: one dict
    # true, 1.0 and "1" equal 1 in Python (or not) but are other JSON values: not shared
    assert [type(i["a"]["int"]) for i in items[2:5]] == [bool, float, str]
    assert len({id(i["a"]) for i in items}) == 4
