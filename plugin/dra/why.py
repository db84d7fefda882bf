"""``cdigen dra why POD``: why a pod's ResourceClaims keep it Pending, or what they got.

Reads the pod, every ResourceClaim (those of other pods hold devices and capacity), the
ResourceSlices and the DeviceClasses from the API server, and runs the offline scheduler
simulator (:mod:`policies.dra.claims`, as ``dra explain`` does) for the pod's unallocated claims on
every node that publishes slices, after what the allocated claims there hold. One screen.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdigen.errors import EXIT_CHECK_FAILED, CdigenError, shortened
from plugin.agent.kubeapi import DEFAULT_API_TIMEOUT_S, api_error
from policies.cel.quantity import format_bytes
from policies.dra.claim_docs import (
    Claim,
    DeviceClass,
    claim_from_doc,
    device_class,
    refuse_unchecked,
)
from policies.dra.claims import FirstFit, NodeState, Pick
from policies.dra.slice_devices import SliceDevice, qualify, slice_devices

SCREEN_LINES = 25
_GROUPS_PER_NODE = 3  # reasons shown per node, the devices sharing one reason on one line


class WhyFailed(CdigenError):
    """The pod or the cluster's objects could not be read."""

    exit_code = EXIT_CHECK_FAILED


@dataclass(frozen=True)
class Cluster:
    """What ``dra why`` reads: the pod, every ResourceClaim by (namespace, name), the
    ResourceSlices and the DeviceClasses, as the API server gives them."""

    pod: Mapping[str, Any]
    claims: Mapping[tuple[str, str], Mapping[str, Any]]
    slices: Sequence[Mapping[str, Any]]
    classes: Sequence[Mapping[str, Any]]


def read_cluster(
    api_client: Any, namespace: str, pod: str, *, timeout_s: float = DEFAULT_API_TIMEOUT_S
) -> Cluster:
    """The objects ``dra why`` needs, over the kubernetes client; :class:`WhyFailed` (one line)
    when the pod does not exist or a call fails."""
    from kubernetes import client

    core, resource = client.CoreV1Api(api_client), client.ResourceV1Api(api_client)

    def get(call: Callable[..., Any], what: str, *args: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            response = call(*args, _preload_content=False, _request_timeout=timeout_s)
            doc = json.loads(response.data)
        except ApiException as exc:
            found = "not found" if exc.status == 404 else "cannot be read"
            raise WhyFailed(f"{found} ({api_error(exc)})", where=what) from None
        except ValueError:
            raise WhyFailed(
                "API server answered with something that is not JSON", where=what
            ) from None
        except Exception as exc:
            raise WhyFailed(api_error(exc), where=what) from None
        if not isinstance(doc, dict):
            raise WhyFailed("API server answered with JSON that is not an object", where=what)
        return doc

    def items(call: Callable[..., Any], what: str) -> list[Mapping[str, Any]]:
        found = get(call, what).get("items")
        if not isinstance(found, list) or not all(isinstance(i, dict) for i in found):
            raise WhyFailed("API server answered with something that is not a list", where=what)
        return found

    pod_doc = get(core.read_namespaced_pod, f"pod {namespace}/{pod}", pod, namespace)
    claims = {}
    for claim in items(resource.list_resource_claim_for_all_namespaces, "resourceclaims"):
        meta = claim.get("metadata") or {}
        claims[(str(meta.get("namespace", "")), str(meta.get("name", "")))] = claim
    return Cluster(
        pod=pod_doc,
        claims=claims,
        slices=items(resource.list_resource_slice, "resourceslices"),
        classes=items(resource.list_device_class, "deviceclasses"),
    )


@dataclass(frozen=True)
class PodClaim:
    """One entry of ``pod.spec.resourceClaims``: its name in the pod, where it comes from, and
    the ResourceClaim's name once there is one."""

    name: str
    origin: str  # "claim X" or "template X"
    claim: str | None


def pod_claims(pod: Mapping[str, Any]) -> list[PodClaim]:
    """The pod's claims: ``resourceClaimName`` as it is, a template's claim by the name the
    resourceclaim controller put in ``status.resourceClaimStatuses``."""
    made = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
        if isinstance(s, Mapping)
    }
    out = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        name = str(entry.get("name", ""))
        if entry.get("resourceClaimName"):
            out.append(PodClaim(name, "claim", str(entry["resourceClaimName"])))
        else:
            template = entry.get("resourceClaimTemplateName")
            made_name = made.get(name)
            out.append(
                PodClaim(name, f"template {template}", str(made_name) if made_name else None)
            )
    return out


def explain_pod(cluster: Cluster, *, driver: str) -> list[str]:
    """At most :data:`SCREEN_LINES` lines: the pod's phase, then each claim, allocated (its
    devices, node and CDI names for ``driver``) or not (why, node by node)."""
    pod = cluster.pod
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace", "default"))
    phase = str((pod.get("status") or {}).get("phase") or "Pending")
    head = _pod_line(pod, namespace, phase)
    lines = [head]
    entries = pod_claims(pod)
    if not entries:
        return [
            *lines,
            "  it has no ResourceClaims (spec.resourceClaims): nothing for DRA to explain",
        ]
    pending: list[tuple[PodClaim, Claim]] = []
    for entry in entries:
        label = f"claim {entry.claim or entry.name} ({entry.origin})"
        doc = cluster.claims.get((namespace, entry.claim)) if entry.claim else None
        if doc is None:
            lines.append(
                f"{label}: not created yet; the resourceclaim controller makes it from the template"
                if entry.claim is None
                else f"{label}: no such ResourceClaim in {namespace}"
            )
            continue
        allocation = ((doc.get("status") or {}).get("allocation") or {}).get("devices") or {}
        results = allocation.get("results")
        if isinstance(results, list):
            lines += _allocated(label, doc, results, driver)
            continue
        source = f"resourceclaim {namespace}/{entry.claim}"
        doc = {**doc, "kind": "ResourceClaim"}  # list items carry no kind
        refuse_unchecked(doc, source)
        claim = claim_from_doc(doc, source)
        lines.append(f"{label}: not allocated")
        lines += _requests(claim)
        pending.append((entry, claim))
    if pending:
        lines += _why_pending([c for _, c in pending], cluster)
    elif phase == "Pending":
        lines.append("every claim is allocated: the pod waits on something else (its events)")
    if len(lines) > SCREEN_LINES:
        cut = len(lines) - SCREEN_LINES + 1
        lines = lines[: SCREEN_LINES - 1]
        lines.append(f"... {cut} more line(s): `cdigen dra explain` shows one node in full")
    return lines


def _pod_line(pod: Mapping[str, Any], namespace: str, phase: str) -> str:
    """``pod NS/NAME: PHASE [on NODE][, not scheduled (REASON: the scheduler's verdict)]``."""
    node = (pod.get("spec") or {}).get("nodeName")
    name = str((pod.get("metadata") or {}).get("name", ""))
    head = f"pod {namespace}/{name}: {phase}" + (f" on {node}" if node else "")
    unscheduled = next(
        (
            c
            for c in (pod.get("status") or {}).get("conditions") or ()
            if c.get("type") == "PodScheduled" and c.get("status") == "False"
        ),
        None,
    )
    if unscheduled:
        said = " ".join(str(unscheduled.get("message", "")).split())
        said = said.split(". ", 1)[0].rstrip(".")  # the scheduler's verdict, not preemption's
        head += f", not scheduled ({unscheduled.get('reason', '')}: {shortened(said, 90)})"
    return head


def _allocated(
    label: str, doc: Mapping[str, Any], results: Sequence[Any], driver: str
) -> list[str]:
    """An allocated claim: where, and each device with what it consumes and its CDI name."""
    from cdigen.cdi.names import qualified_name
    from plugin.dra.claim_spec import claim_device_name, claim_kind
    from plugin.dra.claims import AllocatedDevice

    allocation = (doc.get("status") or {}).get("allocation") or {}
    nodes = [
        str(v)
        for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or ()
        for match in term.get("matchFields") or ()
        if match.get("key") == "metadata.name"
        for v in match.get("values") or ()
    ]
    uid = str((doc.get("metadata") or {}).get("uid", ""))
    lines = [f"{label}: allocated" + (f" on {', '.join(nodes)}" if nodes else "")]
    for result in results:
        if not isinstance(result, Mapping):
            continue
        device = str(result.get("device", ""))
        consumed = ", ".join(
            f"{k.rpartition('/')[2]} {v}" for k, v in (result.get("consumedCapacity") or {}).items()
        )
        lines.append(
            f"  {result.get('request', '')}: {device} ({result.get('driver', '')}, pool "
            f"{result.get('pool', '')})" + (f", consumes {consumed}" if consumed else "")
        )
        if result.get("driver") == driver and uid:
            name = claim_device_name(uid, AllocatedDevice(str(result.get("request", "")), device))
            lines.append(f"    CDI device {qualified_name(claim_kind(driver), name)}")
    return lines


def _requests(claim: Claim) -> list[str]:
    """What each request of an unallocated claim asks: class, count, capacity, selectors."""
    lines = []
    for request in claim.requests:
        for r in request.alternatives or (request,):
            count = "all devices" if r.mode == "All" else f"{r.count} device(s)"
            capacity = "".join(f", {k} {format_bytes(v)}" for k, v in r.capacity.items())
            lines.append(f"  request {r.name}: class {r.class_name}, {count}{capacity}")
            for n, selector in enumerate(r.selectors):
                text = " ".join(selector.expression.split())
                lines.append(f"    selector {n}: {shortened(text, 90)}")
    return lines


def _why_pending(claims: Sequence[Claim], cluster: Cluster) -> list[str]:
    """The simulator's verdict for ``claims`` on each node, after what the allocated claims
    hold there: picks where they would fit, else why and each device's reason."""
    classes = {c.name: c for c in _classes(cluster.classes)}
    for claim in claims:
        for request in claim.requests:
            for r in request.alternatives or (request,):
                if r.class_name not in classes:
                    return [
                        f"request {r.name!r} names DeviceClass {r.class_name!r}, which does not "
                        "exist: the scheduler cannot allocate it anywhere"
                    ]
    nodes = _node_devices(cluster.slices)
    if not nodes:
        return ["no node publishes ResourceSlices: is a DRA driver running?"]
    said: dict[tuple[str, ...], list[str]] = {}  # nodes with the same story are told once
    for node, devices in sorted(nodes.items()):
        fit = FirstFit(devices, classes)
        state, held = _held(fit, cluster.claims.values())
        others = f", after {held} allocated claim(s) there" if held else ""
        story = [f"{len(devices)} device(s){others}"]
        for claim in claims:
            allocation, reasons = fit.explain(claim, state)
            if allocation.error:
                story += _matching(fit, claim, state)
                whose = f"{claim.name}: " if len(claims) > 1 else ""
                story.append(f"  {whose}not allocatable: {allocation.error}")
                story += _grouped(reasons)
                break
            story.append(f"  {claim.name}: would get {', '.join(allocation.devices)}")
            state.add(allocation.picks, fit.by_name)
        said.setdefault(tuple(story), []).append(node)
    lines = []
    for told, names in said.items():
        each = " each" if len(names) > 1 else ""
        lines.append(f"on {_few(names)} ({told[0]}{each}):")
        lines += told[1:]
    return lines


def _few(names: Sequence[str]) -> str:
    """``a, b, c``, or ``a, b and 5 more``."""
    if len(names) <= 3:
        return ", ".join(names)
    return f"{', '.join(names[:2])} and {len(names) - 2} more"


def _matching(fit: FirstFit, claim: Claim, state: NodeState) -> list[str]:
    """For each request: how many devices its class and selectors match, and how many of
    those have room left."""
    lines = []
    for request in claim.requests:
        matched = [d for d in fit.devices if not fit.mismatch(request, d)]
        free = [d for d in matched if not fit.consumption(request, d, state, [])[1]]
        lines.append(
            f"  request {request.name}: {len(matched)} device(s) match its class and "
            f"selectors, {len(free)} of them with room left"
        )
    return lines


def _grouped(reasons: Iterable[tuple[str, str]]) -> list[str]:
    """Devices sharing a reason on one line, the first few reasons."""
    groups: dict[str, list[str]] = {}
    for device, why in reasons:
        groups.setdefault(why, []).append(device)
    lines = []
    for why, devices in list(groups.items())[:_GROUPS_PER_NODE]:
        lines.append(f"    {_few(devices)}: {shortened(why, 100)}")
    if len(groups) > _GROUPS_PER_NODE:
        lines.append(f"    ... {len(groups) - _GROUPS_PER_NODE} other reason(s)")
    return lines


def _classes(docs: Iterable[Mapping[str, Any]]) -> list[DeviceClass]:
    out = []
    for doc in docs:
        name = str((doc.get("metadata") or {}).get("name", ""))
        source = f"deviceclass {name}"
        refuse_unchecked({"kind": "DeviceClass", **doc}, source)
        out.append(device_class(doc, source))
    return out


def _node_devices(slices: Iterable[Mapping[str, Any]]) -> dict[str, list[SliceDevice]]:
    """Each node's devices, from the newest generation of each (driver, pool) published for
    it (the scheduler ignores older generations)."""
    newest: dict[tuple[str, str], int] = {}
    for body in slices:
        spec = body.get("spec") or {}
        pool = spec.get("pool") or {}
        key = (str(spec.get("driver")), str(pool.get("name")))
        newest[key] = max(newest.get(key, 0), int(pool.get("generation", 0)))
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for body in slices:
        spec = body.get("spec") or {}
        pool = spec.get("pool") or {}
        key = (str(spec.get("driver")), str(pool.get("name")))
        if spec.get("nodeName") and int(pool.get("generation", 0)) == newest[key]:
            by_node.setdefault(str(spec["nodeName"]), []).append(body)
    return {node: slice_devices(bodies) for node, bodies in by_node.items()}


def _held(fit: FirstFit, claims: Iterable[Mapping[str, Any]]) -> tuple[NodeState, int]:
    """What the allocated ``claims`` hold of ``fit``'s devices, and how many claims hold some."""
    from policies.dra.slice_devices import quantity

    state = NodeState()
    held = 0
    for doc in claims:
        allocation = ((doc.get("status") or {}).get("allocation") or {}).get("devices") or {}
        picks = []
        for result in allocation.get("results") or ():
            device = fit.by_name.get(str(result.get("device")))
            if device is None or (device.driver, device.pool) != (
                result.get("driver"),
                result.get("pool"),
            ):
                continue
            consumed = {
                qualify(str(k), device.driver): quantity(v, f"consumedCapacity.{k}")
                for k, v in (result.get("consumedCapacity") or {}).items()
            }
            picks.append(Pick(str(result.get("request", "")), device.name, consumed))
        if picks:
            held += 1
            state.add(picks, fit.by_name)
    return state, held
