"""``cdigen dra pods``: the node's table of who holds which GPU, MIG device or claim, mapped
through the checkpoint of the claims this driver prepared (driver name, state dir).
``cdigen plugin pods`` is the device plugin's (:mod:`cdigen.plugin.deviceplugin.pods_cli`); both
print the same table or JSON (:mod:`cdigen.plugin.agent.pods_args`).
"""

from __future__ import annotations

import argparse

from cdigen.constants import KUBELET_DIR
from cdigen.plugin.agent.pods_args import add_pods_options
from cdigen.plugin.dra.cli_args import DEFAULT_DRIVER


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``dra pods``."""
    from cdigen.discover.cli import add_node_source
    from cdigen.model import DRA_MIG_STRATEGIES, DRA_MIG_STRATEGY

    pods = sub.add_parser(
        "pods",
        help="which pod and container hold which GPU, MIG device or claim, and their limits",
        description="Ask the kubelet's PodResources API which ResourceClaims each container "
        "uses and map those this driver prepared (its checkpoint) to GPUs.",
    )
    add_node_source(pods)
    pods.add_argument("--driver-name", default=DEFAULT_DRIVER, help="default %(default)s")
    pods.add_argument(
        "--kubelet-dir", metavar="DIR", default=KUBELET_DIR, help="default %(default)s"
    )
    pods.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where dra serve keeps its checkpoint (default <kubelet-dir>/plugins/<driver>)",
    )
    pods.add_argument(
        "--cdi-dir", metavar="DIR", help="dra serve's --cdi-dir (default as dra serve's)"
    )
    pods.add_argument(
        "--mig-strategy",
        choices=DRA_MIG_STRATEGIES,
        default=DRA_MIG_STRATEGY,
        help="as dra serve's",
    )
    add_pods_options(pods)
    pods.set_defaults(func=_dra_pods)


def _dra_pods(args: argparse.Namespace) -> int:
    from dataclasses import replace
    from pathlib import Path

    from cdigen.catalogue import catalogue
    from cdigen.discover import load_node
    from cdigen.plugin.agent.pods_args import asked_containers, print_holdings
    from cdigen.plugin.dra.attribution import dra_holdings
    from cdigen.plugin.dra.checkpoint import load_checkpoint
    from cdigen.plugin.dra.cli_args import dns_subdomain
    from cdigen.plugin.dra.options import DraOptions

    dns_subdomain(args.driver_name, "--driver-name")
    options = DraOptions(
        node_name="-",  # not read: the checkpoint's place depends on the dirs and driver only
        driver=args.driver_name,
        kubelet_dir=Path(args.kubelet_dir),
        state_dir=Path(args.state_dir) if args.state_dir else None,
    )
    if args.cdi_dir:
        options = replace(options, cdi_dir=Path(args.cdi_dir))
    claims = load_checkpoint(
        options.checkpoint, spec_dir=options.cdi_dir, driver=options.driver
    ).claims
    node = load_node(args.node, sysfs_root=args.sysfs_root, proc_root=args.proc_root)
    entries = {e.dra_name: e for e in catalogue(node, mig_strategy=args.mig_strategy)}
    return print_holdings(args, dra_holdings(asked_containers(args), claims, entries))
