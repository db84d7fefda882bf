"""The DRA plugin's node labels (docs/labels.md), written by
:class:`plugin.agent.feature_file.FeatureFile`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cdigen.labels import node_labels
from cdigen.model import Node
from plugin.agent.health import with_board_health
from policies.device_view import DeviceView


def dra_labels(
    node: Node,
    views: Sequence[DeviceView],
    reasons: Mapping[str, Sequence[str]],
    mig_strategy: str,
) -> dict[str, str]:
    """The DRA plugin's labels: ``node`` with the GPUs of the ``views`` that have health
    ``reasons`` held down. DRA claims share devices: its labels are those of an unshared node."""
    down = frozenset(v.gpu.uuid for v in views if reasons.get(v.name))
    return node_labels(with_board_health(node, down), mig_strategy=mig_strategy)
