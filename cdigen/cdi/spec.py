"""Node + host -> CDI spec: one entry per GPU (or MIG device) per naming strategy, plus ``all``.

The spec works without hooks: every library is also mounted at its SONAME path and its linker
name (``libcuda.so``) in the library directories of both image families (Debian's multiarch
directory and RHEL's ``/usr/lib64``), so the loader and ``gcc -lcuda`` find the driver without
``ldconfig`` in the container. With a hook program (given, or ``nvidia-cdi-hook`` found on the
host), the spec also runs its ``create-symlinks``, ``enable-cuda-compat`` and
``update-ldcache`` hooks, as ``nvidia-ctk cdi generate`` does.

What goes in follows the driver capabilities asked for (NVIDIA's terms, see
:data:`CAPABILITIES`); libraries cdigen does not classify go in with every set.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, replace

from cdigen.cdi import devnodes
from cdigen.cdi.devnodes import DeviceNodeInfo
from cdigen.cdi.driverfiles import DriverFiles, Library, scan_driver
from cdigen.cdi.hostfs import HostFS
from cdigen.cdi.names import (
    DEFAULT_CLASS,
    DEFAULT_VENDOR,
    capability_device_name,
    device_name,
    make_kind,
)
from cdigen.cdi.types import ContainerEditsDoc, DeviceDoc, DeviceNodeDoc, HookDoc, MountDoc, SpecDoc
from cdigen.cdi.version import minimum_version, version_key, version_shortfall
from cdigen.errors import InputError
from cdigen.model import Gpu, Node

NAME_STRATEGIES = ("index", "uuid", "type-index")
MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
# Read-only is enough for a socket: connect() is not a write to the file system.
IPC_MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate", "noexec"]
# As nvidia-ctk does: keeps a legacy nvidia-container-runtime hook from injecting devices again.
SPEC_ENV = ["NVIDIA_VISIBLE_DEVICES=void"]
# Where the hook-free spec puts libcuda.so.1 and libcuda.so for Triton (torch.compile): it asks
# `ldconfig -p` unless this is set, and nothing has updated the image's ld.so.cache.
TRITON_ENV = "TRITON_LIBCUDA_PATH"

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
# Linker names every build may ask for (-lcuda, -lnvidia-ml, ...): the ones nvidia-ctk always
# links (libcuda, libnvidia-opticalflow) and those the driver installer ships.
LINKER_NAME_STEMS = (
    "libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libnvidia-nvvm",
    "libnvidia-opticalflow", "libnvidia-encode", "libnvcuvid", "libnvidia-cfg", "libnvidia-fbc",
    "libnvidia-opencl", "libnvidia-allocator",
)  # fmt: skip
# Extra links glvnd and gbm need (as nvidia-ctk's create-symlinks makes): stem -> (target, link)
# relative to the library's directory; {soname} is the library's SONAME.
EXTRA_LINKS = {
    "libGLX_nvidia": ("{soname}", "libGLX_indirect.so.0"),
    "libnvidia-allocator": ("../{soname}", "gbm/nvidia-drm_gbm.so"),
}
# The library directories each image family's loader and linker search without a cache.
MULTIARCH = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}


@dataclass(frozen=True)
class SpecOptions:
    """What ``cdigen generate`` was asked for, beside the node itself."""

    vendor: str = DEFAULT_VENDOR
    cls: str = DEFAULT_CLASS
    name_strategies: tuple[str, ...] = ("index", "uuid")
    driver_root: str = "/"
    dev_root: str = "/"
    sysfs_root: str = "/sys"
    host_root: str = "/"  # where the host's / is: the roots above are host paths under it
    hook_path: str | None = None  # None: no hooks
    capabilities: tuple[str, ...] = DEFAULT_CAPABILITIES
    # each of these not in ``capabilities`` gets a device ``capability-<name>`` with its files
    capability_devices: tuple[str, ...] = ()
    cdi_version: str | None = None  # None: the minimum the content needs


def parse_name_strategies(text: str) -> tuple[str, ...]:
    """``"index,uuid"`` -> ``("index", "uuid")``; InputError on an unknown or empty strategy."""
    strategies = tuple(dict.fromkeys(s.strip() for s in text.split(",")))
    for s in strategies:
        if s not in NAME_STRATEGIES:
            raise InputError(
                f"unknown device name strategy {s!r}",
                where="--device-name-strategy",
                hint=f"use a comma-separated list of {', '.join(NAME_STRATEGIES)}",
            )
    return strategies


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


def node_doc(info: DeviceNodeInfo) -> DeviceNodeDoc:
    """A device node entry; ``hostPath`` only when it differs, stat fields only when known."""
    doc: DeviceNodeDoc = {"path": info.path}
    if info.host_path != info.path:
        doc["hostPath"] = info.host_path
    if info.type is not None and info.major is not None and info.minor is not None:
        doc["type"] = info.type
        doc["major"] = info.major
        doc["minor"] = info.minor
    if info.file_mode is not None:
        doc["fileMode"] = info.file_mode
    if info.permissions:
        doc["permissions"] = info.permissions
    return doc


def _gpu_names(gpu: Gpu, strategies: Iterable[str]) -> list[str]:
    return [device_name(s, gpu.index, gpu.uuid) for s in strategies]


def _mig_names(gpu: Gpu, position: int, uuid: str, strategies: Iterable[str]) -> list[str]:
    return [device_name(s, gpu.index, uuid, position) for s in strategies]


def _device_entries(
    node: Node, options: SpecOptions, fs: HostFS
) -> list[tuple[list[str], list[DeviceNodeDoc]]]:
    """``(names, device nodes)`` per GPU or MIG device, in index order."""
    entries = []
    for gpu in sorted(node.gpus, key=lambda g: g.index):
        parent = node_doc(devnodes.device_node(options.dev_root, f"/dev/nvidia{gpu.minor}", fs))
        if not gpu.mig_enabled:
            # DRM nodes only where they exist: they are extras, and a missing one would make
            # the runtime refuse the whole device
            drm = [
                node_doc(devnodes.device_node(options.dev_root, p, fs))
                for p in devnodes.drm_nodes(options.sysfs_root, gpu.pci_bus_id, fs)
                if devnodes.node_exists(options.dev_root, p, fs)
            ]
            entries.append((_gpu_names(gpu, options.name_strategies), [parent, *drm]))
            continue
        # by GI and CI ID: the names must not depend on the order discovery listed them in
        migs = sorted(gpu.mig_devices, key=lambda m: (m.gi_id, m.ci_id, m.uuid))
        for position, mig in enumerate(migs):
            caps = [
                node_doc(
                    devnodes.device_node(options.dev_root, f"/dev/nvidia-caps/nvidia-cap{n}", fs)
                )
                for n in mig.cap_minors
            ]
            names = _mig_names(gpu, position, mig.uuid, options.name_strategies)
            entries.append((names, [parent, *caps]))
    return entries


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


def library_families(driver: DriverFiles) -> tuple[str, ...]:
    """The container directories every library's SONAME and linker name go into: the
    multiarch directory (Debian, Ubuntu) of the driver's architecture, and ``/usr/lib64``."""
    for d in driver.library_dirs:
        triplet = d.rstrip("/").rpartition("/")[2]
        if triplet in MULTIARCH.values():
            return (f"/usr/lib/{triplet}", "/usr/lib64")
    return (f"/usr/lib/{MULTIARCH.get(os.uname().machine, MULTIARCH['x86_64'])}", "/usr/lib64")


def _linker_name(lib: Library) -> str | None:
    if not lib.sonames:
        return None
    if lib.linker_names:
        return lib.linker_names[0]
    return f"{lib.stem}.so" if lib.stem in LINKER_NAME_STEMS else None


def _library_links(
    lib: Library, families: Iterable[str], graphics: bool
) -> tuple[list[str], list[tuple[str, str]]]:
    """Where ``lib`` goes beside its own path: SONAME paths (mounted), and ``(target, link)``
    pairs for linker names and glvnd/gbm links (mounted without hooks, else made by the hook)."""
    directory = lib.path.rpartition("/")[0]
    own = directory.removesuffix("/" + lib.subdir.rstrip("/")) if lib.subdir else directory
    dirs = list(dict.fromkeys([own, *families]))
    sonames = [f"{directory}/{s}" for s in lib.sonames]
    sonames += [f"{d}/{lib.subdir}{s}" for d in dirs[1:] for s in lib.sonames]
    links: list[tuple[str, str]] = []
    soname = lib.sonames[0] if lib.sonames else lib.path.rpartition("/")[2]
    linker = _linker_name(lib)
    if linker:
        links += [(soname, f"{d}/{lib.subdir}{linker}") for d in dirs]
    extra = EXTRA_LINKS.get(lib.stem)
    if extra and graphics and not lib.subdir:
        target, link = extra
        links += [(target.format(soname=soname), f"{d}/{link}") for d in dirs]
    return sonames, links


def _mounts(driver: DriverFiles, hooks: bool, graphics: bool) -> list[MountDoc]:
    """Every bind mount, each container path once (runtimes refuse duplicates)."""
    mounts: dict[str, MountDoc] = {}

    def add(host: str, container: str, options: list[str]) -> None:
        mounts.setdefault(container, _mount(host, container, options))

    families = library_families(driver)
    for lib in driver.libraries:
        add(lib.host_path, lib.path, MOUNT_OPTIONS)
    for lib in driver.libraries:
        sonames, links = _library_links(lib, families, graphics)
        for path in sonames:
            add(lib.host_path, path, MOUNT_OPTIONS)
        if not hooks:
            for _, link in links:
                add(lib.host_path, link, MOUNT_OPTIONS)
    for f in (*driver.binaries, *driver.firmware, *driver.configs):
        add(f.host_path, f.path, MOUNT_OPTIONS)
    for f in driver.ipc:
        add(f.host_path, f.path, IPC_MOUNT_OPTIONS)
    return list(mounts.values())


def _mount(host: str, container: str, options: list[str]) -> MountDoc:
    return {"hostPath": host, "containerPath": container, "options": list(options)}


def _hooks(driver: DriverFiles, hook_path: str, graphics: bool) -> list[HookDoc]:
    """create-symlinks (linker names), enable-cuda-compat, update-ldcache, in nvidia-ctk's order."""
    hooks: list[HookDoc] = []
    families = library_families(driver)
    links: dict[str, str] = {}
    for lib in driver.libraries:
        for target, link in _library_links(lib, families, graphics)[1]:
            links.setdefault(link, target)
    if links:
        args = ["nvidia-cdi-hook", "create-symlinks"]
        for link, target in links.items():
            args += ["--link", f"{target}::{link}"]
        hooks.append({"hookName": "createContainer", "path": hook_path, "args": args})
    if any(lib.stem == "libcuda" for lib in driver.libraries) and driver.driver_version:
        args = ["nvidia-cdi-hook", "enable-cuda-compat"]
        args.append(f"--host-driver-version={driver.driver_version}")
        hooks.append({"hookName": "createContainer", "path": hook_path, "args": args})
    if driver.library_dirs:
        args = ["nvidia-cdi-hook", "update-ldcache"]
        for d in driver.library_dirs:
            args += ["--folder", d]
        hooks.append({"hookName": "createContainer", "path": hook_path, "args": args})
    return hooks


def _env(driver: DriverFiles, hooks: bool) -> list[str]:
    env = list(SPEC_ENV)
    if not hooks and any(lib.stem == "libcuda" and lib.sonames for lib in driver.libraries):
        env.append(f"{TRITON_ENV}={library_families(driver)[0]}")
    return env


def _copies(nodes: Iterable[DeviceNodeDoc]) -> list[DeviceNodeDoc]:
    return [n.copy() for n in nodes]


def _edits(
    driver: DriverFiles,
    capabilities: Iterable[str],
    hook_path: str | None,
    control: list[DeviceNodeDoc],
) -> ContainerEditsDoc:
    """The container edits of the driver files of ``capabilities``: the spec's common edits,
    and (with one more capability) what a capability device is measured against."""
    caps = tuple(capabilities)
    driver = select(driver, caps)
    use_hooks = hook_path is not None
    edits: ContainerEditsDoc = {"env": _env(driver, use_hooks)}
    if control:
        edits["deviceNodes"] = _copies(control)
    graphics = "graphics" in caps
    mounts = _mounts(driver, use_hooks, graphics)
    if mounts:
        edits["mounts"] = mounts
    hooks = _hooks(driver, hook_path, graphics) if hook_path else []
    if hooks:
        edits["hooks"] = hooks
    return edits


def _arg_items(args: list[str]) -> list[tuple[str, ...]]:
    """Hook arguments as items: ``("--link", "a::b")``, ``("--host-driver-version=1",)``."""
    items: list[tuple[str, ...]] = []
    k = 0
    while k < len(args):
        arg = args[k]
        paired = k + 1 < len(args) and not args[k + 1].startswith("--")
        if arg.startswith("--") and "=" not in arg and paired:
            items.append((arg, args[k + 1]))
            k += 2
            continue
        items.append((arg,))
        k += 1
    return items


def _hook_beyond(hook: HookDoc, common: list[HookDoc]) -> HookDoc | None:
    """``hook`` less what a common hook of the same program and subcommand already does
    (the links ``create-symlinks`` makes, the folders ``update-ldcache`` reads); None if
    nothing is left."""
    args = hook.get("args", [])
    same = [h for h in common if h["path"] == hook["path"] and h.get("args", [])[:2] == args[:2]]
    out = hook.copy()
    if not same:
        return out
    done = {item for h in same for item in _arg_items(h.get("args", [])[2:])}
    left = [item for item in _arg_items(args[2:]) if item not in done]
    if not left:
        return None
    out["args"] = [*args[:2], *(a for item in left for a in item)]
    return out


def _edits_beyond(full: ContainerEditsDoc, common: ContainerEditsDoc) -> ContainerEditsDoc:
    """What ``full`` adds to ``common`` (the spec's common edits, which every device gets):
    env entries, device nodes and mounts (by container path) and hook work it lacks."""
    out: ContainerEditsDoc = {}
    env = [e for e in full.get("env", []) if e not in common.get("env", [])]
    if env:
        out["env"] = env
    have_nodes = {n["path"] for n in common.get("deviceNodes", [])}
    nodes = [n for n in full.get("deviceNodes", []) if n["path"] not in have_nodes]
    if nodes:
        out["deviceNodes"] = nodes
    have_mounts = {m["containerPath"] for m in common.get("mounts", [])}
    mounts = [m for m in full.get("mounts", []) if m["containerPath"] not in have_mounts]
    if mounts:
        out["mounts"] = mounts
    common_hooks = common.get("hooks", [])
    hooks = [h for h in (_hook_beyond(h, common_hooks) for h in full.get("hooks", [])) if h]
    if hooks:
        out["hooks"] = hooks
    return out


def extra_capabilities(options: SpecOptions) -> tuple[str, ...]:
    """The capabilities asked for as devices that the common edits do not already have."""
    return tuple(c for c in options.capability_devices if c not in options.capabilities)


def missing_capability_devices(spec: SpecDoc, options: SpecOptions) -> tuple[str, ...]:
    """The capabilities asked for as devices that got none: the driver root has no files
    for them (say so: a container asking for one would not start)."""
    names = {d["name"] for d in spec["devices"]}
    return tuple(c for c in extra_capabilities(options) if capability_device_name(c) not in names)


def build_spec(node: Node, options: SpecOptions, driver: DriverFiles, fs: HostFS) -> SpecDoc:
    """The spec for ``node`` on a host (seen through ``fs``) whose driver files are ``driver``;
    InputError if empty or if a pinned ``cdi_version`` is too low for the content.

    Beside the GPU devices and ``all``, each capability of ``options.capability_devices`` not
    in ``options.capabilities`` gets a device (``capability-<name>``) holding what that
    capability adds to the common edits; one whose files the driver root lacks gets none
    (see :func:`missing_capability_devices`)."""
    kind = make_kind(options.vendor, options.cls)
    devices: list[DeviceDoc] = []
    all_nodes: dict[str, DeviceNodeDoc] = {}
    for names, nodes in _device_entries(node, options, fs):
        for n in nodes:
            all_nodes.setdefault(n["path"], n)
        for name in names:
            # copies, not shared dicts: shared ones would come out as YAML anchors and aliases
            devices.append({"name": name, "containerEdits": {"deviceNodes": _copies(nodes)}})
    if not devices:
        raise InputError(
            "the node has no GPUs to expose (none found, or MIG enabled without MIG devices)",
            where=node.name or "node",
            hint="check discovery with 'cdigen discover'",
        )
    devices.append({"name": "all", "containerEdits": {"deviceNodes": _copies(all_nodes.values())}})

    control = [node_doc(n) for n in devnodes.control_nodes(options.dev_root, fs)]
    edits = _edits(driver, options.capabilities, options.hook_path, control)
    for cap in extra_capabilities(options):
        full = _edits(driver, (*options.capabilities, cap), options.hook_path, control)
        beyond = _edits_beyond(full, edits)
        if beyond.get("mounts") or beyond.get("hooks") or beyond.get("deviceNodes"):
            devices.append({"name": capability_device_name(cap), "containerEdits": beyond})

    spec: SpecDoc = {"cdiVersion": "", "kind": kind, "devices": devices, "containerEdits": edits}
    spec["cdiVersion"] = pin_version(spec, options.cdi_version)
    return spec


def pin_version(spec: SpecDoc, requested: str | None) -> str:
    """The version to write: ``requested`` if the content allows it, else the content's minimum."""
    if requested is None:
        return minimum_version(spec)
    version_key(requested)  # unknown versions fail here
    problem = version_shortfall(spec, requested)
    if problem:
        raise InputError(
            problem, where="--cdi-version", hint=f"use {minimum_version(spec)} or later"
        )
    return requested.removeprefix("v")


def generate(node: Node, options: SpecOptions, fs: HostFS | None = None) -> SpecDoc:
    """Scan the host under the roots in ``options`` and build the spec for ``node``.

    ``fs`` is the view of the host at ``options.host_root`` (one per scan: it remembers
    resolved directories); made here when not given.
    """
    fs = fs or HostFS(options.host_root)
    driver = scan_driver(options.driver_root, node.driver_version, fs)
    return build_spec(node, options, driver, fs)
