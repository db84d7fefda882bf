"""What ``cdigen plugin pods`` and ``cdigen dra pods`` share: the options that reach the
kubelet's PodResources API, the one call to it, and the table or JSON they print.

Each wing registers its own ``pods`` command (:mod:`cdigen.plugin.deviceplugin.pods_cli`,
:mod:`cdigen.plugin.dra.pods_cli`), because each maps the kubelet's answer through its own settings.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cdigen.constants import KUBELET_DIR
from cdigen.plugin.agent.podresources import DEFAULT_TIMEOUT_S, socket_path

if TYPE_CHECKING:
    from cdigen.plugin.agent.holdings import Holding
    from cdigen.plugin.agent.podresources import ContainerResources

FORMATS = ("table", "json")


def add_pods_options(parser: argparse.ArgumentParser) -> None:
    """Add the socket, ``--pod``, ``--timeout`` and ``--format`` options to a ``pods`` command."""
    parser.add_argument(
        "--pod-resources-socket",
        metavar="PATH",
        default=str(socket_path(Path(KUBELET_DIR))),
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


def asked_containers(args: argparse.Namespace) -> list[ContainerResources]:
    """The containers the kubelet reports: every pod's, or ``--pod``'s."""
    from cdigen.errors import InputError
    from cdigen.plugin.agent.podresources import check_timeout, get_resources, list_resources

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


def print_holdings(args: argparse.Namespace, rows: list[Holding]) -> int:
    """Print ``rows`` in ``--format``; the command's exit status."""
    from cdigen.plugin.agent.holdings import as_json, table

    sys.stdout.write((table(rows) if args.format == "table" else as_json(rows)) + "\n")
    return 0
