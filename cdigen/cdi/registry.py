"""Spec directories as a runtime sees them (the CDI Go library's cache rules).

Only ``*.yaml`` and ``*.json`` directly inside each directory are read, in name order. A later
directory has priority over an earlier one; two files in the *same* directory defining one device
are a conflict, and the runtime drops that device altogether, whatever later directories say.
A file that fails to load contributes nothing and is reported, whatever is wrong with it (bad
YAML, a dangling link, values of the wrong type): it never affects the devices of other files.
Names that do not end in ``.yaml``/``.json`` (cdigen's ``.cdigen.lock``, temp files) are ignored.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdigen.cdi.names import qualified_name
from cdigen.cdi.validate import SPEC_SUFFIXES, read_spec_document, spec_problems
from cdigen.errors import CdigenError

__all__ = ["read_spec_document"]  # re-exported: the one reader of spec files

DEFAULT_SPEC_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))

log = logging.getLogger("cdigen")


@dataclass(frozen=True)
class SpecFile:
    """One spec file: the devices it defines and why it fails to load (empty if it loads)."""

    path: Path
    priority: int  # index of its directory; higher wins
    kind: str = ""
    device_names: tuple[str, ...] = ()  # qualified: vendor/class=name
    problems: tuple[str, ...] = ()
    # The parsed document (None if it could not be parsed), kept so callers need not re-read it.
    document: Any = field(default=None, compare=False, repr=False)

    @property
    def loads(self) -> bool:
        """Whether a runtime would load this file."""
        return not self.problems


@dataclass(frozen=True)
class RegisteredDevice:
    """A resolvable device: its qualified name and the file that defines it."""

    name: str
    spec_path: Path
    priority: int


@dataclass
class Registry:
    """Every spec file found, the devices that resolve, conflicts and files that failed to load."""

    specs: list[SpecFile] = field(default_factory=list)
    devices: dict[str, RegisteredDevice] = field(default_factory=dict)
    conflicts: dict[str, tuple[Path, ...]] = field(default_factory=dict)

    @property
    def errors(self) -> dict[Path, str]:
        """Files that failed to load, with their first problem."""
        return {s.path: s.problems[0] for s in self.specs if s.problems}


def spec_paths(directory: str | Path) -> list[Path]:
    """The ``*.yaml``/``*.json`` files directly in ``directory``, in name order ([] if missing).

    Dangling symlinks are included (runtimes report them as specs that fail to load).
    """
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    paths = [Path(directory) / n for n in names if Path(n).suffix in SPEC_SUFFIXES]
    return [p for p in paths if p.is_file() or (p.is_symlink() and not p.exists())]


def declared_names(doc: Any) -> list[str]:
    """Qualified device names a document declares, read leniently (for conflict checks)."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("kind"), str):
        return []
    devices = doc.get("devices")
    if not isinstance(devices, list):
        return []
    return [
        qualified_name(doc["kind"], d["name"])
        for d in devices
        if isinstance(d, Mapping) and isinstance(d.get("name"), str)
    ]


def load_spec_file(path: Path, priority: int) -> SpecFile:
    """Read and check one spec file; whatever is wrong with it becomes one of its problems."""
    try:
        doc = read_spec_document(path)
    except CdigenError as exc:
        return SpecFile(path=path, priority=priority, problems=(exc.message,))
    try:
        problems = tuple(spec_problems(doc))
    except Exception as exc:  # isolation: a foreign file must never break the others
        log.debug("checking %s failed", path, exc_info=True)
        problems = (f"cannot be checked ({type(exc).__name__}: {str(exc)[:200]})",)
    kind = doc.get("kind", "") if isinstance(doc, Mapping) else ""
    return SpecFile(
        path=path,
        priority=priority,
        kind=kind if isinstance(kind, str) else "",
        device_names=tuple(declared_names(doc)),
        problems=problems,
        document=doc,
    )


def load_registry(spec_dirs: Sequence[str | Path] = DEFAULT_SPEC_DIRS) -> Registry:
    """Load every spec in ``spec_dirs`` (later directories win) and resolve device names."""
    registry = Registry()
    clashing: dict[str, list[Path]] = {}
    for priority, directory in enumerate(spec_dirs):
        for path in spec_paths(directory):
            spec = load_spec_file(path, priority)
            registry.specs.append(spec)
            if not spec.loads:
                continue
            for name in spec.device_names:
                old = registry.devices.get(name)
                if old is not None and old.priority == priority:
                    clashing.setdefault(name, [old.spec_path]).append(path)
                    continue
                registry.devices[name] = RegisteredDevice(name, path, priority)
    for name, paths in clashing.items():
        registry.devices.pop(name, None)
        registry.conflicts[name] = tuple(dict.fromkeys(paths))
    return registry
