"""What cdigen knows about NVIDIA GPU products that `nvidia-smi topo -m` does not print.

Used to fill in imported topologies (``topo import --gpu-name``) and the built-in samples.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdigen.constants import MIB
from cdigen.families import family_of


@dataclass(frozen=True)
class Product:
    """Static facts about one GPU model, as NVML would report them."""

    name: str  # NVML productName
    capability: tuple[int, int]  # CUDA compute capability (major, minor)
    memory_bytes: int  # NVML total memory
    brand: str

    @property
    def cuda_compute_capability(self) -> str:
        """As NVML's is shown: ``8.9``."""
        return f"{self.capability[0]}.{self.capability[1]}"

    @property
    def architecture(self) -> str:
        """Its family's name (``Ada Lovelace``), from the compute capability."""
        known = family_of(*self.capability)
        return known.name if known else ""


PRODUCTS: tuple[Product, ...] = (
    Product("NVIDIA GeForce RTX 4090", (8, 9), 24564 * MIB, "GeForce"),
    Product("Tesla P100-SXM2-16GB", (6, 0), 16280 * MIB, "Tesla"),
    Product("Tesla V100-SXM2-16GB", (7, 0), 16160 * MIB, "Tesla"),
    Product("Tesla V100-SXM3-32GB", (7, 0), 32510 * MIB, "Tesla"),
    Product("Tesla V100-DGXS-32GB", (7, 0), 32510 * MIB, "Tesla"),
    Product("Quadro RTX 8000", (7, 5), 46080 * MIB, "Quadro RTX"),
    Product("NVIDIA A100-SXM4-80GB", (8, 0), 81920 * MIB, "NVIDIA"),
    Product("NVIDIA A100-SXM4-40GB", (8, 0), 40960 * MIB, "NVIDIA"),
    Product("NVIDIA H100 80GB HBM3", (9, 0), 81559 * MIB, "NVIDIA"),
    Product("NVIDIA L40S", (8, 9), 46068 * MIB, "NVIDIA"),
)

_BY_NAME = {p.name.lower(): p for p in PRODUCTS}


def product(name: str) -> Product | None:
    """The product called ``name`` (case-insensitive), or None if cdigen does not know it."""
    return _BY_NAME.get(name.strip().lower())
