"""``cdigen policy explain``: one request answered as the device plugin would, the next best
sets and why each lost, and the devices the policy's selector refused."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from cdigen.errors import InputError
from cdigen.policies.cli_args import (
    allocator_from_args,
    answer_doc,
    at_least,
    check_share_flags,
    checked_request,
    unique_ids,
)

if TYPE_CHECKING:
    from cdigen.policies.allocator import AllocationRequest, Allocator


def _ids(text: str, flag: str) -> tuple[str, ...]:
    parts = [part.strip() for part in text.split(",")]
    if text.strip() and not all(parts):  # "0,,2" or "0,": a device left out by mistake?
        raise InputError(
            f"{text!r} has an empty entry (position {parts.index('') + 1})",
            where=flag,
            hint="list device IDs separated by single commas, e.g. 0,1,2",
        )
    ids = tuple(p for p in parts if p)
    unique_ids(ids, flag)
    return ids


def _expand_shares(
    allocator: Allocator, ids: tuple[str, ...], args: argparse.Namespace
) -> tuple[str, ...]:
    """With --replicas or --slice-mib: each GPU (``0``) becomes all its shares, ``0=5`` its
    last 5 (as if the first ones were taken); share IDs (``0::slice-3``) stay as they are."""
    from cdigen.shares import no_slices_reason, replica_ids, share_kind, slice_count, slice_ids

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
    from cdigen.shares import gpu_part

    rows: dict[str, dict[str, Any]] = {}
    for device_id in available:
        row = rows.setdefault(gpu_part(device_id), {"gpu": gpu_part(device_id), "free": 0})
        row["free"] += 1
        row.setdefault("chosen", 0)
    for device_id in chosen:
        rows[gpu_part(device_id)]["chosen"] += 1
    return list(rows.values())


def run_explain(args: argparse.Namespace) -> int:
    at_least("--size", args.size, 1)
    at_least("--alternatives", args.alternatives, 0)
    allocator = allocator_from_args(args)
    available = _expand_shares(allocator, _ids(args.available, "--available"), args)
    must = _ids(args.must, "--must")
    request = checked_request(allocator, available, must, args.size, "--available")
    doc = _explain_doc(allocator, request, available, args.alternatives)
    if args.format == "json":
        print(json.dumps(doc, indent=2))
    else:
        _print_text(f"node {allocator.node.name or args.node}, policy {allocator.policy.name}", doc)
    return 0


def _explain_doc(
    allocator: Allocator, request: AllocationRequest, available: tuple[str, ...], count: int
) -> dict[str, Any]:
    """The answer (as replay prints it), the next ``count`` best sets with why each lost, the
    devices the selector refused and, over shares, the shares per GPU."""
    from cdigen.policies.allocator import why_lost
    from cdigen.shares import share_kind

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
            if candidate is winner or len(alternatives) >= count:
                continue
            alternatives.append(
                {
                    "devices": [id_of[p] for p in candidate.positions],
                    "linkScore": candidate.link_score,
                    "numaNodes": list(allocator.topology.numa_nodes(candidate.positions)),
                    "lostBecause": why_lost(winner, candidate),
                }
            )
    doc = answer_doc(answer)
    doc["alternatives"] = alternatives
    doc["selectorFailures"] = [
        {"device": id_of.get(p, str(allocator.topology.gpus[p].index)), "reason": reason}
        for p, reason in sorted({**allocator.selector_failures, **allocator.unusable}.items())
        if p in id_of
    ]
    if any(share_kind(i) != "gpu" for i in available):
        doc["sharesPerGpu"] = _shares_per_gpu(allocator, available, answer.devices)
    return doc


def _device_set(doc: dict[str, Any]) -> str:
    """A set of devices as the text shows the chosen one and each next-best one:
    ``{a, b}  link score S  NUMA nodes N``."""
    return (
        f"{{{', '.join(doc['devices'])}}}  link score {doc['linkScore']}  "
        f"NUMA nodes {doc['numaNodes']}"
    )


def _print_text(title: str, doc: dict[str, Any]) -> None:
    """:func:`_explain_doc`'s document as text, under ``title``."""
    print(title)
    print(f"chosen: {_device_set(doc)}")
    if doc.get("fallbackReason"):
        print(f"fallback: {doc['fallbackReason']}")
    if doc.get("sharesPerGpu"):
        print("shares per GPU:")
        for row in doc["sharesPerGpu"]:
            print(
                f"  {row['gpu']}: {row['free']} free, {row['chosen']} chosen, "
                f"{row['free'] - row['chosen']} left"
            )
    if doc["alternatives"]:
        print("next best:")
        for alt in doc["alternatives"]:
            print(f"  {_device_set(alt)}  lost: {alt['lostBecause']}")
    if doc["selectorFailures"]:
        print("devices that failed the selector (chosen last):")
        for failure in doc["selectorFailures"]:
            print(f"  {failure['device']}: {failure['reason']}")
    else:
        print("selector: every available device passes")
