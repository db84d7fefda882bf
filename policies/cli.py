"""The ``cdigen policy`` subcommands: check, explain, replay, simulate.

Registration is cheap: the engine (CEL, networkx) is imported inside the handlers.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cdigen.cli import usage
from cdigen.discover.cli import add_node_source
from cdigen.errors import CheckFailed

if TYPE_CHECKING:
    pass


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``policy check|explain|replay|simulate`` to ``sub``.

    Long: one flat list of the four commands' options, read top to bottom.
    """
    policy = sub.add_parser(
        "policy",
        help="check allocation policies and see what they choose",
        description="Check policy files, explain a preferred allocation, replay recorded "
        "kubelet requests, and simulate a job mix against go-gpuallocator's best-effort policy.",
    )
    commands = policy.add_subparsers(dest="policy_command", metavar="SUBCOMMAND")

    check = commands.add_parser(
        "check",
        help="check policy files (schema, CEL, a trial evaluation)",
        description="Check allocation policy files: the schema, every CEL expression (syntax, "
        "names, with did-you-mean), and a trial evaluation on every built-in node. One line per "
        "problem; exit 1 if any, 2 for a file that cannot be read.",
        epilog="example: cdigen policy check docs/policies/*.yaml",
    )
    check.add_argument("files", nargs="+", metavar="FILE", help="policy files (YAML or JSON)")
    check.set_defaults(func=_check)

    def common(parser: argparse.ArgumentParser) -> None:
        add_node_source(parser)
        parser.add_argument(
            "--policy",
            default="builtin:default",
            metavar="FILE",
            help="a policy file or a built-in: default, single-numa, pack, spread (also written "
            "builtin:NAME) (default: builtin:default)",
        )

    def shares(parser: argparse.ArgumentParser) -> None:
        group = parser.add_mutually_exclusive_group()
        group.add_argument(
            "--replicas",
            type=int,
            metavar="N",
            help="each GPU is advertised as N time-slicing replicas <gpu>::<k>",
        )
        group.add_argument(
            "--slice-mib",
            type=int,
            metavar="M",
            help="each GPU is advertised as floor(memory/M) memory slices <gpu>::slice-<k>",
        )

    explain = commands.add_parser(
        "explain",
        help="show the preferred set and why others lost",
        description="Answer one preferred-allocation request as the device plugin would: the "
        "chosen devices, their link score and NUMA nodes, the next best sets and why each lost, "
        "and the devices the policy's selector refused.",
        epilog="example: cdigen policy explain --node builtin:dgx1-v100 --available 0,1,2,3,4,5 "
        "--size 2 --alternatives 3",
    )
    common(explain)
    shares(explain)
    explain.add_argument(
        "--available",
        required=True,
        metavar="IDS",
        help="e.g. 0,2,3,5; share IDs (0::1, 0::slice-3); with --replicas or --slice-mib a GPU "
        "stands for all its shares and GPU=N for N free ones",
    )
    explain.add_argument(
        "--size", required=True, type=int, metavar="N", help="how many devices to choose"
    )
    explain.add_argument("--must", default="", metavar="IDS", help="IDs that must be included")
    explain.add_argument(
        "--format", choices=["text", "json"], default="text", help="output format (default: text)"
    )
    explain.add_argument(
        "--alternatives",
        type=int,
        default=5,
        metavar="N",
        help="how many next-best sets to show, each with why it lost (default: 5; 0: none)",
    )
    explain.set_defaults(func=_explain)

    replay = commands.add_parser(
        "replay",
        help="answer recorded requests (JSON lines)",
        description="Answer recorded preferred-allocation requests, one JSON object a line "
        "({available, mustInclude, size}, as 'plugin serve --record-requests' writes them), and "
        "print one answer a line. A bad line is reported (file:line: what) and skipped; exit 2 "
        "at the end if there was one.",
        epilog="example: cdigen policy replay --node builtin:dgx-a100 --policy my.yaml "
        "--requests requests.jsonl",
    )
    common(replay)
    replay.add_argument(
        "--requests",
        required=True,
        metavar="FILE.jsonl",
        help="the requests, one JSON object a line",
    )
    replay.set_defaults(func=_replay)

    simulate = commands.add_parser(
        "simulate",
        help="random 1/2/4/8-GPU jobs (or pods asking for shares): our figures beside a baseline",
        description="Run random job arrivals and departures on the node and compare the policy's "
        "placements with go-gpuallocator's best-effort policy (whole GPUs), or with no "
        "preference (shares, with --replicas or --slice-mib). The same seed gives the same jobs.",
        epilog="example: cdigen policy simulate --node builtin:dgx1-v100 --steps 2000",
    )
    common(simulate)
    shares(simulate)
    simulate.add_argument(
        "--seed", type=int, default=1, help="random seed of the job mix (default: 1)"
    )
    simulate.add_argument(
        "--steps", type=int, default=2000, help="1-100000 arrivals or departures (default 2000)"
    )
    simulate.set_defaults(func=_simulate)
    policy.set_defaults(func=lambda _args: usage(policy))


def _check(args: argparse.Namespace) -> int:
    from cdigen.errors import EXIT_BAD_INPUT, InputError
    from cdigen.fileio import parse_document, read_text
    from cdigen.policies.policy import check_policy_file

    unparsed = 0
    for path in args.files:  # a file that cannot be read is bad input (exit 2), not a problem
        text = read_text(path, what="policy file")
        try:
            parse_document(text, where=path)
        except InputError:  # nor parsed: bad input too, reported with the other files' problems
            unparsed += 1
    problems = [p for path in args.files for p in check_policy_file(path)]
    if problems:
        raise CheckFailed(
            problems, summary="policy check failed", exit_code=EXIT_BAD_INPUT if unparsed else None
        )
    for path in args.files:
        print(f"{path}: ok")
    return 0


def _explain(args: argparse.Namespace) -> int:
    from cdigen.policies.explain_cli import run_explain

    return run_explain(args)


def _replay(args: argparse.Namespace) -> int:
    from cdigen.policies.replay_cli import run_replay

    return run_replay(args)


def _simulate(args: argparse.Namespace) -> int:
    from cdigen.policies.simulate_cli import run_simulate

    return run_simulate(args)
