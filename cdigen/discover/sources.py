"""The names of node sources, and whether one is the hardware itself (kept apart from
:mod:`cdigen.discover` so that the NVML source and the checks can use them without importing
the package that imports them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cdigen.model import Node

NVML = "nvml"


def from_hardware(source: str) -> bool:
    """Whether the node source ``source`` is the hardware itself (NVML), not a description
    (a built-in sample or a node file) that may or may not match the machine."""
    return source == NVML


def describes_hardware(source: str, node: Node) -> bool:
    """Whether ``node`` is the hardware's word: read from NVML now, or a node file that
    ``cdigen discover`` wrote from NVML (at boot, say) rather than a sample or a hand-made file."""
    return from_hardware(source) or node.discovered_by == NVML
