"""``cdigen dra check``: would the scheduler ever allocate these claims on this driver's
devices (:mod:`cdigen.policies.dra.check`)?"""

from __future__ import annotations

import argparse
import sys

from cdigen.memory_shares import memory_shares
from cdigen.plugin.dra.claim_inputs import node_devices, shipped_classes
from cdigen.plugin.dra.cli_args import add_fit_options, dns_subdomain

# The nodes `dra check` fits claims on when no --node is given: whole GPUs, MIG devices,
# NVLink and PCIe machines; a claim passes when it fits one of them.
SAMPLE_NODES = ("builtin:dgx-a100-mig-mixed", "builtin:dgx1-v100", "builtin:rtx4090")


def register_check(dra_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    add_fit_options(
        check,
        driver_help="the driver whose attributes the selectors may name",
        class_note="; classes in FILE count too",
    )
    check.set_defaults(func=_check)


def _check(args: argparse.Namespace) -> int:
    from cdigen.errors import CheckFailed
    from cdigen.policies.dra.check import NodeDevices, Published, check_files
    from cdigen.policies.dra.claim_docs import load_manifests

    dns_subdomain(args.driver_name, "--driver-name")
    class_files = args.classes or [str(p) for p in shipped_classes()]
    classes = load_manifests(class_files)[1]
    from cdigen.discover import load_node

    shares = memory_shares(args)
    nodes = [
        NodeDevices(
            source,
            tuple(node_devices(load_node(source), args.driver_name, args.mig_strategy, shares)[1]),
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
