"""The ``resources`` and ``sharing`` of NVIDIA's device-plugin config as our resources: their
whole-GPU resource, and their time-slicing or MPS replicas as our shared resources."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdigen.errors import InputError
from cdigen.plugin.deviceplugin.nvidia_format import (
    MPS_PIPE_DIRECTORY,
    MPS_SHM_DIRECTORY,
    PATTERN_KEYS,
    REPLICATED_KEYS,
    REPLICATED_RESOURCE_KEYS,
    SHARING_KEYS,
    Reader,
    shown,
)

NVIDIA_DOMAIN = "nvidia.com"
SHARED_SUFFIX = ".shared"  # what renameByDefault appends


def qualified(name: object, *, where: str) -> str:
    """A resource name of theirs with the ``nvidia.com/`` prefix their plugin adds."""
    if not isinstance(name, str) or not name:
        raise InputError(f"expected a resource name, got {name!r}", where=where)
    return name if "/" in name else f"{NVIDIA_DOMAIN}/{name}"


def whole_gpu_resources(read: Reader, resources: Mapping[str, Any]) -> list[dict[str, Any]]:
    gpus = read.entries(resources.get("gpus"), "resources.gpus", PATTERN_KEYS)
    out: list[dict[str, Any]] = []
    for i, entry in enumerate(gpus):
        at = f"resources.gpus[{i}]"
        name = qualified(entry.get("name"), where=f"{read.where}: {at}.name")
        pattern = read.string(entry.get("pattern", "*"), f"{at}.pattern")
        if i > 0:
            read.cannot(at, f"cdigen serves one whole-GPU resource; {name} would be a second")
            continue
        out.append({"name": name, **({"gpus": [pattern]} if pattern != "*" else {})})
    for i, entry in enumerate(read.entries(resources.get("mig"), "resources.mig", PATTERN_KEYS)):
        at = f"resources.mig[{i}]"
        name = qualified(entry.get("name"), where=f"{read.where}: {at}.name")
        pattern = read.string(entry.get("pattern"), f"{at}.pattern")
        if name != f"{NVIDIA_DOMAIN}/mig-{pattern}":
            read.cannot(at, f"cdigen names MIG resources nvidia.com/mig-<profile>, not {name}")
    return out


def shared_resources(
    read: Reader, sharing: Mapping[str, Any], out: Mapping[str, Any]
) -> dict[str, Any]:
    """The shared resources, and the names of the whole-GPU resources they replace."""
    result: dict[str, Any] = {"resources": [], "bases": set()}
    chosen = _sharing_block(read, sharing, out)
    if chosen is None:
        return result
    kind, block = chosen
    rename = read.boolean(block.get("renameByDefault", False), f"sharing.{kind}.renameByDefault")
    fail = read.boolean(
        block.get("failRequestsGreaterThanOne", False), f"sharing.{kind}.failRequestsGreaterThanOne"
    )
    entries = read.entries(
        block.get("resources"), f"sharing.{kind}.resources", REPLICATED_RESOURCE_KEYS
    )
    first_at: dict[str, str] = {}
    shared_by: dict[str, list[tuple[int, list[int | str] | None]]] = {}  # base: (entry, devices)
    for i, entry in enumerate(entries):
        read_entry = _shared_entry(read, f"sharing.{kind}.resources[{i}]", entry, rename)
        if read_entry is None:
            continue
        base, name, replicas, gpus = read_entry
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
    _note_gpus_kept_whole(read, kind, shared_by)
    if kind == "mps" and result["resources"]:
        read.notes.append(
            "sharing.mps: needs an MPS control daemon using "
            f"{MPS_PIPE_DIRECTORY} and {MPS_SHM_DIRECTORY} (deploy/kubernetes/mps runs one)"
        )
    return result


def _sharing_block(
    read: Reader, sharing: Mapping[str, Any], out: Mapping[str, Any]
) -> tuple[str, Mapping[str, Any]] | None:
    """The one sharing strategy that lists resources (``timeSlicing`` or ``mps``) and its
    block; None when neither does."""
    blocks = {
        kind: read.mapping(sharing.get(kind), f"sharing.{kind}", REPLICATED_KEYS)
        for kind in SHARING_KEYS
    }
    used = [k for k in SHARING_KEYS if blocks[k].get("resources")]
    if len(used) > 1:
        raise read.error(
            "both sharing.timeSlicing and sharing.mps list resources",
            "sharing",
            "NVIDIA's plugin takes one sharing strategy; keep one",
        )
    if not used:
        return None
    if used[0] == "mps" and out.get("migStrategy") == "mixed":
        raise read.error(
            "sharing.mps with migStrategy mixed",
            "sharing.mps",
            "NVIDIA's plugin refuses it too: use migStrategy none or single with MPS",
        )
    return used[0], blocks[used[0]]


def _shared_entry(
    read: Reader, at: str, entry: Mapping[str, Any], rename: bool
) -> tuple[str, str, int, list[int | str] | None] | None:
    """One entry of their shared resources: the resource it shares, the name it gives, its
    replicas and GPUs (None: every GPU); None for a MIG resource (collected as one cdigen
    cannot express)."""
    base = qualified(entry.get("name"), where=f"{read.where}: {at}.name")
    replicas = entry.get("replicas")
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise read.error(
            f"replicas must be a positive integer, got {shown(replicas)}", f"{at}.replicas"
        )
    rename_to = entry.get("rename")
    name = (
        qualified(read.string(rename_to, f"{at}.rename"), where=f"{read.where}: {at}.rename")
        if rename_to is not None
        else base + (SHARED_SUFFIX if rename else "")
    )
    if base.partition("/")[2].startswith("mig-"):
        read.cannot(at, f"cdigen does not share MIG devices ({base})")
        return None
    return base, name, replicas, _devices(read, entry.get("devices", "all"), f"{at}.devices")


def _note_gpus_kept_whole(
    read: Reader, kind: str, shared_by: Mapping[str, list[tuple[int, list[int | str] | None]]]
) -> None:
    """Collect, per shared resource whose entries all name GPUs, the GPUs left out: their
    plugin keeps them whole under the resource's name, which ours cannot say unasked."""
    for base, listed in shared_by.items():
        if all(gpus is not None for _, gpus in listed):  # some GPUs of the base stay whole
            chosen = [g for _, gpus in listed for g in gpus or ()]
            entries_at = ", ".join(f"resources[{i}]" for i, _ in listed)
            read.cannot(
                f"sharing.{kind}.{entries_at} devices: the GPUs outside {shown(chosen)}",
                f"their plugin keeps them whole under {base}; add {{name: {base}, gpus: [...]}} "
                "naming them after converting",
            )


def _devices(read: Reader, devices: object, path: str) -> list[int | str] | None:
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
                raise read.error(f"{shown(item)} is not a GPU index or UUID", path)
        return out
    raise read.error(
        f"expected all, a count or a list of GPU indexes and UUIDs, got {shown(devices)}", path
    )
