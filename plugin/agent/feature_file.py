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
from collections.abc import Callable, Mapping
from pathlib import Path

from cdigen.errors import CdigenError
from cdigen.labels import feature_file_text

log = logging.getLogger("cdigen.plugin")

DEFAULT_FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
MAX_FEATURE_FILE_BYTES = 65536  # NFD skips a larger feature file


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
