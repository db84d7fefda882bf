"""``cdigen plugin pods`` and ``cdigen dra pods``: the node's table of who holds which GPU.

One subcommand per wing, because each maps the kubelet's answer through its own settings: the
device plugin through the resources its config makes of the node (sharing, MIG strategy,
resource names), DRA through the checkpoint of the claims it prepared (driver name, state dir).
Both print the same table (:func:`plugin.attribution.holdings.table`) or JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cdigen.constants import KUBELET_DIR
from plugin.attribution.podresources import DEFAULT_TIMEOUT_S, socket_path

if TYPE_CHECKING:
    from plugin.attribution.holdings import Holding
    from plugin.attribution.podresources import ContainerResources

DEFAULT_KUBELET_DIR = Path(KUBELET_DIR)
FORMATS = ("table", "json")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pod-resources-socket",
        metavar="PATH",
        default=str(socket_path(DEFAULT_KUBELET_DIR)),
        help="the kubelet's PodResources API (default %(default)s)",
    )
    parser.add_argument(
        "--pod",
        metavar="NAMESPACE/NAME",
        help="only this pod (the API's Get; default: every pod, List)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        default=DEFAULT_TIMEOUT_S,
        help="deadline of the whole call to the kubelet (default %(default)g)",
    )
    parser.add_argument("--format", choices=FORMATS, default="table", help="default table")


def register_plugin(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``plugin pods``."""
    from cdigen.discover.cli import add_node_source

    pods = sub.add_parser(
        "pods",
        help="which pod and container hold which GPU, share or MIG device, and their limits",
        description="Ask the kubelet's PodResources API which device IDs each container got "
        "and map them to GPUs through the resources --config makes of the node.",
    )
    add_node_source(pods, defaults=False)
    pods.add_argument("--config", metavar="FILE", help="the plugin config file serve runs with")
    _common(pods)
    pods.set_defaults(func=_plugin_pods)


def register_dra(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``dra pods``."""
    from cdigen.discover.cli import add_node_source
    from cdigen.model import DRA_MIG_STRATEGIES, DRA_MIG_STRATEGY
    from plugin.dra.cli_args import DEFAULT_DRIVER

    pods = sub.add_parser(
        "pods",
        help="which pod and container hold which GPU, MIG device or claim, and their limits",
        description="Ask the kubelet's PodResources API which ResourceClaims each container "
        "uses and map those this driver prepared (its checkpoint) to GPUs.",
    )
    add_node_source(pods)
    pods.add_argument("--driver-name", default=DEFAULT_DRIVER, help="default %(default)s")
    pods.add_argument(
        "--kubelet-dir", metavar="DIR", default=str(DEFAULT_KUBELET_DIR), help="default %(default)s"
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
    _common(pods)
    pods.set_defaults(func=_dra_pods)


def _containers(args: argparse.Namespace) -> list[ContainerResources]:
    from cdigen.errors import InputError
    from plugin.attribution.podresources import check_timeout, get_resources, list_resources

    timeout = check_timeout(args.timeout)
    socket = Path(args.pod_resources_socket)
    if args.pod is None:
        return list_resources(socket, timeout_s=timeout)
    namespace, sep, name = args.pod.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise InputError(
            f"{args.pod!r} is not NAMESPACE/NAME", where="--pod", hint="e.g. --pod default/trainer"
        )
    return get_resources(socket, namespace, name, timeout_s=timeout)


def _print(args: argparse.Namespace, rows: list[Holding]) -> int:
    from plugin.attribution.holdings import as_json, table

    sys.stdout.write((table(rows) if args.format == "table" else as_json(rows)) + "\n")
    return 0


def _plugin_pods(args: argparse.Namespace) -> int:
    from cdigen.discover import load_node
    from plugin.attribution.wings import plugin_holdings
    from plugin.config import load_config
    from plugin.layout import plan_resources_for

    flags = {"node": args.node, "sysfs_root": args.sysfs_root, "proc_root": args.proc_root}
    config = load_config(args.config, flags=flags)
    node = load_node(  # as plugin serve discovers it (NVML's library under the driver root)
        config.node,
        sysfs_root=config.sysfs_root,
        proc_root=config.proc_root,
        driver_root=config.driver_root,
        host_root=config.host_root,
    )
    resources = plan_resources_for(node, config)
    return _print(args, plugin_holdings(_containers(args), resources))


def _dra_pods(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from cdigen.catalogue import catalogue
    from cdigen.discover import load_node
    from plugin.attribution.wings import dra_holdings
    from plugin.dra.checkpoint import load_checkpoint
    from plugin.dra.cli_args import dns_subdomain
    from plugin.dra.options import DraOptions

    dns_subdomain(args.driver_name, "--driver-name")
    options = DraOptions(
        node_name="-",  # not read: the checkpoint's place depends on the dirs and driver only
        driver=args.driver_name,
        kubelet_dir=Path(args.kubelet_dir),
        state_dir=Path(args.state_dir) if args.state_dir else None,
    )
    if args.cdi_dir:
        options = replace(options, cdi_dir=Path(args.cdi_dir))
    claims = load_checkpoint(options.checkpoint, spec_dir=options.cdi_dir, driver=options.driver)
    node = load_node(args.node, sysfs_root=args.sysfs_root, proc_root=args.proc_root)
    entries = {e.dra_name: e for e in catalogue(node, mig_strategy=args.mig_strategy)}
    return _print(args, dra_holdings(_containers(args), claims, entries))
