"""``cdigen dra explain``, ``check`` (offline claim tools: their logic lives in
:mod:`policies.dra.claims` and :mod:`policies.dra.check`) and ``why`` (a live cluster,
:mod:`plugin.dra.why`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cdigen.model import MIG_STRATEGIES
from plugin.dra.cli_args import DEFAULT_DRIVER, api_timeout, dns_subdomain, quantity_bytes

if TYPE_CHECKING:
    from cdigen.model import Node
    from policies.device_view import DeviceView
    from policies.dra.claim_docs import Claim
    from policies.dra.claims import Allocation, FirstFit, NodeState


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
        "show the picks and why every other device lost.",
    )
    explain.add_argument("--node", required=True, metavar="SRC", help="builtin:NAME or a file")
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
        default="mixed",
        help="how MIG-enabled GPUs are published, as `dra serve --mig-strategy` (default mixed)",
    )
    explain.add_argument("--memory-step", metavar="QUANTITY", help="as `dra serve --memory-step`")
    explain.set_defaults(func=_explain)


def _register_check(dra_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = dra_sub.add_parser(
        "check",
        help="catch misspelt attributes and capacities in claims and DeviceClasses",
        description="Check the CEL selectors, constraints and capacity requests of "
        "ResourceClaims, ResourceClaimTemplates and DeviceClasses against the attributes "
        "and capacities this driver publishes. Exit 1 when a check fails, 2 for bad input.",
    )
    check.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="YAML files of ResourceClaims, ResourceClaimTemplates and DeviceClasses",
    )
    check.add_argument(
        "--driver-name",
        default=DEFAULT_DRIVER,
        help=f"the driver whose attributes the selectors may name (default {DEFAULT_DRIVER})",
    )
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
    why.add_argument("-n", "--namespace", default="default", help="the pod's namespace")
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
    from cdigen.discover import load_node
    from cdigen.errors import InputError
    from plugin.dra.slices import MemoryShares, build_slices
    from policies.device_view import device_views
    from policies.dra.claim_docs import load_manifests
    from policies.dra.claims import FirstFit, NodeState
    from policies.dra.order import ordered_views
    from policies.dra.slice_devices import slice_devices

    dns_subdomain(args.driver_name, "--driver-name")
    class_files = args.classes or [str(p) for p in _shipped_classes()]
    claims, classes = load_manifests([*args.claim, *class_files])
    if not claims:
        raise InputError(
            "no ResourceClaim or ResourceClaimTemplate found", where=", ".join(args.claim)
        )
    node = load_node(args.node)
    views = ordered_views(device_views(node, mig_strategy=args.mig_strategy), node)
    shares = (
        MemoryShares(quantity_bytes(args.memory_step, "--memory-step"))
        if args.memory_step is not None
        else None
    )
    node_name = node.name or "node"
    slices = build_slices(
        views, driver=args.driver_name, node_name=node_name, generation=1, shares=shares
    )
    fit = FirstFit(slice_devices(slices), classes)
    state = NodeState()
    failed = 0
    for n, claim in enumerate(claims):
        if n:
            print()
        allocation, reasons = fit.explain(claim, state)
        for line in _explained(claim, allocation, reasons, fit, node, views, node_name):
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


def _shipped_classes() -> list[Path]:
    """The DeviceClasses ``kubectl apply -k deploy/dra`` installs, where this checkout has them."""
    path = Path(__file__).resolve().parents[2] / "deploy" / "dra" / "deviceclasses.yaml"
    return [path] if path.is_file() else []


def _explained(
    claim: Claim,
    allocation: Allocation,
    reasons: Sequence[tuple[str, str]],
    fit: FirstFit,
    node: Node,
    views: Sequence[DeviceView],
    node_name: str,
) -> list[str]:
    """One claim's explanation, with its link score and a note for each capacity request met
    by a whole device (published without consumable capacity)."""
    from policies.cel.quantity import format_bytes
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
        if capacity and not fit.by_name[pick.device].allow_multiple:
            wanted = ", ".join(f"{k} {format_bytes(v)}" for k, v in capacity.items())
            lines.append(
                f"note: request {pick.request!r} asks for capacity ({wanted}), but "
                f"{pick.device} is published without consumable capacity (dra serve without "
                "--memory-step): the claim gets the whole device"
            )
    return lines


def _capacity_left(fit: FirstFit, state: NodeState, allocated: int) -> list[str]:
    """What the claims allocated so far leave: every device, whole or its capacity left."""
    from policies.cel.quantity import format_bytes

    lines = [f"after {allocated} allocated claim(s):"]
    width = max(len(d.name) for d in fit.devices)
    for device in fit.devices:
        if device.name in state.exclusive:
            left = "held whole"
        elif device.allow_multiple and device.capacity:
            held = state.consumed.get(device.name, {})
            left = ", ".join(
                f"{name.rpartition('/')[2]} {format_bytes(total - held.get(name, 0))} left of "
                f"{format_bytes(total)}"
                for name, total in sorted(device.capacity.items())
            )
        else:
            left = "free"
        lines.append(f"  {device.name:<{width}}  {left}")
    return lines


def _check(args: argparse.Namespace) -> int:
    from cdigen.errors import CheckFailed
    from policies.dra.check import Published, check_files

    dns_subdomain(args.driver_name, "--driver-name")
    found = check_files(args.files, Published.of(args.driver_name))
    for warning in (p for p in found if p.warning):
        print(f"cdigen: warning: {warning}", file=sys.stderr)
    problems = [p for p in found if not p.warning]
    if problems:
        raise CheckFailed([str(p) for p in problems], summary="dra check failed")
    print(f"{len(args.files)} file(s) OK against the attributes of {args.driver_name}")
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
    return 0
