"""The ``flags`` of NVIDIA's device-plugin config as our settings: MIG strategy, roots, the
device list strategy, and each flag cdigen cannot honour collected for the conversion."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdigen.errors import close_match
from cdigen.model import MIG_STRATEGIES
from cdigen.plugin.deviceplugin.nvidia_format import (
    FLAGS_AS_OURS,
    LIST_STRATEGIES,
    NVML_DISCOVERY,
    PLUGIN_FLAGS_AS_OURS,
    PLUGIN_KEYS,
    THEIR_LIST_STRATEGIES,
    Reader,
    shown,
)


def flags_as_ours(read: Reader, flags: Mapping[str, Any]) -> dict[str, Any]:
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
    plugin = read.mapping(flags.get("plugin"), "flags.plugin", PLUGIN_KEYS)
    listed = plugin.get("deviceListStrategy")
    if listed is not None:
        out.update(_list_strategy(read, listed))
    _as_ours(read, plugin, "flags.plugin", PLUGIN_FLAGS_AS_OURS)
    _as_ours(read, flags, "flags", FLAGS_AS_OURS)
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
    read: Reader, block: Mapping[str, Any], path: str, table: Mapping[str, tuple[object, str]]
) -> None:
    """Each setting of ``table`` in ``block``: type-checked, and collected as one cdigen cannot
    express unless its value is the one that means what cdigen does anyway."""
    for key, (same, why) in table.items():
        if key not in block or block[key] is None:
            continue
        value = block[key]
        at = f"{path}.{key}"
        value = read.boolean(value, at) if isinstance(same, bool) else read.string(value, at)
        if key == "deviceDiscoveryStrategy" and value in NVML_DISCOVERY:
            continue
        if value != same:
            read.cannot(f"{at}: {shown(value)}", why)


def _list_strategy(read: Reader, listed: object) -> dict[str, Any]:
    """Their deviceListStrategy (a name or a list of names) as ours: one strategy, CDI first."""
    path = "flags.plugin.deviceListStrategy"
    if isinstance(listed, str):
        names = [listed]
    elif isinstance(listed, list) and listed and all(isinstance(n, str) for n in listed):
        names = list(listed)
    else:
        raise read.error(
            f"expected a strategy name or a list of names, got {shown(listed)}",
            path,
            f"e.g. cdi-cri; their names: {', '.join(THEIR_LIST_STRATEGIES)}",
        )
    for name in names:
        if name not in THEIR_LIST_STRATEGIES:
            guess = close_match(name, THEIR_LIST_STRATEGIES)
            hint = f"did you mean {guess!r}?" if guess else None
            raise read.error(f"unknown device list strategy {name!r}", path, hint)
    usable = sorted((n for n in names if n in LIST_STRATEGIES), key=LIST_STRATEGIES.index)
    if not usable:  # the devices would reach the container some other way than asked
        read.cannot(f"{path}: {', '.join(names)}", f"use one of {', '.join(LIST_STRATEGIES)}")
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
