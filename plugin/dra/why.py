"""``cdigen dra why POD``: why a pod's ResourceClaims keep it Pending, or what they got.

Reads the pod, every ResourceClaim (those of other pods hold devices and capacity), the
ResourceSlices and the DeviceClasses from the API server, and runs the offline scheduler
simulator (:mod:`cdigen.policies.dra.claims`, as ``dra explain`` does) for the pod's unallocated
claims on every node that publishes slices, after what the allocated claims there hold. One screen.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from cdigen.errors import EXIT_CHECK_FAILED, CdigenError, printable, shortened
from cdigen.plugin.agent.kubeapi import DEFAULT_API_TIMEOUT_S, api_error, get_json
from cdigen.plugin.dra.api_objects import (
    SHAPE_ERRORS,
    described,
    name_of,
    obj,
    objs,
    seq,
)
from cdigen.plugin.dra.kube import RESOURCE_API
from cdigen.plugin.dra.why_memo import (
    MemoPrograms,
    collector_paused,
    devices_key,
    loads,
    node_key,
)
from cdigen.plugin.dra.why_nodes import (
    InvalidPools,
    classes_of,
    held_by_pool,
    held_on,
    node_devices,
    node_slices,
)
from cdigen.policies.dra.claim_docs import (
    Claim,
    claim_from_doc,
    refuse_unchecked,
)
from cdigen.policies.dra.claims import FirstFit, NodeState
from cdigen.sizes import quantity_text

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
    from kubernetes.client.exceptions import ApiException

    def get(path: str, what: str) -> Any:
        try:
            doc = get_json(api_client, path, timeout_s=timeout_s, loads=loads)
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

    def items(path: str, what: str) -> list[Mapping[str, Any]]:
        found = get(path, what).get("items")
        if not isinstance(found, list) or not all(isinstance(i, dict) for i in found):
            raise WhyFailed("API server answered with something that is not a list", where=what)
        return found

    pod_path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}"
    pod_doc = get(pod_path, f"pod {namespace}/{pod}")
    claims = {}
    for claim in items(f"{RESOURCE_API}/resourceclaims", "resourceclaims"):
        claims[name_of(claim)] = claim
    return Cluster(
        pod=pod_doc,
        claims=claims,
        slices=items(f"{RESOURCE_API}/resourceslices", "resourceslices"),
        classes=items(f"{RESOURCE_API}/deviceclasses", "deviceclasses"),
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
    resourceclaim controller put in ``status.resourceClaimStatuses``; :class:`Malformed`
    naming the field when one is not the shape the API gives."""
    status = obj(pod.get("status"), "status")
    made = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in objs(status.get("resourceClaimStatuses"), "status.resourceClaimStatuses")
    }
    out = []
    spec = obj(pod.get("spec"), "spec")
    for entry in objs(spec.get("resourceClaims"), "spec.resourceClaims"):
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
    devices, node and CDI names for ``driver``) or not (why, node by node). Every name from
    the API is printed escaped; a malformed object of the pod's own is :class:`WhyFailed`
    naming it, any other is skipped and named in the last line."""
    pod = cluster.pod
    namespace, name = name_of(pod)
    namespace = namespace or "default"
    try:
        phase = str(obj(pod.get("status"), "status").get("phase") or "Pending")
        head = _pod_line(pod, namespace, phase)
        entries = pod_claims(pod)
    except SHAPE_ERRORS as exc:
        raise WhyFailed(
            printable(described(exc)), where=printable(f"pod {namespace}/{name}")
        ) from None
    lines = [head]
    if not entries:
        return [
            printable(lines[0]),
            "  it has no ResourceClaims (spec.resourceClaims): nothing for DRA to explain",
        ]
    pending: list[Claim] = []
    for entry in entries:
        claim_lines, claim = _claim_lines(entry, cluster, namespace, driver)
        lines += claim_lines
        if claim is not None:
            pending.append(claim)
    skipped: list[str] = []
    if pending:
        with collector_paused():
            lines += _why_pending(pending, cluster, skipped)
    elif phase == "Pending":
        lines.append("every claim is allocated: the pod waits on something else (its events)")
    room = SCREEN_LINES - (1 if skipped else 0)
    if len(lines) > room:
        cut = len(lines) - room + 1
        lines = lines[: room - 1]
        lines.append(f"... {cut} more line(s): `cdigen dra explain` shows one node in full")
    if skipped:
        more = f" and {len(skipped) - 2} more" if len(skipped) > 2 else ""
        lines.append(f"skipped as malformed: {'; '.join(skipped[:2])}{more}")
    return [printable(line) for line in lines]


def _claim_lines(
    entry: PodClaim, cluster: Cluster, namespace: str, driver: str
) -> tuple[list[str], Claim | None]:
    """One claim of the pod: its lines, and the claim when it waits for an allocation;
    :class:`WhyFailed` naming it when it is malformed."""
    label = f"claim {entry.claim or entry.name} ({entry.origin})"
    doc = cluster.claims.get((namespace, entry.claim)) if entry.claim else None
    if doc is None:
        return [
            f"{label}: not created yet; the resourceclaim controller makes it from the template"
            if entry.claim is None
            else f"{label}: no such ResourceClaim in {namespace}"
        ], None
    source = f"resourceclaim {namespace}/{entry.claim}"
    try:
        status = obj(doc.get("status"), "status")
        allocation = obj(status.get("allocation"), "status.allocation")
        devices = obj(allocation.get("devices"), "status.allocation.devices")
        results = devices.get("results")
        if isinstance(results, list):
            return _allocated(label, doc, results, driver), None
        claim_doc = {**doc, "kind": "ResourceClaim"}  # list items carry no kind
        refuse_unchecked(claim_doc, source)
        claim = claim_from_doc(claim_doc, source)
    except SHAPE_ERRORS as exc:
        raise WhyFailed(printable(described(exc)), where=printable(source)) from None
    return [f"{label}: not allocated", *_requests(claim)], claim


def _pod_line(pod: Mapping[str, Any], namespace: str, phase: str) -> str:
    """``pod NS/NAME: PHASE [on NODE][, not scheduled (REASON: the scheduler's verdict)]``."""
    node = obj(pod.get("spec"), "spec").get("nodeName")
    name = name_of(pod)[1]
    head = f"pod {namespace}/{name}: {phase}" + (f" on {node}" if node else "")
    conditions = objs(obj(pod.get("status"), "status").get("conditions"), "status.conditions")
    unscheduled = next(
        (c for c in conditions if c.get("type") == "PodScheduled" and c.get("status") == "False"),
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
    from cdigen.plugin.dra.claim_spec import claim_device_name, claim_kind
    from cdigen.plugin.dra.claims import AllocatedDevice

    allocation = obj(obj(doc.get("status"), "status").get("allocation"), "status.allocation")
    selector = obj(allocation.get("nodeSelector"), "status.allocation.nodeSelector")
    nodes = []
    field = "status.allocation.nodeSelector.nodeSelectorTerms"
    for t, term in enumerate(objs(selector.get("nodeSelectorTerms"), field)):
        for match in objs(term.get("matchFields"), f"{field}[{t}].matchFields"):
            if match.get("key") == "metadata.name":
                nodes += [str(v) for v in seq(match.get("values"), f"{field}[{t}].values")]
    uid = str(obj(doc.get("metadata"), "metadata").get("uid", ""))
    lines = [f"{label}: allocated" + (f" on {', '.join(nodes)}" if nodes else "")]
    for n, result in enumerate(objs(results, "status.allocation.devices.results")):
        device = str(result.get("device", ""))
        capacity = obj(
            result.get("consumedCapacity"),
            f"status.allocation.devices.results[{n}].consumedCapacity",
        )
        consumed = ", ".join(f"{k.rpartition('/')[2]} {v}" for k, v in capacity.items())
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
            capacity = "".join(f", {k} {quantity_text(v)}" for k, v in r.capacity.items())
            lines.append(f"  request {r.name}: class {r.class_name}, {count}{capacity}")
            for n, selector in enumerate(r.selectors):
                text = " ".join(selector.expression.split())
                lines.append(f"    selector {n}: {shortened(text, 90)}")
    return lines


def _why_pending(claims: Sequence[Claim], cluster: Cluster, skipped: list[str]) -> list[str]:
    """The simulator's verdict for ``claims`` on each node, after what the allocated claims
    hold there: picks where they would fit, else why and each device's reason. Malformed
    objects of others are left out and named in ``skipped``."""
    classes = {c.name: c for c in classes_of(cluster.classes, skipped)}
    for claim in claims:
        for request in claim.requests:
            for r in request.alternatives or (request,):
                if r.class_name not in classes:
                    return [
                        f"request {r.name!r} names DeviceClass {r.class_name!r}, which does not "
                        "exist: the scheduler cannot allocate it anywhere"
                    ]
    nodes = node_slices(cluster.slices, skipped)
    if not nodes:
        return ["no node publishes ResourceSlices: is a DRA driver running?"]
    before = len(skipped)
    by_pool = held_by_pool(cluster.claims, skipped)
    bad_nodes: list[str] = []  # named before the claims, as the nodes come first
    said: dict[tuple[str, ...], list[str]] = {}  # nodes with the same story are told once
    programs = MemoPrograms()  # each selector compiled once, its verdicts kept, for every node
    stories: dict[tuple[Any, ...], tuple[str, ...]] = {}  # identical nodes simulated once
    fits: dict[tuple[Any, ...], FirstFit] = {}
    for node in sorted(nodes):
        devices = node_devices(node, nodes[node], bad_nodes)
        if devices is None:
            continue
        invalid = InvalidPools.of(devices)  # the scheduler allocates from none of these
        devices = invalid.valid(devices)
        pools = {(d.driver, d.pool) for d in devices}
        holders = [h for pool in sorted(pools) for h in by_pool.get(pool, ())]
        shape = devices_key(devices)
        fit = fits.get(shape)  # a fit reads no pool: nodes of equal devices share one
        if fit is None:
            fit = fits[shape] = FirstFit(devices, classes, programs=programs)
        state, held = held_on(devices, fit, holders)  # told in the fit's devices
        key = (node_key(fit, state, held), invalid.lines)  # lines tell the pools apart
        story = stories.get(key)
        if story is None:
            story = stories[key] = _node_story(fit, claims, state, held, invalid)
        said.setdefault(story, []).append(node)
    skipped[before:before] = bad_nodes
    if not said:
        return ["no node publishes ResourceSlices: is a DRA driver running?"]
    lines = []
    for told, names in said.items():
        each = " each" if len(names) > 1 else ""
        lines.append(f"on {_few(names)} ({told[0]}{each}):")
        lines += told[1:]
    return lines


def _node_story(
    fit: FirstFit, claims: Sequence[Claim], state: NodeState, held: int, invalid: InvalidPools
) -> tuple[str, ...]:
    """One node's lines: its devices (``fit``'s; those of ``invalid`` pools, left out of it,
    told apart), then each claim's picks, or why it does not fit there."""
    others = f", after {held} allocated claim(s) there" if held else ""
    story = [f"{len(fit.devices)} device(s){others}", *invalid.lines]
    for claim in claims:
        whose = f"{claim.name}: " if len(claims) > 1 else ""
        refused = invalid.refusal(claim)
        if refused:
            story.append(f"  {whose}not allocatable: {refused}")
            break
        allocation, reasons = fit.explain(claim, state)
        if allocation.error:
            story += _matching(fit, claim, state)
            story.append(f"  {whose}not allocatable: {allocation.error}")
            story += _grouped(reasons)
            break
        got = ", ".join(fit.label(key) for key in allocation.keys)
        story.append(f"  {claim.name}: would get {got}")
        state.add(allocation.picks, fit.by_key)
    return tuple(story)


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
