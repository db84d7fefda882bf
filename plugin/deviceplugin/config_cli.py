"""``cdigen plugin config convert``: NVIDIA's device-plugin config file as a cdigen one."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cdigen.cli import usage


def register(plugin_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``plugin config convert`` to the ``plugin`` subcommands."""
    config = plugin_sub.add_parser(
        "config",
        help="work with plugin config files",
        description="Plugin config files: check one as plugin serve would load it; convert "
        "NVIDIA's device-plugin config into cdigen's.",
    )
    config_sub = config.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    convert = config_sub.add_parser(
        "convert",
        help="write a cdigen plugin config from NVIDIA's device-plugin config (version: v1)",
        description=(
            "Read NVIDIA's k8s-device-plugin config file (version: v1: flags, resources, "
            "sharing.timeSlicing, sharing.mps, renameByDefault, failRequestsGreaterThanOne) and "
            "write the cdigen plugin config that advertises the same resources. An unknown key "
            "or a value of the wrong type is refused (exit 2); so is a setting cdigen cannot "
            "express, unless --drop-unsupported is given, and then each dropped one is named "
            "on stderr and as a comment in the output."
        ),
    )
    convert.add_argument("file", metavar="FILE", help="NVIDIA's config file (YAML or JSON)")
    convert.add_argument(
        "--output", "-o", metavar="PATH", help="write here (atomically) instead of stdout"
    )
    convert.add_argument(
        "--drop-unsupported",
        action="store_true",
        help="drop the settings cdigen cannot express, naming each on stderr (default: refuse "
        "the file, exit 2)",
    )
    convert.set_defaults(func=_convert)
    check = config_sub.add_parser(
        "check",
        help="load a plugin config as plugin serve would and show what the kubelet would see",
        description=(
            "Load FILE exactly as `cdigen plugin serve --config FILE` would (CDIGEN_* variables "
            "and the flags below included), refuse what serve refuses (two resources advertising "
            "one GPU among it), and print per resource the devices each GPU is advertised as "
            "and the limits a container gets. Exit 0 when the config would serve, 1 when it "
            "would be refused, 2 when FILE cannot be read or a flag is bad."
        ),
        epilog="example: cdigen plugin config check sharing.yaml --node builtin:rtx4090",
    )
    check.add_argument("file", metavar="FILE", help="cdigen plugin config file (YAML or JSON)")
    check.add_argument(
        "--node",
        metavar="SOURCE",
        help="the node to check against, as plugin serve --node: nvml, builtin:NAME or a node "
        "file (default: the config's node, else nvml)",
    )
    check.add_argument(
        "--policy-dir",
        metavar="DIR",
        help="as plugin serve --policy-dir (default: the config's policyDir)",
    )
    check.set_defaults(func=_check)
    config.set_defaults(func=lambda args: usage(config))


def _convert(args: argparse.Namespace) -> int:
    from cdigen.errors import InputError
    from cdigen.fileio import atomic_write, dump_document, read_document
    from cdigen.plugin.deviceplugin.config import config_from_document, validate_config
    from cdigen.plugin.deviceplugin.nvidia_config import convert, describe, is_nvidia_config

    doc = read_document(args.file, what="NVIDIA device-plugin config")
    if not is_nvidia_config(doc):
        raise InputError(
            "not NVIDIA's device-plugin config format (no version, flags, sharing or "
            "resources.gpus)",
            where=args.file,
            hint="a cdigen config needs no conversion: pass it to plugin serve --config",
        )
    converted = convert(doc, where=args.file, drop_unsupported=args.drop_unsupported)
    # the result must load as a config the plugin accepts (one owner per GPU included): a
    # converter bug is ours, not theirs
    loaded = config_from_document(converted.document, where=f"{args.file} (converted)")
    try:
        validate_config(loaded)
    except InputError as exc:
        where = f"{args.file} (converted): {exc.where}" if exc.where else args.file
        raise InputError(exc.message, where=where, hint=exc.hint) from None
    text = describe(converted.notes, converted.dropped) + dump_document(converted.document, "yaml")
    for note in converted.notes:
        print(f"cdigen: note: {note}", file=sys.stderr)
    for setting in converted.dropped:
        print(f"cdigen: dropped: {setting}", file=sys.stderr)
    if args.output:
        atomic_write(args.output, text.encode())
        print(f"cdigen: wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _check(args: argparse.Namespace) -> int:
    from cdigen.errors import FlagError, InputError
    from cdigen.fileio import read_document
    from cdigen.plugin.deviceplugin.config import (
        ResourcesError,
        config_from_document,
        merged_config,
    )
    from cdigen.plugin.deviceplugin.config_report import config_report, load_config_node

    # read once (what is checked is what was parsed); unreadable, not YAML: bad input, 2
    doc = read_document(args.file, what="plugin config file")
    if args.policy_dir is not None and not Path(args.policy_dir).is_dir():
        raise InputError(
            f"{args.policy_dir} is not a directory",
            where="--policy-dir",
            hint="give the policy directory plugin serve reads",
        )
    flags = {"node": args.node, "policy_dir": args.policy_dir}
    try:
        from_file = config_from_document(doc, where=str(args.file))
    except InputError as exc:
        return _refused(exc)  # names the file
    try:
        config = merged_config(from_file, path=args.file, flags=flags)
    except FlagError:  # a flag of this command (or its variable): bad usage, 2
        raise
    except ResourcesError as exc:
        return _refused(exc)  # names the file
    except InputError as exc:
        return _refused(exc, args.file)
    node = load_config_node(config)  # discovery failing is about --node, not the config: 2
    try:
        lines = config_report(config, node)
    except InputError as exc:
        return _refused(exc, args.file)
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    return 0


def _refused(exc: Exception, file: str | None = None) -> int:
    """A config serve would refuse: one line, exit 1; ``file``: the config file the error
    does not name yet, put before its field."""
    from cdigen.errors import InputError

    if isinstance(exc, InputError) and file is not None:
        where = f"{file}: {exc.where}" if exc.where else file
        exc = InputError(exc.message, where=where, hint=exc.hint)
    print(f"cdigen: error: {exc}", file=sys.stderr)
    return 1
