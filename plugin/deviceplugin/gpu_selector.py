"""Which GPUs a resource advertises: a config resource's ``gpus:`` list, and the rule that no
GPU is advertised by two resources.

The kubelet keeps one count per resource and admits pods against the counts it last read; it
does not know that a replica of ``nvidia.com/gpu.shared`` and a whole ``nvidia.com/gpu`` are the
same card. So a GPU has one owner: a config in which two resources would advertise the same GPU
is refused (at load where the config alone shows it, at start where only the node does), and
``gpus:`` splits the GPUs between resources. Each entry of the list is a GPU's NVML index (an
integer), its UUID (``GPU-…``) or a pattern on its product name (``*4090*``, matched as
shell-style wildcards, case-sensitive, as NVIDIA's device plugin matches ``resources.gpus``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdigen.errors import InputError
from cdigen.model import Gpu

UUID_PREFIX = "GPU-"


@dataclass(frozen=True)
class GpuSelector:
    """The GPUs of one resource: by NVML index, by UUID, or by a product-name pattern."""

    indexes: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()
    products: tuple[str, ...] = ()

    def matches(self, gpu: Gpu) -> bool:
        """Whether ``gpu`` is one of these."""
        return (
            gpu.index in self.indexes
            or gpu.uuid in self.uuids
            or any(fnmatch.fnmatchcase(gpu.name, p) for p in self.products)
        )

    def describe(self) -> str:
        """The list as the config has it: ``[0, GPU-…, '*4090*']``."""
        parts = [str(i) for i in self.indexes] + list(self.uuids) + list(self.products)
        return "[" + ", ".join(parts) + "]"


def selector_from_doc(value: Any, *, where: str) -> GpuSelector:
    """The :class:`GpuSelector` of a config ``gpus:`` list; InputError naming ``where``."""
    hint = "e.g. gpus: [0, 1], gpus: [GPU-8f6e…] or gpus: ['*4090*']"
    if not isinstance(value, list) or not value:
        raise InputError(
            f"gpus must be a non-empty list of GPU indexes, UUIDs or product patterns, "
            f"got {value!r}",
            where=where,
            hint=hint,
        )
    indexes: list[int] = []
    uuids: list[str] = []
    products: list[str] = []
    for item in value:
        if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            indexes.append(item)
        elif isinstance(item, str) and item.startswith(UUID_PREFIX):
            uuids.append(item)
        elif isinstance(item, str) and item.strip():
            products.append(item)
        else:
            raise InputError(
                f"{item!r} is not a GPU index (0, 1, …), UUID (GPU-…) or product pattern",
                where=where,
                hint=hint,
            )
    twice = sorted({str(i) for i in value if value.count(i) > 1})
    if twice:
        raise InputError(f"{twice[0]} is listed twice", where=where)
    return GpuSelector(tuple(indexes), tuple(uuids), tuple(products))


@dataclass(frozen=True)
class Claimant:
    """A resource that advertises whole GPUs or shares of them, with its ``gpus:`` (None: all)."""

    name: str
    gpus: GpuSelector | None


def static_overlap(claimants: Sequence[Claimant]) -> tuple[Claimant, Claimant, str] | None:
    """Two resources the config alone shows would advertise the same GPU, and which: one of them
    takes every GPU, or both name the same index, UUID or pattern. None when only a node can
    tell (an index against a UUID, two patterns)."""
    for i, first in enumerate(claimants):
        for second in claimants[i + 1 :]:
            why = _same_gpus(first.gpus, second.gpus)
            if why is not None:
                return first, second, why
    return None


def _same_gpus(a: GpuSelector | None, b: GpuSelector | None) -> str | None:
    if a is None or b is None:
        return "every GPU"
    for mine, theirs in ((a.indexes, b.indexes), (a.uuids, b.uuids), (a.products, b.products)):
        common = [x for x in mine if x in theirs]
        if common:
            return f"GPU {common[0]}" if isinstance(common[0], int) else repr(common[0])
    return None


def owners(gpus: Iterable[Gpu], claimants: Sequence[Claimant]) -> Mapping[str, str]:
    """Per GPU UUID: the one resource that advertises it (GPUs no resource selects are left
    out). InputError naming both resources and the GPU when two select one GPU."""
    out: dict[str, str] = {}
    for gpu in gpus:
        mine = [c.name for c in claimants if c.gpus is None or c.gpus.matches(gpu)]
        if len(mine) > 1:
            what = f"GPU {gpu.index} ({gpu.name}, {gpu.uuid})"
            raise InputError(overlap_message(mine[0], mine[1], what), hint=OVERLAP_HINT)
        if mine:
            out[gpu.uuid] = mine[0]
    return out


OVERLAP_HINT = (
    "give each resource its own GPUs with gpus: [INDEX|UUID|'PRODUCT-PATTERN', …], or keep one "
    "of them (docs/sharing.md, 'One GPU, one owner')"
)


def overlap_message(first: str, second: str, what: str) -> str:
    """The one line that refuses a config whose resources ``first`` and ``second`` would both
    advertise ``what``."""
    return (
        f"resources {first} and {second} would both advertise {what}: the kubelet counts each "
        "resource on its own and would hand the same GPU out under both"
    )
