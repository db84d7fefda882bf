"""The fully-qualified CDI names the device plugin hands out: by UUID, as the generated spec names
its GPUs, MIG devices and capability devices (:func:`cdigen.cdi.names.device_name`)."""

from __future__ import annotations

from collections.abc import Sequence

from cdigen.cdi.names import capability_device_name, device_name, qualified_name
from cdigen.model import Gpu

NAME_STRATEGY = "uuid"  # the plugin hands out CDI names by UUID


def gpu_cdi_name(cdi_kind: str, gpu: Gpu) -> str:
    """The fully-qualified CDI name of a whole GPU, as the generated spec names it."""
    return qualified_name(cdi_kind, device_name(NAME_STRATEGY, gpu.index, gpu.uuid))


def mig_cdi_name(cdi_kind: str, gpu: Gpu, position: int, mig_uuid: str) -> str:
    """The fully-qualified CDI name of the MIG device at ``position`` on ``gpu``."""
    return qualified_name(cdi_kind, device_name(NAME_STRATEGY, gpu.index, mig_uuid, position))


def capability_cdi_names(cdi_kind: str, capabilities: Sequence[str]) -> tuple[str, ...]:
    """The fully-qualified CDI names of capability devices, as the generated spec names them
    (``nvidia.com/gpu=capability-graphics``)."""
    return tuple(qualified_name(cdi_kind, capability_device_name(c)) for c in capabilities)
