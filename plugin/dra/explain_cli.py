"""``cdigen dra explain``: which devices the scheduler's first fit would pick for a claim on
this node (:mod:`cdigen.policies.dra.claims`), and why not others."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cdigen.discover.cli import add_node_source
from cdigen.memory_shares import memory_shares
from cdigen.plugin.dra.claim_inputs import node_devices, shipped_classes
from cdigen.plugin.dra.cli_args import add_fit_options, dns_subdomain

if TYPE_CHECKING:
    from cdigen.memory_shares import MemoryShares
    from cdigen.model import Node
    from cdigen.policies.device_view import DeviceView
    from cdigen.policies.dra.claim_docs import Claim
    from cdigen.policies.dra.claims import Allocation, FirstFit, NodeState


def register_explain(dra_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    add_fit_options(
        explain,
        driver_help="the driver the claim asks, as in `dra serve`",
        mig_note=": a claim picks MIG devices by attribute, with no resource name per profile, "
        "so offering those that exist costs nothing; the device plugin defaults to none, which "
        "changes no resource name",
    )
    explain.set_defaults(func=_explain)


def _explain(args: argparse.Namespace) -> int:
    from cdigen.discover.cli import _load
    from cdigen.errors import InputError
    from cdigen.policies.dra.claim_docs import load_manifests
    from cdigen.policies.dra.claims import FirstFit, NodeState

    dns_subdomain(args.driver_name, "--driver-name")
    class_files = args.classes or [str(p) for p in shipped_classes()]
    claims, classes = load_manifests([*args.claim, *class_files])
    if not claims:
        raise InputError(
            "no ResourceClaim or ResourceClaimTemplate found", where=", ".join(args.claim)
        )
    from cdigen.policies.dra.explanation import refused_at_create, unknown_classes

    refused = refused_at_create(claims, classes) or unknown_classes(claims, classes)
    if refused:  # as the API server: before any device is looked at
        for line in refused:
            print(line, file=sys.stderr)
        return 1
    node = _load(args)
    shares = memory_shares(args)
    views, devices = node_devices(node, args.driver_name, args.mig_strategy, shares)
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
            state.add(allocation.picks, fit.by_key)
    if len(claims) > 1 or state.consumed:
        print()
        for line in _capacity_left(fit, state, len(claims) - failed):
            print(line)
    return 1 if failed else 0


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
    from cdigen.policies.dra.explanation import render_explanation
    from cdigen.policies.graph import build_topology
    from cdigen.sizes import quantity_text

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
        memory = pick.consumed.get(f"{fit.by_key[pick.key].driver}/memory")
        if shares is not None and memory is not None and "memory" not in (capacity or {}):
            lines.append(
                f"note: request {pick.request!r} names no memory: it takes the default share, "
                f"{quantity_text(memory)} of {pick.device} ({shares.described()}; dra serve "
                "--default-share or --shares-per-gpu sets it)"
            )
        if capacity and not fit.by_key[pick.key].allow_multiple:
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
        if device.key in state.exclusive:
            left = "held whole"
        elif device.allow_multiple and device.capacity:
            held = state.consumed.get(device.key, {})
            left = ", ".join(
                f"{name.rpartition('/')[2]} {quantity_text(total - held.get(name, 0))} left of "
                f"{quantity_text(total)}"
                for name, total in sorted(device.capacity.items())
            )
        else:
            left = "free"
        lines.append(f"  {device.name:<{width}}  {left}")
    return lines
