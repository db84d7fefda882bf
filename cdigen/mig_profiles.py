"""The MIG geometry of the GPUs cdigen can partition on demand: each profile, where it may be
placed, and what it takes of the GPU's memory and compute slices.

A GPU in MIG mode is cut in ``memory_slices`` memory slices and ``compute_slices`` compute
slices (GPCs). A GPU instance of a profile sits at a *placement*: ``start`` and
``memory_slices`` consecutive memory slices; two instances never share a memory slice. The
profile and placement IDs are NVML's (``nvmlDeviceGetGpuInstancePossiblePlacements``,
``NVML_GPU_INSTANCE_PROFILE_*``, ``NVML_COMPUTE_INSTANCE_PROFILE_*``); the memory sizes are
NVML's ``memorySizeMB`` of each profile, which the published capacity shows (the MIG device made
at prepare reports its own).
"""

from __future__ import annotations

from dataclasses import dataclass

# NVML_GPU_INSTANCE_PROFILE_* (nvml.h)
GI_1_SLICE, GI_2_SLICE, GI_3_SLICE, GI_4_SLICE, GI_7_SLICE = 0, 1, 2, 3, 4
GI_1_SLICE_REV2 = 9  # one compute slice with two memory slices (1g.20gb)
# NVML_COMPUTE_INSTANCE_PROFILE_*: the compute instance that fills its GPU instance
CI_1_SLICE, CI_2_SLICE, CI_3_SLICE, CI_4_SLICE, CI_7_SLICE = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class MigProfile:
    """One GPU instance profile, with the compute instance that fills it."""

    name: str  # "1g.10gb"
    gi_profile: int
    ci_profile: int
    memory_slices: int  # the size of each placement
    compute_slices: int
    memory_mib: int
    starts: tuple[int, ...]  # the placements' first memory slice

    @property
    def memory_bytes(self) -> int:
        """The instance's memory in bytes."""
        return self.memory_mib << 20


@dataclass(frozen=True)
class MigPlacement:
    """A profile at one placement: what one on-demand MIG device would be."""

    profile: MigProfile
    start: int

    @property
    def memory_slices(self) -> range:
        """The memory slices it takes."""
        return range(self.start, self.start + self.profile.memory_slices)


@dataclass(frozen=True)
class MigGeometry:
    """How one GPU model partitions."""

    memory_slices: int
    compute_slices: int
    profiles: tuple[MigProfile, ...]

    def placements(self) -> tuple[MigPlacement, ...]:
        """Every placement of every profile, smallest profile first, each profile's from the
        highest memory slice down: a first fit then fills the GPU from the top and keeps the
        low slices, where the large profiles must start, free the longest."""
        return tuple(MigPlacement(p, s) for p in self.profiles for s in sorted(p.starts)[::-1])


def _profiles(sizes: dict[str, int], double_memory_1g: str | None) -> tuple[MigProfile, ...]:
    """The usual A100/H100 profiles, ``sizes`` giving each one's MiB by name."""
    names = list(sizes)
    plain = [
        (GI_1_SLICE, CI_1_SLICE, 1, 1, tuple(range(7))),
        (GI_2_SLICE, CI_2_SLICE, 2, 2, (0, 2, 4)),
        (GI_3_SLICE, CI_3_SLICE, 4, 3, (0, 4)),
        (GI_4_SLICE, CI_4_SLICE, 4, 4, (0,)),
        (GI_7_SLICE, CI_7_SLICE, 8, 7, (0,)),
    ]
    out = [
        MigProfile(name, gi, ci, mem, compute, sizes[name], starts)
        for name, (gi, ci, mem, compute, starts) in zip(
            [n for n in names if n != double_memory_1g], plain, strict=True
        )
    ]
    if double_memory_1g:
        out.insert(
            1,
            MigProfile(
                double_memory_1g, GI_1_SLICE_REV2, CI_1_SLICE, 2, 1, sizes[double_memory_1g],
                (0, 2, 4, 6),
            ),
        )  # fmt: skip
    return tuple(out)


_A100_40 = {"1g.5gb": 4864, "2g.10gb": 9856, "3g.20gb": 19968, "4g.20gb": 19968, "7g.40gb": 40192}
_A100_80 = {
    "1g.10gb": 9728,
    "1g.20gb": 19968,
    "2g.20gb": 19968,
    "3g.40gb": 40192,
    "4g.40gb": 40192,
    "7g.80gb": 80896,
}
_H100_80 = {
    "1g.10gb": 9984,
    "1g.20gb": 20096,
    "2g.20gb": 20096,
    "3g.40gb": 40320,
    "4g.40gb": 40320,
    "7g.80gb": 80640,
}

GEOMETRIES: dict[str, MigGeometry] = {
    "nvidia a100-sxm4-40gb": MigGeometry(8, 7, _profiles(_A100_40, None)),
    "nvidia a100-sxm4-80gb": MigGeometry(8, 7, _profiles(_A100_80, "1g.20gb")),
    "nvidia h100 80gb hbm3": MigGeometry(8, 7, _profiles(_H100_80, "1g.20gb")),
}


def mig_geometry(product_name: str) -> MigGeometry | None:
    """The MIG geometry of GPU model ``product_name`` (NVML's name), or None if unknown."""
    return GEOMETRIES.get(product_name.strip().lower())
