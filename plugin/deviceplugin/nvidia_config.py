"""NVIDIA's device-plugin config (``version: v1``) read into ours.

``cdigen plugin config convert`` turns one of their config files into a cdigen plugin config
and says, per key, what has no equivalent here: the flags are
:mod:`cdigen.plugin.deviceplugin.nvidia_flags`'s, the resources and sharing
:mod:`cdigen.plugin.deviceplugin.nvidia_sharing`'s; their format and its strict reader are
:mod:`cdigen.plugin.deviceplugin.nvidia_format`'s, their environment variables
:mod:`cdigen.plugin.deviceplugin.nvidia_env`'s. Pure functions over parsed documents: no gRPC, no
files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdigen.errors import InputError
from cdigen.plugin.deviceplugin.nvidia_flags import flags_as_ours
from cdigen.plugin.deviceplugin.nvidia_format import (
    FLAG_KEYS,
    RESOURCE_KEYS,
    SHARING_KEYS,
    TOP_KEYS,
    Reader,
)
from cdigen.plugin.deviceplugin.nvidia_sharing import shared_resources, whole_gpu_resources


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
    read = Reader(where)
    doc = read.mapping(doc, "", TOP_KEYS)
    version = doc.get("version", "v1")
    if version != "v1":
        raise read.error(
            f"unknown NVIDIA config version {version!r}", "version", "only version: v1 is known"
        )
    out: dict[str, Any] = {"apiVersion": "cdigen/v1alpha1", "kind": "PluginConfig"}
    out.update(flags_as_ours(read, read.mapping(doc.get("flags"), "flags", FLAG_KEYS)))
    resources = whole_gpu_resources(
        read, read.mapping(doc.get("resources"), "resources", RESOURCE_KEYS)
    )
    sharing = read.mapping(doc.get("sharing"), "sharing", SHARING_KEYS)
    shared = shared_resources(read, sharing, out)
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


def describe(notes: Sequence[str], dropped: Sequence[str] = ()) -> str:
    """The notes and dropped settings as YAML comment lines for the top of a converted file."""
    head = "# converted by `cdigen plugin config convert` from NVIDIA's device-plugin config"
    lines = [head, *(f"# note: {n}" for n in notes), *(f"# dropped: {d}" for d in dropped)]
    return "\n".join(lines) + "\n"
