"""Settings of ``cdigen plugin serve``: flag > env (``CDIGEN_*``) > config file > default."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdigen.errors import ContentError, FlagError, InputError
from cdigen.model import DEVICE_PLUGIN_MIG_STRATEGY, MIG_STRATEGIES
from cdigen.plugin.agent.health_watchers import DEFAULT_POLL_INTERVAL_S
from cdigen.plugin.agent.logs import LOG_FORMATS, LOG_LEVELS
from cdigen.plugin.agent.xid import DEFAULT_IGNORED_XIDS, DEFAULT_RECOVER_AFTER_S
from cdigen.plugin.deviceplugin.config_sources import (
    check_choice,
    overrides_from_env,
    overrides_from_file,
    parse_seconds,
    with_nvidia_env,
)
from cdigen.plugin.deviceplugin.defaults import (
    DEFAULT_CDI_KIND,
    DEFAULT_PLUGIN_DIR,
    DEFAULT_RESOURCE,
    DEFAULT_SPEC_DIRS,
    DEFAULT_STRATEGY,
    STRATEGIES,
)

if (
    TYPE_CHECKING
):  # cdigen.plugin.deviceplugin.sharing is imported when a config file is read: --help stays fast
    from cdigen.plugin.deviceplugin.gpu_selector import Claimant, GpuSelector
    from cdigen.plugin.deviceplugin.sharing import Sharing

ENV_PREFIX = "CDIGEN_"


class ResourcesError(InputError):
    """The resource list as a whole cannot be served (two owners of a GPU, a name twice, MIG
    resources that do not fit the strategy): :func:`load_config` names the file it came from."""


@dataclass(frozen=True)
class ResourceConfig:
    """One advertised extended resource and the policy that answers its preferred allocations."""

    name: str = DEFAULT_RESOURCE
    policy: str | None = None  # None: the built-in default policy
    sharing: Sharing | None = None  # None: whole GPUs (or MIG devices)
    # driver capabilities its containers get; those beyond the node-wide ``capabilities`` come
    # as capability devices (``nvidia.com/gpu=capability-graphics``). None: the node-wide ones
    capabilities: tuple[str, ...] | None = None
    # the GPUs it advertises (whole or in shares); None: every GPU. No GPU has two owners.
    gpus: GpuSelector | None = None


@dataclass(frozen=True)
class HealthConfig:
    """How device health is watched."""

    ignored_xids: tuple[int, ...] = DEFAULT_IGNORED_XIDS
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    recover_after_s: float = DEFAULT_RECOVER_AFTER_S


@dataclass(frozen=True)
class PluginConfig:
    """Every setting of a serving plugin, after merging all sources."""

    node: str = "nvml"
    plugin_dir: Path = Path(DEFAULT_PLUGIN_DIR)
    spec_dirs: tuple[Path, ...] = tuple(Path(d) for d in DEFAULT_SPEC_DIRS)
    cdi_kind: str = DEFAULT_CDI_KIND
    device_list_strategy: str = DEFAULT_STRATEGY
    policy_dir: Path | None = None
    mig_strategy: str = DEVICE_PLUGIN_MIG_STRATEGY
    health: HealthConfig = field(default_factory=HealthConfig)
    log_level: str = "info"
    log_format: str = "text"
    resources: tuple[ResourceConfig, ...] = (ResourceConfig(),)
    metrics_address: str | None = None  # HOST:PORT for /metrics and /healthz; None: off
    generate_specs: bool = False  # rewrite the CDI spec in spec_dirs[0] on a new MIG layout
    driver_root: str = "/"  # for generation
    dev_root: str = "/"  # for generation
    host_root: str = "/"  # for generation: where the host's / is (driver/dev roots are under it)
    capabilities: tuple[str, ...] = ("compute", "utility")  # for generation: driver capabilities
    rescan_interval_s: float = 30.0  # how often NVML is asked for a new MIG layout
    sysfs_root: str = "/sys"  # NVML discovery: NUMA fallback
    proc_root: str = "/proc"  # NVML discovery: driver/nvidia-caps/mig-minors
    features_file: Path | None = None  # NFD feature file kept current with the node labels

    @property
    def gpu_resource(self) -> str:
        """The resource name of whole GPUs (and of MIG devices under ``single``)."""
        for resource in self.resources:
            if not is_mig_resource(resource.name) and resource.sharing is None:
                return resource.name
        return DEFAULT_RESOURCE

    @property
    def advertises_whole_gpus(self) -> bool:
        """False when every GPU resource listed is a sharing one: GPUs go out as shares only."""
        gpu_resources = [r for r in self.resources if not is_mig_resource(r.name)]
        return not gpu_resources or any(r.sharing is None for r in gpu_resources)

    def extra_capabilities(self, resource: str) -> tuple[str, ...]:
        """The capabilities ``resource`` asks for beyond the node-wide ones, in NVIDIA's
        order: Allocate hands each out as a capability device after the GPUs."""
        from cdigen.cdi.capabilities import ordered_capabilities

        asked = (c for r in self.resources if r.name == resource for c in r.capabilities or ())
        return ordered_capabilities(c for c in asked if c not in self.capabilities)

    @property
    def capability_devices(self) -> tuple[str, ...]:
        """Every capability some resource asks for beyond the node-wide ones: generateSpecs
        writes a capability device for each."""
        from cdigen.cdi.capabilities import ordered_capabilities

        return ordered_capabilities(
            c for r in self.resources for c in self.extra_capabilities(r.name)
        )

    @property
    def gpu_claimants(self) -> tuple[Claimant, ...]:
        """The resources that advertise GPUs, whole or in shares (per-profile MIG entries only
        choose policies), each with the GPUs it selects: no GPU may have two."""
        from cdigen.plugin.deviceplugin.gpu_selector import Claimant

        return tuple(
            Claimant(r.name, r.gpus) for r in self.resources if not is_mig_resource(r.name)
        )

    @property
    def sharing_resources(self) -> tuple[ResourceConfig, ...]:
        """The resources that advertise shares of GPUs, in config order."""
        return tuple(r for r in self.resources if r.sharing is not None)


def is_mig_resource(name: str) -> bool:
    """True for a per-profile MIG resource name such as ``nvidia.com/mig-1g.10gb``."""
    return name.partition("/")[2].startswith("mig-")


def _apply(config: PluginConfig, overrides: Mapping[str, Any]) -> PluginConfig:
    changes: dict[str, Any] = {}
    health = config.health
    for name, value in overrides.items():
        if value is None:
            continue
        if name in ("plugin_dir", "policy_dir", "features_file"):
            changes[name] = Path(value)
        elif name == "spec_dirs":
            changes[name] = tuple(Path(v) for v in value)
        elif name == "resource":
            changes["resources"] = _renamed(changes.get("resources", config.resources), value)
        elif name == "resources":
            changes[name] = tuple(ResourceConfig(**fields) for fields in value)
        elif name == "capabilities":
            from cdigen.cdi.capabilities import parse_capabilities

            changes[name] = parse_capabilities(str(value))
        elif name == "ignored_xids":
            health = replace(health, ignored_xids=tuple(sorted(set(value))))
        elif name == "health_poll_interval":
            health = replace(
                health, poll_interval_s=parse_seconds(value, where="--health-poll-interval")
            )
        elif name == "rescan_interval_s":
            changes[name] = parse_seconds(value, where="rescanIntervalSeconds")
        elif name == "recover_after_s":
            health = replace(health, recover_after_s=float(value))
        else:
            changes[name] = value
    return replace(config, health=health, **changes)


def _renamed(resources: tuple[ResourceConfig, ...], name: Any) -> tuple[ResourceConfig, ...]:
    """``resources`` with the whole-GPU one named ``name`` (``--resource``/``CDIGEN_RESOURCE``);
    the sharing and MIG ones stay. A lone sharing resource is renamed itself; with only
    per-profile MIG entries (which choose policies) the whole-GPU resource is added."""
    whole = [i for i, r in enumerate(resources) if not is_mig_resource(r.name) and not r.sharing]
    if whole:
        return tuple(
            replace(r, name=str(name)) if i == whole[0] else r for i, r in enumerate(resources)
        )
    if len(resources) == 1 and not is_mig_resource(resources[0].name):
        return (replace(resources[0], name=str(name)),)
    if all(is_mig_resource(r.name) for r in resources):
        return (ResourceConfig(str(name)), *resources)
    raise FlagError(
        f"the config lists {len(resources)} resources but no whole-GPU resource to rename "
        f"to {name!r}",
        where="--resource/CDIGEN_RESOURCE",
        hint="rename the resource in the config file's resources instead",
    )


def validate_config(config: PluginConfig) -> PluginConfig:
    """``config`` as a whole checked as ``plugin serve`` checks it after merging its sources
    (choices, resource names, one owner per GPU); InputError on the first problem."""
    check_choice(config.device_list_strategy, STRATEGIES, what="device list strategy")
    check_choice(config.log_level, LOG_LEVELS, what="log level")
    check_choice(config.log_format, LOG_FORMATS, what="log format")
    check_choice(config.mig_strategy, MIG_STRATEGIES, what="MIG strategy")
    _check_served_names(config)
    _check_resource_kinds(config)
    from cdigen.cdi.names import kind_problem

    problem = kind_problem(config.cdi_kind)
    if problem:
        raise InputError(problem, where="CDI kind")
    return config


def _check_served_names(config: PluginConfig) -> None:
    """Each resource name one the kubelet takes, and no name twice."""
    from cdigen.plugin.deviceplugin.registration import resource_name_problem

    for resource in config.resources:
        problem = resource_name_problem(resource.name)
        if problem:
            raise InputError(
                problem, where="resource name", hint="use DOMAIN/NAME, e.g. nvidia.com/gpu"
            )
    names = [r.name for r in config.resources]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ResourcesError(
            f"resource {twice[0]} is listed more than once",
            where="resources",
            hint="give each resource its own name (each is served on its own socket)",
        )


def _check_resource_kinds(config: PluginConfig) -> None:
    """Whole-GPU, shared and per-profile MIG resources that fit together: one whole-GPU
    resource, MIG ones only under the mixed strategy and never shared or given gpus, no GPU
    claimed twice."""
    gpu_resources = [
        r for r in config.resources if not is_mig_resource(r.name) and r.sharing is None
    ]
    mig_resources = [r for r in config.resources if is_mig_resource(r.name)]
    if mig_resources and config.mig_strategy != "mixed":
        raise ResourcesError(
            f"resource {mig_resources[0].name} is a per-profile MIG resource, but migStrategy "
            f"is {config.mig_strategy!r}",
            where="resources",
            hint="set migStrategy: mixed, or drop the mig- resource",
        )
    from cdigen.plugin.deviceplugin.gpu_selector import (
        OVERLAP_HINT,
        overlap_message,
        static_overlap,
    )

    overlap = static_overlap(config.gpu_claimants)
    if overlap is not None:
        first, second, what = overlap
        raise ResourcesError(
            overlap_message(first.name, second.name, what), where="resources", hint=OVERLAP_HINT
        )
    if len(gpu_resources) > 1:
        # even on GPUs of their own: one whole-GPU resource is served (the MIG single strategy
        # and --resource rename it)
        raise ResourcesError(
            f"resources {gpu_resources[0].name} and {gpu_resources[1].name} both advertise "
            "whole GPUs; one whole-GPU resource is served",
            where="resources",
            hint="keep one whole-GPU resource; add sharing: {replicas: N} or "
            "sharing: {memorySliceMiB: M} to the others",
        )
    mig_selected = [r.name for r in mig_resources if r.gpus is not None]
    if mig_selected:
        raise ResourcesError(
            f"resource {mig_selected[0]} is a per-profile MIG resource: its devices are the MIG "
            "devices of that profile, and gpus does not apply",
            where="resources",
            hint="leave gpus out of mig- resources",
        )
    shared_mig = [r.name for r in config.resources if r.sharing and is_mig_resource(r.name)]
    if shared_mig:
        raise ResourcesError(
            f"resource {shared_mig[0]} is a per-profile MIG resource and cannot be shared",
            where="resources",
            hint="give the sharing resource a name such as nvidia.com/gpu.shared",
        )


def load_config(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    content: bytes | None = None,
) -> PluginConfig:
    """Merge defaults, the config file, ``CDIGEN_*`` variables and flags, in rising precedence.

    NVIDIA's environment names stand in for ours where they mean the same (one deprecation
    warning each); NVIDIA's config format is refused with the command that converts it.
    ``content``: the file's bytes, already read (cdigen.plugin.agent.config_file), named by
    ``path``.
    """
    config = PluginConfig() if path is None else config_from_file(path, content)
    return merged_config(config, path=path, env=env, flags=flags)


def config_from_file(path: str | Path, content: bytes | None = None) -> PluginConfig:
    """The settings of the config file at ``path`` over the defaults (``content``: its bytes,
    already read); every InputError names the file."""
    from cdigen.fileio import parse_document, read_document

    if content is not None:
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"not UTF-8 text (byte {exc.start})", where=str(path)) from None
        doc = parse_document(text, where=str(path))
    else:
        doc = read_document(path, what="plugin config file")
    return config_from_document(doc, where=str(path))


def merged_config(
    config: PluginConfig,
    *,
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> PluginConfig:
    """``config`` (the file's, from ``path``) under the ``CDIGEN_*`` variables and the flags,
    checked as a whole: FlagError for a flag's (or its variable's) value, ResourcesError
    naming ``path`` for a resource list that cannot be served, InputError otherwise."""
    env_overrides = overrides_from_env(with_nvidia_env(os.environ if env is None else env))
    config = _apply(config, env_overrides)
    config = _apply(config, dict(flags or {}))
    try:
        return validate_config(config)
    except ResourcesError as exc:  # the resource list is the file's: name it
        if path is None:
            raise
        raise ResourcesError(exc.message, where=f"{path}: resources", hint=exc.hint) from None


def config_from_document(doc: Any, *, where: str) -> PluginConfig:
    """The settings a config document asks for over the defaults (not yet validated as a
    whole: :func:`load_config` does that after env and flags); None (an empty file) asks
    for none."""
    from cdigen.plugin.deviceplugin.nvidia_config import convert_hint, is_nvidia_config
    from cdigen.schemas import validate

    if doc is None:
        doc = {}

    if is_nvidia_config(doc):
        raise InputError(
            "this is NVIDIA's device-plugin config format (version/flags/sharing), not cdigen's",
            where=where,
            hint=convert_hint(where),
        )
    _check_resource_names(doc, where)
    validate(doc, "plugin-config", where=where)
    try:
        return _apply(PluginConfig(), overrides_from_file(doc))
    except InputError as exc:  # the checks beyond the schema (sharing): name the file too
        at = f"{where}: {exc.where}" if exc.where else where
        raise ContentError(exc.message, where=at, hint=exc.hint) from None


def _check_resource_names(doc: Any, where: str) -> None:
    """A resource name the kubelet would refuse, said as for ``--resource`` (before the
    schema, whose pattern would only quote itself)."""
    from cdigen.plugin.deviceplugin.registration import resource_name_problem

    resources = doc.get("resources") if isinstance(doc, Mapping) else None
    for i, resource in enumerate(resources if isinstance(resources, list) else []):
        name = resource.get("name") if isinstance(resource, Mapping) else None
        problem = resource_name_problem(name) if isinstance(name, str) else None
        if problem:
            raise InputError(
                problem,
                where=f"{where}: resources[{i}].name",
                hint="use DOMAIN/NAME, e.g. nvidia.com/gpu",
            )
