"""The ``cdigen dra`` subcommands: ``serve`` runs the kubelet DRA plugin."""

from __future__ import annotations

import argparse
import os
import sys

from cdigen.discover.cli import add_node_source
from plugin.defaults import LOG_FORMATS, LOG_LEVELS, MIG_STRATEGIES

DEFAULT_DRIVER = "gpu.cdigen.dev"  # plugin.dra.serve.DEFAULT_DRIVER; kept here so --help is cheap


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``dra serve`` to ``sub``."""
    dra = sub.add_parser(
        "dra",
        help="serve GPUs to the kubelet through Dynamic Resource Allocation (resource.k8s.io/v1)",
        description="The kubelet DRA plugin: publishes ResourceSlices and prepares claims as "
        "transient CDI specs.",
    )
    dra_sub = dra.add_subparsers(dest="dra_command", metavar="SUBCOMMAND")
    serve = dra_sub.add_parser(
        "serve",
        help="run the DRA plugin until SIGTERM/SIGINT",
        description="Serve dra/v1 and dra/v1beta1 on <kubelet-dir>/plugins/<driver>/dra.sock, "
        "register through <kubelet-dir>/plugins_registry/<driver>-reg.sock, and publish this "
        "node's ResourceSlices.",
    )
    add_node_source(serve)
    serve.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="this node's Kubernetes name (default: $NODE_NAME)",
    )
    serve.add_argument(
        "--driver-name",
        default=DEFAULT_DRIVER,
        help=f"the DRA driver name; attributes live under it (default {DEFAULT_DRIVER})",
    )
    serve.add_argument("--kubelet-dir", default="/var/lib/kubelet", metavar="DIR")
    serve.add_argument(
        "--cdi-dir",
        default="/var/run/cdi",
        metavar="DIR",
        help="where the per-claim CDI specs go (default /var/run/cdi)",
    )
    serve.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where the checkpoint of prepared claims lives (default "
        "<kubelet-dir>/plugins/<driver>)",
    )
    serve.add_argument("--kubeconfig", metavar="FILE", help="default: the in-cluster config")
    serve.add_argument("--mig-strategy", choices=MIG_STRATEGIES, default="mixed")
    serve.add_argument("--driver-root", default="/", metavar="DIR")
    serve.add_argument("--dev-root", default="/", metavar="DIR")
    serve.add_argument("--host-root", default="/", metavar="DIR")
    serve.add_argument(
        "--delete-slices-on-exit",
        action="store_true",
        help="delete this node's ResourceSlices on SIGTERM (an uninstall, not an upgrade)",
    )
    serve.add_argument("--log-level", dest="dra_log_level", choices=LOG_LEVELS, default="info")
    serve.add_argument("--log-format", dest="dra_log_format", choices=LOG_FORMATS, default="text")
    serve.set_defaults(func=_serve)
    dra.set_defaults(func=lambda args: _usage(dra))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cdigen.discover import load_node
    from cdigen.errors import InputError
    from plugin.cli import setup_logging
    from plugin.dra.kube import KubeApi, api_client
    from plugin.dra.serve import DraOptions, DraPlugin, serve_until_signalled
    from plugin.serve import open_nvml

    if not args.node_name:
        raise InputError(
            "no node name",
            where="--node-name",
            hint="pass --node-name or set NODE_NAME (the DaemonSet sets it from spec.nodeName)",
        )
    setup_logging(args.dra_log_level, args.dra_log_format)
    options = DraOptions(
        node_name=args.node_name,
        driver=args.driver_name,
        kubelet_dir=Path(args.kubelet_dir),
        cdi_dir=Path(args.cdi_dir),
        state_dir=Path(args.state_dir) if args.state_dir else None,
        mig_strategy=args.mig_strategy,
        driver_root=args.driver_root,
        dev_root=args.dev_root,
        sysfs_root=args.sysfs_root,
        host_root=args.host_root,
        delete_slices_on_exit=args.delete_slices_on_exit,
    )
    nvml = open_nvml(args.node)
    node = load_node(
        args.node, sysfs_root=args.sysfs_root, proc_root=args.proc_root, nvml_module=nvml
    )
    api = KubeApi(api_client(args.kubeconfig))
    plugin = DraPlugin(
        options, node, slices=api, claims=api, owner=api.node_owner(options.node_name), nvml=nvml
    )
    return serve_until_signalled(plugin)
