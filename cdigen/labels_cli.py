"""The ``labels`` subcommand: the node labels (docs/labels.md) a node source yields."""

from __future__ import annotations

import argparse
import json

from cdigen.constants import GPU_RESOURCE
from cdigen.errors import EXIT_OK, InputError
from cdigen.model import MIG_STRATEGIES

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
        default="none",
        help="the device plugin's MIG strategy (default: none)",
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
    sharing = LabelSharing(
        replicas=args.replicas,
        strategy=args.sharing_strategy if args.replicas > 1 else "none",
        renamed=args.shared_resource != DEFAULT_RESOURCE,
    )
    labels = node_labels(_load(args), mig_strategy=args.mig_strategy, sharing=sharing)
    if args.format == "json":
        sys.stdout.write(json.dumps(labels, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(labels_text(labels))
    sys.stdout.flush()
    return EXIT_OK
