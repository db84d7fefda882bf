"""The ``cdigen dra`` command: ``serve`` runs the kubelet DRA plugin
(:mod:`cdigen.plugin.dra.serve_cli`); ``explain`` and ``check`` are offline claim tools, ``why``
asks a live cluster (:mod:`cdigen.plugin.dra.claims_cli`); ``pods`` asks the kubelet who holds which
GPU (:mod:`cdigen.plugin.dra.pods_cli`). Registering imports nothing heavy."""

from __future__ import annotations

import argparse

from cdigen.cli import usage
from cdigen.plugin.dra.cli_args import DEFAULT_DRIVER

__all__ = ["DEFAULT_DRIVER", "register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``dra`` and its subcommands to ``sub``."""
    dra = sub.add_parser(
        "dra",
        help="serve GPUs to the kubelet through Dynamic Resource Allocation (resource.k8s.io/v1)",
        description="The kubelet DRA plugin: publishes ResourceSlices and prepares claims as "
        "transient CDI specs.",
    )
    dra_sub = dra.add_subparsers(dest="dra_command", metavar="SUBCOMMAND")
    from cdigen.plugin.dra import claims_cli, pods_cli, serve_cli

    serve_cli.register(dra_sub)
    claims_cli.register(dra_sub)
    pods_cli.register(dra_sub)
    dra.set_defaults(func=lambda args: usage(dra))
