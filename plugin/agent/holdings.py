"""The rows of attribution: one per container, GPU and source (extended resource or claim), and
how they are printed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cdigen.constants import MIB
from cdigen.errors import printable

# Kubernetes names are at most 253 characters; anything longer is cut before it is shown.
NAME_LIMIT = 253


@dataclass(frozen=True)
class Holding:
    """What one container holds of one GPU through one source.

    ``kind``: ``gpu`` (the whole GPU), ``mig`` (MIG devices), ``replica`` or ``slice`` (shares
    of a device-plugin resource), ``shared`` (a DRA device shared through consumable capacity).
    ``source``: the extended resource (device plugin) or ``<namespace>/<name>`` of the claim
    (DRA). ``devices``: the device IDs (device plugin) or device names (DRA) held.
    ``names``: the devices as the table shows them: a share's number (``#3``), a device's DRA
    name (``gpu-0``, ``gpu-0-mig-1-0``). ``allocation``: what one allocation is (the
    container's resource, or the claim's UID), so that a claim several containers use counts
    once on its GPU. ``memory_limit_bytes``: the
    memory the container was given on this GPU; None where nothing limits it (time-slicing).
    """

    namespace: str
    pod: str
    container: str
    gpu_uuid: str
    gpu_index: int
    kind: str
    source: str
    devices: tuple[str, ...]
    allocation: str
    memory_limit_bytes: int | None
    names: tuple[str, ...] = ()  # short names of ``devices`` for the table (default: the IDs)

    @property
    def shown(self) -> tuple[str, ...]:
        """What the table's DEVICES column lists."""
        return self.names or self.devices


def printable_name(text: str) -> str:
    """A Kubernetes name from outside (a namespace, pod, container, claim, device, node or
    resource) as cdigen shows it in a table, JSON, /metrics or a log line: escaped as
    :func:`cdigen.errors.printable` escapes every name printed from outside, and cut to
    :data:`NAME_LIMIT`."""
    return printable(text, NAME_LIMIT)


def sorted_holdings(rows: Iterable[Holding]) -> list[Holding]:
    """Rows by namespace, pod, container, GPU index and source: a stable table."""
    return sorted(rows, key=lambda h: (h.namespace, h.pod, h.container, h.gpu_index, h.source))


def memory_text(limit: int | None) -> str:
    """A limit in MiB (``4096Mi``), or ``none``."""
    if limit is None:
        return "none"
    return f"{limit // MIB}Mi" if limit % MIB == 0 else str(limit)


COLUMNS = ("NAMESPACE", "POD", "CONTAINER", "GPU", "GPU-UUID", "KIND", "FROM", "DEVICES", "MEMORY")


def table(rows: Sequence[Holding]) -> str:
    """The rows as an aligned text table (names escaped), header first."""
    lines = [COLUMNS]
    for h in sorted_holdings(rows):
        lines.append(
            (
                printable_name(h.namespace),
                printable_name(h.pod),
                printable_name(h.container),
                str(h.gpu_index),
                h.gpu_uuid,
                h.kind,
                printable_name(h.source),
                ",".join(printable_name(d) for d in h.shown),
                memory_text(h.memory_limit_bytes),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def as_json(rows: Sequence[Holding]) -> str:
    """The rows as a JSON list (camelCase keys; names escaped as in the table)."""
    docs = [
        {
            "namespace": printable_name(h.namespace),
            "pod": printable_name(h.pod),
            "container": printable_name(h.container),
            "gpuIndex": h.gpu_index,
            "gpuUuid": h.gpu_uuid,
            "kind": h.kind,
            "from": printable_name(h.source),
            "devices": [printable_name(d) for d in h.devices],
            "names": [printable_name(d) for d in h.shown],
            "memoryLimitBytes": h.memory_limit_bytes,
        }
        for h in sorted_holdings(rows)
    ]
    return json.dumps(docs, indent=2)
