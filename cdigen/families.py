"""NVIDIA's GPU families (architectures) in one table: the name NVML's architecture is shown as
(``Gpu.architecture``), GFD's ``gpu.family`` label, the NVML constant, and the compute
capabilities each family holds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """One family: ``name`` as shown (``Ada Lovelace``), ``label`` as GFD writes it
    (``ada-lovelace``), ``nvml`` the ``NVML_DEVICE_ARCH_*`` constant (None before Kepler), and
    its compute capabilities: majors ``majors`` with minors from ``minor_from`` up to, not
    including, ``minor_below`` (one major holds two families on Volta/Turing, Ampere/Ada)."""

    name: str
    label: str
    nvml: str | None
    majors: tuple[int, ...]
    minor_from: int = 0
    minor_below: int = 100

    def holds(self, major: int, minor: int) -> bool:
        """Whether compute capability ``major.minor`` is of this family."""
        return major in self.majors and self.minor_from <= minor < self.minor_below


FAMILIES = (
    Family("Tesla", "tesla", None, (1,)),
    Family("Fermi", "fermi", None, (2,)),
    Family("Kepler", "kepler", "NVML_DEVICE_ARCH_KEPLER", (3,)),
    Family("Maxwell", "maxwell", "NVML_DEVICE_ARCH_MAXWELL", (5,)),
    Family("Pascal", "pascal", "NVML_DEVICE_ARCH_PASCAL", (6,)),
    Family("Volta", "volta", "NVML_DEVICE_ARCH_VOLTA", (7,), minor_below=5),
    Family("Turing", "turing", "NVML_DEVICE_ARCH_TURING", (7,), minor_from=5),
    Family("Ampere", "ampere", "NVML_DEVICE_ARCH_AMPERE", (8,), minor_below=9),
    Family("Ada Lovelace", "ada-lovelace", "NVML_DEVICE_ARCH_ADA", (8,), minor_from=9),
    Family("Hopper", "hopper", "NVML_DEVICE_ARCH_HOPPER", (9,)),
    Family("Blackwell", "blackwell", "NVML_DEVICE_ARCH_BLACKWELL", (10, 12)),
)


def family_of(major: int, minor: int) -> Family | None:
    """The family of compute capability ``major.minor``, or None (4.x, 11.x, one not out yet)."""
    return next((f for f in FAMILIES if f.holds(major, minor)), None)
