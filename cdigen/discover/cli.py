"""The ``discover``, ``topo`` and ``topo import`` subcommands."""

from __future__ import annotations

import argparse
import functools
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cdigen import logs
from cdigen.errors import EXIT_OK, InputError
from cdigen.model import MAX_MEMORY_BYTES

if TYPE_CHECKING:
    from cdigen.model import Node


def parse_size(text: str) -> int:
    """``--memory``: bytes as every memory flag takes them (:func:`cdigen.sizes.parse_bytes`:
    ``80GiB``, ``24Gi``, ``24GB``, plain bytes), at most 16 TiB."""
    from cdigen.sizes import parse_bytes

    value = parse_bytes(text, "--memory")
    if value > MAX_MEMORY_BYTES:
        raise InputError(
            f"{text[:40]!r} is more than 16 TiB", where="--memory", hint="give the GPU's memory"
        )
    return value


@functools.cache  # every command that takes --node lists them in its help
def _sample_names() -> str:
    from cdigen.discover.builtin import names

    return ", ".join(names())


def add_node_source(
    parser: argparse.ArgumentParser,
    *,
    roots: bool = True,
    defaults: bool = True,
    driver_root: bool = False,
) -> None:
    """Add ``--node`` and, with ``roots``, ``--sysfs-root``/``--proc-root`` (what ``load_node``
    takes) to ``parser``; with ``driver_root`` also ``--driver-root``/``--host-root`` (where NVML's
    library is looked for first). With ``defaults=False`` they default to None, for a command
    that fills unset flags from elsewhere (``plugin serve``: environment, then its config file)."""

    def default(value: str) -> str | None:
        return value if defaults else None

    parser.add_argument(
        "--node",
        metavar="SRC",
        default=default("nvml"),
        help="where the node description comes from: 'nvml' (the driver; default), a node file "
        f"(YAML/JSON), or builtin:NAME with NAME one of {_sample_names()}",
    )
    if not roots:
        return
    parser.add_argument(
        "--sysfs-root",
        metavar="DIR",
        default=default("/sys"),
        help="sysfs root for the NVML source's NUMA fallback (default: /sys)",
    )
    parser.add_argument(
        "--proc-root",
        metavar="DIR",
        default=default("/proc"),
        help="procfs root for the NVML source's MIG capability minors (default: /proc)",
    )
    if not driver_root:
        return
    parser.add_argument(
        "--driver-root",
        metavar="DIR",
        default=default("/"),
        help="where the driver is installed: NVML's library is loaded from there first, e.g. "
        "/run/nvidia/driver for a containerized driver (default: /)",
    )
    parser.add_argument(
        "--host-root",
        metavar="DIR",
        default=default("/"),
        help="where the host's / is mounted when run in a container (e.g. /host): "
        "--driver-root is a host path, read under DIR (default: /)",
    )


def _add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output",
        "-o",
        metavar="PATH",
        default="-",
        help="write here instead of stdout ('-'); the file is replaced atomically",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``discover``, ``topo`` and ``topo import`` to ``sub``."""
    _register_discover(sub)
    _register_topo(sub)


def _register_discover(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``discover`` and its options."""
    discover = sub.add_parser(
        "discover",
        help="print the node description (GPUs, MIG devices, links) a source yields",
        description="Discover the GPUs of this node (through NVML) or load a simulated one, and "
        "print the node description. The output is a node file: it loads unchanged with "
        "--node PATH.",
        epilog="examples: cdigen discover; cdigen discover --node builtin:dgx-a100 --format json",
    )
    add_node_source(discover, driver_root=True)
    discover.add_argument(
        "--format", choices=["yaml", "json"], default="yaml", help="default: yaml"
    )
    _add_output(discover)
    discover.set_defaults(func=run_discover)


def _register_topo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``topo`` and its options, then its ``import`` subcommand."""
    topo = sub.add_parser(
        "topo",
        help="show the GPU topology as an 'nvidia-smi topo -m' matrix, Graphviz or JSON",
        description="Show how the GPUs of a node are connected: X self, NV# bonded NVLinks "
        "(NVSwitch pairs included), PIX/PXB/PHB/NODE/SYS PCIe levels, ? unknown; plus each GPU's "
        "NUMA node. 'cdigen topo import' turns a saved 'nvidia-smi topo -m' into a node file.",
        epilog="examples: cdigen topo --node builtin:dgx1-v100; "
        "cdigen topo --node builtin:dgx-a100 --format dot | dot -Tsvg > a100.svg",
    )
    add_node_source(topo, driver_root=True)
    topo.add_argument(
        "--format", choices=["matrix", "dot", "json"], default="matrix", help="default: matrix"
    )
    _add_output(topo)
    topo.set_defaults(func=run_topo)
    topo_sub = topo.add_subparsers(dest="topo_command", metavar="SUBCOMMAND")
    _register_topo_import(topo_sub)


def _register_topo_import(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``topo import`` and its options."""
    imp = sub.add_parser(
        "import",
        help="turn a saved 'nvidia-smi topo -m' output into a node file",
        description="Parse the text 'nvidia-smi topo -m' printed (tabs or spaces; NIC rows, "
        "the legend and '#' lines are ignored) into a node file. NV# pairs get # NVLinks and an "
        "unknown PCIe level. NUMA nodes come from the 'NUMA Affinity' column, or else are "
        "inferred from distinct CPU affinity sets (a note says so). topo -m shows no product "
        "names, memory, UUIDs or bus IDs: give the first two with options; the others are made up "
        "(deterministic, well-formed).",
        epilog="example: nvidia-smi topo -m > topo.txt; cdigen topo import topo.txt "
        "--gpu-name 'NVIDIA A100-SXM4-80GB' -o node.yaml; cdigen topo --node node.yaml",
    )
    imp.add_argument("file", metavar="FILE", help="the saved output ('-' for stdin)")
    imp.add_argument(
        "--gpu-name",
        default="",
        metavar="NAME",
        help="product name of the GPUs, e.g. 'NVIDIA A100-SXM4-80GB' (known names also set "
        "architecture, compute capability and memory)",
    )
    imp.add_argument(
        "--memory",
        metavar="SIZE",
        help="memory per GPU: bytes or e.g. 80GiB (default: by --gpu-name; for a name cdigen "
        "does not know, 0 and a warning)",
    )
    imp.add_argument("--name", default="", help="a label for the node (default: the file name)")
    imp.add_argument("--driver-version", default="", metavar="V", help="e.g. 550.54.15")
    imp.add_argument("--cuda-driver-version", default="", metavar="V", help="e.g. 12.4")
    imp.add_argument(
        "--format",
        dest="import_format",
        choices=["yaml", "json"],
        default="yaml",
        help="node file format (default: yaml)",
    )
    _add_output(imp)
    imp.set_defaults(func=run_topo_import)


def _emit(text: str, output: str) -> None:
    if output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from cdigen.errors import InputError
    from cdigen.fileio import atomic_write

    target = Path(output)
    if not target.parent.is_dir():
        raise InputError(
            f"directory {str(target.parent)!r} does not exist",
            where="--output",
            hint="create it first, or write to an existing directory",
        )
    atomic_write(target, text.encode("utf-8"))
    logs.logger().info("wrote %s", output)


def _load(args: argparse.Namespace) -> Node:
    """The node ``--node`` names; its notes and GPU errors go to stderr."""
    from cdigen.discover import load_node

    node = load_node(
        args.node,
        sysfs_root=args.sysfs_root,
        proc_root=args.proc_root,
        driver_root=args.driver_root,
        host_root=args.host_root,
    )
    for note in node.notes:
        print(f"cdigen: note: {note}", file=sys.stderr)
    for gpu in node.gpus:
        if gpu.error:
            print(f"cdigen: warning: GPU {gpu.index}: {gpu.error}", file=sys.stderr)
    return node


def run_discover(args: argparse.Namespace) -> int:
    """``cdigen discover``: print the node description."""
    from cdigen.nodefile import dump_node

    _emit(dump_node(_load(args), args.format), args.output)
    return EXIT_OK


def run_topo(args: argparse.Namespace) -> int:
    """``cdigen topo``: print the topology matrix, Graphviz or JSON."""
    from cdigen.discover import render

    node = _load(args)
    renderers = {
        "matrix": render.render_matrix,
        "dot": render.render_dot,
        "json": render.render_json,
    }
    _emit(renderers[args.format](node), args.output)
    return EXIT_OK


def run_topo_import(args: argparse.Namespace) -> int:
    """``cdigen topo import``: a saved ``nvidia-smi topo -m`` -> node file."""
    from cdigen.discover.topo_import import NodeFacts, import_topo_warned
    from cdigen.fileio import read_stdin, read_text
    from cdigen.nodefile import dump_node, node_from_dict, node_to_dict

    if args.file == "-":
        where, text = "<stdin>", read_stdin(what="topo -m text")
    else:
        where, text = args.file, read_text(args.file, what="topo -m text")
    facts = NodeFacts(
        name=args.name or ("" if args.file == "-" else Path(args.file).stem),
        gpu_name=args.gpu_name,
        memory_bytes=parse_size(args.memory) if args.memory is not None else None,
        driver_version=args.driver_version,
        cuda_driver_version=args.cuda_driver_version,
    )
    node, warnings = import_topo_warned(text, where=where, facts=facts)
    # What we write must load again: the flags' values meet the node schema too. Every GPU is
    # checked, and one link of each kind (the rest differ only in their GPU indexes, which
    # check_node saw): half a million links at 1,000 GPUs took the schema most of a minute.
    doc = node_to_dict(node)
    kinds = {(k["pcie"], k["nvlinks"]): k for k in reversed(doc["links"])}
    doc["links"] = list(kinds.values())
    try:
        node_from_dict(doc, where=where)
    except InputError as exc:
        raise InputError(
            f"the imported node would not load: {exc.message}",
            where=where,
            hint=_flag_hint(exc.message),
        ) from None
    text = dump_node(node, args.import_format)
    if args.import_format == "yaml":  # JSON has no comments: the stderr note below says it
        text = INVENTED_HEADER + text
    _emit(text, args.output)
    for note in (*node.notes, INVENTED_NOTE):  # only once it worked: a failure is one line
        print(f"cdigen: note: {note}", file=sys.stderr)
    for warning in warnings:
        print(f"cdigen: warning: {warning}", file=sys.stderr)
    return EXIT_OK


# node-file fields that come from topo import's flags
_FLAG_FIELDS = (
    (re.compile(r"^gpus\[\d+\]\.name\b"), "--gpu-name"),
    (re.compile(r"^gpus\[\d+\]\.memoryBytes\b"), "--memory"),
    (re.compile(r"^name\b"), "--name"),
    (re.compile(r"^driverVersion\b"), "--driver-version"),
    (re.compile(r"^cudaDriverVersion\b"), "--cuda-driver-version"),
)


def _flag_hint(message: str) -> str:
    """Which flag to fix for a schema ``message`` about the imported node; or, where no flag
    made the value, that the fault is cdigen's."""
    flag = next((f for pattern, f in _FLAG_FIELDS if pattern.match(message)), None)
    if flag is not None:
        return f"check {flag}"
    return "this value was made by cdigen, not given by a flag: please report it with the file"


INVENTED_NOTE = (
    "topo -m shows no UUIDs, minors or PCI bus IDs: those in the imported node are invented "
    "(stable per file); use 'cdigen discover' on the node for the real ones"
)
INVENTED_HEADER = (
    "# Imported from nvidia-smi topo -m by cdigen: GPU uuid, minor and pciBusId are INVENTED\n"
    "# (topo -m does not show them); run 'cdigen discover' on the node for the real values.\n"
)
