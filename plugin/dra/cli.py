"""The ``cdigen dra`` subcommands: ``serve`` runs the kubelet DRA plugin; ``explain`` and
``check`` are offline claim tools (their logic lives in :mod:`policies.claims` and
:mod:`policies.claim_check`); ``why`` asks a live cluster (:mod:`plugin.dra.why`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cdigen.cdi.specdir import DYNAMIC_SPEC_DIR
from cdigen.discover.cli import add_node_source
from cdigen.model import DRA_MIG_STRATEGIES, MIG_STRATEGIES
from plugin.agent.logs import LOG_FORMATS, LOG_LEVELS
from plugin.agent.mps import LIMIT_KEYS

if TYPE_CHECKING:
    from cdigen.model import Node
    from policies.claim_docs import Claim
    from policies.claims import Allocation, FirstFit, NodeState
    from policies.device_view import DeviceView

DEFAULT_DRIVER = "gpu.cdigen.dev"  # policies.device_view.DRA_DRIVER; kept here so --help is cheap


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
        default="/var/lib/kubelet",
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
    serve.add_argument("--kubeconfig", metavar="FILE", help="default: the in-cluster config")
    serve.add_argument(
        "--api-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="give up on an API server call after this long (default 5)",
    )
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
        default="mixed",
        help="mixed or single: a MIG-enabled GPU is published as its MIG devices; none: "
        "whole GPUs only; dynamic: every MIG placement, made at prepare (needs --node nvml; "
        "docs/mig.md) (default mixed)",
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
        "--delete-slices-on-exit",
        action="store_true",
        help="delete this node's ResourceSlices on SIGTERM (an uninstall, not an upgrade)",
    )
    sharing = serve.add_argument_group("sharing (docs/dra-sharing.md)")
    sharing.add_argument(
        "--memory-step",
        metavar="QUANTITY",
        help="publish whole GPUs as consumable capacity (KEP-5075, Kubernetes 1.36 beta): "
        "several claims each take memory in steps of QUANTITY (e.g. 1Gi)",
    )
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
    serve.add_argument(
        "--log-level",
        dest="dra_log_level",
        choices=LOG_LEVELS,
        default="info",
        help="least severe log records written to stderr (default info)",
    )
    serve.add_argument(
        "--log-format",
        dest="dra_log_format",
        choices=LOG_FORMATS,
        default="text",
        help="text lines, or one JSON object a line for a log collector (default text)",
    )
    serve.set_defaults(func=_serve)

    explain = dra_sub.add_parser(
        "explain",
        help="which devices the scheduler's first fit would pick for a claim, and why not others",
        description="Build this node's ResourceSlices as `dra serve` publishes them, run the "
        "scheduler's first fit (CEL selectors, matchAttribute, capacity) for the claim, and "
        "show the picks and why every other device lost.",
    )
    explain.add_argument("--node", required=True, metavar="SRC", help="builtin:NAME or a file")
    explain.add_argument(
        "--claim",
        required=True,
        action="append",
        metavar="FILE",
        help="ResourceClaims or ResourceClaimTemplates (DeviceClasses in them are used too); "
        "repeatable: the claims are allocated in order, each after the ones before it",
    )
    explain.add_argument(
        "--class",
        dest="classes",
        action="append",
        default=[],
        metavar="FILE",
        help="DeviceClass manifest(s); repeatable (default: the classes deploy/dra installs)",
    )
    explain.add_argument(
        "--driver-name",
        default=DEFAULT_DRIVER,
        help=f"the driver the claim asks, as in `dra serve` (default {DEFAULT_DRIVER})",
    )
    explain.add_argument(
        "--mig-strategy",
        choices=MIG_STRATEGIES,
        default="mixed",
        help="how MIG-enabled GPUs are published, as `dra serve --mig-strategy` (default mixed)",
    )
    explain.add_argument("--memory-step", metavar="QUANTITY", help="as `dra serve --memory-step`")
    explain.set_defaults(func=_explain)

    check = dra_sub.add_parser(
        "check",
        help="catch misspelt attributes and capacities in claims and DeviceClasses",
        description="Check the CEL selectors, constraints and capacity requests of "
        "ResourceClaims, ResourceClaimTemplates and DeviceClasses against the attributes "
        "and capacities this driver publishes. Exit 1 when a check fails, 2 for bad input.",
    )
    check.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="YAML files of ResourceClaims, ResourceClaimTemplates and DeviceClasses",
    )
    check.add_argument(
        "--driver-name",
        default=DEFAULT_DRIVER,
        help=f"the driver whose attributes the selectors may name (default {DEFAULT_DRIVER})",
    )
    check.set_defaults(func=_check)

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
    why.add_argument("-n", "--namespace", default="default", help="the pod's namespace")
    why.add_argument("--kubeconfig", metavar="FILE", help="default: the in-cluster config")
    why.add_argument(
        "--api-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="give up on an API server call after this long (default 5)",
    )
    why.add_argument(
        "--driver-name",
        default=DEFAULT_DRIVER,
        help=f"the driver whose CDI device names are shown (default {DEFAULT_DRIVER})",
    )
    why.set_defaults(func=_why)
    dra.set_defaults(func=lambda args: _usage(dra))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _dns_subdomain(
    value: str, flag: str, longest: int = 63, example: str = "gpu.cdigen.dev"
) -> None:
    """InputError naming ``flag`` unless ``value`` is a DNS subdomain of at most ``longest``
    characters, as Kubernetes requires of driver (63) and node (253) names."""
    from cdigen.errors import InputError, shortened
    from plugin.agent.names import is_dns_subdomain

    if not is_dns_subdomain(value, longest):
        raise InputError(
            f"{shortened(value, 80)!r} is not a DNS subdomain of at most {longest} characters",
            where=flag,
            hint=f"use lowercase letters, digits, '-' and '.', e.g. {example}",
        )


def _quantity_bytes(text: str, flag: str) -> int:
    from cdigen.errors import InputError
    from policies.cel import parse_quantity

    try:
        value = parse_quantity(text)
    except ValueError:
        value = None
    if value is None or value < 1 or value != int(value):
        raise InputError(
            f"{text!r} is not a positive whole quantity of bytes", where=flag, hint="e.g. 1Gi"
        )
    return int(value)


def _sharing_options(args: argparse.Namespace) -> dict[str, object]:
    from cdigen.errors import InputError
    from plugin.agent.mps import SHM_HINT, shm_directory_problem
    from plugin.dra.mps import MpsSettings
    from plugin.dra.slices import MemoryShares
    from policies.shares import MAX_REPLICAS

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
            hint="the directory the node's nvidia-cuda-mps-control uses, e.g. /run/nvidia/mps",
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
        "memory_shares": MemoryShares(_quantity_bytes(args.memory_step, "--memory-step"))
        if args.memory_step is not None
        else None,
    }
    if taints is not None:
        out["taint_xids"] = taints
    return out


def _taint_xids(items: list[str] | None) -> dict[int, str] | None:
    from cdigen.errors import InputError
    from plugin.dra.serve import TAINT_EFFECTS

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


def _explain(args: argparse.Namespace) -> int:
    from cdigen.discover import load_node
    from cdigen.errors import InputError
    from plugin.dra.slices import MemoryShares, build_slices
    from policies.claims import FirstFit, NodeState, load_manifests, slice_devices
    from policies.device_view import device_views
    from policies.dra_order import ordered_views

    _dns_subdomain(args.driver_name, "--driver-name")
    class_files = args.classes or [str(p) for p in _shipped_classes()]
    claims, classes = load_manifests([*args.claim, *class_files])
    if not claims:
        raise InputError(
            "no ResourceClaim or ResourceClaimTemplate found", where=", ".join(args.claim)
        )
    node = load_node(args.node)
    views = ordered_views(device_views(node, mig_strategy=args.mig_strategy), node)
    shares = (
        MemoryShares(_quantity_bytes(args.memory_step, "--memory-step"))
        if args.memory_step is not None
        else None
    )
    node_name = node.name or "node"
    slices = build_slices(
        views, driver=args.driver_name, node_name=node_name, generation=1, shares=shares
    )
    fit = FirstFit(slice_devices(slices), classes)
    state = NodeState()
    failed = 0
    for n, claim in enumerate(claims):
        if n:
            print()
        allocation, reasons = fit.explain(claim, state)
        for line in _explained(claim, allocation, reasons, fit, node, views, node_name):
            print(line)
        if allocation.error:
            failed += 1
        else:
            state.add(allocation.picks, fit.by_name)
    if len(claims) > 1 or state.consumed:
        print()
        for line in _capacity_left(fit, state, len(claims) - failed):
            print(line)
    return 1 if failed else 0


def _shipped_classes() -> list[Path]:
    """The DeviceClasses ``kubectl apply -k deploy/dra`` installs, where this checkout has them."""
    path = Path(__file__).resolve().parents[2] / "deploy" / "dra" / "deviceclasses.yaml"
    return [path] if path.is_file() else []


def _explained(
    claim: Claim,
    allocation: Allocation,
    reasons: Sequence[tuple[str, str]],
    fit: FirstFit,
    node: Node,
    views: Sequence[DeviceView],
    node_name: str,
) -> list[str]:
    """One claim's explanation, with its link score and a note for each capacity request met
    by a whole device (published without consumable capacity)."""
    from policies.claims import format_bytes, render_explanation
    from policies.graph import build_topology

    score = None
    if allocation.picks:
        topology = build_topology(node)
        by_name = {v.name: v for v in views}
        positions = tuple(
            sorted({topology.position_by_uuid[by_name[d].gpu.uuid] for d in allocation.devices})
        )
        score = topology.set_score(positions) if len(positions) > 1 else None
    lines = render_explanation(claim, allocation, reasons, node=node_name, link_score=score)
    asked = {r.name: r.capacity for r in claim.requests for r in (r.alternatives or (r,))}
    for pick in allocation.picks:
        capacity = asked.get(pick.request)
        if capacity and not fit.by_name[pick.device].allow_multiple:
            wanted = ", ".join(f"{k} {format_bytes(v)}" for k, v in capacity.items())
            lines.append(
                f"note: request {pick.request!r} asks for capacity ({wanted}), but "
                f"{pick.device} is published without consumable capacity (dra serve without "
                "--memory-step): the claim gets the whole device"
            )
    return lines


def _capacity_left(fit: FirstFit, state: NodeState, allocated: int) -> list[str]:
    """What the claims allocated so far leave: every device, whole or its capacity left."""
    from policies.claims import format_bytes

    lines = [f"after {allocated} allocated claim(s):"]
    width = max(len(d.name) for d in fit.devices)
    for device in fit.devices:
        if device.name in state.exclusive:
            left = "held whole"
        elif device.allow_multiple and device.capacity:
            held = state.consumed.get(device.name, {})
            left = ", ".join(
                f"{name.rpartition('/')[2]} {format_bytes(total - held.get(name, 0))} left of "
                f"{format_bytes(total)}"
                for name, total in sorted(device.capacity.items())
            )
        else:
            left = "free"
        lines.append(f"  {device.name:<{width}}  {left}")
    return lines


def _check(args: argparse.Namespace) -> int:
    from cdigen.errors import CheckFailed
    from policies.claim_check import Published, check_files

    _dns_subdomain(args.driver_name, "--driver-name")
    found = check_files(args.files, Published.of(args.driver_name))
    for warning in (p for p in found if p.warning):
        print(f"cdigen: warning: {warning}", file=sys.stderr)
    problems = [p for p in found if not p.warning]
    if problems:
        raise CheckFailed([str(p) for p in problems], summary="dra check failed")
    print(f"{len(args.files)} file(s) OK against the attributes of {args.driver_name}")
    return 0


def _api_timeout(seconds: float) -> None:
    from cdigen.errors import InputError

    if not seconds > 0 or seconds > 3600:
        raise InputError(
            f"{seconds:g} is not a timeout",
            where="--api-timeout",
            hint="pass seconds between 0 and 3600, e.g. 5",
        )


def _why(args: argparse.Namespace) -> int:
    from plugin.agent.kubeapi import api_client
    from plugin.dra.why import explain_pod, read_cluster

    _dns_subdomain(args.driver_name, "--driver-name")
    _dns_subdomain(args.namespace, "--namespace", example="default")
    _dns_subdomain(args.pod, "POD", 253, example="trainer-0")
    _api_timeout(args.api_timeout)
    cluster = read_cluster(
        api_client(args.kubeconfig), args.namespace, args.pod, timeout_s=args.api_timeout
    )
    for line in explain_pod(cluster, driver=args.driver_name):
        print(line)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cdigen.cdi.capabilities import parse_capabilities
    from cdigen.discover import from_hardware, load_node
    from cdigen.discover.nvml_library import start_nvml
    from cdigen.errors import InputError
    from cdigen.nodelock import GpuServerLock
    from plugin.agent.kubeapi import api_client
    from plugin.agent.logs import setup_logging
    from plugin.dra.kube import KubeApi
    from plugin.dra.serve import DraOptions, DraPlugin, serve_until_signalled

    if not args.node_name:
        raise InputError(
            "no node name",
            where="--node-name",
            hint="pass --node-name or set NODE_NAME (the DaemonSet sets it from spec.nodeName)",
        )
    _dns_subdomain(args.node_name, "--node-name", 253)
    _dns_subdomain(args.driver_name, "--driver-name")
    _api_timeout(args.api_timeout)
    if args.health_address:
        from plugin.agent.sockets import parse_address

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
        proc_root=args.proc_root,
        delete_slices_on_exit=args.delete_slices_on_exit,
        features_file=Path(args.features_file) if args.features_file else None,
        capability_devices=parse_capabilities(args.capability_devices, "--capability-devices")
        if args.capability_devices is not None
        else (),
        **_sharing_options(args),  # type: ignore[arg-type]
    )
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
    # the device plugin must not serve this node's GPUs too: held while serving
    with GpuServerLock(options.kubelet_dir, "cdigen dra serve"):
        plugin = DraPlugin(
            options, node, slices=api, claims=api, node_owner=api.node_owner, nvml=nvml
        )
        return serve_until_signalled(plugin, args.health_address)
