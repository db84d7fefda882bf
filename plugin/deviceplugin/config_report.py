"""What the kubelet would see from a plugin config on a node: ``cdigen plugin config check``.

The config is planned as ``plugin serve`` plans it
(:func:`cdigen.plugin.deviceplugin.layout.plan_layout`, policies included), so a config that check
passes is one serve starts with; the lines say per resource how many devices each GPU is advertised
as and what a container gets for one of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from cdigen.model import Gpu, Node
from cdigen.plugin.deviceplugin.config import PluginConfig
from cdigen.plugin.deviceplugin.resources import AdvertisedDevice, Resource


def load_config_node(config: PluginConfig) -> Node:
    """The node ``config`` serves, discovered as ``plugin serve`` discovers it."""
    from cdigen.discover import load_node

    return load_node(
        config.node,
        sysfs_root=config.sysfs_root,
        proc_root=config.proc_root,
        driver_root=config.driver_root,
        host_root=config.host_root,
    )


def config_report(config: PluginConfig, node: Node) -> list[str]:
    """The report's lines for ``config`` on ``node``; InputError for what serve would refuse
    (a GPU with two owners, an unknown policy, a MIG layout the strategy cannot hold)."""
    from cdigen.plugin.deviceplugin.layout import plan_layout
    from cdigen.plugin.deviceplugin.sharing import advisory_warning, no_slices_warnings
    from cdigen.policies.policy_set import load_policy_set

    layout = plan_layout(node, config, load_policy_set(config.policy_dir))
    count = len(node.gpus)
    lines = [
        f"node {node.name or config.node}: {count} GPU{'s' if count != 1 else ''}; "
        f"migStrategy {config.mig_strategy}, deviceListStrategy {config.device_list_strategy}"
    ]
    policies = layout.policy_names()
    for resource in layout.resources:
        lines += _resource_lines(node, resource, policies.get(resource.name, "default"))
    unowned = _unadvertised(node, layout.resources)
    if unowned:
        lines.append(f"not advertised: {', '.join(_gpu(g) for g in unowned)}")
    for resource in layout.resources:
        if resource.sharing is None:
            continue
        warning = advisory_warning(resource.sharing, resource.name)
        for line in ([warning] if warning else []) + list(
            no_slices_warnings(node, resource.sharing, resource.name)
        ):
            lines.append(f"warning: {line}")
    lines.append("ok: plugin serve would start with this config")
    return lines


def _gpu(gpu: Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.name}, {gpu.uuid})"


def _resource_lines(node: Node, resource: Resource, policy: str) -> list[str]:
    from cdigen.plugin.deviceplugin.sharing import share_env

    sharing = resource.sharing
    what = (
        "whole GPUs"
        if sharing is None and resource.mig_profile is None
        else f"MIG {resource.mig_profile} devices"
        if sharing is None
        else f"{sharing.replicas} replicas per GPU"
        if sharing.replicas is not None
        else f"{sharing.memory_slice_mib} MiB memory slices"
    )
    if sharing is not None and sharing.mps_pipe_directory is not None:
        what += ", MPS"
    lines = [f"resource {resource.name}: {len(resource.devices)} devices ({what}; policy {policy})"]
    by_gpu: dict[str, list[AdvertisedDevice]] = {}
    for device in resource.devices:
        by_gpu.setdefault(device.gpu_uuid, []).append(device)
    gpus = {g.uuid: g for g in node.gpus}
    for uuid, devices in by_gpu.items():
        count = len(devices)
        line = f"  {_gpu(gpus[uuid])}: {count} device{'s' if count != 1 else ''}"
        if sharing is not None:  # the resource's own catalogue entries: none built again
            env = share_env([devices[0].entry], sharing, resource=resource.name)
            limits = " ".join(f"{k}={v}" for k, v in env if k.startswith("CUDA_MPS_"))
            line += f"; one share gets {limits}" if limits else "; no limits (time-sliced)"
        lines.append(line)
    return lines


def _unadvertised(node: Node, resources: Sequence[Resource]) -> list[Gpu]:
    seen = {d.gpu_uuid for r in resources for d in r.devices}
    return [g for g in node.gpus if g.uuid not in seen]
