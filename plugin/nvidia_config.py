"""NVIDIA's device-plugin config (``version: v1``) and environment names, read into ours.

``cdigen plugin config convert`` turns one of their config files into a cdigen plugin config
and says, per key, what has no equivalent here. :func:`nvidia_env` maps the environment
variables their DaemonSets set onto the ``CDIGEN_*`` ones where they mean the same.
Pure functions over parsed documents: no gRPC, no files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdigen.errors import InputError
from cdigen.model import MIG_STRATEGIES
from plugin.defaults import STRATEGIES

NVIDIA_DOMAIN = "nvidia.com"
SHARED_SUFFIX = ".shared"  # what renameByDefault appends
# What cdigen's MPS component (deploy/kubernetes/components/mps) runs the daemon with.
MPS_PIPE_DIRECTORY = "/run/nvidia/mps"
MPS_SHM_DIRECTORY = "/run/nvidia/mps-shm"

# Their list strategies that mean the same here; volume-mounts has no equivalent.
# ours less native, which NVIDIA's plugin has not
_LIST_STRATEGIES = tuple(s for s in STRATEGIES if s != "native")

# Flags dropped on conversion, with why (what cdigen does instead).
_DROPPED_FLAGS = {
    "failOnInitError": "cdigen exits with a one-line error when it cannot start, and the "
    "DaemonSet restarts it",
    "restartOnDeviceUnhealthy": "cdigen marks unhealthy devices and keeps serving the others",
    "gdsEnabled": "no GDS injection; add the GDS devices to the CDI spec with cdigen generate",
    "mofedEnabled": "no MOFED injection",
    "mpsRoot": f"cdigen's MPS directories are {MPS_PIPE_DIRECTORY} and {MPS_SHM_DIRECTORY}",
    "gfd": "node labels come from `cdigen labels` and the plugin's feature file",
    "deviceDiscoveryStrategy": "cdigen discovers through NVML (or a node file)",
    "imex": "no IMEX channels",
}
_DROPPED_PLUGIN_FLAGS = {
    "passDeviceSpecs": "device nodes always reach the container through the CDI spec",
    "deviceIDStrategy": "the kubelet gets GPU UUIDs; containers get CDI names",
    "cdiAnnotationPrefix": "cdigen uses the CDI default prefix cdi.k8s.io/",
    "nvidiaCTKPath": "cdigen writes its own CDI specs (cdigen generate) and needs no hook binary",
    "containerDriverRoot": "use hostRoot/driverRoot: see docs/install.md",
}


def convert_hint(path: str) -> str:
    """How to turn NVIDIA's config file ``path`` into ours."""
    return f"convert it with: cdigen plugin config convert {path} --output cdigen-config.yaml"


@dataclass(frozen=True)
class Converted:
    """Our config document, and one note per thing of theirs with no equivalent here."""

    document: dict[str, Any]
    notes: tuple[str, ...]


def is_nvidia_config(doc: object) -> bool:
    """True when ``doc`` is in NVIDIA's format (``version``, ``flags``, top-level ``sharing``,
    or ``resources`` as a mapping of ``gpus``/``mig``), none of which ours has."""
    if not isinstance(doc, Mapping):
        return False
    return (
        "version" in doc
        or "flags" in doc
        or "sharing" in doc
        or isinstance(doc.get("resources"), Mapping)
    )


def convert(doc: Mapping[str, Any], *, where: str) -> Converted:
    """Our plugin config for NVIDIA's config ``doc``; InputError naming ``where`` on a value
    theirs would refuse too (an unknown version or MIG strategy, replicas below 1)."""
    if doc.get("version", "v1") != "v1":
        raise InputError(
            f"unknown NVIDIA config version {doc.get('version')!r}",
            where=f"{where}: version",
            hint="only version: v1 is known",
        )
    notes: list[str] = []
    out: dict[str, Any] = {"apiVersion": "cdigen/v1alpha1", "kind": "PluginConfig"}
    out.update(_flags(_mapping(doc, "flags", where), where=where, notes=notes))
    resources = _resources(_mapping(doc, "resources", where), where=where, notes=notes)
    shared = _sharing(_mapping(doc, "sharing", where), out, where=where, notes=notes)
    # a shared resource replaces the whole-GPU one it shares, as in their plugin
    whole = [r for r in resources if r["name"] not in shared["bases"]]
    if whole or shared["resources"]:
        out["resources"] = whole + shared["resources"]
    for key in sorted(set(doc) - {"version", "flags", "resources", "sharing"}):
        notes.append(f"{key}: not part of NVIDIA's v1 format known here; dropped")
    return Converted(out, tuple(notes))


def _mapping(doc: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = doc.get(key) or {}
    if not isinstance(value, Mapping):
        raise InputError(
            f"{key} must be a mapping, got {type(value).__name__}", where=f"{where}: {key}"
        )
    return value


def _flags(flags: Mapping[str, Any], *, where: str, notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    strategy = flags.get("migStrategy")
    if strategy is not None:
        if strategy not in MIG_STRATEGIES:
            raise InputError(
                f"unknown MIG strategy {strategy!r}",
                where=f"{where}: flags.migStrategy",
                hint=f"use one of: {', '.join(MIG_STRATEGIES)}",
            )
        out["migStrategy"] = strategy
    if flags.get("nvidiaDriverRoot") is not None:
        out["driverRoot"] = str(flags["nvidiaDriverRoot"])
    if flags.get("nvidiaDevRoot") is not None:
        out["devRoot"] = str(flags["nvidiaDevRoot"])
    plugin = flags.get("plugin") or {}
    if not isinstance(plugin, Mapping):
        raise InputError("flags.plugin must be a mapping", where=f"{where}: flags.plugin")
    listed = plugin.get("deviceListStrategy")
    if listed is not None:
        out.update(_list_strategy(listed, notes))
    for key in sorted(plugin):
        if key in _DROPPED_PLUGIN_FLAGS:
            notes.append(f"flags.plugin.{key}: no equivalent ({_DROPPED_PLUGIN_FLAGS[key]})")
        elif key != "deviceListStrategy":
            notes.append(f"flags.plugin.{key}: unknown to the converter; dropped")
    known = {"migStrategy", "nvidiaDriverRoot", "nvidiaDevRoot", "plugin"}
    for key in sorted(set(flags) - known):
        why = _DROPPED_FLAGS.get(key, "unknown to the converter")
        notes.append(f"flags.{key}: no equivalent ({why})")
    return out


def _list_strategy(listed: object, notes: list[str]) -> dict[str, Any]:
    """Their deviceListStrategy (a name or a list) as ours: one strategy, CDI first."""
    names = [listed] if isinstance(listed, str) else list(listed or [])  # type: ignore[call-overload]
    usable = sorted((n for n in names if n in _LIST_STRATEGIES), key=_LIST_STRATEGIES.index)
    dropped = [str(n) for n in names if n not in usable[:1]]
    if dropped:
        chosen = usable[0] if usable else "the default, cdi-cri"
        notes.append(
            f"flags.plugin.deviceListStrategy: {', '.join(dropped)} dropped (cdigen passes one "
            f"strategy: {chosen})"
        )
    if usable[:1] == ["envvar"]:
        notes.append(
            "flags.plugin.deviceListStrategy: envvar kept: it needs NVIDIA's container runtime; "
            "cdigen's default, cdi-cri, needs only CDI in the runtime"
        )
    return {"deviceListStrategy": usable[0]} if usable else {}


def qualified(name: object, *, where: str) -> str:
    """A resource name of theirs with the ``nvidia.com/`` prefix their plugin adds."""
    if not isinstance(name, str) or not name:
        raise InputError(f"expected a resource name, got {name!r}", where=where)
    return name if "/" in name else f"{NVIDIA_DOMAIN}/{name}"


def _resources(
    resources: Mapping[str, Any], *, where: str, notes: list[str]
) -> list[dict[str, Any]]:
    gpus = _entries(resources.get("gpus"), f"{where}: resources.gpus")
    out: list[dict[str, Any]] = []
    if gpus:
        first = gpus[0]
        out.append({"name": qualified(first.get("name"), where=f"{where}: resources.gpus[0]")})
        if first.get("pattern", "*") != "*" or len(gpus) > 1:
            notes.append(
                "resources.gpus: cdigen advertises every GPU under one resource; patterns "
                f"dropped, all GPUs go to {out[0]['name']}"
            )
    for i, entry in enumerate(_entries(resources.get("mig"), f"{where}: resources.mig")):
        name = qualified(entry.get("name"), where=f"{where}: resources.mig[{i}]")
        pattern = entry.get("pattern")
        if name != f"{NVIDIA_DOMAIN}/mig-{pattern}":
            notes.append(
                f"resources.mig[{i}]: cdigen names MIG resources nvidia.com/mig-<profile>; "
                f"{name} for {pattern!r} dropped"
            )
    for key in sorted(set(resources) - {"gpus", "mig"}):
        notes.append(f"resources.{key}: unknown to the converter; dropped")
    return out


def _entries(value: object, where: str) -> list[Mapping[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(e, Mapping) for e in value):
        raise InputError("expected a list of {pattern, name} entries", where=where)
    return value


def _sharing(
    sharing: Mapping[str, Any], out: Mapping[str, Any], *, where: str, notes: list[str]
) -> dict[str, Any]:
    """The shared resources, and the names of the whole-GPU resources they replace."""
    result: dict[str, Any] = {"resources": [], "bases": set()}
    used = [k for k in ("timeSlicing", "mps") if (sharing.get(k) or {}).get("resources")]
    if len(used) > 1:
        raise InputError(
            "both sharing.timeSlicing and sharing.mps list resources",
            where=f"{where}: sharing",
            hint="NVIDIA's plugin takes one sharing strategy; keep one",
        )
    for key in sorted(set(sharing) - {"timeSlicing", "mps"}):
        notes.append(f"sharing.{key}: unknown to the converter; dropped")
    if not used:
        return result
    kind = used[0]
    block = sharing[kind]
    if kind == "mps" and out.get("migStrategy") == "mixed":
        raise InputError(
            "sharing.mps with migStrategy mixed",
            where=f"{where}: sharing.mps",
            hint="NVIDIA's plugin refuses it too: use migStrategy none or single with MPS",
        )
    if block.get("strategy"):
        notes.append(f"sharing.{kind}.strategy: {block['strategy']!r} dropped")
    rename = bool(block.get("renameByDefault", False))
    fail = bool(block.get("failRequestsGreaterThanOne", False))
    for i, entry in enumerate(_entries(block.get("resources"), f"{where}: sharing.{kind}")):
        at = f"{where}: sharing.{kind}.resources[{i}]"
        base = qualified(entry.get("name"), where=at)
        replicas = entry.get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise InputError(f"replicas must be a positive integer, got {replicas!r}", where=at)
        if base.partition("/")[2].startswith("mig-"):
            notes.append(
                f"sharing.{kind}.resources[{i}]: cdigen does not share MIG devices; {base} dropped"
            )
            continue
        if entry.get("devices", "all") != "all":
            notes.append(
                f"sharing.{kind}.resources[{i}].devices: cdigen shares every GPU; "
                f"{entry['devices']!r} dropped"
            )
        name = entry.get("rename")
        name = qualified(name, where=at) if name else base + (SHARED_SUFFIX if rename else "")
        shares: dict[str, Any] = {"replicas": replicas}
        if fail:
            shares["failRequestsGreaterThanOne"] = True
        if kind == "mps":
            shares["mps"] = {"pipeDirectory": MPS_PIPE_DIRECTORY, "shmDirectory": MPS_SHM_DIRECTORY}
        result["resources"].append({"name": name, "sharing": shares})
        result["bases"].add(base)
    if kind == "mps" and result["resources"]:
        notes.append(
            "sharing.mps: needs an MPS control daemon using "
            f"{MPS_PIPE_DIRECTORY} and {MPS_SHM_DIRECTORY} (deploy/kubernetes/mps runs one)"
        )
    return result


# Their environment variables that mean the same as ours.
NVIDIA_ENV_VARS = {
    "MIG_STRATEGY": "CDIGEN_MIG_STRATEGY",
    "DEVICE_LIST_STRATEGY": "CDIGEN_DEVICE_LIST_STRATEGY",
    "NVIDIA_DRIVER_ROOT": "CDIGEN_DRIVER_ROOT",
    "NVIDIA_DEV_ROOT": "CDIGEN_DEV_ROOT",
}


def nvidia_env(env: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """The ``CDIGEN_*`` variables NVIDIA's names in ``env`` stand for, where ours are unset,
    and one deprecation line per name used."""
    mapped: dict[str, str] = {}
    lines: list[str] = []
    for theirs, ours in NVIDIA_ENV_VARS.items():
        value = env.get(theirs)
        if not value:
            continue
        if theirs == "DEVICE_LIST_STRATEGY":
            value = _env_list_strategy(value)
            if value is None:
                lines.append(
                    f"{theirs}={env[theirs]} has no equivalent here (use {ours}: "
                    f"{', '.join(_LIST_STRATEGIES)}); ignored"
                )
                continue
        if env.get(ours):
            lines.append(f"{theirs} is NVIDIA's name; {ours} is set too and wins")
            continue
        mapped[ours] = value
        lines.append(f"{theirs} is NVIDIA's name for {ours}; read it as that (deprecated)")
    return mapped, tuple(lines)


def _env_list_strategy(value: str) -> str | None:
    usable = [n for n in value.split(",") if n.strip() in _LIST_STRATEGIES]
    return usable[0].strip() if usable else None


def describe(notes: Sequence[str]) -> str:
    """The notes as YAML comment lines for the top of a converted file."""
    head = "# converted by `cdigen plugin config convert` from NVIDIA's device-plugin config"
    return "\n".join([head, *(f"# note: {n}" for n in notes)]) + "\n"
