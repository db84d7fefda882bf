"""``cdigen policy replay``: recorded preferred-allocation requests (JSON lines) answered one
a line, bad lines reported and skipped."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cdigen.errors import EXIT_BAD_INPUT, InputError
from cdigen.policies.cli_args import allocator_from_args, answer_doc, checked_request, unique_ids

MAX_REPORTED_LINES = 20  # bad request lines named one by one; the last line counts them all


def run_replay(args: argparse.Namespace) -> int:
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
            request = checked_request(
                allocator, doc["available"], doc["mustInclude"], doc["size"], where
            )
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
        out.write(json.dumps(answer_doc(answer)) + "\n")
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
            f"the other {total - bad} were answered on stdout"
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
    except ValueError:  # json's only other ValueError: an integer past Python's digit limit
        raise InputError(
            f"invalid JSON: an integer of more than {sys.get_int_max_str_digits()} digits",
            where=where,
            hint="use short integers",
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
    unique_ids(doc["available"], f"{where}: available")
    unique_ids(doc["mustInclude"], f"{where}: mustInclude")
    return doc
