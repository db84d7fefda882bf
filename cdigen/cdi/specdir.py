"""Which entries of a spec directory a runtime reads, without reading them.

Kept apart from :mod:`cdigen.cdi.cache` (which loads them) so that listing a directory costs
no import of the loader.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

SPEC_SUFFIXES = (".yaml", ".json")  # what runtimes load from a spec dir, and nothing else
# The spec dirs runtimes read by default (later wins): static specs, written at boot, and
# dynamic ones such as per-claim specs, on a tmpfs that a reboot empties.
STATIC_SPEC_DIR = Path("/etc/cdi")
DYNAMIC_SPEC_DIR = Path("/var/run/cdi")
DEFAULT_SPEC_DIRS = (STATIC_SPEC_DIR, DYNAMIC_SPEC_DIR)


def spec_suffix(name: str) -> str:
    """The extension as Go's ``filepath.Ext`` sees it (``.yaml`` is a ``.yaml`` file)."""
    dot = name.rfind(".")
    return name[dot:] if dot >= 0 else ""


def spec_files(directory: str | Path) -> list[Path]:
    """The entries of ``directory`` a runtime tries to load, in name order ([] if unreadable).

    Subdirectories are skipped; links are kept (to a file, a directory or nothing: the last
    two fail to load, as in runtimes).
    """
    try:
        if stat.S_ISLNK(os.lstat(directory).st_mode):
            return []
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    paths = [Path(directory) / n for n in names if spec_suffix(n) in SPEC_SUFFIXES]
    return [p for p in paths if p.is_symlink() or not p.is_dir()]
