"""The node labels a serving plugin keeps current in a Node Feature Discovery feature file.

NFD's local source reads every file in ``/etc/kubernetes/node-feature-discovery/features.d/``
(``key=value`` lines; names starting with ``.`` are skipped, so the temporary file of an atomic
write is never read half-written) and turns its lines into node labels. The plugins call
:meth:`FeatureFile.update` whenever their node changes (health, MIG layout, config); the file is
rewritten, atomically, only when the labels changed. It is left in place when the plugin stops
(docs/labels.md, "When the plugin stops"). A write that fails (a read-only directory, a full
tmpfs) is retried on its own, after 1, 2, 4 ... up to 60 seconds, with the newest labels: the
node may not change again for days.
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
RETRY_FIRST_S = 1.0
RETRY_MOST_S = 60.0


class FeatureFile:
    """The plugin's NFD feature file; with no path, every call does nothing."""

    def __init__(self, path: str | Path | None, *, retry_first_s: float = RETRY_FIRST_S) -> None:
        self.path = Path(path) if path else None
        self._written: str | None = None  # the text last written; None: not yet
        self.writes = 0
        self._lock = threading.Lock()  # health listeners may call from several threads
        self._retry_first_s = retry_first_s
        self._retry_s = 0.0  # the wait before the next retry; 0: none pending
        self._timer: threading.Timer | None = None
        self._failure: str | None = None  # the last failure logged (each said once)

    def update(self, labels: Callable[[], Mapping[str, str]]) -> bool:
        """Rewrite the file with ``labels()`` if they changed; True when written. A failure is
        logged, never raised: the labels must not stop the serving. ``labels`` is called only
        when there is a file to write."""
        if self.path is None:
            return False
        with self._lock:
            if self._timer is not None:  # these labels are newer than a pending retry's
                self._timer.cancel()
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
            self._failed(str(exc), labels)
            return False
        self._written = text
        self.writes += 1
        if self._failure is not None:
            log.info("node labels written to %s after a failed write", path)
        self._failure, self._retry_s = None, 0.0
        log.info("node labels written to %s (%d labels)", path, len(current))
        return True

    def _failed(self, why: str, labels: Callable[[], Mapping[str, str]]) -> None:
        """Log the failure (once while it stays the same) and retry later with the labels
        of the moment."""
        self._retry_s = min(RETRY_MOST_S, self._retry_s * 2 or self._retry_first_s)
        if why != self._failure:
            self._failure = why
            log.error("node labels not written (retried every %g s at most): %s", RETRY_MOST_S, why)
        if self._timer is not None:
            self._timer.cancel()
        self._timer = threading.Timer(self._retry_s, self._retry, args=(labels,))
        self._timer.daemon = True
        self._timer.start()

    def _retry(self, labels: Callable[[], Mapping[str, str]]) -> None:
        if self.path is not None:
            with self._lock:
                self._update(self.path, labels)

    def stop(self) -> None:
        """Cancel a pending retry."""
        if self._timer is not None:
            self._timer.cancel()
