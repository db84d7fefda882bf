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

from cdigen.errors import InputError, close_match
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
_THEIR_LIST_STRATEGIES = (*_LIST_STRATEGIES, "volume-mounts")

# The keys of their v1 format, per level (k8s-device-plugin api/config/v1).
_TOP_KEYS = ("version", "flags", "resources", "sharing", "imex")
_FLAG_KEYS = (
    "migStrategy",
    "failOnInitError",
    "mpsRoot",
    "nvidiaDriverRoot",
    "nvidiaDevRoot",
    "gdsEnabled",
    "mofedEnabled",
    "useNodeFeatureAPI",
    "deviceDiscoveryStrategy",
    "plugin",
    "gfd",
)
_PLUGIN_KEYS = (
    "passDeviceSpecs",
    "deviceListStrategy",
    "deviceIDStrategy",
    "cdiAnnotationPrefix",
    "nvidiaCTKPath",
    "containerDriverRoot",
)
_SHARING_KEYS = ("timeSlicing", "mps")
_REPLICATED_KEYS = ("renameByDefault", "failRequestsGreaterThanOne", "resources")
_REPLICATED_RESOURCE_KEYS = ("name", "rename", "devices", "replicas")
_RESOURCE_KEYS = ("gpus", "mig")
_PATTERN_KEYS = ("pattern", "name")

# Settings whose value cdigen cannot honour: (their value that means what cdigen does anyway,
# what cdigen does instead). A value other than the first is refused unless dropped by request.
_FLAGS_AS_OURS: dict[str, tuple[object, str]] = {
    "failOnInitError": (True, "cdigen exits with a one-line error when it cannot start"),
    "gdsEnabled": (False, "no GDS injection; add the GDS devices to the CDI spec yourself"),
    "mofedEnabled": (False, "no MOFED injection"),
    "useNodeFeatureAPI": (False, "node labels come from `cdigen labels` (a feature file)"),
    "mpsRoot": (
        MPS_PIPE_DIRECTORY,
        f"cdigen's MPS directories are {MPS_PIPE_DIRECTORY} and {MPS_SHM_DIRECTORY}",
    ),
    "deviceDiscoveryStrategy": ("auto", "cdigen discovers through NVML (or a node file)"),
}
_PLUGIN_FLAGS_AS_OURS: dict[str, tuple[object, str]] = {
    "passDeviceSpecs": (False, "device nodes reach the container through the CDI spec"),
    "deviceIDStrategy": ("uuid", "the kubelet gets GPU UUIDs"),
    "cdiAnnotationPrefix": ("cdi.k8s.io/", "cdigen uses the CDI default prefix cdi.k8s.io/"),
    "nvidiaCTKPath": (None, "cdigen writes its own CDI specs and needs no hook binary"),
    "containerDriverRoot": (None, "use hostRoot/driverRoot: see docs/install.md"),
}
_NVML_DISCOVERY = ("auto", "nvml")


def convert_hint(path: str) -> str:
    """How to turn NVIDIA's config file ``path`` into ours."""
    return f"convert it with: cdigen plugin config convert {path} --output cdigen-config.yaml"


@dataclass(frozen=True)
class Converted:
    """Our config document, a note per thing worth knowing, and each setting of theirs that
    was dropped (only when the caller asked to drop what cannot be expressed)."""

    document: dict[str, Any]
    notes: tuple[str, ...]
    dropped: tuple[str, ...] = ()


class _Reader:
    """Their document read strictly: unknown keys and wrong types are refused at once (exit 2);
    settings cdigen cannot express are collected, refused at the end unless dropping them was
    asked for."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.unsupported: list[str] = []
        self.notes: list[str] = []

    def error(self, message: str, path: str, hint: str | None = None) -> InputError:
        return InputError(message, where=f"{self.where}: {path}", hint=hint)

    def mapping(self, value: object, path: str, known: Sequence[str]) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.error(f"expected a mapping, got {_shown(value)}", path)
        for key in value:
            if key not in known:
                guess = close_match(str(key), known)
                hint = f"did you mean {guess!r}?" if guess else f"known: {', '.join(known)}"
                raise self.error(f"unknown key {str(key)!r}", _join(path, str(key)), hint)
        return value

    def boolean(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            quoted = " (a string: write it without quotes)" if isinstance(value, str) else ""
            raise self.error(f"expected true or false, got {_shown(value)}{quoted}", path)
        return value

    def string(self, value: object, path: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.error(f"expected a string, got {_shown(value)}", path)
        return value

    def entries(self, value: object, path: str, known: Sequence[str]) -> list[Mapping[str, Any]]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(f"expected a list, got {_shown(value)}", path)
        return [self.mapping(e, f"{path}[{i}]", known) for i, e in enumerate(value)]

    def cannot(self, path: str, why: str) -> None:
        self.unsupported.append(f"{path} ({why})")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _shown(value: object) -> str:
    from cdigen.schemas import describe_value

    return describe_value(value)


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


def convert(doc: Mapping[str, Any], *, where: str, drop_unsupported: bool = False) -> Converted:
    """Our plugin config for NVIDIA's config ``doc``. InputError naming ``where`` and the key on
    an unknown key (with a did-you-mean), a value of the wrong type, a value theirs would refuse
    too, and, unless ``drop_unsupported``, a setting cdigen cannot express (the first named,
    with how many more)."""
    read = _Reader(where)
    doc = read.mapping(doc, "", _TOP_KEYS)
    version = doc.get("version", "v1")
    if version != "v1":
        raise read.error(
            f"unknown NVIDIA config version {version!r}", "version", "only version: v1 is known"
        )
    out: dict[str, Any] = {"apiVersion": "cdigen/v1alpha1", "kind": "PluginConfig"}
    out.update(_flags(read, read.mapping(doc.get("flags"), "flags", _FLAG_KEYS)))
    resources = _resources(read, read.mapping(doc.get("resources"), "resources", _RESOURCE_KEYS))
    sharing = read.mapping(doc.get("sharing"), "sharing", _SHARING_KEYS)
    shared = _sharing(read, sharing, out)
    if doc.get("imex"):
        read.cannot("imex", "no IMEX channels")
    # a shared resource replaces the whole-GPU one it shares, as in their plugin
    whole = [r for r in resources if r["name"] not in shared["bases"]]
    if whole or shared["resources"]:
        out["resources"] = whole + shared["resources"]
    if read.unsupported and not drop_unsupported:
        more = f" (and {len(read.unsupported) - 1} more)" if len(read.unsupported) > 1 else ""
        raise InputError(
            f"cannot express {read.unsupported[0]}{more}",
            where=where,
            hint="change or remove it, or pass --drop-unsupported to convert without it "
            "(each dropped setting is named)",
        )
    return Converted(out, tuple(read.notes), tuple(read.unsupported))


def _flags(read: _Reader, flags: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    strategy = flags.get("migStrategy")
    if strategy is not None:
        if strategy not in MIG_STRATEGIES:
            raise read.error(
                f"unknown MIG strategy {strategy!r}",
                "flags.migStrategy",
                f"use one of: {', '.join(MIG_STRATEGIES)}",
            )
        out["migStrategy"] = strategy
    if flags.get("nvidiaDriverRoot") is not None:
        out["driverRoot"] = read.string(flags["nvidiaDriverRoot"], "flags.nvidiaDriverRoot")
    if flags.get("nvidiaDevRoot") is not None:
        out["devRoot"] = read.string(flags["nvidiaDevRoot"], "flags.nvidiaDevRoot")
    plugin = read.mapping(flags.get("plugin"), "flags.plugin", _PLUGIN_KEYS)
    listed = plugin.get("deviceListStrategy")
    if listed is not None:
        out.update(_list_strategy(read, listed))
    _as_ours(read, plugin, "flags.plugin", _PLUGIN_FLAGS_AS_OURS)
    _as_ours(read, flags, "flags", _FLAGS_AS_OURS)
    if flags.get("failOnInitError") is True:
        read.notes.append(
            "flags.failOnInitError: no equivalent (cdigen exits with a one-line error when it "
            "cannot start, and the DaemonSet restarts it)"
        )
    if flags.get("gfd"):
        read.mapping(
            flags["gfd"],
            "flags.gfd",
            ("oneshot", "noTimestamp", "sleepInterval", "outputFile", "machineTypeFile"),
        )
        read.cannot("flags.gfd", "node labels come from `cdigen labels` and the feature file")
    return out


def _as_ours(
    read: _Reader, block: Mapping[str, Any], path: str, table: Mapping[str, tuple[object, str]]
) -> None:
    """Each setting of ``table`` in ``block``: type-checked, and collected as one cdigen cannot
    express unless its value is the one that means what cdigen does anyway."""
    for key, (same, why) in table.items():
        if key not in block or block[key] is None:
            continue
        value = block[key]
        at = f"{path}.{key}"
        value = read.boolean(value, at) if isinstance(same, bool) else read.string(value, at)
        if key == "deviceDiscoveryStrategy" and value in _NVML_DISCOVERY:
            continue
        if value != same:
            read.cannot(f"{at}: {_shown(value)}", why)


def _list_strategy(read: _Reader, listed: object) -> dict[str, Any]:
    """Their deviceListStrategy (a name or a list of names) as ours: one strategy, CDI first."""
    path = "flags.plugin.deviceListStrategy"
    if isinstance(listed, str):
        names = [listed]
    elif isinstance(listed, list) and listed and all(isinstance(n, str) for n in listed):
        names = list(listed)
    else:
        raise read.error(
            f"expected a strategy name or a list of names, got {_shown(listed)}",
            path,
            f"e.g. cdi-cri; their names: {', '.join(_THEIR_LIST_STRATEGIES)}",
        )
    for name in names:
        if name not in _THEIR_LIST_STRATEGIES:
            guess = close_match(name, _THEIR_LIST_STRATEGIES)
            hint = f"did you mean {guess!r}?" if guess else None
            raise read.error(f"unknown device list strategy {name!r}", path, hint)
    usable = sorted((n for n in names if n in _LIST_STRATEGIES), key=_LIST_STRATEGIES.index)
    if not usable:  # the devices would reach the container some other way than asked
        read.cannot(f"{path}: {', '.join(names)}", f"use one of {', '.join(_LIST_STRATEGIES)}")
        return {}
    dropped = [n for n in names if n != usable[0]]
    if dropped:  # the container still gets its devices, by the one strategy kept
        read.notes.append(
            f"{path}: {', '.join(dropped)} dropped (cdigen passes one strategy: {usable[0]})"
        )
    if usable[:1] == ["envvar"]:
        read.notes.append(
            f"{path}: envvar kept: it needs NVIDIA's container runtime; cdigen's default, "
            "cdi-cri, needs only CDI in the runtime"
        )
    return {"deviceListStrategy": usable[0]} if usable else {}


def qualified(name: object, *, where: str) -> str:
    """A resource name of theirs with the ``nvidia.com/`` prefix their plugin adds."""
    if not isinstance(name, str) or not name:
        raise InputError(f"expected a resource name, got {name!r}", where=where)
    return name if "/" in name else f"{NVIDIA_DOMAIN}/{name}"


def _resources(read: _Reader, resources: Mapping[str, Any]) -> list[dict[str, Any]]:
    gpus = read.entries(resources.get("gpus"), "resources.gpus", _PATTERN_KEYS)
    out: list[dict[str, Any]] = []
    for i, entry in enumerate(gpus):
        at = f"resources.gpus[{i}]"
        name = qualified(entry.get("name"), where=f"{read.where}: {at}.name")
        pattern = read.string(entry.get("pattern", "*"), f"{at}.pattern")
        if i > 0:
            read.cannot(at, f"cdigen serves one whole-GPU resource; {name} would be a second")
            continue
        out.append({"name": name, **({"gpus": [pattern]} if pattern != "*" else {})})
    for i, entry in enumerate(read.entries(resources.get("mig"), "resources.mig", _PATTERN_KEYS)):
        at = f"resources.mig[{i}]"
        name = qualified(entry.get("name"), where=f"{read.where}: {at}.name")
        pattern = read.string(entry.get("pattern"), f"{at}.pattern")
        if name != f"{NVIDIA_DOMAIN}/mig-{pattern}":
            read.cannot(at, f"cdigen names MIG resources nvidia.com/mig-<profile>, not {name}")
    return out


def _sharing(read: _Reader, sharing: Mapping[str, Any], out: Mapping[str, Any]) -> dict[str, Any]:
    """The shared resources, and the names of the whole-GPU resources they replace."""
    result: dict[str, Any] = {"resources": [], "bases": set()}
    blocks = {
        kind: read.mapping(sharing.get(kind), f"sharing.{kind}", _REPLICATED_KEYS)
        for kind in _SHARING_KEYS
    }
    used = [k for k in _SHARING_KEYS if blocks[k].get("resources")]
    if len(used) > 1:
        raise read.error(
            "both sharing.timeSlicing and sharing.mps list resources",
            "sharing",
            "NVIDIA's plugin takes one sharing strategy; keep one",
        )
    if not used:
        return result
    kind = used[0]
    block = blocks[kind]
    if kind == "mps" and out.get("migStrategy") == "mixed":
        raise read.error(
            "sharing.mps with migStrategy mixed",
            "sharing.mps",
            "NVIDIA's plugin refuses it too: use migStrategy none or single with MPS",
        )
    rename = read.boolean(block.get("renameByDefault", False), f"sharing.{kind}.renameByDefault")
    fail = read.boolean(
        block.get("failRequestsGreaterThanOne", False), f"sharing.{kind}.failRequestsGreaterThanOne"
    )
    entries = read.entries(
        block.get("resources"), f"sharing.{kind}.resources", _REPLICATED_RESOURCE_KEYS
    )
    first_at: dict[str, str] = {}
    shared_by: dict[str, list[tuple[int, list[int | str] | None]]] = {}  # base: (entry, devices)
    for i, entry in enumerate(entries):
        at = f"sharing.{kind}.resources[{i}]"
        base = qualified(entry.get("name"), where=f"{read.where}: {at}.name")
        replicas = entry.get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise read.error(
                f"replicas must be a positive integer, got {_shown(replicas)}", f"{at}.replicas"
            )
        rename_to = entry.get("rename")
        name = (
            qualified(read.string(rename_to, f"{at}.rename"), where=f"{read.where}: {at}.rename")
            if rename_to is not None
            else base + (SHARED_SUFFIX if rename else "")
        )
        if base.partition("/")[2].startswith("mig-"):
            read.cannot(at, f"cdigen does not share MIG devices ({base})")
            continue
        gpus = _devices(read, entry.get("devices", "all"), f"{at}.devices")
        if name in first_at:
            raise read.error(
                f"{first_at[name]} and resources[{i}] both give resource {name}",
                f"sharing.{kind}",
                "give each entry its own rename, or merge them into one entry",
            )
        first_at[name] = f"resources[{i}]"
        for j, other in shared_by.get(base, []):
            if other is None or gpus is None:  # one of them shares every GPU of the base
                raise read.error(
                    f"resources[{j}] and resources[{i}] both share {base}, and "
                    f"resources[{j if other is None else i}] every GPU of it",
                    f"sharing.{kind}",
                    "give each entry its own devices, or merge them into one entry",
                )
        shared_by.setdefault(base, []).append((i, gpus))
        shares: dict[str, Any] = {"replicas": replicas}
        if fail:
            shares["failRequestsGreaterThanOne"] = True
        if kind == "mps":
            shares["mps"] = {"pipeDirectory": MPS_PIPE_DIRECTORY, "shmDirectory": MPS_SHM_DIRECTORY}
        resource: dict[str, Any] = {"name": name}
        if gpus is not None:
            resource["gpus"] = gpus
        result["resources"].append({**resource, "sharing": shares})
        result["bases"].add(base)
    for base, listed in shared_by.items():
        if all(gpus is not None for _, gpus in listed):  # some GPUs of the base stay whole
            chosen = [g for _, gpus in listed for g in gpus or ()]
            entries_at = ", ".join(f"resources[{i}]" for i, _ in listed)
            read.cannot(
                f"sharing.{kind}.{entries_at} devices: the GPUs outside {_shown(chosen)}",
                f"their plugin keeps them whole under {base}; add {{name: {base}, gpus: [...]}} "
                "naming them after converting",
            )
    if kind == "mps" and result["resources"]:
        read.notes.append(
            "sharing.mps: needs an MPS control daemon using "
            f"{MPS_PIPE_DIRECTORY} and {MPS_SHM_DIRECTORY} (deploy/kubernetes/mps runs one)"
        )
    return result


def _devices(read: _Reader, devices: object, path: str) -> list[int | str] | None:
    """Their ``devices`` (``all``, a count, or a list of GPU indexes and UUIDs) as our ``gpus``
    list (None: every GPU)."""
    if devices == "all":
        return None
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        return list(range(devices))
    if isinstance(devices, list) and devices:
        out: list[int | str] = []
        for item in devices:
            if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
                out.append(item)
            elif isinstance(item, str) and item.isdigit():
                out.append(int(item))
            elif isinstance(item, str) and item.startswith("GPU-"):
                out.append(item)
            elif isinstance(item, str) and (item.startswith("MIG-") or ":" in item):
                raise read.error(
                    f"{item!r} is a MIG device", path, "cdigen does not share MIG devices"
                )
            else:
                raise read.error(f"{_shown(item)} is not a GPU index or UUID", path)
        return out
    raise read.error(
        f"expected all, a count or a list of GPU indexes and UUIDs, got {_shown(devices)}", path
    )


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


def describe(notes: Sequence[str], dropped: Sequence[str] = ()) -> str:
    """The notes and dropped settings as YAML comment lines for the top of a converted file."""
    head = "# converted by `cdigen plugin config convert` from NVIDIA's device-plugin config"
    lines = [head, *(f"# note: {n}" for n in notes), *(f"# dropped: {d}" for d in dropped)]
    return "\n".join(lines) + "\n"
