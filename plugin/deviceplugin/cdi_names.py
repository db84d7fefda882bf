"""The fully-qualified CDI names the device plugin hands out: by UUID, as the generated spec names
its GPUs, MIG devices and capability devices (:meth:`cdigen.catalogue.CatalogueEntry.cdi_name`)."""

from __future__ import annotations

from collections.abc import Sequence

from cdigen.catalogue import CatalogueEntry
from cdigen.cdi.names import capability_device_name, qualified_name

NAME_STRATEGY = "uuid"  # the plugin hands out CDI names by UUID


def entry_cdi_name(cdi_kind: str, entry: CatalogueEntry) -> str:
    """The fully-qualified CDI name of a catalogue device, as the generated spec names it (a
    share's is its GPU's)."""
    return entry.qualified_cdi_name(cdi_kind, NAME_STRATEGY)


def capability_cdi_names(cdi_kind: str, capabilities: Sequence[str]) -> tuple[str, ...]:
    """The fully-qualified CDI names of capability devices, as the generated spec names them
    (``nvidia.com/gpu=capability-graphics``)."""
    return tuple(qualified_name(cdi_kind, capability_device_name(c)) for c in capabilities)
