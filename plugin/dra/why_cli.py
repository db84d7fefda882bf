"""``cdigen dra why``: why a pod's ResourceClaims keep it Pending, or what they got, read from a
live cluster (:mod:`cdigen.plugin.dra.why`)."""

from __future__ import annotations

import argparse
from typing import Any

from cdigen.plugin.dra.cli_args import (
    DEFAULT_DRIVER,
    add_api_options,
    api_timeout,
    dns_subdomain,
)


def register_why(dra_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    why = dra_sub.add_parser(
        "why",
        help="why a pod's ResourceClaims keep it Pending, or what they got (live cluster)",
        description="Read the pod, the ResourceClaims, ResourceSlices and DeviceClasses from the "
        "API server; for a claim not allocated, run the scheduler's first fit (as `dra explain`) "
        "on every node after what other claims hold there; for an allocated one, show its "
        "devices, node and CDI device names. One screen. Exit 1 when the pod or the API server "
        "cannot be read.",
    )
    why.add_argument("pod", metavar="POD", help="the pod's name")
    why.add_argument(
        "-n", "--namespace", default="default", help="the pod's namespace (default: default)"
    )
    add_api_options(why)
    why.add_argument(
        "--driver-name",
        default=DEFAULT_DRIVER,
        help=f"the driver whose CDI device names are shown (default {DEFAULT_DRIVER})",
    )
    why.set_defaults(func=_why)


def _why(args: argparse.Namespace) -> int:
    from cdigen.plugin.agent.kubeapi import api_client
    from cdigen.plugin.dra.why import explain_pod, read_cluster

    dns_subdomain(args.driver_name, "--driver-name")
    dns_subdomain(args.namespace, "--namespace", example="default")
    dns_subdomain(args.pod, "POD", 253, example="trainer-0")
    api_timeout(args.api_timeout)
    client = api_client(args.kubeconfig)  # one client (and one kubeconfig read) for both
    cluster = read_cluster(client, args.namespace, args.pod, timeout_s=args.api_timeout)
    for line in explain_pod(cluster, driver=args.driver_name):
        print(line)
    for line in _stale_lines(args, cluster, client):
        print(line)
    return 0


def _stale_lines(args: argparse.Namespace, cluster: Any, client: Any) -> list[str]:
    """The nodes that still advertise an extended resource the pod asks for and one of the
    driver's DeviceClasses serves (cdigen.plugin.dra.stale), one line each."""
    from cdigen.plugin.dra.kube import KubeApi
    from cdigen.plugin.dra.stale import pod_stale_lines

    api = KubeApi(client, timeout_s=args.api_timeout)
    return pod_stale_lines(
        cluster.pod, cluster.classes, cluster.slices, api.read_node, args.driver_name
    )
