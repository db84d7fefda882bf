"""Extended resources a Node still advertises that a DeviceClass serves through DRA.

A DeviceClass with ``extendedResourceName: nvidia.com/gpu`` (KEP-5004) lets an unchanged pod's
``nvidia.com/gpu: 1`` be met by this driver, but only on nodes whose status does not advertise
that resource itself: where it does, the scheduler counts the node's own number (a device
plugin's) instead. The kubelet keeps a removed device plugin's resource in the Node's status (at
0 while it remembers the plugin; at its old number after a restart without its device-plugin
checkpoint, when pods asking for it are admitted and run with no GPU), so moving a node from the
device plugin to DRA removes it by hand (docs/dra.md). ``dra serve`` (at start) and ``dra why``
(for a pod) say so in one line.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdigen.plugin.agent.holdings import printable_name

log = logging.getLogger(__name__)

DOCS = "docs/dra.md, 'Moving a node from the device plugin to DRA'"


@dataclass(frozen=True)
class StaleResource:
    """``resource`` in ``node``'s status (``amount``, its allocatable or else its capacity),
    which DeviceClass ``device_class`` serves through DRA."""

    node: str
    resource: str
    amount: str
    device_class: str


def served_resources(classes: Iterable[Mapping[str, Any]], driver: str) -> dict[str, str]:
    """``extendedResourceName`` -> DeviceClass name, for the classes that may pick ``driver``'s
    devices: those whose selectors name the driver (``"gpu.cdigen.dev"``), or that have none."""
    out: dict[str, str] = {}
    for doc in classes:
        spec = _mapping(_mapping(doc).get("spec"))
        name = spec.get("extendedResourceName")
        if not isinstance(name, str) or not name:
            continue
        selectors = spec.get("selectors") or []
        if not isinstance(selectors, list) or (
            selectors and not any(_names(s, driver) for s in selectors)
        ):
            continue
        out.setdefault(name, str(_mapping(doc.get("metadata")).get("name", "")))
    return out


def _names(selector: Any, driver: str) -> bool:
    """Whether a class selector's CEL names ``driver`` as a string literal."""
    cel = selector.get("cel") if isinstance(selector, Mapping) else None
    text = cel.get("expression") if isinstance(cel, Mapping) else None
    return isinstance(text, str) and (f'"{driver}"' in text or f"'{driver}'" in text)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _nonzero(amount: Any) -> bool:
    from cdigen.policies.cel import parse_quantity

    try:
        return parse_quantity(str(amount)) != 0
    except ValueError:
        return True  # not a quantity: it is there, and not zero


def stale_resources(node: Mapping[str, Any], served: Mapping[str, str]) -> list[StaleResource]:
    """The ``served`` resources ``node`` (a Node object) advertises in its status, each with
    its allocatable (else capacity) number; a resource at 0 everywhere is not advertised."""
    status = _mapping(node.get("status"))
    name = str(_mapping(node.get("metadata")).get("name", ""))
    lists = [_mapping(status.get(k)) for k in ("allocatable", "capacity")]
    found = []
    for resource, device_class in sorted(served.items()):
        amounts = [str(x[resource]) for x in lists if resource in x]
        advertised = [a for a in amounts if _nonzero(a)]
        if advertised:
            found.append(StaleResource(name, resource, advertised[0], device_class))
    return found


def removal_command(node: str, resources: Sequence[str]) -> str:
    """The kubectl command that removes ``resources`` from ``node``'s status (a JSON patch on
    the status subresource; ``/`` in a name is ``~1`` in a JSON pointer)."""
    ops = [
        {"op": "remove", "path": f"/status/{part}/{r.replace('~', '~0').replace('/', '~1')}"}
        for r in resources
        for part in ("capacity", "allocatable")
    ]
    patch = json.dumps(ops, separators=(",", ":"))
    return f"kubectl patch node {node} --subresource=status --type=json -p '{patch}'"


def stale_line(found: Sequence[StaleResource]) -> str:
    """One line for ``found`` (all of one node), or "" when there is nothing."""
    if not found:
        return ""
    node = printable_name(found[0].node)
    what = ", ".join(
        f"{printable_name(s.resource)}: {printable_name(s.amount)} "
        f"(DeviceClass {printable_name(s.device_class)} serves it)"
        for s in found
    )
    command = removal_command(node, [printable_name(s.resource) for s in found])
    return (
        f"node {node} still advertises {what} in its status, left by a device plugin: the "
        "scheduler counts that instead of this driver's devices, and pods asking for it get "
        f"no GPU from DRA; remove it with: {command} ({DOCS})"
    )


def warn_if_stale(read_node: Any, list_classes: Any, node_name: str, driver: str) -> str:
    """``dra serve`` at start: read the Node and the DeviceClasses and log one WARNING line when
    the node still advertises an extended resource one of the driver's classes serves; the
    line ("" when none). An API server that cannot answer (or RBAC) leaves one INFO line."""
    try:
        served = served_resources(list_classes(), driver)
        node = read_node(node_name) if served else {}
    except Exception as exc:  # the API may be away or refuse (RBAC): the check is advisory
        from cdigen.plugin.agent.kubeapi import api_error

        log.info("cannot check node %s for stale extended resources: %s", node_name, api_error(exc))
        return ""
    line = stale_line(stale_resources(node, served)) if served else ""
    if line:
        log.warning("%s", line)
    return line


def _asked(pod: Mapping[str, Any]) -> set[str]:
    """The resource names the pod's containers (init containers too) ask for."""
    names: set[str] = set()
    for key in ("initContainers", "containers"):
        containers = _mapping(pod.get("spec")).get(key)
        for container in containers if isinstance(containers, list) else ():
            resources = _mapping(_mapping(container).get("resources"))
            for part in ("limits", "requests"):
                names.update(str(k) for k in _mapping(resources.get(part)))
    return names


def pod_stale_lines(
    pod: Mapping[str, Any],
    classes: Iterable[Mapping[str, Any]],
    slices: Iterable[Mapping[str, Any]],
    read_node: Any,
    driver: str,
    most_nodes: int = 8,
) -> list[str]:
    """``dra why``: for a pod asking for an extended resource one of ``driver``'s DeviceClasses
    serves, one line per node that still advertises it: the pod's node once it is scheduled,
    else the first ``most_nodes`` nodes that publish ``driver``'s slices. A node that cannot be
    read is left out (the rest of ``dra why`` said what could not be read)."""
    served = {r: c for r, c in served_resources(classes, driver).items() if r in _asked(pod)}
    if not served:
        return []
    scheduled = _mapping(pod.get("spec")).get("nodeName")
    nodes: list[str] = [scheduled] if isinstance(scheduled, str) and scheduled else []
    if not nodes:
        for body in slices:
            slice_spec = _mapping(_mapping(body).get("spec"))
            name = slice_spec.get("nodeName")
            if slice_spec.get("driver") == driver and isinstance(name, str) and name:
                nodes += [] if name in nodes else [name]
    lines = []
    for name in nodes[:most_nodes]:
        try:
            node = read_node(name)
        except Exception:  # advisory: the pod's own story is told without it
            continue
        line = stale_line(stale_resources(node, served))
        if line:
            lines.append(line)
    return lines
