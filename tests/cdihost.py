"""A fake GPU host for CDI tests: driver root, dev root and sysfs in a temporary directory.

The driver root has versioned driver libraries with SONAME symlinks (and a ``lib*.so`` linker
link, and a non-driver library that must be ignored), a glibc ``ld.so.cache`` naming an extra
library directory, binaries, GSP firmware and the persistenced socket. The dev root has real
character device nodes (``os.mknod``) where the process may create them, else plain files. The
fake sysfs has ``bus/pci/devices/<bdf>/drm/{cardN,renderDN}`` and ``numa_node``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdigen.cdi.spec import SpecOptions
from cdigen.model import Gpu, MigDevice, Node

DRIVER_VERSION = "550.54.15"
LIB_DIR = "/usr/lib/x86_64-linux-gnu"
EXTRA_LIB_DIR = "/opt/nvidia/lib64"  # known only through ld.so.cache
NVIDIA_MAJOR = 195
UVM_MAJOR = 510
CAPS_MAJOR = 511
DRI_MAJOR = 226

# (file stem, SONAME) of a typical driver's user-space libraries.
DRIVER_LIBRARIES = (
    ("libcuda", "libcuda.so.1"),
    ("libnvidia-ml", "libnvidia-ml.so.1"),
    ("libnvidia-ptxjitcompiler", "libnvidia-ptxjitcompiler.so.1"),
    ("libcudadebugger", "libcudadebugger.so.1"),
    ("libnvidia-nvvm", "libnvidia-nvvm.so.4"),
    ("libnvidia-opencl", "libnvidia-opencl.so.1"),
    ("libnvidia-cfg", "libnvidia-cfg.so.1"),
    ("libnvidia-allocator", "libnvidia-allocator.so.1"),
    ("libnvidia-encode", "libnvidia-encode.so.1"),
    ("libnvcuvid", "libnvcuvid.so.1"),
    ("libnvidia-opticalflow", "libnvidia-opticalflow.so.1"),
    ("libnvidia-gpucomp", None),  # no SONAME link: mounted at its versioned path only
)
EXTRA_DIR_LIBRARIES = (("libnvidia-fbc", "libnvidia-fbc.so.1"),)
# With ``graphics=True``: graphics libraries, vdpau, and the config files loaders read.
GRAPHICS_LIBRARIES = (
    ("libGLX_nvidia", "libGLX_nvidia.so.0"),
    ("libEGL_nvidia", "libEGL_nvidia.so.0"),
    ("libnvidia-glcore", None),
    ("libnvidia-eglcore", None),
)
EGL_GBM = "libnvidia-egl-gbm.so.1.1.1"  # its own version, not the driver's
VDPAU = ("libvdpau_nvidia", "libvdpau_nvidia.so.1")
CONFIG_FILES = {  # host path -> container path cdigen must mount it at
    "/usr/share/vulkan/icd.d/nvidia_icd.json": "/usr/share/vulkan/icd.d/nvidia_icd.json",
    "/etc/vulkan/implicit_layer.d/nvidia_layers.json": (
        "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json"
    ),
    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json": "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json": (
        "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json"
    ),
    "/etc/OpenCL/vendors/nvidia.icd": "/etc/OpenCL/vendors/nvidia.icd",
}
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control")
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")


@dataclass(frozen=True)
class FakeHost:
    """Paths of a built fake host and what was put there."""

    base: Path
    driver_root: Path
    dev_root: Path
    sysfs_root: Path
    node: Node
    driver_version: str
    real_nodes: bool  # True: char devices via mknod; False: plain files stand in
    libraries: tuple[tuple[str, str | None], ...] = field(default=())  # (container path, soname)


def make_node(
    gpus: int = 2, *, mig_gpu: int | None = None, driver_version: str = DRIVER_VERSION
) -> Node:
    """A node with ``gpus`` GPUs whose minors run backwards (minor != index, as on real hosts).

    ``mig_gpu`` turns MIG on for that index, with two MIG devices.
    """
    out = []
    for i in range(gpus):
        migs: tuple[MigDevice, ...] = ()
        if i == mig_gpu:
            migs = (
                MigDevice(
                    f"MIG-{i:08d}-aaaa-bbbb-cccc-000000000001", "1g.10gb", 7, 0, 10 << 30, (66, 67)
                ),
                MigDevice(
                    f"MIG-{i:08d}-aaaa-bbbb-cccc-000000000002", "1g.10gb", 8, 0, 10 << 30, (75, 76)
                ),
            )
        out.append(
            Gpu(
                index=i,
                minor=gpus - 1 - i,
                uuid=f"GPU-{i:08d}-1111-2222-3333-444455556666",
                name="NVIDIA A100-SXM4-80GB",
                architecture="Ampere",
                cuda_compute_capability="8.0",
                memory_bytes=80 << 30,
                pci_bus_id=f"00000000:{0x07 + 0x10 * i:02X}:00.0",
                numa_node=i // 4,
                mig_enabled=i == mig_gpu,
                mig_devices=migs,
            )
        )
    return Node(
        gpus=tuple(out), driver_version=driver_version, cuda_driver_version="12.4", name="fake"
    )


def _under(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _mknod(path: Path, major: int, minor: int, mode: int = 0o666) -> bool:
    """A char device; a plain file if mknod is not permitted. True if a real node was made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mknod(path, mode | stat.S_IFCHR, os.makedev(major, minor))
        path.chmod(mode)
        return True
    except PermissionError:
        _write(path, "", mode)
        return False


def _bind_socket(path: Path) -> None:
    """A unix socket file at ``path``, bound by a short relative name (sun_path is 108 bytes)."""
    cwd = os.getcwd()
    os.chdir(path.parent)
    try:
        with contextlib.closing(socket.socket(socket.AF_UNIX)) as s:
            s.bind(path.name)
    finally:
        os.chdir(cwd)


def write_ld_cache(path: Path, entries: list[tuple[str, str]]) -> None:
    """Write a glibc ``ld.so.cache`` (new format 1.1) listing x86-64 ``(soname, path)`` entries."""
    header_size, entry_size = 48, 24
    strings = bytearray()
    offsets = []
    table_start = header_size + entry_size * len(entries)
    for soname, target in entries:
        key = table_start + len(strings)
        strings += soname.encode() + b"\0"
        value = table_start + len(strings)
        strings += target.encode() + b"\0"
        offsets.append((key, value))
    out = bytearray(b"glibc-ld.so.cache1.1")
    out += struct.pack("<IIB3xI12x", len(entries), len(strings), 2, 0)
    for key, value in offsets:
        out += struct.pack("<iIIIQ", 0x0303, key, value, 0, 0)
    out += strings
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(out))


def _libraries(
    driver_root: Path,
    directory: str,
    libs: tuple[tuple[str, str | None], ...],
    version: str,
    absolute_links: bool = False,
) -> list[tuple[str, str | None]]:
    made = []
    for stem, soname in libs:
        versioned = f"{stem}.so.{version}"
        _write(_under(driver_root, f"{directory}/{versioned}"), f"fake {versioned}\n", 0o755)
        if soname:
            target = f"{directory}/{versioned}" if absolute_links else versioned
            os.symlink(target, _under(driver_root, f"{directory}/{soname}"))
        made.append((f"{directory}/{versioned}", soname))
    return made


def build_host(
    base: Path,
    node: Node | None = None,
    *,
    extra_libraries: int = 0,
    dev_nodes: bool = True,
    hook: bool = False,
    ipc: bool = True,
    merged: bool = False,
    absolute_links: bool = False,
    graphics: bool = False,
) -> FakeHost:
    """Build a fake host under ``base`` for ``node`` (default: :func:`make_node`).

    ``merged``: one tree, as a host's ``/`` mounted at ``base`` (driver and dev root ``base``,
    sysfs ``base/sys``); else three trees ``driver``, ``devroot`` and ``sys``.
    ``absolute_links`` (merged only): ``/lib`` and the SONAME links point at absolute host paths
    (``libcuda.so.1 -> /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15``), as some distributions
    ship them; they resolve correctly only inside ``base``.
    ``graphics``: also :data:`GRAPHICS_LIBRARIES`, the EGL GBM platform library, vdpau (in
    ``vdpau/``, with its SONAME link) and the :data:`CONFIG_FILES`.
    """
    if absolute_links and not merged:
        raise ValueError("absolute_links needs merged=True: the links name host paths")
    node = node or make_node()
    version = node.driver_version or DRIVER_VERSION
    if merged:
        driver_root, dev_root, sysfs_root = base, base, base / "sys"
    else:
        driver_root, dev_root, sysfs_root = base / "driver", base / "devroot", base / "sys"
    for d in (driver_root / "usr/lib/x86_64-linux-gnu", dev_root / "dev", sysfs_root):
        d.mkdir(parents=True, exist_ok=True)

    extra = tuple(
        (f"libnvidia-extra{i:02d}", f"libnvidia-extra{i:02d}.so.1") for i in range(extra_libraries)
    )
    libs = _libraries(driver_root, LIB_DIR, DRIVER_LIBRARIES + extra, version, absolute_links)
    libs += _libraries(driver_root, EXTRA_LIB_DIR, EXTRA_DIR_LIBRARIES, version, absolute_links)
    if graphics:
        libs += _libraries(driver_root, LIB_DIR, GRAPHICS_LIBRARIES, version, absolute_links)
        libs += _libraries(driver_root, f"{LIB_DIR}/vdpau", (VDPAU,), version, absolute_links)
        _write(_under(driver_root, f"{LIB_DIR}/{EGL_GBM}"), f"fake {EGL_GBM}\n", 0o755)
        os.symlink(EGL_GBM, _under(driver_root, f"{LIB_DIR}/libnvidia-egl-gbm.so.1"))
        libs.append((f"{LIB_DIR}/{EGL_GBM}", "libnvidia-egl-gbm.so.1"))
        for host_file in CONFIG_FILES:
            _write(_under(driver_root, host_file), f'{{"file": "{host_file}"}}\n')
    os.symlink("libcuda.so.1", _under(driver_root, f"{LIB_DIR}/libcuda.so"))  # linker link
    _write(_under(driver_root, f"{LIB_DIR}/libz.so.1.2.13"), "not a driver library\n")
    os.symlink("libz.so.1.2.13", _under(driver_root, f"{LIB_DIR}/libz.so.1"))
    write_ld_cache(
        driver_root / "etc/ld.so.cache",
        [(s, f"{p.rpartition('/')[0]}/{s}") for p, s in libs if s]
        + [("libz.so.1", f"{LIB_DIR}/libz.so.1")],
    )
    for name in BINARIES:
        _write(_under(driver_root, f"/usr/bin/{name}"), f"#!/bin/sh\necho fake {name}\n", 0o755)
    for name in FIRMWARE:
        _write(_under(driver_root, f"/usr/lib/firmware/nvidia/{version}/{name}"), f"fw {name}\n")
    if hook:
        _write(_under(driver_root, "/usr/bin/nvidia-cdi-hook"), "#!/bin/sh\nexit 0\n", 0o755)
    if ipc:
        sock_path = _under(driver_root, "/run/nvidia-persistenced/socket")
        sock_path.parent.mkdir(parents=True)
        _bind_socket(sock_path)
    # merged /usr: /lib/... is the same directory. Made last: written through, an absolute link
    # would lead this process into its own /usr/lib.
    os.symlink("/usr/lib" if absolute_links else "usr/lib", driver_root / "lib")

    real = True
    if dev_nodes:
        dev = dev_root / "dev"
        real &= _mknod(dev / "nvidiactl", NVIDIA_MAJOR, 255)
        real &= _mknod(dev / "nvidia-modeset", NVIDIA_MAJOR, 254)
        real &= _mknod(dev / "nvidia-uvm", UVM_MAJOR, 0)
        real &= _mknod(dev / "nvidia-uvm-tools", UVM_MAJOR, 1)
        for gpu in node.gpus:
            real &= _mknod(dev / f"nvidia{gpu.minor}", NVIDIA_MAJOR, gpu.minor)
            real &= _mknod(dev / f"dri/card{gpu.index + 1}", DRI_MAJOR, gpu.index + 1)
            real &= _mknod(dev / f"dri/renderD{128 + gpu.index}", DRI_MAJOR, 128 + gpu.index, 0o666)
            for mig in gpu.mig_devices:
                for cap in mig.cap_minors:
                    real &= _mknod(dev / f"nvidia-caps/nvidia-cap{cap}", CAPS_MAJOR, cap, 0o444)
    for gpu in node.gpus:
        bdf = sysfs_bdf(gpu.pci_bus_id)
        # as in sysfs: bus/pci/devices/<bdf> is a relative link into devices/
        pci = sysfs_root / "devices/pci0000:00" / bdf
        link = sysfs_root / "bus/pci/devices" / bdf
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(f"../../../devices/pci0000:00/{bdf}", link)
        (pci / "drm" / f"card{gpu.index + 1}").mkdir(parents=True)
        (pci / "drm" / f"renderD{128 + gpu.index}").mkdir()
        (pci / "drm" / "version").write_text("1.1.0 20060810\n")  # not a node: must be ignored
        (pci / "numa_node").write_text(f"{gpu.numa_node if gpu.numa_node is not None else -1}\n")
    return FakeHost(
        base=base,
        driver_root=driver_root,
        dev_root=dev_root,
        sysfs_root=sysfs_root,
        node=node,
        driver_version=version,
        real_nodes=real and dev_nodes,
        libraries=tuple(libs),
    )


def spec_options(host: FakeHost, **kw: Any) -> SpecOptions:
    """``SpecOptions`` with the host's driver, dev and sysfs roots; ``kw`` adds or overrides."""
    roots = {
        "driver_root": str(host.driver_root),
        "dev_root": str(host.dev_root),
        "sysfs_root": str(host.sysfs_root),
    }
    return SpecOptions(**{**roots, **kw})


def sysfs_bdf(pci_bus_id: str) -> str:
    """``00000000:07:00.0`` -> ``0000:07:00.0`` (written independently of cdigen's helper)."""
    domain, bus, devfn = pci_bus_id.lower().split(":")
    return f"{domain[-4:]}:{bus}:{devfn}"
