"""``cdigen plugin config convert``: NVIDIA's device-plugin config file as a cdigen one."""

from __future__ import annotations

import argparse
import sys


def register(plugin_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``plugin config convert`` to the ``plugin`` subcommands."""
    config = plugin_sub.add_parser(
        "config",
        help="work with plugin config files",
        description="Plugin config files: convert NVIDIA's device-plugin config into cdigen's.",
    )
    config_sub = config.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    convert = config_sub.add_parser(
        "convert",
        help="write a cdigen plugin config from NVIDIA's device-plugin config (version: v1)",
        description=(
            "Read NVIDIA's k8s-device-plugin config file (version: v1: flags, resources, "
            "sharing.timeSlicing, sharing.mps, renameByDefault, failRequestsGreaterThanOne) and "
            "write the cdigen plugin config that advertises the same resources. What has no "
            "equivalent here is listed as a note on stderr and as comments in the output."
        ),
    )
    convert.add_argument("file", metavar="FILE", help="NVIDIA's config file (YAML or JSON)")
    convert.add_argument(
        "--output", "-o", metavar="PATH", help="write here (atomically) instead of stdout"
    )
    convert.set_defaults(func=_convert)
    config.set_defaults(func=lambda args: _usage(config))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _convert(args: argparse.Namespace) -> int:
    from cdigen.errors import InputError
    from cdigen.fileio import atomic_write, dump_document, read_document
    from plugin.config import config_from_document
    from plugin.nvidia_config import convert, describe, is_nvidia_config

    doc = read_document(args.file, what="NVIDIA device-plugin config")
    if not is_nvidia_config(doc):
        raise InputError(
            "not NVIDIA's device-plugin config format (no version, flags, sharing or "
            "resources.gpus)",
            where=args.file,
            hint="a cdigen config needs no conversion: pass it to plugin serve --config",
        )
    converted = convert(doc, where=args.file)
    # the result must load as a config the plugin accepts: a converter bug is ours, not theirs
    config_from_document(converted.document, where=f"{args.file} (converted)")
    text = describe(converted.notes) + dump_document(converted.document, "yaml")
    for note in converted.notes:
        print(f"cdigen: note: {note}", file=sys.stderr)
    if args.output:
        atomic_write(args.output, text.encode())
        print(f"cdigen: wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
