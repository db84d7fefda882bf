"""The node labels a serving plugin keeps current in a Node Feature Discovery feature file.

NFD's local source reads every file in ``/etc/kubernetes/node-feature-discovery/features.d/``
(``key=value`` lines; names starting with ``.`` are skipped, so the temporary file of an atomic
write is never read half-written) and turns its lines into node labels. The plugins call
:meth:`FeatureFile.update` whenever their node changes (health, MIG layout, config); the file is
rewritten, atomically, only when the labels changed. It is left in place when the plugin stops
(docs/labels.md, "When the plugin stops").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cdigen.errors import CdigenError
from cdigen.labels import NOT_SHARED, LabelSharing, feature_file_text, node_labels
from plugin.defaults import DEFAULT_RESOURCE

if TYPE_CHECKING:
    from cdigen.model import Node
    from plugin.config import PluginConfig
    from policies.device_view import DeviceView

log = logging.getLogger("cdigen.plugin")

DEFAULT_FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
MAX_FEATURE_FILE_BYTES = 65536  # NFD skips a larger feature file


def config_sharing(config: PluginConfig, node: Node) -> LabelSharing:
    """GFD's view of the config's sharing: the first GPU resource that shares whole GPUs.

    Replicas are per GPU; memory slices count as replicas (the fewest any GPU holds). The
    strategy is ``mps`` when the shares run under MPS, else ``time-slicing``."""
    from policies.shares import slice_count

    for resource in config.sharing_resources:
        sharing = resource.sharing
        if sharing is None:
            continue
        if sharing.replicas is not None:
            replicas = sharing.replicas
        else:
            assert sharing.memory_slice_mib is not None
            whole = [g for g in node.gpus if not g.mig_enabled] or list(node.gpus)
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


def dra_labels(
    node: Node,
    views: Sequence[DeviceView],
    reasons: Mapping[str, Sequence[str]],
    mig_strategy: str,
) -> dict[str, str]:
    """The DRA plugin's labels: ``node`` with the GPUs of the ``views`` that have health
    ``reasons`` held down. DRA claims share devices: its labels are those of an unshared node."""
    from plugin.layout import with_board_health

    down = frozenset(v.gpu.uuid for v in views if reasons.get(v.name))
    return node_labels(with_board_health(node, down), mig_strategy=mig_strategy)


class FeatureFile:
    """The plugin's NFD feature file; with no path, every call does nothing."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._written: str | None = None  # the text last written; None: not yet
        self.writes = 0
        self._lock = threading.Lock()  # health listeners may call from several threads

    def update(self, labels: Callable[[], Mapping[str, str]]) -> bool:
        """Rewrite the file with ``labels()`` if they changed; True when written. A failure is
        logged, never raised: the labels must not stop the serving. ``labels`` is called only
        when there is a file to write."""
        if self.path is None:
            return False
        with self._lock:
            return self._update(self.path, labels)

    def _update(self, path: Path, labels: Callable[[], Mapping[str, str]]) -> bool:
        try:
            current = labels()
        except (CdigenError, ValueError) as exc:
            log.error("node labels not computed, %s unchanged: %s", path, exc)
            return False
        text = feature_file_text(current)
        if text == self._written:
            return False
        if len(text.encode("utf-8")) > MAX_FEATURE_FILE_BYTES:
            log.warning("%s is over NFD's %d bytes: NFD skips it", path, MAX_FEATURE_FILE_BYTES)
        from cdigen.fileio import atomic_write

        try:
            atomic_write(path, text.encode("utf-8"))
        except CdigenError as exc:
            log.error("node labels not written: %s", exc)
            return False
        self._written = text
        self.writes += 1
        log.info("node labels written to %s (%d labels)", path, len(current))
        return True
