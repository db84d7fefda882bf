"""``cdigen dra explain``, ``check`` (offline claim tools: their logic lives in
:mod:`policies.dra.claims` and :mod:`policies.dra.check`) and ``why`` (a live cluster,
:mod:`plugin.dra.why`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdigen.discover.cli import add_node_source
from cdigen.memory_shares import add_share_options, memory_shares
from cdigen.model import DRA_MIG_STRATEGY, MIG_STRATEGIES
from plugin.dra.cli_args import DEFAULT_DRIVER, api_timeout, dns_subdomain, shares_problem

# The nodes `dra check` fits claims on when no --node is given: whole GPUs, MIG devices,
# NVLink and PCIe machines; a claim passes when it fits one of them.
SAMPLE_NODES = ("builtin:dgx-a100-mig-mixed", "builtin:dgx1-v100", "builtin:rtx4090")

if TYPE_CHECKING:
    from collections.abc import Mapping

    from cdigen.memory_shares import MemoryShares
    from cdigen.model import Node
    from policies.device_view import DeviceView
    from policies.dra.claim_docs import Claim, DeviceClass
    from policies.dra.claims import Allocation, FirstFit, NodeState, SliceDevice


def register(dra_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``dra explain``, ``dra check`` and ``dra why`` to ``dra_sub``."""
    _register_explain(dra_sub)
    _register_check(dra_sub)
    _register_why(dra_sub)


def _register_explain(dra_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    explain = dra_sub.add_parser(
        "explain",
        help="which devices the scheduler's first fit would pick for a claim, and why not others",
        description="Build this node's ResourceSlices as `dra serve` publishes them, run the "
        "scheduler's first fit (CEL selectors, matchAttribute, capacity) for the claim, and "
        "show the picks and why every other device lost. Exit 0 when every claim fits, 1 when "
        "one does not, 2 for bad usage or input.",
        epilog="example (in deploy/dra/examples): cdigen dra explain --node builtin:rtx4090 "
        "--memory-step 1Mi --claim memory-3gi.yaml --claim memory-18gi.yaml",
    )
    # --node (nvml by default, as every command that reads a node) and its roots
    add_node_source(explain, driver_root=True)
    explain.add_argument(
        "--claim",
        required=True,
        action="append",
        metavar="FILE",
        help="ResourceClaims or ResourceClaimTemplates (DeviceClasses in them are used too); "
        "repeatable: the claims are allocated in order, each after the ones before it",
    )
    explain.add_argument(
        "--class",
        dest="classes",
        action="append",
        default=[],
        metavar="FILE",
        help="DeviceClass manifest(s); repeatable (default: the classes deploy/dra installs)",
    )
    explain.add_argument(
        "--driver-name",
        default=DEFAULT_DRIVER,
        help=f"the driver the claim asks, as in `dra serve` (default {DEFAULT_DRIVER})",
    )
    explain.add_argument(
        "--mig-strategy",
        choices=MIG_STRATEGIES,
        default=DRA_MIG_STRATEGY,
        help="how MIG-enabled GPUs are published, as `dra serve --mig-strategy` "
        f"(default {DRA_MIG_STRATEGY}: a claim picks MIG devices by attribute, with no "
        "resource name per profile, so offering those that exist costs nothing; the device plugin "
        "defaults to none, which changes no resource name)",
    )
    add_share_options(explain.add_argument_group("sharing, as `dra serve` takes it"))
    explain.set_defaults(func=_explain)


def _register_check(dra_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = dra_sub.add_parser(
        "check",
        help="would the scheduler ever allocate these claims on this driver's devices?",
        description="Check ResourceClaims, ResourceClaimTemplates and DeviceClasses as the API "
        "server and the scheduler take them: CEL selectors compiled as the API server does "
        "(refused at create: exit 1), then each claim allocated by the scheduler's first fit "
        "on the devices `dra serve` would publish for each --node. Exit 1 exactly when a claim "
        "could never be allocated on any of them (refused at create, unknown DeviceClass, a "
        "CEL error on a device, no device matching, capacity above every device, more devices "
        "than the node has), with one line saying which; 0 when each could; 2 for bad input. "
        "Names the driver does not publish are reported too: an error when the claim fails, "
        "a warning when it does not.",
        epilog="example: cdigen dra check --node builtin:dgx1-v100 claim.yaml",
    )
    check.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="YAML files of ResourceClaims, ResourceClaimTemplates and DeviceClasses",
    )
    check.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="SRC",
        help="builtin:NAME or a node file whose devices the claims must fit; repeatable "
        f"(default: {', '.join(SAMPLE_NODES)}: a claim passes when it fits one of them)",
    )
    check.add_argument(
        "--class",
        dest="classes",
        action="append",
        default=[],
        metavar="FILE",
        help="DeviceClass manifest(s); repeatable (default: the classes deploy/dra installs; "
        "classes in FILE count too)",
    )
    check.add_argument(
        "--driver-name",
        default=DEFAULT_DRIVER,
        help=f"the driver whose attributes the selectors may name (default {DEFAULT_DRIVER})",
    )
    check.add_argument(
        "--mig-strategy",
        choices=MIG_STRATEGIES,
        default=DRA_MIG_STRATEGY,
        help="how MIG-enabled GPUs are published, as `dra serve --mig-strategy` "
        f"(default {DRA_MIG_STRATEGY})",
    )
    add_share_options(check.add_argument_group("sharing, as `dra serve` takes it"))
    check.set_defaults(func=_check)


def _register_why(dra_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    why = dra_sub.add_parser(
        "why",
        help="why a pod's ResourceClaims keep it Pending, or what they got (live cluster)",
        description="Read the pod, the ResourceClaims, ResourceSlices and DeviceClasses from the "
        "API server; for a claim not allocated, run the scheduler's first fit (as `dra explain`) "
        "on every node after what other claims hold there; for an allocated one, show its "
        "devices, node and CDI device names. One screen. Exit 1 when the pod or the API server "
        "cannot be read.",
    )
    why.add_argument("pod", metavar="POD", help="the pod's name")
    why.add_argument(
        "-n", "--namespace", default="default", help="the pod's namespace (default: default)"
    )
    why.add_argument("--kubeconfig", metavar="FILE", help="default: the in-cluster config")
    why.add_argument(
        "--api-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="give up on an API server call after this long (default 5)",
    )
    why.add_argument(
        "--driver-name",
        default=DEFAULT_DRIVER,
        help=f"the driver whose CDI device names are shown (default {DEFAULT_DRIVER})",
    )
    why.set_defaults(func=_why)


def _explain(args: argparse.Namespace) -> int:
    from cdigen.discover.cli import _load
    from cdigen.errors import InputError
    from policies.dra.claims import FirstFit, NodeState, load_manifests

    dns_subdomain(args.driver_name, "--driver-name")
    class_files = args.classes or [str(p) for p in _shipped_classes()]
    claims, classes = load_manifests([*args.claim, *class_files])
    if not claims:
        raise InputError(
            "no ResourceClaim or ResourceClaimTemplate found", where=", ".join(args.claim)
        )
    refused = _refused_at_create(claims, classes) or _unknown_classes(claims, classes)
    if refused:  # as the API server: before any device is looked at
        for line in refused:
            print(line, file=sys.stderr)
        return 1
    node = _load(args)
    shares = memory_shares(args)
    views, devices = _node_devices(node, args.driver_name, args.mig_strategy, shares)
    node_name = node.name or "node"
    fit = FirstFit(devices, classes)
    state = NodeState()
    failed = 0
    for n, claim in enumerate(claims):
        if n:
            print()
        allocation, reasons = fit.explain(claim, state)
        for line in _explained(claim, allocation, reasons, fit, node, views, node_name, shares):
            print(line)
        if allocation.error:
            failed += 1
        else:
            state.add(allocation.picks, fit.by_name)
    if len(claims) > 1 or state.consumed:
        print()
        for line in _capacity_left(fit, state, len(claims) - failed):
            print(line)
    return 1 if failed else 0


def _refused_at_create(claims: Sequence[Claim], classes: Mapping[str, DeviceClass]) -> list[str]:
    """What the API server refuses when the claims and classes are created, one line each, in
    its words: every selector compiled as it compiles them."""
    from policies.cel import CelCompileError, compile_expression
    from policies.dra.claims import DEVICE_VARIABLES

    selectors = [s for c in classes.values() for s in c.selectors]
    for claim in claims:
        for request in claim.requests:
            for choice in request.alternatives or (request,):
                selectors += choice.selectors
    lines = []
    for selector in selectors:
        try:
            compile_expression(selector.expression, DEVICE_VARIABLES)
        except CelCompileError as exc:
            lines.append(
                f"{selector.source}: {selector.field}: CEL line {exc.line}, column {exc.column}: "
                f"{exc} (the API server refuses it at create)"
            )
    return lines


def _unknown_classes(claims: Sequence[Claim], classes: Mapping[str, DeviceClass]) -> list[str]:
    """A line for each request naming a DeviceClass that is not among ``classes``."""
    from policies.dra.check import unknown_class_message

    lines = []
    for claim in claims:
        for request in claim.requests:
            for choice in request.alternatives or (request,):
                if choice.class_name not in classes:
                    lines.append(
                        f"{claim.source}: claim {claim.name}: request {choice.name!r}: "
                        + unknown_class_message(choice.class_name, classes)
                    )
    return lines


def _node_devices(
    node: Node, driver: str, mig_strategy: str, shares: MemoryShares | None
) -> tuple[list[DeviceView], list[SliceDevice]]:
    """The node's device views and the devices of the ResourceSlices `dra serve` would publish
    for it with these shares (a default share the API server would refuse is refused here too,
    naming its flag)."""
    from plugin.dra.slices import build_slices
    from policies.device_view import device_views
    from policies.dra.claims import slice_devices
    from policies.dra.order import ordered_views

    views = ordered_views(device_views(node, mig_strategy=mig_strategy), node)
    shares_problem(shares, views)
    slices = build_slices(
        views, driver=driver, node_name=node.name or "node", generation=1, shares=shares
    )
    return views, list(slice_devices(slices))


def _shipped_classes() -> list[Path]:
    """The DeviceClasses ``kubectl apply -k deploy/dra`` installs, shipped as package data."""
    from cdigen.package_data import shipped_file

    return [
        shipped_file(
            "cdigen.dra_files", "deviceclasses.yaml", checkout="deploy/dra/deviceclasses.yaml"
        )
    ]


def _explained(
    claim: Claim,
    allocation: Allocation,
    reasons: Sequence[tuple[str, str]],
    fit: FirstFit,
    node: Node,
    views: Sequence[DeviceView],
    node_name: str,
    shares: MemoryShares | None = None,
) -> list[str]:
    """One claim's explanation, with its link score, a note for each capacity request met
    by a whole device (published without consumable capacity), and one for each request that
    named no memory and took the node's default share."""
    from cdigen.sizes import quantity_text
    from policies.dra.explanation import render_explanation
    from policies.graph import build_topology

    score = None
    if allocation.picks:
        topology = build_topology(node)
        by_name = {v.name: v for v in views}
        positions = tuple(
            sorted({topology.position_by_uuid[by_name[d].gpu.uuid] for d in allocation.devices})
        )
        score = topology.set_score(positions) if len(positions) > 1 else None
    lines = render_explanation(claim, allocation, reasons, node=node_name, link_score=score)
    asked = {r.name: r.capacity for r in claim.requests for r in (r.alternatives or (r,))}
    for pick in allocation.picks:
        capacity = asked.get(pick.request)
        memory = pick.consumed.get(f"{fit.by_name[pick.device].driver}/memory")
        if shares is not None and memory is not None and "memory" not in (capacity or {}):
            lines.append(
                f"note: request {pick.request!r} names no memory: it takes the default share, "
                f"{quantity_text(memory)} of {pick.device} ({shares.described()}; dra serve "
                "--default-share or --shares-per-gpu sets it)"
            )
        if capacity and not fit.by_name[pick.device].allow_multiple:
            wanted = ", ".join(f"{k} {quantity_text(v)}" for k, v in capacity.items())
            lines.append(
                f"note: request {pick.request!r} asks for capacity ({wanted}), but "
                f"{pick.device} is published without consumable capacity (dra serve without "
                "--memory-step): the claim gets the whole device"
            )
    return lines


def _capacity_left(fit: FirstFit, state: NodeState, allocated: int) -> list[str]:
    """What the claims allocated so far leave: every device, whole or its capacity left."""
    from cdigen.sizes import quantity_text

    lines = [f"after {allocated} allocated claim(s):"]
    width = max(len(d.name) for d in fit.devices)
    for device in fit.devices:
        if device.name in state.exclusive:
            left = "held whole"
        elif device.allow_multiple and device.capacity:
            held = state.consumed.get(device.name, {})
            left = ", ".join(
                f"{name.rpartition('/')[2]} {quantity_text(total - held.get(name, 0))} left of "
                f"{quantity_text(total)}"
                for name, total in sorted(device.capacity.items())
            )
        else:
            left = "free"
        lines.append(f"  {device.name:<{width}}  {left}")
    return lines


def _check(args: argparse.Namespace) -> int:
    from cdigen.errors import CheckFailed
    from policies.dra.check import NodeDevices, Published, check_files
    from policies.dra.claims import load_manifests

    dns_subdomain(args.driver_name, "--driver-name")
    class_files = args.classes or [str(p) for p in _shipped_classes()]
    classes = load_manifests(class_files)[1] if class_files else {}
    from cdigen.discover import load_node

    shares = memory_shares(args)
    nodes = [
        NodeDevices(
            source,
            tuple(_node_devices(load_node(source), args.driver_name, args.mig_strategy, shares)[1]),
        )
        for source in (args.node or SAMPLE_NODES)
    ]
    result = check_files(args.files, Published.of(args.driver_name), nodes, classes)
    found = result.problems
    for warning in (p for p in found if p.warning):
        print(f"cdigen: warning: {warning}", file=sys.stderr)
    problems = [p for p in found if not p.warning]
    if problems:
        raise CheckFailed([str(p) for p in problems], summary="dra check failed")
    for note in result.notes:
        print(note)
    said = f"{len(args.files)} file(s) OK against the attributes of {args.driver_name}"
    if result.claims:
        where = " or ".join(args.node or SAMPLE_NODES)
        said += f"; {result.claims} claim(s), each could be allocated on {where}"
    print(said)
    return 0


def _why(args: argparse.Namespace) -> int:
    from plugin.agent.kubeapi import api_client
    from plugin.dra.why import explain_pod, read_cluster

    dns_subdomain(args.driver_name, "--driver-name")
    dns_subdomain(args.namespace, "--namespace", example="default")
    dns_subdomain(args.pod, "POD", 253, example="trainer-0")
    api_timeout(args.api_timeout)
    cluster = read_cluster(
        api_client(args.kubeconfig), args.namespace, args.pod, timeout_s=args.api_timeout
    )
    for line in explain_pod(cluster, driver=args.driver_name):
        print(line)
    for line in _stale_lines(args, cluster):
        print(line)
    return 0


def _stale_lines(args: argparse.Namespace, cluster: Any) -> list[str]:
    """The nodes that still advertise an extended resource the pod asks for and one of the
    driver's DeviceClasses serves (plugin.dra.stale), one line each."""
    from plugin.agent.kubeapi import api_client
    from plugin.dra.kube import KubeApi
    from plugin.dra.stale import pod_stale_lines

    api = KubeApi(api_client(args.kubeconfig), timeout_s=args.api_timeout)
    return pod_stale_lines(
        cluster.pod, cluster.classes, cluster.slices, api.read_node, args.driver_name
    )
