"""``cdigen plugin pods``: the node's table of who holds which GPU, share or MIG device, mapped
through the resources the plugin's config makes of the node (sharing, MIG strategy, resource
names). ``cdigen dra pods`` is DRA's (:mod:`cdigen.plugin.dra.pods_cli`); both print the same table
or JSON (:mod:`cdigen.plugin.agent.pods_args`).
"""

from __future__ import annotations

import argparse

from cdigen.plugin.agent.pods_args import add_pods_options


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    add_pods_options(pods)
    pods.set_defaults(func=_plugin_pods)


def _plugin_pods(args: argparse.Namespace) -> int:
    from cdigen.plugin.agent.pods_args import asked_containers, print_holdings
    from cdigen.plugin.deviceplugin.attribution import plugin_holdings
    from cdigen.plugin.deviceplugin.config import load_config
    from cdigen.plugin.deviceplugin.config_report import load_config_node
    from cdigen.plugin.deviceplugin.layout import plan_resources_for

    flags = {"node": args.node, "sysfs_root": args.sysfs_root, "proc_root": args.proc_root}
    config = load_config(args.config, flags=flags)
    node = load_config_node(config)  # as plugin serve discovers it
    resources = plan_resources_for(node, config)
    return print_holdings(args, plugin_holdings(asked_containers(args), resources))
