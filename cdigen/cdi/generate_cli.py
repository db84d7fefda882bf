"""The ``generate`` subcommand: its options, and the checks and spec options made of them.

Registration is cheap: the handler imports the CDI modules only when it runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cdigen.cdi.names import DEFAULT_CLASS, DEFAULT_VENDOR
from cdigen.cdi.specdir import STATIC_SPEC_DIR
from cdigen.discover.cli import add_node_source
from cdigen.errors import EXIT_OK, InputError

if TYPE_CHECKING:
    from cdigen.cdi.hostfs import HostFS
    from cdigen.cdi.spec import SpecOptions

DEFAULT_OUTPUT_DIR = str(STATIC_SPEC_DIR)


def register_generate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``generate`` and its options, in the order ``--help`` lists them."""
    gen = sub.add_parser(
        "generate",
        help="write a CDI spec for the node's GPUs",
        description="Write a CDI spec for every GPU (and MIG device) of the node into the "
        "output directory, atomically; refuses when another spec defines the same devices. "
        "Exit 0 when the spec was written or is unchanged (or printed), 2 for bad usage or "
        "input, a node that cannot be discovered, a conflicting spec or a failed write.",
        epilog="examples: cdigen generate; cdigen generate --node builtin:rtx4090 --dry-run; "
        "cdigen generate --host-root /host --driver-root /run/nvidia/driver (in a container)",
    )
    add_node_source(gen, roots=False)  # --sysfs-root below also feeds the spec; no --proc-root
    _add_host_roots(gen)
    _add_output_options(gen)
    _add_spec_options(gen)
    gen.set_defaults(func=run_generate)


def _add_host_roots(gen: argparse.ArgumentParser) -> None:
    """Where ``generate`` reads the host: driver, dev and sysfs roots, and the host's ``/``."""
    gen.add_argument("--driver-root", default="/", metavar="DIR", help="driver root (default: /)")
    gen.add_argument("--dev-root", default="/", metavar="DIR", help="device-node root (default: /)")
    gen.add_argument("--sysfs-root", default="/sys", metavar="DIR", help="sysfs (default: /sys)")
    gen.add_argument(
        "--host-root",
        default="/",
        metavar="DIR",
        help="where the host's / is mounted when run in a container (e.g. /host): the three "
        "roots above are host paths, read under DIR, and the spec names host paths; symlinks "
        "resolve inside DIR (default: /)",
    )


def _add_output_options(gen: argparse.ArgumentParser) -> None:
    """Where and how ``generate`` writes the spec."""
    gen.add_argument(
        "--output-dir",
        default=DEFAULT_OUTPUT_DIR,
        metavar="DIR",
        help=f"spec directory (default: {DEFAULT_OUTPUT_DIR})",
    )
    gen.add_argument(
        "--output",
        "-o",
        metavar="PATH|-",
        help="write to this file instead of <output-dir>/<vendor>-<class>.<format>; '-': stdout",
    )
    gen.add_argument("--dry-run", action="store_true", help="print the spec; write nothing")
    gen.add_argument(
        "--format", choices=["yaml", "json"], default="yaml", help="spec format (default: yaml)"
    )


def _add_spec_options(gen: argparse.ArgumentParser) -> None:
    """What the spec holds: its kind, device names, hooks, capabilities and version."""
    gen.add_argument(
        "--vendor", default=DEFAULT_VENDOR, help=f"CDI vendor (default: {DEFAULT_VENDOR})"
    )
    gen.add_argument(
        "--class", dest="cls", default=DEFAULT_CLASS, help=f"CDI class (default: {DEFAULT_CLASS})"
    )
    gen.add_argument(
        "--device-name-strategy",
        default="index,uuid",
        metavar="LIST",
        help="comma-separated: index, uuid, type-index (default: index,uuid)",
    )
    gen.add_argument(
        "--hook-path",
        metavar="PATH",
        help="nvidia-cdi-hook to run as createContainer hooks (default: found under the driver "
        "root, else no hooks)",
    )
    gen.add_argument(
        "--no-hooks",
        action="store_true",
        help="no hooks even where nvidia-cdi-hook is installed: libraries are mounted at their "
        "SONAME and linker-name paths instead, which every image's loader finds",
    )
    gen.add_argument(
        "--capabilities",
        default="compute,utility",
        metavar="LIST",
        help="driver capabilities, comma-separated: compute, utility, video, graphics, display, "
        "or all (default: compute,utility)",
    )
    gen.add_argument(
        "--capability-devices",
        metavar="LIST",
        help="also write one device per capability in LIST (same names, or all) that "
        "--capabilities leaves out, named capability-<name> (e.g. nvidia.com/gpu="
        "capability-graphics), holding what it adds: containers that ask for it beside a GPU "
        "get it (default: none)",
    )
    gen.add_argument(
        "--cdi-version",
        metavar="X.Y.Z",
        help="pin cdiVersion (default: the lowest the content needs); fails if too low",
    )


def run_generate(args: argparse.Namespace) -> int:
    """Handle ``cdigen generate``."""
    from cdigen.cdi.checks import check_roots
    from cdigen.cdi.spec_service import node_spec
    from cdigen.cdi.write import render_spec
    from cdigen.discover import load_node

    _check_generate_args(args)
    fs = _host_fs(args)
    # the roots again inside node_spec; here so that a wrong one fails before discovery runs
    check_roots(
        driver_root=args.driver_root,
        dev_root=args.dev_root,
        sysfs_root=args.sysfs_root,
        hook_path=args.hook_path,
        fs=fs,
    )
    options = _spec_options(args, fs)
    node = load_node(
        args.node,
        sysfs_root=_located(fs, args.sysfs_root),
        proc_root=_located(fs, "/proc"),
        driver_root=args.driver_root,
        host_root=fs.root,
    )
    dry_run = args.dry_run or args.output == "-"
    made = node_spec(
        node,
        options,
        source=args.node,
        fs=fs,
        output_dir=None if dry_run else Path(args.output_dir),
        fmt=args.format,
        output=Path(args.output) if args.output and not dry_run else None,
    )
    if made.host_warning:
        print(f"cdigen: warning: {made.host_warning}", file=sys.stderr)
    _warn_missing_capabilities(made.missing_capabilities, args.driver_root)
    if made.written is None:
        sys.stdout.write(render_spec(made.spec, args.format))
        return EXIT_OK
    status = "wrote" if made.written.changed else "unchanged"
    print(
        f"{status} {made.written.path} ({len(made.spec['devices'])} devices, "
        f"cdiVersion {made.spec['cdiVersion']})"
    )
    return EXIT_OK


def _check_generate_args(args: argparse.Namespace) -> None:
    """InputError for a bad kind, ``--cdi-version`` or hook option: before discovery runs (and
    warns of anything)."""
    from cdigen.cdi.names import make_kind

    make_kind(args.vendor, args.cls)
    if args.cdi_version is not None:
        from cdigen.cdi.version import version_key

        try:
            version_key(args.cdi_version)
        except InputError as exc:
            raise InputError(exc.message, where="--cdi-version", hint=exc.hint) from None
    if args.hook_path and not args.hook_path.startswith("/"):
        raise InputError(
            f"{args.hook_path!r} is not an absolute path",
            where="--hook-path",
            hint="runtimes run hooks by absolute host path, e.g. /usr/bin/nvidia-cdi-hook",
        )
    if args.no_hooks and args.hook_path:
        raise InputError(
            "--hook-path and --no-hooks contradict each other",
            where="--no-hooks",
            hint="give one of them",
        )


def _spec_options(args: argparse.Namespace, fs: HostFS) -> SpecOptions:
    """The spec options ``generate`` was given; the hook found under the driver root unless
    one is given or ``--no-hooks``."""
    from cdigen.cdi.capabilities import parse_capabilities
    from cdigen.cdi.driverfiles import find_hook
    from cdigen.cdi.spec import SpecOptions, parse_name_strategies

    hook = None if args.no_hooks else args.hook_path or find_hook(args.driver_root, fs)
    return SpecOptions(
        vendor=args.vendor,
        cls=args.cls,
        name_strategies=parse_name_strategies(args.device_name_strategy),
        driver_root=args.driver_root,
        dev_root=args.dev_root,
        sysfs_root=args.sysfs_root,
        host_root=fs.root,
        hook_path=hook,
        capabilities=parse_capabilities(args.capabilities),
        capability_devices=(
            parse_capabilities(args.capability_devices, where="--capability-devices")
            if args.capability_devices is not None
            else ()
        ),
        cdi_version=args.cdi_version,
    )


def _warn_missing_capabilities(missing: tuple[str, ...], driver_root: str) -> None:
    """One warning line per capability asked for as a device that got none."""
    from cdigen.cdi.names import capability_device_name

    for cap in missing:
        print(
            f"cdigen: warning: --capability-devices: no {cap} files under the driver root "
            f"{driver_root}, so the spec has no {capability_device_name(cap)} device; a "
            "container asking for it would not start",
            file=sys.stderr,
        )


def _host_fs(args: argparse.Namespace) -> HostFS:
    """The view of the host for ``--host-root``; InputError if it cannot be used."""
    from cdigen.cdi.hostfs import HostFS

    if not args.host_root:
        raise InputError(
            "the path is empty",
            where="--host-root",
            hint="give the directory the host's / is mounted at (e.g. /host), or leave it out",
        )
    fs = HostFS(args.host_root)
    for flag, value in (("--driver-root", args.driver_root), ("--dev-root", args.dev_root)):
        if not value.startswith("/"):
            raise InputError(
                f"{value!r} is not an absolute path",
                where=flag,
                hint="spec host paths are absolute; give e.g. / or /run/nvidia/driver",
            )
    if not fs.confined:
        return fs
    if not Path(args.host_root).is_dir():
        raise InputError(
            f"{args.host_root!r} is not a directory",
            where="--host-root",
            hint="mount the host's / there (e.g. hostPath / at /host) or leave --host-root out",
        )
    for flag, value in (
        ("--driver-root", args.driver_root),
        ("--dev-root", args.dev_root),
        ("--sysfs-root", args.sysfs_root),
    ):
        if not value.startswith("/"):
            raise InputError(
                f"{value!r} is not an absolute path",
                where=flag,
                hint=f"with --host-root, {flag} is the path on the host, e.g. / or /sys",
            )
    return fs


def _located(fs: HostFS, path: str) -> str:
    """``path`` on the host as this process reaches it (itself when not under a host root)."""
    try:
        return fs.locate(path)
    except OSError as e:  # a symlink loop: following it further could leave the root
        raise InputError(
            f"cannot resolve {path}: {e.strerror}",
            where=f"--host-root {fs.root}",
            hint="fix the symlinks on the host",
        ) from e
