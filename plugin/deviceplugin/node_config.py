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

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cdigen.errors import ContentError, InputError, printable
from cdigen.plugin.agent.config_file import read_config_file
from cdigen.plugin.agent.lifecycle import ReloadableServable
from cdigen.plugin.deviceplugin.config import PluginConfig

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


def said(exc: Exception) -> str:
    """An error as a log line may show it: a :class:`ContentError` without the content it
    quotes, any other escaped."""
    return exc.redacted() if isinstance(exc, ContentError) else printable(str(exc))


class ConfigSwitcher:
    """A :class:`ReloadableServable` that serves the node's chosen config and switches on a change.

    ``load`` turns a config file's name and bytes (read by :func:`read_config_file`) into
    settings (flags applied over them); ``make`` builds the plugin for them. The label source is
    asked every ``interval_s``.

    A switch builds the new plugin before it stops the one in force; when the new one fails to
    build, nothing is stopped; when it fails to start (a policy it names is missing, its metrics
    port is taken), the config in force is started again. A config that failed is not tried
    again until its name or content changes.
    """

    def __init__(
        self,
        configs: NamedConfigs,
        labels: LabelSource,
        load: Callable[[Path, bytes], PluginConfig],
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
        self._failed: InForce | None = None  # a config that failed to start: not retried
        self._config: PluginConfig | None = None  # the settings in force, to start again
        self.plugin: ReloadableServable | None = None
        self.in_force: InForce | None = None

    def _read(self, path: Path) -> bytes:
        return read_config_file(self.configs.directory, path)

    def start(self) -> None:
        """Serve the chosen config (the default when the labels cannot be read, name no
        config, or name one that does not load or start); the default's errors are raised,
        as a single config's are."""
        labels = self._labels.labels()
        name = self.configs.chosen(labels)
        default = self.configs.default
        path = self.configs.path(name)
        if path is None:
            self._complain(name, self._missing(name) + f"; serving the default {default!r}")
            name, path = default, self.configs.path(default)
        assert path is not None  # NamedConfigs.open checked the default
        if name != default:
            try:
                self._serve(name, path)
                return
            except InputError as exc:
                why = said(exc)
            except Exception as exc:  # it failed to start: what it had started is stopped
                why = f"it failed to start: {said(exc)}"
            self._complain(name, f"config {name!r} not applied, serving the default: {why}")
            name, path = default, self.configs.path(default)
            assert path is not None
        self._serve(name, path)

    def _serve(self, name: str, path: Path) -> None:
        content = self._read(path)
        config = self._load(path, content)
        plugin = self._make(config)
        try:
            plugin.start()
        except BaseException:
            with contextlib.suppress(Exception):
                plugin.stop()
            raise
        self.plugin, self.in_force, self._config = plugin, InForce(name, content), config
        log.info("serving config %r (%s)", name, printable(str(path)))
        self._thread = threading.Thread(target=self._watch, name="node-config", daemon=True)
        self._thread.start()

    def _missing(self, name: str) -> str:
        names = ", ".join(config_names(self.configs.directory))
        return printable(
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
                state = "the config in force is served" if self.plugin else "no config is served"
                log.error("config check failed (%s): %s", said(exc), state)

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
            content = self._read(path)
        except InputError as exc:
            self._complain(
                name, f"config {name!r} not applied, keeping the one in force: {said(exc)}"
            )
            return False
        with self._lock:
            chosen = InForce(name, content)
            if self._stop.is_set() or self.in_force == chosen:
                self._failed = None  # back on the config in force: a failed one may be retried
                return False
            if self._failed == chosen:
                return False  # it failed to start as it is: said once, not retried
            try:
                config = self._load(path, content)
                plugin = self._make(config)  # built before anything in force is stopped
            except Exception as exc:
                self._complain(
                    name, f"config {name!r} not applied, keeping the one in force: {said(exc)}"
                )
                return False
            old = self.in_force
            log.info(
                "switching config %r -> %r: restarting the resource servers",
                old.name if old else None,
                name,
            )
            if self.plugin is not None:
                self.plugin.stop()
                self.plugin = None
            try:
                plugin.start()
            except Exception as exc:
                with contextlib.suppress(Exception):
                    plugin.stop()
                self._failed = chosen
                self._restart(name, old, exc)
                return False
            self.plugin, self.in_force, self._config = plugin, chosen, config
            self._complaint = None
            return True

    def _restart(self, name: str, old: InForce | None, exc: Exception) -> None:
        """Start the config that was in force again after ``name`` failed to start."""
        if old is None or self._config is None:
            log.error("config %r failed to start (%s): no config is served", name, said(exc))
            return
        try:
            plugin = self._make(self._config)
            plugin.start()
        except Exception as again:
            self.in_force, self._failed = None, None  # the next poll tries the chosen again
            log.error(
                "config %r failed to start (%s), and config %r failed to start again (%s): "
                "no devices are served until a config starts",
                name,
                said(exc),
                old.name,
                said(again),
            )
            return
        self.plugin = plugin
        self._complain(
            name,
            f"config {name!r} failed to start ({said(exc)}): config {old.name!r} is served "
            "again; it is retried when its file or the node label changes",
        )

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
        self._client = api_client
        self.node_name = node_name
        self.timeout_s = timeout_s
        self._last_problem: str | None = None

    def labels(self) -> Mapping[str, str] | None:
        """The Node's labels, or None when the API server cannot give them."""
        from urllib.parse import quote

        from cdigen.plugin.agent.kubeapi import api_error, get_json

        try:
            path = f"/api/v1/nodes/{quote(self.node_name, safe='')}"
            node = get_json(self._client, path, timeout_s=self.timeout_s)
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
