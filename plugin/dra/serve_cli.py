"""``cdigen dra serve``: its options, their checks, and the plugin they start."""

from __future__ import annotations

import argparse
import logging
import os
from typing import TYPE_CHECKING

from cdigen.cdi.specdir import DYNAMIC_SPEC_DIR
from cdigen.constants import KUBELET_DIR
from cdigen.discover.cli import add_node_source
from cdigen.discover.numa import NUMA_FORMS
from cdigen.logs import DEFAULT_LEVEL
from cdigen.memory_shares import add_share_options, memory_shares
from cdigen.model import DRA_MIG_STRATEGIES, DRA_MIG_STRATEGY
from cdigen.plugin.agent.logs import LOG_FORMATS
from cdigen.plugin.agent.mps import LIMIT_KEYS
from cdigen.plugin.agent.xid import add_xid_options, xid_flags
from cdigen.plugin.dra.cli_args import (
    DEFAULT_DRIVER,
    add_api_options,
    api_timeout,
    dns_subdomain,
)

if TYPE_CHECKING:
    from cdigen.plugin.dra.options import DraOptions


def register(dra_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``dra serve`` to ``dra_sub``.

    Long: one flat list of the command's options, read top to bottom as ``--help`` prints them.
    """
    serve = dra_sub.add_parser(
        "serve",
        help="run the DRA plugin until SIGTERM/SIGINT",
        description="Serve dra/v1 and dra/v1beta1 on <kubelet-dir>/plugins/<driver>/dra.sock, "
        "register through <kubelet-dir>/plugins_registry/<driver>-reg.sock, and publish this "
        "node's ResourceSlices.",
        epilog="examples: cdigen dra serve --node-name gpu-node-1 (NVML, the kubelet in "
        "/var/lib/kubelet); cdigen dra serve --node-name gpu-node-1 --memory-step 1Gi (GPU "
        "memory as consumable capacity, for claims that ask for memory)",
    )
    add_node_source(serve, driver_root=True)  # --node, --sysfs/proc-root, --driver/host-root
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
    serve.add_argument(
        "--kubelet-dir",
        default=KUBELET_DIR,
        metavar="DIR",
        help="the kubelet's root, holding plugins/ and plugins_registry/ "
        "(default /var/lib/kubelet)",
    )
    serve.add_argument(
        "--cdi-dir",
        default=str(DYNAMIC_SPEC_DIR),
        metavar="DIR",
        help=f"where the per-claim CDI specs go (default {DYNAMIC_SPEC_DIR})",
    )
    serve.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where the checkpoint of prepared claims lives (default "
        "<kubelet-dir>/plugins/<driver>)",
    )
    add_api_options(serve)
    serve.add_argument(
        "--features-file",
        metavar="PATH",
        help="keep the node labels (docs/labels.md) in this Node Feature Discovery feature file, "
        "e.g. /etc/kubernetes/node-feature-discovery/features.d/cdigen-dra-plugin (default off)",
    )
    serve.add_argument(
        "--health-address",
        metavar="HOST:PORT",
        help="serve /healthz here: 200 once registered with the kubelet, else 503, with what "
        "is pending (e.g. 127.0.0.1:9466; default off)",
    )
    serve.add_argument(
        "--mig-strategy",
        choices=DRA_MIG_STRATEGIES,
        default=DRA_MIG_STRATEGY,
        help="mixed or single: a MIG-enabled GPU is published as its MIG devices; none: "
        "whole GPUs only; dynamic: every MIG placement, made at prepare (needs --node nvml; "
        f"docs/mig.md) (default {DRA_MIG_STRATEGY}: a claim picks MIG devices by attribute, "
        "with no resource name per profile, so offering those that exist costs nothing; "
        "the device plugin defaults to none, which changes no resource name)",
    )
    serve.add_argument(
        "--dev-root",
        default="/",
        metavar="DIR",
        help="where the device nodes are, as a host path (default: /)",
    )
    serve.add_argument(
        "--capability-devices",
        metavar="CAPS",
        help="driver capabilities (video, graphics, display; or all) that claims may ask for "
        "beyond compute and utility through a GpuConfig (docs/dra.md); default: none",
    )
    serve.add_argument(
        "--numa-node-attribute",
        choices=NUMA_FORMS,
        default="scalar",
        help="resource.kubernetes.io/numaNode as one int (scalar, the default) or as the list "
        "of the GPU's NUMA node and its same-socket nodes at the least SLIT distance, read "
        "under --sysfs-root (list: only where the cluster has DRAListTypeAttributes on; "
        "KEP-6072)",
    )
    serve.add_argument(
        "--delete-slices-on-exit",
        action="store_true",
        help="delete this node's ResourceSlices on SIGTERM (an uninstall, not an upgrade)",
    )
    sharing = serve.add_argument_group("sharing (docs/dra-sharing.md)")
    add_share_options(sharing)  # --memory-step, --default-share, --shares-per-gpu
    sharing.add_argument(
        "--replicas",
        type=int,
        metavar="N",
        help="a whole-GPU claim (one claim shared by several pods) gets 1/N of the memory "
        "as its MPS limit; the fallback without consumable capacity",
    )
    sharing.add_argument(
        "--mps-pipe-dir",
        metavar="DIR",
        help="the MPS control daemon's pipe directory, mounted into limited claims; without "
        "it the limits are advisory",
    )
    sharing.add_argument(
        "--mps-shm-dir",
        metavar="DIR",
        help="the node directory the MPS control daemon has at /dev/shm, mounted at /dev/shm "
        "in limited claims (with --mps-pipe-dir), so that pods need no hostIPC",
    )
    sharing.add_argument(
        "--mps-thread-percentage",
        metavar="N|proportional",
        help="also set CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: a fixed 1-100, or proportional to "
        "the memory share",
    )
    sharing.add_argument(
        "--mps-limit-key",
        choices=LIMIT_KEYS,
        default="index",
        help="key CUDA_MPS_PINNED_DEVICE_MEM_LIMIT by CUDA ordinal (default; MPS applies it) "
        "or by GPU UUID",
    )
    serve.add_argument(
        "--taint-xid",
        action="append",
        metavar="XID=EFFECT",
        help="taint a device with EFFECT (NoSchedule, NoExecute, or None: informational, "
        "Kubernetes 1.35+) on this Xid; repeatable; "
        "replaces the default list (48, 64, 79, 94, 95 NoSchedule; NoExecute also evicts); "
        "--taint-xid none taints on no Xid",
    )
    add_xid_options(serve, defaults="default")  # the device plugin's health.* config keys
    serve.add_argument(
        "--log-format",
        dest="dra_log_format",
        choices=LOG_FORMATS,
        default="text",
        help="text lines, or one JSON object a line for a log collector (default text)",
    )
    serve.set_defaults(func=_serve)


def _sharing_options(args: argparse.Namespace) -> dict[str, object]:
    from cdigen.errors import InputError
    from cdigen.plugin.agent.mps import PIPE_HINT, SHM_HINT, shm_directory_problem
    from cdigen.plugin.dra.mps import MpsSettings
    from cdigen.shares import MAX_REPLICAS

    threads: int | None = None
    text = args.mps_thread_percentage
    if text is not None:
        if text == "proportional":
            threads = 0
        elif text.isdecimal() and 1 <= int(text) <= 100:
            threads = int(text)
        else:
            raise InputError(
                f"{text!r} is not a percentage",
                where="--mps-thread-percentage",
                hint="use 1-100 or proportional",
            )
    if args.replicas is not None and not 1 <= args.replicas <= MAX_REPLICAS:
        raise InputError(f"{args.replicas} is not in 1-{MAX_REPLICAS}", where="--replicas")
    if args.mps_pipe_dir is not None and not args.mps_pipe_dir.startswith("/"):
        raise InputError(
            f"{args.mps_pipe_dir!r} is not an absolute path",
            where="--mps-pipe-dir",
            hint=PIPE_HINT,
        )
    if args.mps_shm_dir is not None:
        problem = shm_directory_problem(args.mps_shm_dir, args.mps_pipe_dir)
        if problem:
            raise InputError(problem, where="--mps-shm-dir", hint=SHM_HINT)
    taints = _taint_xids(args.taint_xid)
    out: dict[str, object] = {
        "mps": MpsSettings(
            pipe_dir=args.mps_pipe_dir,
            shm_dir=args.mps_shm_dir,
            thread_percentage=threads,
            replicas=args.replicas,
            limit_key=args.mps_limit_key,
        ),
        "memory_shares": memory_shares(args),
    }
    if taints is not None:
        out["taint_xids"] = taints
    return out


def _taint_xids(items: list[str] | None) -> dict[int, str] | None:
    from cdigen.errors import InputError
    from cdigen.policies.dra.slice_devices import TAINT_EFFECTS

    if not items:
        return None
    if items == ["none"]:
        return {}
    out: dict[int, str] = {}
    for item in items:
        xid, _, effect = item.partition("=")
        if not xid.isdecimal() or effect not in TAINT_EFFECTS:
            raise InputError(
                f"{item!r} is not XID=EFFECT",
                where="--taint-xid",
                hint=f"e.g. 79=NoExecute; effects: {', '.join(TAINT_EFFECTS)}",
            )
        out[int(xid)] = effect
    return out


def _serve(args: argparse.Namespace) -> int:
    from cdigen.cdi.checks import check_host
    from cdigen.cdi.hostfs import HostFS
    from cdigen.discover import from_hardware, load_node
    from cdigen.discover.nvml_library import start_nvml
    from cdigen.nodelock import GpuServerLock
    from cdigen.plugin.agent.kubeapi import api_client
    from cdigen.plugin.agent.logs import setup_logging
    from cdigen.plugin.dra.healthz import serve_until_signalled
    from cdigen.plugin.dra.kube import KubeApi
    from cdigen.plugin.dra.kubelet_plugin import DraPlugin
    from cdigen.plugin.dra.stale import warn_if_stale

    _check_serve_args(args)
    setup_logging(args.log_level or DEFAULT_LEVEL, args.dra_log_format)  # cdigen's --log-level
    options = _dra_options(args)
    nvml = None
    if from_hardware(args.node):  # kept open for Xid health; the library from the driver root
        import pynvml

        nvml = pynvml
        start_nvml(nvml, driver_root=args.driver_root, host_root=args.host_root)
    node = load_node(
        args.node,
        sysfs_root=args.sysfs_root,
        proc_root=args.proc_root,
        nvml_module=nvml,
        driver_root=args.driver_root,
        host_root=args.host_root,
    )
    api = KubeApi(api_client(args.kubeconfig), timeout_s=args.api_timeout)
    # the guards of `cdigen generate`, for the claims' specs: roots, the driver's libraries
    warning = check_host(
        node,
        source=args.node,
        driver_root=args.driver_root,
        dev_root=args.dev_root,
        sysfs_root=args.sysfs_root,
        fs=HostFS(args.host_root),
    )
    if warning:
        logging.getLogger("cdigen.plugin.dra.kubelet_plugin").warning("%s", warning)
    # the device plugin must not serve this node's GPUs too: held while serving
    with GpuServerLock(options.kubelet_dir, "cdigen dra serve"):
        plugin = DraPlugin(
            options,
            node,
            slices=api,
            claims=api,
            node_owner=api.node_owner,
            nvml=nvml,
            stale_check=lambda: warn_if_stale(
                api.read_node, api.list_device_classes, options.node_name, options.driver
            ),
        )
        return serve_until_signalled(plugin, args.health_address)


def _check_serve_args(args: argparse.Namespace) -> None:
    """InputError for the first option that cannot serve: names, timeout, address, strategy."""
    from cdigen.discover import from_hardware
    from cdigen.errors import InputError

    if not args.node_name:
        raise InputError(
            "no node name",
            where="--node-name",
            hint="pass --node-name or set NODE_NAME (the DaemonSet sets it from spec.nodeName)",
        )
    dns_subdomain(args.node_name, "--node-name", 253)
    dns_subdomain(args.driver_name, "--driver-name")
    api_timeout(args.api_timeout)
    if args.health_address:
        from cdigen.plugin.agent.sockets import parse_address

        try:
            parse_address(args.health_address)
        except InputError:
            raise InputError(
                f"{args.health_address!r} is not HOST:PORT",
                where="--health-address",
                hint="e.g. 127.0.0.1:9466, or :0 for any free port",
            ) from None
    if args.mig_strategy == "dynamic" and not from_hardware(args.node):
        raise InputError(
            f"dynamic makes MIG devices through NVML, and --node is {args.node!r}",
            where="--mig-strategy",
            hint="pass --node nvml (the default) on the GPU node, or another strategy",
        )


def _dra_options(args: argparse.Namespace) -> DraOptions:
    from pathlib import Path

    from cdigen.cdi.capabilities import parse_capabilities
    from cdigen.plugin.dra.options import DraOptions

    return DraOptions(
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
        proc_root=args.proc_root,
        delete_slices_on_exit=args.delete_slices_on_exit,
        numa_form=args.numa_node_attribute,
        features_file=Path(args.features_file) if args.features_file else None,
        capability_devices=parse_capabilities(args.capability_devices, "--capability-devices")
        if args.capability_devices is not None
        else (),
        **_sharing_options(args),  # type: ignore[arg-type]
        **xid_flags(args),  # ignored_xids, recover_after_s: those given
    )
