"""Driver capabilities (NVIDIA's terms: compute, utility, video, graphics, display): which
driver files each one brings in, and picking a capability set's files out of a driver scan.

Libraries cdigen does not classify go in with every set.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from cdigen.cdi.driverfiles import DriverFiles
from cdigen.errors import InputError

CAPABILITIES = ("compute", "utility", "video", "graphics", "display")
DEFAULT_CAPABILITIES = ("compute", "utility")
# Library stems per capability (libnvidia-container's lists); others go in with every set.
CAPABILITY_LIBRARIES = {
    "utility": ("libnvidia-ml", "libnvidia-cfg"),
    "compute": (
        "libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-ptxjitcompiler",
        "libnvidia-fatbinaryloader", "libnvidia-allocator", "libnvidia-compiler",
        "libnvidia-pkcs11", "libnvidia-pkcs11-openssl3", "libnvidia-nvvm", "libnvidia-gpucomp",
    ),
    "video": ("libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid"),
    "graphics": (
        "libnvidia-eglcore", "libnvidia-glcore", "libnvidia-tls", "libnvidia-glsi",
        "libnvidia-fbc", "libnvidia-ifr", "libnvidia-rtcore", "libnvoptix", "libGLX_nvidia",
        "libEGL_nvidia", "libGLESv2_nvidia", "libGLESv1_CM_nvidia", "libnvidia-glvkspirv",
        "libnvidia-cbl", "libnvidia-egl-gbm", "libnvidia-egl-wayland", "libnvidia-egl-wayland2",
        "libnvidia-egl-xcb", "libnvidia-egl-xlib", "libnvidia-vulkan-producer",
        "libnvidia-allocator",  # also compute; GBM loads it as gbm/nvidia-drm_gbm.so
    ),
    "display": ("libglxserver_nvidia",),
}  # fmt: skip
CAPABILITY_BINARIES = {
    "utility": ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"),
    "compute": ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
}
# Config files by their directory under /etc or /usr/share.
CAPABILITY_CONFIGS = {
    "compute": ("OpenCL/",),  # the OpenCL ICD: OpenCL is compute, as libnvidia-opencl is
    "graphics": ("vulkan/", "glvnd/", "egl/", "nvidia/nvoptix"),
    "display": ("X11/",),
}


def ordered_capabilities(caps: Iterable[str]) -> tuple[str, ...]:
    """The known capabilities among ``caps``, once each, in NVIDIA's order."""
    named = set(caps)
    return tuple(c for c in CAPABILITIES if c in named)


def parse_capabilities(text: str, where: str = "--capabilities") -> tuple[str, ...]:
    """``"compute,utility"`` (or ``all``) -> capabilities; InputError (at ``where``) on an
    unknown one."""
    if text.strip() == "all":
        return CAPABILITIES
    caps = tuple(dict.fromkeys(c.strip() for c in text.split(",") if c.strip()))
    for c in caps or ("",):
        if c not in CAPABILITIES:
            raise InputError(
                f"unknown driver capability {c!r}",
                where=where,
                hint=f"use a comma-separated list of {', '.join(CAPABILITIES)}, or all",
            )
    return caps


def _classes_of(stem: str, table: dict[str, tuple[str, ...]]) -> set[str] | None:
    """The capabilities that bring ``stem`` in; None for one no capability claims."""
    caps = {cap for cap, stems in table.items() if stem in stems}
    return caps or None


def select(driver: DriverFiles, capabilities: Iterable[str]) -> DriverFiles:
    """``driver`` with only the files of ``capabilities`` (unclassified libraries stay)."""
    caps = set(capabilities)

    def wanted(classes: set[str] | None) -> bool:
        return classes is None or bool(classes & caps)

    return replace(
        driver,
        libraries=tuple(
            lib for lib in driver.libraries if wanted(_classes_of(lib.stem, CAPABILITY_LIBRARIES))
        ),
        binaries=tuple(
            b
            for b in driver.binaries
            if wanted(_classes_of(b.path.rpartition("/")[2], CAPABILITY_BINARIES))
        ),
        configs=tuple(
            c
            for c in driver.configs
            if any(
                c.path.removeprefix("/etc/").removeprefix("/usr/share/").startswith(prefix)
                for cap, prefixes in CAPABILITY_CONFIGS.items()
                if cap in caps
                for prefix in prefixes
            )
        ),
    )
