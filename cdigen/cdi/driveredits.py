"""The container edits of a set of driver files: bind mounts, hooks and environment.

The edits work without hooks: every library is also mounted at its SONAME path and its linker
name (``libcuda.so``) in the library directories of both image families (Debian's multiarch
directory and RHEL's ``/usr/lib64``), so the loader and ``gcc -lcuda`` find the driver without
``ldconfig`` in the container. With a hook program (given, or ``nvidia-cdi-hook`` found on the
host), they also run its ``create-symlinks``, ``enable-cuda-compat`` and ``update-ldcache``
hooks, as ``nvidia-ctk cdi generate`` does.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from cdigen.cdi.capabilities import select
from cdigen.cdi.driverfiles import DriverFiles, Library
from cdigen.cdi.types import ContainerEditsDoc, DeviceNodeDoc, HookDoc, MountDoc

MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
# Read-only is enough for a socket: connect() is not a write to the file system.
IPC_MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate", "noexec"]
# As nvidia-ctk does: keeps a legacy nvidia-container-runtime hook from injecting devices again.
SPEC_ENV = ["NVIDIA_VISIBLE_DEVICES=void"]
# Where the hook-free spec puts libcuda.so.1 and libcuda.so for Triton (torch.compile): it asks
# `ldconfig -p` unless this is set, and nothing has updated the image's ld.so.cache.
TRITON_ENV = "TRITON_LIBCUDA_PATH"

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


def copy_nodes(nodes: Iterable[DeviceNodeDoc]) -> list[DeviceNodeDoc]:
    return [n.copy() for n in nodes]


_Made = tuple[list[str], list[MountDoc], list[HookDoc]]
# The env, mounts and hooks of a driver's files by what they depend on. DRA builds a spec for
# every claim from one scan of the driver: making them again each time was a third of a
# NodePrepareResources (benchmarks/bench_dra.py). A new scan is a new key.
_MADE: dict[tuple[DriverFiles, tuple[str, ...], str | None], _Made] = {}
_MADE_MAX = 16


def _made(driver: DriverFiles, caps: tuple[str, ...], hook_path: str | None) -> _Made:
    key = (driver, caps, hook_path)
    made = _MADE.get(key)
    if made is None:
        selected = select(driver, caps)
        use_hooks = hook_path is not None
        graphics = "graphics" in caps
        hooks = _hooks(selected, hook_path, graphics) if hook_path else []
        made = (_env(selected, use_hooks), _mounts(selected, use_hooks, graphics), hooks)
        if len(_MADE) >= _MADE_MAX:
            _MADE.pop(next(iter(_MADE)))
        _MADE[key] = made
    return made


def driver_edits(
    driver: DriverFiles,
    capabilities: Iterable[str],
    hook_path: str | None,
    control: list[DeviceNodeDoc],
) -> ContainerEditsDoc:
    """The container edits of the driver files of ``capabilities``: the spec's common edits,
    and (with one more capability) what a capability device is measured against. Each call
    gets its own lists and entries, free to change."""
    env, mounts, hooks = _made(driver, tuple(capabilities), hook_path)
    edits: ContainerEditsDoc = {"env": list(env)}
    if control:
        edits["deviceNodes"] = copy_nodes(control)
    if mounts:
        edits["mounts"] = [m.copy() for m in mounts]
    if hooks:
        edits["hooks"] = [h.copy() for h in hooks]
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


def edits_beyond(full: ContainerEditsDoc, common: ContainerEditsDoc) -> ContainerEditsDoc:
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
