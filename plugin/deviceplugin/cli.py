"""The ``cdigen plugin`` subcommands: ``serve`` runs the kubelet device plugin."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdigen.cli import usage
from cdigen.discover.cli import add_node_source
from cdigen.model import DEVICE_PLUGIN_MIG_STRATEGY, MIG_STRATEGIES
from cdigen.plugin.agent.logs import LOG_FORMATS, setup_logging
from cdigen.plugin.agent.xid import add_xid_options, xid_flags
from cdigen.plugin.deviceplugin.defaults import DEFAULT_PLUGIN_DIR, STRATEGIES

if TYPE_CHECKING:
    from cdigen.nodelock import GpuServerLock
    from cdigen.plugin.deviceplugin.config import PluginConfig
    from cdigen.plugin.deviceplugin.node_config import NamedConfigs, NodeLabels


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``plugin serve`` (and ``plugin config``) to ``sub``.

    Long: one flat list of the serve command's options, read top to bottom.
    """
    plugin = sub.add_parser(
        "plugin",
        help="serve GPUs to the kubelet (device plugin API v1beta1)",
        description="The kubelet device plugin: advertises GPUs and hands them out as CDI names.",
    )
    plugin_sub = plugin.add_subparsers(dest="plugin_command", metavar="SUBCOMMAND")
    serve = plugin_sub.add_parser(
        "serve",
        help="run the device plugin until SIGTERM/SIGINT (SIGHUP reloads policies)",
        description=(
            "Serve one gRPC DevicePlugin per resource on <plugin-dir>/cdigen-<resource>.sock and "
            "register with <plugin-dir>/kubelet.sock. Settings: flag > CDIGEN_* environment > "
            "--config file > default."
        ),
        epilog="examples: cdigen plugin serve (NVML, the kubelet's /var/lib/kubelet/device-"
        "plugins); cdigen plugin serve --node builtin:rtx4090 --config sharing.yaml "
        "--spec-dir /tmp/cdi --plugin-dir /tmp/dp (docs/sharing.md)",
    )
    add_node_source(serve, defaults=False)
    serve.add_argument("--config", metavar="FILE", help="plugin config file (YAML)")
    serve.add_argument(
        "--config-dir",
        metavar="DIR",
        help="named configs, one file each (a ConfigMap mounted there); the node label "
        "--config-label chooses one, switched live (instead of --config; needs --node-name)",
    )
    serve.add_argument(
        "--default-config",
        metavar="NAME",
        help="the config of a node without the label (default: the only one, else 'default')",
    )
    serve.add_argument(
        "--config-label",
        metavar="KEY",
        default="cdigen.dev/device-plugin.config",
        help="node label naming the config (default %(default)s; NVIDIA's "
        "nvidia.com/device-plugin.config is read when it is absent)",
    )
    serve.add_argument(
        "--config-poll-interval",
        type=float,
        metavar="SECONDS",
        default=5.0,
        help="how often the node label and the chosen file are checked (default 5)",
    )
    serve.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="this node's Kubernetes name, for --config-dir (default: $NODE_NAME)",
    )
    serve.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="for --config-dir: how to reach the API server (default: the in-cluster config)",
    )
    serve.add_argument(
        "--plugin-dir",
        metavar="DIR",
        help=f"kubelet device plugin dir (default {DEFAULT_PLUGIN_DIR})",
    )
    serve.add_argument(
        "--spec-dir",
        metavar="DIR",
        action="append",
        help="CDI spec dir to check names against (repeatable; default /etc/cdi, /var/run/cdi)",
    )
    serve.add_argument("--policy-dir", metavar="DIR", help="directory of allocation policy files")
    serve.add_argument("--resource", metavar="NAME", help="resource name (default nvidia.com/gpu)")
    serve.add_argument(
        "--cdi-kind", metavar="VENDOR/CLASS", help="CDI kind (default nvidia.com/gpu)"
    )
    serve.add_argument("--device-list-strategy", choices=STRATEGIES, help="default: cdi-cri")
    serve.add_argument(
        "--mig-strategy",
        choices=MIG_STRATEGIES,
        help="none: whole GPUs; single: MIG devices as the GPU resource; mixed: one resource "
        f"per profile, nvidia.com/mig-<profile> (default {DEVICE_PLUGIN_MIG_STRATEGY}, as "
        "NVIDIA's device plugin: the others change the resource names pods ask for; dra serve "
        "defaults to mixed, since claims pick MIG devices by attribute)",
    )
    serve.add_argument(
        "--generate-specs",
        action="store_const",
        const=True,
        help="write the CDI spec into the first --spec-dir at start and on every new MIG layout",
    )
    serve.add_argument(
        "--driver-root",
        metavar="DIR",
        help="where the driver is installed (e.g. /run/nvidia/driver): NVML's library is loaded "
        "from there first, and --generate-specs mounts its files (default /)",
    )
    serve.add_argument("--dev-root", metavar="DIR", help="device-node root for --generate-specs")
    serve.add_argument(
        "--host-root",
        metavar="DIR",
        help="where the host's / is mounted (e.g. /host): --driver-root and --dev-root are host "
        "paths under it, as for `cdigen generate --host-root`",
    )
    serve.add_argument(
        "--health-poll-interval",
        type=float,
        metavar="SECONDS",
        help="how often node file, spec dirs and NVML are checked (default 0.5)",
    )
    add_xid_options(serve, defaults="default: the config file's, else")  # as dra serve's
    serve.add_argument("--log-format", choices=LOG_FORMATS, help="log line format (default text)")
    serve.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        help="serve Prometheus /metrics and /healthz here (e.g. 127.0.0.1:9465; default off)",
    )
    serve.add_argument(
        "--record-requests",
        metavar="FILE",
        help="append every GetPreferredAllocation request of the kubelet to FILE, one JSON "
        "object a line, as 'cdigen policy replay --requests' reads them (stops at 64 MiB)",
    )
    serve.add_argument(
        "--features-file",
        metavar="PATH",
        help="keep the node labels (docs/labels.md) in this Node Feature Discovery feature file, "
        "e.g. /etc/kubernetes/node-feature-discovery/features.d/cdigen (default off)",
    )
    serve.set_defaults(func=_serve)
    from cdigen.plugin.deviceplugin import config_cli

    config_cli.register(plugin_sub)
    from cdigen.plugin.deviceplugin import pods_cli

    pods_cli.register(plugin_sub)
    plugin.set_defaults(func=lambda args: usage(plugin))


def _serve(args: argparse.Namespace) -> int:
    from cdigen.errors import InputError
    from cdigen.plugin.agent.sockets import make_plugin_dir
    from cdigen.plugin.deviceplugin.config import load_config
    from cdigen.plugin.deviceplugin.runner import Plugin, open_nvml, serve_until_signalled

    flags = {
        "node": args.node,
        "sysfs_root": args.sysfs_root,
        "proc_root": args.proc_root,
        "plugin_dir": args.plugin_dir,
        "spec_dirs": args.spec_dir,
        "policy_dir": args.policy_dir,
        "resource": args.resource,
        "cdi_kind": args.cdi_kind,
        "device_list_strategy": args.device_list_strategy,
        "health_poll_interval": args.health_poll_interval,
        **xid_flags(args),  # ignored_xids, recover_after_s: those given
        "log_level": args.log_level,  # cdigen's --log-level; None: the config's, else info
        "log_format": args.log_format,
        "metrics_address": args.metrics_address,
        "mig_strategy": args.mig_strategy,
        "generate_specs": args.generate_specs,
        "driver_root": args.driver_root,
        "dev_root": args.dev_root,
        "host_root": args.host_root,
        "features_file": args.features_file,
    }
    for flag, value in (
        ("--plugin-dir", args.plugin_dir),
        ("--policy-dir", args.policy_dir),
        ("--features-file", args.features_file),
        *(("--spec-dir", d) for d in args.spec_dir or ()),
    ):
        if value == "":  # Path("") would be the current directory
            raise InputError(
                "the path is empty", where=flag, hint="give a directory, or leave the flag out"
            )
    if args.config_dir is not None:
        return _serve_named_configs(args, flags)
    for flag, value in (
        ("--kubeconfig", args.kubeconfig),
        ("--default-config", args.default_config),
    ):
        if value is not None:
            raise InputError(
                "only read with --config-dir (named configs chosen by node label)",
                where=f"{flag}: {value}",
                hint=f"add --config-dir DIR, or leave {flag} out",
            )
    config = load_config(args.config, flags=flags)
    make_plugin_dir(config.plugin_dir)  # a bad one is the only output, before start-up's logs
    setup_logging(config.log_level, config.log_format)
    plugin = Plugin(
        config,
        nvml=open_nvml(config.node, config.driver_root, config.host_root),
        record_requests=args.record_requests,
    )
    with gpu_server_lock(config.plugin_dir):  # before anything is served or written
        return serve_until_signalled(plugin)


def gpu_server_lock(plugin_dir: Path) -> GpuServerLock:
    """Held while serving: refuses to serve where ``cdigen dra serve`` serves this node's GPUs
    (cdigen.nodelock); the kubelet's dir is the plugin dir's parent
    (/var/lib/kubelet/device-plugins)."""
    from cdigen.nodelock import GpuServerLock

    return GpuServerLock(plugin_dir.parent, "cdigen plugin serve")


def _serve_named_configs(args: argparse.Namespace, flags: dict[str, Any]) -> int:
    """``plugin serve --config-dir``: the node label's config, switched live."""
    from pathlib import Path

    from cdigen.errors import InputError
    from cdigen.plugin.agent.config_file import read_config_file
    from cdigen.plugin.agent.kubeapi import api_client
    from cdigen.plugin.agent.sockets import make_plugin_dir
    from cdigen.plugin.deviceplugin.config import load_config
    from cdigen.plugin.deviceplugin.node_config import NamedConfigs, NodeLabels

    if args.config is not None:
        raise InputError(
            "--config and --config-dir both given",
            where="plugin serve",
            hint="use --config for one config, --config-dir for named configs chosen by label",
        )
    if not args.node_name:
        raise InputError(
            "no node name: --config-dir reads this node's labels",
            where="--node-name",
            hint="pass --node-name or set NODE_NAME (the DaemonSet sets it from spec.nodeName)",
        )
    if not 0 < args.config_poll_interval <= 3600:
        raise InputError(
            f"expected seconds in (0, 3600], got {args.config_poll_interval}",
            where="--config-poll-interval",
        )
    configs = NamedConfigs.open(Path(args.config_dir), args.default_config, args.config_label)

    def load(path: Path, content: bytes) -> PluginConfig:
        return load_config(path, flags=flags, content=content)

    default_path = configs.path(configs.default)
    assert default_path is not None
    # a bad default is one line and exit 2, before anything starts
    first = load(default_path, read_config_file(configs.directory, default_path))
    labels = NodeLabels(api_client(args.kubeconfig), args.node_name)
    make_plugin_dir(first.plugin_dir)
    with gpu_server_lock(first.plugin_dir):
        return _serve_switching(args, first, configs, labels, load)


def _serve_switching(
    args: argparse.Namespace,
    first: PluginConfig,
    configs: NamedConfigs,
    labels: NodeLabels,
    load: Callable[[Path, bytes], PluginConfig],
) -> int:
    """Serve the named configs (the lock taken)."""
    from cdigen.plugin.deviceplugin.node_config import ConfigSwitcher
    from cdigen.plugin.deviceplugin.runner import Plugin, open_nvml, serve_until_signalled

    setup_logging(first.log_level, first.log_format)
    # NVML once for the process: every named config serves the same node
    nvml = open_nvml(first.node, first.driver_root, first.host_root)
    switcher = ConfigSwitcher(
        configs,
        labels,
        load,
        lambda config: Plugin(config, nvml=nvml, record_requests=args.record_requests),
        interval_s=args.config_poll_interval,
    )
    return serve_until_signalled(switcher)
