"""Spec directories as a runtime sees them: the CDI Go library v1.1.0's ``Cache``.

Rules (``pkg/cdi/cache.go``, ``spec-dirs.go``):

- Each directory is read on its own, not recursively: every ``*.yaml``/``*.json`` entry in name
  order (subdirectories skipped; ``.cdigen.lock``, ``*.yml`` and temp files ignored). A spec
  directory that is itself a symbolic link is not read (``filepath.Walk`` does not follow it).
- A file loads by the library's rules (:mod:`cdigen.cdi.load`), not by ``cdigen validate``'s lint;
  one that does not load contributes nothing and is reported with a one-line reason.
- A later directory wins over an earlier one. Two files in one directory defining one device are
  a conflict: the device is dropped, whatever any other directory says.
- Injection merges the spec-wide edits of each spec once and each device's own edits, in request
  order, with :func:`cdigen.cdi.edits.merge_edits` (later edits win, mounts sorted).

:class:`SpecCache` reloads when the directories change (a cheap signature of names, inodes,
mtimes and sizes) and keeps each state as one immutable :class:`SpecState`, so readers on other
threads never see half of a reload.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cdigen import logs
from cdigen.cdi.edits import ContainerEdits, merge_edits
from cdigen.cdi.load import LoadedSpec, load_spec
from cdigen.cdi.names import qualified_name
from cdigen.cdi.specdecode import SpecLoadError
from cdigen.cdi.specdir import DEFAULT_SPEC_DIRS, SPEC_SUFFIXES, spec_files, spec_suffix
from cdigen.errors import CdigenError

_MEMO_LIMIT = 4096  # merged edits kept per state for repeated requests (Allocate's hot path)

log = logs.logger()

Signature = tuple[tuple[str, int, int, int, int], ...]


class UnresolvedDevices(CdigenError):
    """Device names no loaded spec defines (``names``, in the order asked), as a runtime
    refuses them: ``unresolvable CDI devices NAME, ...``."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        super().__init__(f"unresolvable CDI devices {', '.join(names)}")


@dataclass(frozen=True)
class SpecFile:
    """One spec file found: the devices it defines and why it fails to load (empty if it loads)."""

    path: Path
    priority: int  # index of its directory; higher wins
    kind: str = ""
    device_names: tuple[str, ...] = ()  # qualified: vendor/class=name
    problems: tuple[str, ...] = ()

    @property
    def loads(self) -> bool:
        """Whether a runtime loads this file."""
        return not self.problems


@dataclass(frozen=True)
class CdiDevice:
    """A resolvable device: its qualified name, the spec defining it and its own edits."""

    name: str
    spec: LoadedSpec
    edits: ContainerEdits

    @property
    def spec_path(self) -> Path:
        """The file that defines the device."""
        return self.spec.path


@dataclass(frozen=True)
class SpecState:
    """The spec directories at one moment: files, resolvable devices, conflicts and errors."""

    files: tuple[SpecFile, ...] = ()
    devices: Mapping[str, CdiDevice] = field(default_factory=dict)
    conflicts: Mapping[str, tuple[Path, ...]] = field(default_factory=dict)
    signature: Signature = ()
    _memo: dict[tuple[str, ...], ContainerEdits] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def errors(self) -> dict[Path, str]:
        """Files that fail to load, each with the one-line reason a runtime gives first."""
        return {f.path: f.problems[0] for f in self.files if f.problems}

    def edits_for(self, names: Sequence[str]) -> ContainerEdits:
        """The merged edits ``InjectDevices`` applies for ``names``; UnresolvedDevices naming
        every name that does not resolve."""
        key = tuple(names)
        memo = self._memo.get(key)
        if memo is not None:
            return memo
        missing = [n for n in key if n not in self.devices]
        if missing:
            raise UnresolvedDevices(tuple(missing))
        parts: list[ContainerEdits] = []
        seen: set[Path] = set()
        for name in key:
            device = self.devices[name]
            if device.spec.path not in seen:
                seen.add(device.spec.path)
                parts.append(device.spec.edits)
            parts.append(device.edits)
        merged = merge_edits(parts)
        if len(self._memo) < _MEMO_LIMIT:
            self._memo[key] = merged
        return merged


def signature(spec_dirs: Sequence[Path]) -> Signature:
    """Names, inodes, mtimes, ctimes and sizes of the spec files: changes whenever one does."""
    entries: list[tuple[str, int, int, int, int]] = []
    for directory in spec_dirs:
        try:
            st = os.lstat(directory)
            names = sorted(os.listdir(directory)) if stat.S_ISDIR(st.st_mode) else []
        except OSError:
            entries.append((str(directory), -1, -1, -1, -1))
            continue
        entries.append((str(directory), st.st_ino, st.st_mtime_ns, 0, 0))
        for name in names:
            if spec_suffix(name) not in SPEC_SUFFIXES:
                continue
            path = os.path.join(directory, name)
            try:
                st = os.stat(path)
            except OSError:
                entries.append((path, -1, -1, -1, -1))
                continue
            entries.append((path, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size))
    return tuple(entries)


def load_state(
    spec_dirs: Sequence[Path], sig: Signature = (), *, exclude: Path | None = None
) -> SpecState:
    """Load ``spec_dirs`` by the library's rules (``Cache.refresh``), leaving out the file
    ``exclude`` (the one about to be rewritten: reading it would be wasted work)."""
    files: list[SpecFile] = []
    devices: dict[str, CdiDevice] = {}
    clashes: dict[str, list[Path]] = {}
    for priority, directory in enumerate(spec_dirs):
        for path in spec_files(directory):
            if path == exclude:
                continue
            try:
                spec = load_spec(path, priority)
            except SpecLoadError as exc:
                files.append(SpecFile(path, priority, problems=tuple(exc.problems)))
                continue
            except Exception as exc:  # isolation: a foreign file must never break the others
                log.debug("loading %s failed", path, exc_info=True)
                reason = f"cannot be loaded ({type(exc).__name__}: {str(exc)[:200]})"
                files.append(SpecFile(path, priority, problems=(reason,)))
                continue
            qualified = [(qualified_name(spec.kind, n), e) for n, e in spec.devices.items()]
            files.append(SpecFile(path, priority, spec.kind, tuple(q for q, _ in qualified)))
            for name, edits in qualified:
                old = devices.get(name)
                if old is not None and old.spec.priority == priority:
                    clashes.setdefault(name, [old.spec.path]).append(path)
                    continue
                devices[name] = CdiDevice(name, spec, edits)
    for name in clashes:
        devices.pop(name, None)
    conflicts = {n: tuple(dict.fromkeys(p)) for n, p in sorted(clashes.items())}
    return SpecState(tuple(files), devices, conflicts, sig)


class SpecCache:
    """The spec dirs loaded as runtimes load them, reloaded whenever they change.

    Every read first compares the directories' :func:`signature` with the loaded one; safe to
    share between threads.
    """

    def __init__(self, spec_dirs: Sequence[str | Path] = DEFAULT_SPEC_DIRS) -> None:
        self.spec_dirs = tuple(Path(os.path.normpath(d)) for d in spec_dirs)
        self._lock = threading.Lock()
        self._state: SpecState | None = None

    def refresh(self) -> bool:
        """Reload if any spec file or directory changed; whether it did."""
        sig = signature(self.spec_dirs)
        state = self._state
        if state is not None and state.signature == sig:
            return False
        with self._lock:
            state = self._state
            if state is not None and state.signature == sig:
                return False
            self._state = load_state(self.spec_dirs, sig)
            return True

    def state(self) -> SpecState:
        """The current state (reloaded first if the directories changed)."""
        self.refresh()
        state = self._state
        assert state is not None
        return state

    def device(self, name: str) -> CdiDevice | None:
        """The device ``name`` (``vendor/class=name``) resolves to, or None."""
        return self.state().devices.get(name)

    def edits_for(self, names: Sequence[str]) -> ContainerEdits:
        """The merged edits a runtime injects for ``names``; UnresolvedDevices naming the
        unresolved ones."""
        return self.state().edits_for(names)

    @property
    def conflicts(self) -> Mapping[str, tuple[Path, ...]]:
        """Devices dropped because two files of one directory define them, with those files."""
        return self.state().conflicts

    @property
    def errors(self) -> dict[Path, str]:
        """Files that fail to load, with a one-line reason each."""
        return self.state().errors

    def names(self) -> frozenset[str]:
        """Every resolvable qualified device name."""
        return frozenset(self.state().devices)
