"""Per-node configs: several named plugin configs in one directory (a ConfigMap mounted as
files), the one in force chosen by a node label and switched live.

The label is ``cdigen.dev/device-plugin.config``; NVIDIA's ``nvidia.com/device-plugin.config``
is read when ours is absent, so nodes labelled for NVIDIA's plugin keep their choice. A node
without either label gets the default config. A switch (a new label value, or new content in
the chosen file) stops the plugin's servers and starts them with the new config, as NVIDIA's
plugin does: the kubelet sees the old resources go and the new ones register, and the process
stays up. A label naming no config, or a config that does not load, is one ERROR line and the
config in force stays.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cdigen.errors import InputError
from plugin.agent.lifecycle import ReloadableServable
from plugin.config import PluginConfig

log = logging.getLogger("cdigen.plugin")

CONFIG_LABEL = "cdigen.dev/device-plugin.config"
NVIDIA_CONFIG_LABEL = "nvidia.com/device-plugin.config"
SUFFIXES = ("", ".yaml", ".yml", ".json")
DEFAULT_NAME = "default"


class LabelSource(Protocol):
    """This node's labels; None when they cannot be read now (the caller keeps what it has)."""

    def labels(self) -> Mapping[str, str] | None:
        """The node's current labels, or None."""
        ...


@dataclass(frozen=True)
class NamedConfigs:
    """The named configs of ``directory`` (one file each: ``NAME``, ``NAME.yaml``, ``NAME.yml``
    or ``NAME.json``; the dot-files of a mounted ConfigMap are skipped) and the default."""

    directory: Path
    default: str
    label: str = CONFIG_LABEL

    @classmethod
    def open(cls, directory: Path, default: str | None, label: str) -> NamedConfigs:
        """The configs of ``directory``; InputError when it has none, or when the default is
        not there (given, or implied: the only config, else one named ``default``)."""
        names = config_names(directory)
        if not names:
            raise InputError(
                "no config files in it",
                where=f"--config-dir: {directory}",
                hint="put one file per named config there (a ConfigMap mounted as a volume)",
            )
        if default is None:
            if len(names) == 1:
                default = names[0]
            elif DEFAULT_NAME in names:
                default = DEFAULT_NAME
            else:
                raise InputError(
                    f"{len(names)} configs ({', '.join(names)}) and none is the default",
                    where=f"--config-dir: {directory}",
                    hint="pass --default-config NAME, or name one of them 'default'",
                )
        if default not in names:
            raise InputError(
                f"no config named {default!r} in {directory} (it has: {', '.join(names)})",
                where="--default-config",
                hint="name one of the files there, without its suffix",
            )
        return cls(directory, default, label)

    def path(self, name: str) -> Path | None:
        """The file of config ``name``, or None."""
        if not _plain_name(name):
            return None
        for suffix in SUFFIXES:
            candidate = self.directory / f"{name}{suffix}"
            if candidate.is_file():
                return candidate
        return None

    def chosen(self, labels: Mapping[str, str] | None) -> str:
        """The config name the node's labels ask for (ours first, then NVIDIA's), else the
        default."""
        labels = labels or {}
        return labels.get(self.label) or labels.get(NVIDIA_CONFIG_LABEL) or self.default


def config_names(directory: Path) -> list[str]:
    """The config names in ``directory``, sorted (file names without their suffix)."""
    try:
        entries = sorted(p for p in directory.iterdir() if not p.name.startswith("."))
    except OSError as exc:
        raise InputError(
            f"cannot read it: {exc.strerror}",
            where=f"--config-dir: {directory}",
            hint="mount the ConfigMap of named configs there",
        ) from None
    names = []
    for entry in entries:
        if not entry.is_file():
            continue
        stem = entry.name
        for suffix in SUFFIXES[1:]:
            if stem.endswith(suffix):
                stem = stem[: -len(suffix)]
                break
        if stem not in names:
            names.append(stem)
    return names


def _plain_name(name: str) -> bool:
    """A config name is a file name in the directory: no path, no dot-file."""
    return bool(name) and "/" not in name and "\0" not in name and not name.startswith(".")


@dataclass(frozen=True)
class InForce:
    """The config the plugin serves: its name, and the file's bytes it was loaded from."""

    name: str
    content: bytes


class ConfigSwitcher:
    """A :class:`ReloadableServable` that serves the node's chosen config and switches on a change.

    ``load`` turns a config file into settings (flags applied over it); ``make`` builds the
    plugin for them. The label source is asked every ``interval_s``.
    """

    def __init__(
        self,
        configs: NamedConfigs,
        labels: LabelSource,
        load: Callable[[Path], PluginConfig],
        make: Callable[[PluginConfig], ReloadableServable],
        *,
        interval_s: float = 5.0,
    ) -> None:
        self.configs = configs
        self._labels = labels
        self._load = load
        self._make = make
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._complaint: tuple[str, str] | None = None  # the last ERROR: each said once
        self.plugin: ReloadableServable | None = None
        self.in_force: InForce | None = None

    def start(self) -> None:
        """Serve the chosen config (the default when the labels cannot be read or name no
        config); its load errors are raised, as a single config's are."""
        labels = self._labels.labels()
        name = self.configs.chosen(labels)
        default = self.configs.default
        path = self.configs.path(name)
        if path is None:
            self._complain(name, self._missing(name) + f"; serving the default {default!r}")
            name, path = default, self.configs.path(default)
        assert path is not None  # NamedConfigs.open checked the default
        try:
            config = self._load(path)
        except InputError as exc:
            if name == default:
                raise
            self._complain(name, f"config {name!r} not applied, serving the default: {exc}")
            name, path = default, self.configs.path(default)
            assert path is not None
            config = self._load(path)
        content = path.read_bytes()
        plugin = self._make(config)
        plugin.start()
        self.plugin, self.in_force = plugin, InForce(name, content)
        log.info("serving config %r (%s)", name, path)
        self._thread = threading.Thread(target=self._watch, name="node-config", daemon=True)
        self._thread.start()

    def _missing(self, name: str) -> str:
        names = ", ".join(config_names(self.configs.directory))
        return (
            f"node label {self.configs.label}={name} names no config in "
            f"{self.configs.directory} (it has: {names})"
        )

    def _complain(self, name: str, message: str) -> None:
        if self._complaint != (name, message):
            self._complaint = (name, message)
            log.error("%s", message)

    def _watch(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.check()
            except Exception as exc:  # never let the watcher die: the plugin keeps serving
                log.error("config switch failed, keeping the config in force: %s", exc)

    def check(self) -> bool:
        """Switch if the chosen config or its content changed; True when it switched."""
        labels = self._labels.labels()
        if labels is None:
            return False
        name = self.configs.chosen(labels)
        path = self.configs.path(name)
        if path is None:
            self._complain(name, self._missing(name) + "; keeping the config in force")
            return False
        try:
            content = path.read_bytes()
        except OSError as exc:
            self._complain(name, f"cannot read {path}: {exc.strerror}; keeping the config in force")
            return False
        with self._lock:
            if self._stop.is_set() or self.in_force == InForce(name, content):
                return False
            try:
                config = self._load(path)
            except InputError as exc:
                self._complain(
                    name, f"config {name!r} not applied, keeping the one in force: {exc}"
                )
                return False
            old = self.in_force
            assert self.plugin is not None and old is not None
            log.info("switching config %r -> %r: restarting the resource servers", old.name, name)
            self.plugin.stop()
            plugin = self._make(config)
            plugin.start()
            self.plugin, self.in_force, self._complaint = plugin, InForce(name, content), None
            return True

    def reload_policies(self) -> bool:
        """SIGHUP: the plugin in force reloads its policies."""
        with self._lock:
            return self.plugin.reload_policies() if self.plugin is not None else False

    def stop(self) -> None:
        """Stop watching, then the plugin in force."""
        self._stop.set()
        with self._lock:
            if self.plugin is not None:
                self.plugin.stop()


class NodeLabels:
    """:class:`LabelSource` over the API server: ``read_node`` bounded by ``timeout_s``; a
    failure is one WARNING per kind of failure and None."""

    def __init__(self, api_client: object, node_name: str, *, timeout_s: float = 5.0) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self.node_name = node_name
        self.timeout_s = timeout_s
        self._last_problem: str | None = None

    def labels(self) -> Mapping[str, str] | None:
        """The Node's labels, or None when the API server cannot give them."""
        import json

        from plugin.agent.kubeapi import api_error

        try:
            response: Any = self._core.read_node(
                self.node_name, _preload_content=False, _request_timeout=self.timeout_s
            )
            node = json.loads(response.data)
            labels = (node.get("metadata") or {}).get("labels") or {}
            if not isinstance(labels, dict):
                raise ValueError("metadata.labels is not a mapping")
        except Exception as exc:
            problem = api_error(exc) if not isinstance(exc, ValueError) else str(exc)
            if problem != self._last_problem:
                self._last_problem = problem
                log.warning(
                    "cannot read the labels of Node %s (%s): keeping the config in force",
                    self.node_name,
                    problem,
                )
            return None
        self._last_problem = None
        return {str(k): str(v) for k, v in labels.items()}
