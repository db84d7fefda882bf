"""The ``cdigen policy`` subcommands: check, explain, replay, simulate.

Registration is cheap: the engine (CEL, networkx) is imported inside the handlers.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from cdigen.discover.cli import add_node_source
from cdigen.errors import EXIT_BAD_INPUT, CheckFailed, InputError
from policies.cli_args import allocator_from_args, at_least, check_share_flags

if TYPE_CHECKING:
    from policies.allocator import AllocationAnswer, AllocationRequest, Allocator


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``policy check|explain|replay|simulate`` to ``sub``."""
    policy = sub.add_parser(
        "policy",
        help="check allocation policies and see what they choose",
        description="Check policy files, explain a preferred allocation, replay recorded "
        "kubelet requests, and simulate a job mix against go-gpuallocator's best-effort policy.",
    )
    commands = policy.add_subparsers(dest="policy_command", metavar="ACTION")

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
            "builtin:NAME)",
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
    policy.set_defaults(func=lambda _args: _usage(policy))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _check(args: argparse.Namespace) -> int:
    from cdigen.fileio import read_text
    from policies.policy import check_policy_file

    for path in args.files:  # a file that cannot be read is bad input (exit 2), not a problem
        read_text(path, what="policy file")
    problems = [p for path in args.files for p in check_policy_file(path)]
    if problems:
        raise CheckFailed(problems, summary="policy check failed")
    for path in args.files:
        print(f"{path}: ok")
    return 0


def _ids(text: str, flag: str) -> tuple[str, ...]:
    ids = tuple(part.strip() for part in text.split(",") if part.strip())
    _unique(ids, flag)
    return ids


def _unique(ids: tuple[str, ...], where: str) -> None:
    """InputError when ``ids`` names a device twice (``0`` and ``"0"`` are the same ID): the
    one check of explain's flags and replay's lines."""
    seen: set[str] = set()
    twice = [i for i in ids if i in seen or seen.add(i)]  # type: ignore[func-returns-value]
    if twice:
        shown = ", ".join(twice[:3])
        raise InputError(f"{where} lists a device twice: {shown}", hint="list each ID once")


def _request(
    allocator: Allocator,
    available: tuple[str, ...],
    must: tuple[str, ...],
    size: int,
    where: str,
) -> AllocationRequest:
    """A request checked the way the CLI is strict and prefer() is not."""
    from policies.allocator import AllocationRequest

    outside = [m for m in must if m not in set(available)]
    if outside:
        raise InputError(
            f"must-include devices {', '.join(outside)} are not among the available ones",
            where=where,
            hint="add them to the available list",
        )
    unknown = [i for i in available if allocator.position_of(i) is None]
    if unknown:
        raise InputError(
            f"unknown device IDs {', '.join(unknown[:5])} on node {allocator.node.name or '?'}",
            where=where,
            hint="use GPU indexes or UUIDs from 'cdigen discover'",
        )
    if size < 1:
        raise InputError(f"size must be at least 1, got {size}", where=where)
    return AllocationRequest(available, must, size)


def _answer_doc(answer: AllocationAnswer) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "devices": list(answer.devices),
        "linkScore": answer.link_score,
        "numaNodes": list(answer.numa_nodes),
    }
    if answer.fallback_reason:
        doc["fallbackReason"] = answer.fallback_reason
    return doc


def _expand_shares(
    allocator: Allocator, ids: tuple[str, ...], args: argparse.Namespace
) -> tuple[str, ...]:
    """With --replicas or --slice-mib: each GPU (``0``) becomes all its shares, ``0=5`` its
    last 5 (as if the first ones were taken); share IDs (``0::slice-3``) stay as they are."""
    from policies.shares import no_slices_reason, replica_ids, share_kind, slice_count, slice_ids

    replicas, slice_mib = check_share_flags(args)
    if replicas is None and slice_mib is None:
        return ids
    out: list[str] = []
    for device_id in ids:
        if share_kind(device_id) != "gpu":
            out.append(device_id)
            continue
        gpu_id, _, count_text = device_id.partition("=")
        position = allocator.position_of(gpu_id)
        if position is None:
            raise InputError(
                f"unknown GPU {gpu_id} on node {allocator.node.name or '?'}",
                where="--available",
                hint="use GPU indexes or UUIDs from 'cdigen discover'",
            )
        gpu = allocator.topology.gpus[position]
        reason = no_slices_reason(gpu, slice_mib) if slice_mib is not None else None
        if reason is not None:
            raise InputError(reason, where=f"--available {gpu_id} with --slice-mib {slice_mib}")
        shares = (
            replica_ids(gpu_id, replicas)
            if replicas is not None
            else slice_ids(gpu_id, slice_count(gpu, slice_mib or 1))
        )
        if count_text:
            if not count_text.isdigit() or int(count_text) > len(shares):
                raise InputError(
                    f"{device_id}: expected GPU=N with N free shares, at most {len(shares)}",
                    where="--available",
                )
            shares = shares[len(shares) - int(count_text) :]  # the first ones are taken
        out.extend(shares)
    return tuple(out)


def _shares_per_gpu(
    allocator: Allocator, available: tuple[str, ...], chosen: tuple[str, ...]
) -> list[dict[str, Any]]:
    """Free and chosen shares per GPU, for requests over replicas or slices."""
    from policies.shares import gpu_part

    rows: dict[str, dict[str, Any]] = {}
    for device_id in available:
        row = rows.setdefault(gpu_part(device_id), {"gpu": gpu_part(device_id), "free": 0})
        row["free"] += 1
        row.setdefault("chosen", 0)
    for device_id in chosen:
        rows[gpu_part(device_id)]["chosen"] += 1
    return list(rows.values())


def _explain(args: argparse.Namespace) -> int:
    from policies.allocator import why_lost
    from policies.shares import share_kind

    at_least("--size", args.size, 1)
    at_least("--alternatives", args.alternatives, 0)
    allocator = allocator_from_args(args)
    available = _expand_shares(allocator, _ids(args.available, "--available"), args)
    request = _request(allocator, available, _ids(args.must, "--must"), args.size, "--available")
    answer = allocator.prefer(request)
    id_of: dict[int, str] = {}
    for device_id in available:
        position = allocator.position_of(device_id)
        if position is not None:
            id_of.setdefault(position, device_id)
    candidates = allocator.candidates(request)
    chosen = tuple(sorted(p for i in answer.devices if (p := allocator.position_of(i)) is not None))
    winner = next((c for c in candidates if c.positions == chosen), None)
    alternatives: list[dict[str, Any]] = []
    if winner is not None:
        for candidate in candidates:
            if candidate is winner or len(alternatives) >= args.alternatives:
                continue
            alternatives.append(
                {
                    "devices": [id_of[p] for p in candidate.positions],
                    "linkScore": candidate.link_score,
                    "numaNodes": list(allocator.topology.numa_nodes(candidate.positions)),
                    "lostBecause": why_lost(winner, candidate),
                }
            )
    failures = [
        {"device": id_of.get(p, str(allocator.topology.gpus[p].index)), "reason": reason}
        for p, reason in sorted({**allocator.selector_failures, **allocator.unusable}.items())
        if p in id_of
    ]
    shared = any(share_kind(i) != "gpu" for i in available)
    per_gpu = _shares_per_gpu(allocator, available, answer.devices) if shared else []
    if args.format == "json":
        doc = _answer_doc(answer)
        doc["alternatives"] = alternatives
        doc["selectorFailures"] = failures
        if shared:
            doc["sharesPerGpu"] = per_gpu
        print(json.dumps(doc, indent=2))
        return 0
    node = allocator.node.name or args.node
    print(f"node {node}, policy {allocator.policy.name}")
    print(
        f"chosen: {{{', '.join(answer.devices)}}}  link score {answer.link_score}  "
        f"NUMA nodes {list(answer.numa_nodes)}"
    )
    if answer.fallback_reason:
        print(f"fallback: {answer.fallback_reason}")
    if per_gpu:
        print("shares per GPU:")
        for row in per_gpu:
            print(
                f"  {row['gpu']}: {row['free']} free, {row['chosen']} chosen, "
                f"{row['free'] - row['chosen']} left"
            )
    if alternatives:
        print("next best:")
        for alt in alternatives:
            print(
                f"  {{{', '.join(alt['devices'])}}}  link score {alt['linkScore']}  "
                f"NUMA nodes {alt['numaNodes']}  lost: {alt['lostBecause']}"
            )
    if failures:
        print("devices that failed the selector (chosen last):")
        for failure in failures:
            print(f"  {failure['device']}: {failure['reason']}")
    else:
        print("selector: every available device passes")
    return 0


MAX_REPORTED_LINES = 20  # bad request lines named one by one; the last line counts them all


def _replay(args: argparse.Namespace) -> int:
    """Answer each request line; a bad line is one stderr line (file:line: what) and the rest
    are answered; exit 2 at the end when there was one. A file with no request at all is one
    line (the wrong file, most likely)."""
    from cdigen.errors import AllocationError
    from cdigen.fileio import read_text

    allocator = allocator_from_args(args)
    text = read_text(args.requests, what="requests file")
    out = sys.stdout
    bad = total = 0
    held: list[str] = []  # bad lines before the first good one: maybe no line is a request

    def report(message: str) -> None:
        out.flush()  # answers and errors in the order of the lines on a terminal
        print(f"cdigen: error: {message}", file=sys.stderr)

    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        total += 1
        where = f"{args.requests}:{number}"
        try:
            doc = _parse_request_line(line, where)
            request = _request(allocator, doc["available"], doc["mustInclude"], doc["size"], where)
            try:
                answer = allocator.prefer(request)
            except AllocationError as exc:
                raise InputError(exc.message, where=where, hint=exc.hint) from None
        except InputError as exc:
            bad += 1
            if bad <= MAX_REPORTED_LINES:
                (held.append if bad == total else report)(str(exc))
            continue
        for message in held:
            report(message)
        held = []
        out.write(json.dumps(_answer_doc(answer)) + "\n")
    if bad and bad == total and bad > 1:
        report(
            f"{args.requests}: none of its {bad} lines is a request ({held[0]}); expected one "
            "JSON object a line: {available, mustInclude, size}"
        )
    elif held:
        report(held[0])
    elif bad > 1:
        report(
            f"{args.requests}: {bad} of {total} request lines could not be answered "
            f"({'listed above' if bad <= MAX_REPORTED_LINES else 'the first 20 listed above'}); "
            "the others were"
        )
    return EXIT_BAD_INPUT if bad else 0


def _parse_request_line(line: str, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON at column {exc.colno}: {exc.msg}", where=where) from None
    except RecursionError:
        raise InputError(
            "JSON nested too deeply",
            where=where,
            hint="a request is {available, mustInclude, size}",
        ) from None
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise InputError(
            f"invalid JSON: {str(exc).split(';')[0]}", where=where, hint="use short integers"
        ) from None
    if not isinstance(doc, dict):
        raise InputError("expected an object {available, mustInclude, size}", where=where)
    unknown = set(doc) - {"available", "mustInclude", "size"}
    if unknown:
        raise InputError(
            f"unknown keys {sorted(unknown)}", where=where, hint="use available, mustInclude, size"
        )
    available, must, size = doc.get("available"), doc.get("mustInclude", []), doc.get("size")
    for name, value in (("available", available), ("mustInclude", must)):
        if not isinstance(value, list) or not all(
            isinstance(v, (str, int)) and not isinstance(v, bool) for v in value
        ):
            raise InputError(f"{name} must be a list of IDs (strings or indexes)", where=where)
    if not isinstance(size, int) or isinstance(size, bool):
        raise InputError("size must be an integer", where=where)
    doc = {
        "available": tuple(str(v) for v in available),  # type: ignore[union-attr]
        "mustInclude": tuple(str(v) for v in must),
        "size": size,
    }
    _unique(doc["available"], f"{where}: available")
    _unique(doc["mustInclude"], f"{where}: mustInclude")
    return doc


def _simulate(args: argparse.Namespace) -> int:
    from policies.simulate_cli import run_simulate

    return run_simulate(args)
