"""The DRA plugin's node labels (docs/labels.md), written by
:class:`plugin.agent.feature_file.FeatureFile`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cdigen.labels import OURS, node_labels
from cdigen.model import Node
from plugin.agent.health import with_board_health
from plugin.dra.slices import MemoryShares
from policies.device_view import DeviceView

MIB = 1 << 20


def share_labels(shares: MemoryShares | None, views: Sequence[DeviceView]) -> dict[str, str]:
    """``cdigen.dev/dra.memory-step`` and ``cdigen.dev/dra.default-share`` (MiB, as GFD writes
    memory): the step of the memory shares and what a claim that names no memory (an unchanged
    ``nvidia.com/gpu: 1`` pod) takes, the least over the shared GPUs; none without shares."""
    if shares is None:
        return {}
    totals = [v.capacity.get("memory", 0) for v in views if v.mig is None]
    defaults = [shares.default_for(t) for t in totals if shares.shares(t)]
    if not defaults:
        return {}
    return {
        f"{OURS}dra.memory-step": str(shares.step // MIB),
        f"{OURS}dra.default-share": str(min(defaults) // MIB),
    }


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
