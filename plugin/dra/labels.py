"""The DRA plugin's node labels (docs/labels.md), written by
:class:`cdigen.plugin.agent.feature_file.FeatureFile`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cdigen.labels import OURS, node_labels
from cdigen.memory_shares import MemoryShares
from cdigen.model import Node
from cdigen.plugin.agent.health import with_board_health
from cdigen.plugin.dra.cli_args import whole_gpu_memory
from cdigen.policies.device_view import DeviceView


def share_labels(shares: MemoryShares | None, views: Sequence[DeviceView]) -> dict[str, str]:
    """``cdigen.dev/dra.memory-step`` and ``cdigen.dev/dra.default-share`` (MiB): the memory
    shares' step and what a claim that names no memory takes (none without shares)."""
    if shares is None:
        return {}
    return {OURS + k: v for k, v in shares.labels(whole_gpu_memory(views)).items()}


def dra_labels(
    node: Node,
    views: Sequence[DeviceView],
    reasons: Mapping[str, Sequence[str]],
    mig_strategy: str,
    shares: MemoryShares | None = None,
) -> dict[str, str]:
    """The DRA plugin's labels: ``node`` with the GPUs of the ``views`` that have health
    ``reasons`` held down, and the memory shares (:func:`share_labels`). DRA claims share
    devices: its other labels are those of an unshared node."""
    down = frozenset(v.gpu.uuid for v in views if reasons.get(v.name))
    labels = node_labels(with_board_health(node, down), mig_strategy=mig_strategy)
    if labels:
        labels.update(share_labels(shares, views))
    return dict(sorted(labels.items()))
