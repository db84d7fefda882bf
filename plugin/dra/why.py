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

from cdigen.errors import EXIT_CHECK_FAILED, CdigenError, printable, shortened
from plugin.agent.kubeapi import DEFAULT_API_TIMEOUT_S, api_error
from policies.cel.quantity import format_bytes
from policies.dra.claim_docs import refuse_unchecked
from policies.dra.claims import (
    Claim,
    DeviceClass,
    FirstFit,
    NodeState,
    Pick,
    SliceDevice,
    claim_from_doc,
    device_class,
    qualify,
    slice_devices,
)

SCREEN_LINES = 25
_GROUPS_PER_NODE = 3  # reasons shown per node, the devices sharing one reason on one line


class WhyFailed(CdigenError):
    """The pod or the cluster's objects could not be read."""

    exit_code = EXIT_CHECK_FAILED


class Malformed(Exception):
    """A field of an API object that does not have the shape the API gives it; the message
    names the field (never more than a short, escaped quote of its value)."""


# What the objects' readers may raise on a shape they do not expect: the simulator's readers
# (policies.dra) check what a manifest on disk may hold, not every shape a hostile API object may.
_SHAPE_ERRORS = (Malformed, CdigenError, AttributeError, TypeError, ValueError, KeyError)


def _what(exc: BaseException) -> str:
    if isinstance(exc, CdigenError):
        return exc.message if exc.where is None else f"{exc.where}: {exc.message}"
    if isinstance(exc, Malformed):
        return str(exc)
    return f"malformed ({type(exc).__name__}: {shortened(str(exc), 60)})"


def _kind(value: Any) -> str:
    kinds = {"str": "a string", "int": "a number", "float": "a number", "bool": "a boolean"}
    return kinds.get(type(value).__name__, "a list" if isinstance(value, list) else "an object")


def _obj(value: Any, field: str) -> Mapping[str, Any]:
    """``value`` as an object (None: empty), or :class:`Malformed` naming ``field``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise Malformed(f"{field} is {_kind(value)}, not an object")
    return value


def _list(value: Any, field: str) -> Sequence[Any]:
    """``value`` as a list (None: empty), or :class:`Malformed` naming ``field``."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise Malformed(f"{field} is {_kind(value)}, not a list")
    return value


def _objs(value: Any, field: str) -> list[Mapping[str, Any]]:
    """``value`` as a list of objects, or :class:`Malformed` naming the first bad entry."""
    items = _list(value, field)
    for n, item in enumerate(items):
        _obj(item, f"{field}[{n}]")
    return [i for i in items if i is not None]


def _int(value: Any, field: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise Malformed(f"{field} is {_kind(value)}, not an integer")
    return value


def _name(doc: Mapping[str, Any]) -> tuple[str, str]:
    meta = doc.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


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
        claims[_name(claim)] = claim
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
    resourceclaim controller put in ``status.resourceClaimStatuses``; :class:`Malformed`
    naming the field when one is not the shape the API gives."""
    status = _obj(pod.get("status"), "status")
    made = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in _objs(status.get("resourceClaimStatuses"), "status.resourceClaimStatuses")
    }
    out = []
    spec = _obj(pod.get("spec"), "spec")
    for entry in _objs(spec.get("resourceClaims"), "spec.resourceClaims"):
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
    namespace, name = _name(pod)
    namespace = namespace or "default"
    try:
        phase = str(_obj(pod.get("status"), "status").get("phase") or "Pending")
        head = _pod_line(pod, namespace, phase)
        entries = pod_claims(pod)
    except _SHAPE_ERRORS as exc:
        raise WhyFailed(printable(_what(exc)), where=printable(f"pod {namespace}/{name}")) from None
    lines = [head]
    if not entries:
        return [
            printable(lines[0]),
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
        source = f"resourceclaim {namespace}/{entry.claim}"
        try:
            status = _obj(doc.get("status"), "status")
            allocation = _obj(status.get("allocation"), "status.allocation")
            devices = _obj(allocation.get("devices"), "status.allocation.devices")
            results = devices.get("results")
            if isinstance(results, list):
                lines += _allocated(label, doc, results, driver)
                continue
            claim_doc = {**doc, "kind": "ResourceClaim"}  # list items carry no kind
            refuse_unchecked(claim_doc, source)
            claim = claim_from_doc(claim_doc, source)
        except _SHAPE_ERRORS as exc:
            raise WhyFailed(printable(_what(exc)), where=printable(source)) from None
        lines.append(f"{label}: not allocated")
        lines += _requests(claim)
        pending.append((entry, claim))
    skipped: list[str] = []
    if pending:
        lines += _why_pending([c for _, c in pending], cluster, skipped)
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


def _pod_line(pod: Mapping[str, Any], namespace: str, phase: str) -> str:
    """``pod NS/NAME: PHASE [on NODE][, not scheduled (REASON: the scheduler's verdict)]``."""
    node = _obj(pod.get("spec"), "spec").get("nodeName")
    name = _name(pod)[1]
    head = f"pod {namespace}/{name}: {phase}" + (f" on {node}" if node else "")
    conditions = _objs(_obj(pod.get("status"), "status").get("conditions"), "status.conditions")
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
    from plugin.dra.claim_spec import claim_device_name, claim_kind
    from plugin.dra.claims import AllocatedDevice

    allocation = _obj(_obj(doc.get("status"), "status").get("allocation"), "status.allocation")
    selector = _obj(allocation.get("nodeSelector"), "status.allocation.nodeSelector")
    nodes = []
    field = "status.allocation.nodeSelector.nodeSelectorTerms"
    for t, term in enumerate(_objs(selector.get("nodeSelectorTerms"), field)):
        for match in _objs(term.get("matchFields"), f"{field}[{t}].matchFields"):
            if match.get("key") == "metadata.name":
                nodes += [str(v) for v in _list(match.get("values"), f"{field}[{t}].values")]
    uid = str(_obj(doc.get("metadata"), "metadata").get("uid", ""))
    lines = [f"{label}: allocated" + (f" on {', '.join(nodes)}" if nodes else "")]
    for n, result in enumerate(_objs(results, "status.allocation.devices.results")):
        device = str(result.get("device", ""))
        capacity = _obj(
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
            capacity = "".join(f", {k} {format_bytes(v)}" for k, v in r.capacity.items())
            lines.append(f"  request {r.name}: class {r.class_name}, {count}{capacity}")
            for n, selector in enumerate(r.selectors):
                text = " ".join(selector.expression.split())
                lines.append(f"    selector {n}: {shortened(text, 90)}")
    return lines


def _why_pending(claims: Sequence[Claim], cluster: Cluster, skipped: list[str]) -> list[str]:
    """The simulator's verdict for ``claims`` on each node, after what the allocated claims
    hold there: picks where they would fit, else why and each device's reason. Malformed
    objects of others are left out and named in ``skipped``."""
    classes = {c.name: c for c in _classes(cluster.classes, skipped)}
    for claim in claims:
        for request in claim.requests:
            for r in request.alternatives or (request,):
                if r.class_name not in classes:
                    return [
                        f"request {r.name!r} names DeviceClass {r.class_name!r}, which does not "
                        "exist: the scheduler cannot allocate it anywhere"
                    ]
    nodes = _node_devices(cluster.slices, skipped)
    if not nodes:
        return ["no node publishes ResourceSlices: is a DRA driver running?"]
    held_by_pool = _held_by_pool(cluster.claims, skipped)
    said: dict[tuple[str, ...], list[str]] = {}  # nodes with the same story are told once
    programs: dict[str, Any] = {}  # each selector compiled once for every node
    for node, devices in sorted(nodes.items()):
        fit = FirstFit(devices, classes, programs=programs)
        pools = {(d.driver, d.pool) for d in devices}
        holders = [h for pool in sorted(pools) for h in held_by_pool.get(pool, ())]
        state, held = _held(fit, holders)
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


def _classes(docs: Iterable[Mapping[str, Any]], skipped: list[str]) -> list[DeviceClass]:
    out = []
    for doc in docs:
        source = f"deviceclass {_name(doc)[1]}"
        try:
            refuse_unchecked({"kind": "DeviceClass", **doc}, source)
            _obj(doc.get("spec"), "spec")
            out.append(device_class(doc, source))
        except _SHAPE_ERRORS as exc:
            skipped.append(f"{source} ({_what(exc)})")
    return out


def _node_devices(
    slices: Iterable[Mapping[str, Any]], skipped: list[str]
) -> dict[str, list[SliceDevice]]:
    """Each node's devices, from the newest generation of each (driver, pool) published for
    it (the scheduler ignores older generations); malformed slices are left out."""
    read: list[tuple[str, tuple[str, str], int, Mapping[str, Any]]] = []
    newest: dict[tuple[str, str], int] = {}
    for body in slices:
        try:
            spec = _obj(body.get("spec"), "spec")
            pool = _obj(spec.get("pool"), "spec.pool")
            generation = _int(pool.get("generation"), "spec.pool.generation")
            _objs(spec.get("devices"), "spec.devices")
        except Malformed as exc:
            skipped.append(f"resourceslice {_name(body)[1]} ({exc})")
            continue
        key = (str(spec.get("driver")), str(pool.get("name")))
        newest[key] = max(newest.get(key, 0), generation)
        if spec.get("nodeName"):
            read.append((str(spec["nodeName"]), key, generation, body))
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for node, key, generation, body in read:
        if generation == newest[key]:
            by_node.setdefault(node, []).append(body)
    out = {}
    for node, bodies in by_node.items():
        try:
            out[node] = slice_devices(bodies)
        except _SHAPE_ERRORS as exc:
            skipped.append(f"the resourceslices of node {node} ({_what(exc)})")
    return out


# An allocated claim's results in one (driver, pool): the claim's name, the (driver, pool) and
# (request, device, consumed capacity by qualified name) for each result there.
Held = tuple[str, tuple[str, str], list[tuple[str, str, dict[str, int]]]]


def _held_by_pool(
    claims: Mapping[tuple[str, str], Mapping[str, Any]], skipped: list[str]
) -> dict[tuple[str, str], list[Held]]:
    """What each allocated claim holds, by (driver, pool), read once for every node; a
    malformed claim is left out and named in ``skipped``."""
    from policies.dra.slice_devices import quantity

    out: dict[tuple[str, str], list[Held]] = {}
    for (namespace, name), doc in claims.items():
        try:
            status = _obj(doc.get("status"), "status")
            allocation = _obj(status.get("allocation"), "status.allocation")
            devices = _obj(allocation.get("devices"), "status.allocation.devices")
            mine: dict[tuple[str, str], list[tuple[str, str, dict[str, int]]]] = {}
            field = "status.allocation.devices.results"
            for n, result in enumerate(_objs(devices.get("results"), field)):
                driver = str(result.get("driver"))
                at = f"{field}[{n}].consumedCapacity"
                consumed = {
                    qualify(str(k), driver): quantity(v, f"{at}.{k}")
                    for k, v in _obj(result.get("consumedCapacity"), at).items()
                }
                key = (driver, str(result.get("pool")))
                entry = (str(result.get("request", "")), str(result.get("device")), consumed)
                mine.setdefault(key, []).append(entry)
        except _SHAPE_ERRORS as exc:
            skipped.append(f"resourceclaim {namespace}/{name} ({_what(exc)})")
            continue
        for key, picks in mine.items():
            out.setdefault(key, []).append((f"{namespace}/{name}", key, picks))
    return out


def _held(fit: FirstFit, holders: Iterable[Held]) -> tuple[NodeState, int]:
    """What the allocated claims ``holders`` hold of ``fit``'s devices, and how many claims
    hold some."""
    state = NodeState()
    held = 0
    for _, (driver, pool), results in holders:
        picks = []
        for request, name, consumed in results:
            device = fit.by_name.get(name)
            if device is None or (device.driver, device.pool) != (driver, pool):
                continue
            picks.append(Pick(request, device.name, consumed))
        if picks:
            held += 1
            state.add(picks, fit.by_name)
    return state, held
