"""The CEL ``device`` map of a device-plugin policy is the DRA view of the GPU (one place)."""

from __future__ import annotations

from celpy import celtypes

from cdigen.constants import DRA_DRIVER
from cdigen.discover import load_node
from cdigen.policies.cel import compile_expression, device_value
from cdigen.policies.device_view import device_views


def _names(value: celtypes.MapType, domain: str) -> set[str]:
    return {str(k) for k in value[celtypes.StringType("attributes")][domain]}


def test_the_device_map_carries_the_dra_view_under_both_driver_domains() -> None:
    node = load_node("builtin:dgx-a100")
    views = {v.gpu.index: v for v in device_views(node, mig_strategy="none")}
    for gpu in node.gpus:
        value = device_value(gpu, node)
        # the DRA view's plain names, minus what needs the whole node (NVLink groups)
        plain = {n for n in views[gpu.index].attributes if "/" not in n} - {
            "nvlinkDomain",
            "nvlinkClique",
        }
        assert _names(value, "gpu.nvidia.com") == plain
        assert _names(value, DRA_DRIVER) == plain
        assert _names(value, "resource.kubernetes.io") == {"pciBusID", "numaNode"}
        assert _names(value, "cdigen.dev") == {
            "index",
            "minor",
            "numaNode",
            "pciBusId",
            "migEnabled",
        }


def test_a_policy_reads_the_same_facts_in_either_driver_domain() -> None:
    node = load_node("builtin:dgx-a100")
    gpu = node.gpus[3]
    for domain in ("gpu.nvidia.com", DRA_DRIVER):
        program = compile_expression(
            f'device.attributes["{domain}"].index == 3 && '
            f'device.attributes["{domain}"].uuid == "{gpu.uuid}" && '
            f'device.attributes["{domain}"].driverVersion.isGreaterThan(semver("1.0.0")) && '
            f'device.capacity["{domain}"].memory.compareTo(quantity("{gpu.memory_bytes}")) == 0 '
            '&& device.attributes["resource.kubernetes.io"].numaNode == '
            'device.attributes["cdigen.dev"].numaNode',
            frozenset({"device"}),
        )
        assert program.evaluate({"device": device_value(gpu, node)}) is True
