"""The device plugin's node labels: its MIG strategy and its sharing, as GPU Feature Discovery
words them (docs/labels.md); written by :class:`cdigen.plugin.agent.feature_file.FeatureFile`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdigen.labels import NOT_SHARED, LabelSharing, node_labels
from cdigen.plugin.deviceplugin.defaults import DEFAULT_RESOURCE

if TYPE_CHECKING:
    from cdigen.model import Node
    from cdigen.plugin.deviceplugin.config import PluginConfig


def config_sharing(config: PluginConfig, node: Node) -> LabelSharing:
    """GFD's view of the config's sharing: the first GPU resource that shares whole GPUs.

    Replicas are per GPU; memory slices count as replicas (the fewest any of its GPUs holds). The
    strategy is ``mps`` when the shares run under MPS, else ``time-slicing``."""
    from cdigen.shares import slice_count

    for resource in config.sharing_resources:
        sharing = resource.sharing
        if sharing is None:
            continue
        if sharing.replicas is not None:
            replicas = sharing.replicas
        else:
            assert sharing.memory_slice_mib is not None
            mine = [g for g in node.gpus if resource.gpus is None or resource.gpus.matches(g)]
            whole = [g for g in mine if not g.mig_enabled] or mine
            replicas = min((slice_count(g, sharing.memory_slice_mib) for g in whole), default=1)
        strategy = "mps" if sharing.mps_pipe_directory is not None else "time-slicing"
        return LabelSharing(
            replicas=max(replicas, 1),
            strategy=strategy,
            renamed=resource.name != DEFAULT_RESOURCE,
        )
    return NOT_SHARED


def plugin_labels(node: Node, config: PluginConfig) -> dict[str, str]:
    """The device plugin's labels for ``node`` (health applied) under ``config``: its MIG
    strategy and sharing."""
    return node_labels(node, mig_strategy=config.mig_strategy, sharing=config_sharing(config, node))
