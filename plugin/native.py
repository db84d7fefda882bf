"""The ``native`` strategy: a CDI spec's edits for some devices, for runtimes without CDI.

The spec is found through the same registry ``cdigen list`` uses; the edits are the spec-wide
``containerEdits`` followed by each device's own, as a CDI runtime would apply them. Hooks cannot
be expressed in an AllocateResponse; they are logged once and skipped (the spec's SONAME symlink
mounts are what make the libraries usable without them).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from plugin.health import dir_signature
from plugin.service import ContainerEdits, DeviceNodeEdit, MountEdit

log = logging.getLogger("cdigen.plugin")


def _node_edit(doc: Mapping[str, Any]) -> DeviceNodeEdit:
    path = str(doc["path"])
    return DeviceNodeEdit(
        path=path,
        host_path=str(doc.get("hostPath") or path),
        permissions=str(doc.get("permissions") or "rwm"),
    )


def _mount_edit(doc: Mapping[str, Any]) -> MountEdit:
    options = [str(o) for o in doc.get("options") or []]
    return MountEdit(
        host_path=str(doc["hostPath"]),
        container_path=str(doc["containerPath"]),
        read_only="ro" in options,
    )


def merge_edits(edit_docs: Sequence[Mapping[str, Any]]) -> ContainerEdits:
    """Merge CDI ``containerEdits`` documents in order; later env values win, duplicates dropped."""
    env: dict[str, str] = {}
    nodes: dict[str, DeviceNodeEdit] = {}
    mounts: dict[str, MountEdit] = {}
    hooks: list[str] = []
    for doc in edit_docs:
        for entry in doc.get("env") or []:
            key, _, _ = str(entry).partition("=")
            env[key] = str(entry)
        for node in doc.get("deviceNodes") or []:
            edit = _node_edit(node)
            nodes.setdefault(edit.path, edit)
        for mount in doc.get("mounts") or []:
            edit_m = _mount_edit(mount)
            mounts.setdefault(edit_m.container_path, edit_m)
        hooks.extend(str(h.get("hookName", "?")) for h in doc.get("hooks") or [])
    return ContainerEdits(
        env=tuple(env.values()),
        device_nodes=tuple(nodes.values()),
        mounts=tuple(mounts.values()),
        hooks=tuple(hooks),
    )


class SpecEdits:
    """Looks up CDI names in the spec dirs and returns their merged edits (an ``EditsLookup``)."""

    def __init__(self, spec_dirs: Sequence[Path]) -> None:
        self.spec_dirs = tuple(spec_dirs)
        self._lock = threading.Lock()
        self._cache_key: tuple[tuple[str, int, int], ...] | None = None
        self._docs: dict[Path, Any] = {}
        self._registry: Any = None
        self._warned_hooks = False

    def _current(self) -> tuple[Any, dict[Path, Any]]:
        from cdigen.cdi.registry import load_registry

        key = dir_signature(self.spec_dirs)
        with self._lock:
            if key != self._cache_key:
                self._registry = load_registry(list(self.spec_dirs))
                self._docs = {s.path: s.document for s in self._registry.specs if s.loads}
                self._cache_key = key
            return self._registry, self._docs

    def __call__(self, names: Sequence[str]) -> ContainerEdits:
        """The merged edits of ``names``; KeyError naming a name no spec defines."""
        registry, docs = self._current()
        edit_docs: list[Mapping[str, Any]] = []
        seen_specs: set[Path] = set()
        for name in names:
            device = registry.devices.get(name)
            if device is None:
                raise KeyError(
                    f"CDI device {name} is not defined in {', '.join(map(str, self.spec_dirs))}"
                )
            doc = docs[device.spec_path]
            if device.spec_path not in seen_specs:
                seen_specs.add(device.spec_path)
                edit_docs.append(doc.get("containerEdits") or {})
            short = name.partition("=")[2]
            for entry in doc.get("devices") or []:
                if entry.get("name") == short:
                    edit_docs.append(entry.get("containerEdits") or {})
                    break
        edits = merge_edits(edit_docs)
        if edits.hooks and not self._warned_hooks:
            self._warned_hooks = True
            log.warning(
                "native strategy: the spec's hooks (%s) cannot be passed in an AllocateResponse "
                "and are skipped",
                ", ".join(sorted(set(edits.hooks))),
            )
        return edits
