"""The ``labels`` subcommand: the node labels (docs/labels.md) a node source yields."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from cdigen.constants import GPU_RESOURCE
from cdigen.errors import EXIT_OK, InputError
from cdigen.model import DEVICE_PLUGIN_MIG_STRATEGY, DRA_MIG_STRATEGY, MIG_STRATEGIES

if TYPE_CHECKING:
    from cdigen.model import Node

DEFAULT_RESOURCE = GPU_RESOURCE


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``labels`` to ``sub``."""
    from cdigen.discover.cli import add_node_source

    labels = sub.add_parser(
        "labels",
        help="print the node labels (NVIDIA GPU Feature Discovery's names, and cdigen.dev/...)",
        description="Print the Kubernetes node labels for this node's GPUs, one key=value per "
        "line in key order: NVIDIA GPU Feature Discovery's names and value formats "
        "(nvidia.com/gpu.product, gpu.memory in MiB, ...), so that nodeSelectors written for it "
        "keep working, and cdigen.dev/... for NVLink and NUMA facts. The plugins keep the same "
        "labels current through Node Feature Discovery (--features-file); without NFD, apply "
        "them with kubectl (docs/labels.md). Give the --mig-strategy and sharing the plugin "
        "uses: they change the gpu.* labels.",
        epilog="examples: cdigen labels --node builtin:dgx-a100; "
        'cdigen labels | xargs kubectl label node "$(hostname)" --overwrite',
    )
    add_node_source(labels, driver_root=True)
    labels.add_argument(
        "--mig-strategy",
        choices=MIG_STRATEGIES,
        default=DEVICE_PLUGIN_MIG_STRATEGY,
        help="the plugin's MIG strategy (default: the device plugin's, "
        f"{DEVICE_PLUGIN_MIG_STRATEGY}; for a node served by dra serve give its "
        f"--mig-strategy, by default {DRA_MIG_STRATEGY})",
    )
    labels.add_argument(
        "--replicas",
        type=int,
        default=1,
        metavar="N",
        help="devices the plugin advertises per GPU when it shares them (default: 1, not shared)",
    )
    labels.add_argument(
        "--sharing-strategy",
        choices=["time-slicing", "mps"],
        default="time-slicing",
        help="how the replicas share a GPU (default: time-slicing)",
    )
    labels.add_argument(
        "--shared-resource",
        default=DEFAULT_RESOURCE,
        metavar="NAME",
        help="the resource the replicas go out as; any other name than nvidia.com/gpu drops "
        "the -SHARED suffix of gpu.product, as NVIDIA's renamed resources do "
        "(default: nvidia.com/gpu)",
    )
    from cdigen.memory_shares import add_share_options

    # the DRA plugin's memory shares: its cdigen.dev/dra.* labels (plugin/dra/labels.py)
    add_share_options(labels.add_argument_group("memory shares of cdigen dra serve"))
    labels.add_argument(
        "--format",
        choices=["text", "json"],
        default="text",
        help="text: key=value lines; json: one object (default: text)",
    )
    labels.set_defaults(func=run_labels)


def run_labels(args: argparse.Namespace) -> int:
    """``cdigen labels``: print the node labels."""
    import sys

    from cdigen.discover.cli import _load  # discover's loader: notes and GPU errors to stderr
    from cdigen.labels import LabelSharing, labels_text, node_labels

    if not 1 <= args.replicas <= 1024:
        raise InputError(
            f"--replicas {args.replicas} is out of range",
            hint="give the replicas per GPU of the plugin's sharing config, 1 to 1024",
        )
    if args.sharing_strategy == "mps" and args.replicas == 1:
        raise InputError(
            "--sharing-strategy mps needs --replicas N (N > 1): without replicas the GPUs are "
            "not shared and the strategy would be ignored",
            where="--sharing-strategy",
            hint="give the replicas per GPU of the plugin's MPS config, e.g. --replicas 4",
        )
    sharing = LabelSharing(
        replicas=args.replicas,
        strategy=args.sharing_strategy if args.replicas > 1 else "none",
        renamed=args.shared_resource != DEFAULT_RESOURCE,
    )
    node = _load(args)
    if args.mig_strategy == "none" and any(g.mig_enabled for g in node.gpus):
        print(
            "cdigen: warning: MIG is enabled on some GPUs, which the plugin does not advertise "
            "under --mig-strategy none (labelled nvidia.com/mig.strategy=none); give the "
            "plugin's strategy: --mig-strategy single or mixed",
            file=sys.stderr,
        )
    labels = node_labels(node, mig_strategy=args.mig_strategy, sharing=sharing)
    labels.update(_dra_share_labels(args, node))
    if args.format == "json":
        sys.stdout.write(json.dumps(labels, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(labels_text(labels))
    sys.stdout.flush()
    return EXIT_OK


def _dra_share_labels(args: argparse.Namespace, node: Node) -> dict[str, str]:
    """The labels of ``dra serve``'s memory shares (``--memory-step`` and what a claim naming
    no memory takes), as its feature file has them; none without ``--memory-step``."""
    from cdigen.catalogue import catalogue
    from cdigen.labels import OURS
    from cdigen.memory_shares import check_shares, memory_shares

    shares = memory_shares(args)
    if shares is None or not node.gpus:
        return {}
    whole = {
        e.dra_name: e.gpu.memory_bytes
        for e in catalogue(node, mig_strategy=args.mig_strategy)
        if e.kind == "gpu"
    }
    check_shares(shares, whole)
    return {OURS + k: v for k, v in shares.labels(whole).items()}
