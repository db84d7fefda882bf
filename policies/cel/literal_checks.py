"""cel-go's create-time checks of literals: int and uint literals in range (its parser), and
its validators of literal ``duration()``/``timestamp()`` arguments and ``matches`` patterns."""

from __future__ import annotations

from cdigen.policies.cel.cel_types import INT, INT64, CelType


def integer_in_range(literal: str, kind: CelType) -> bool:
    """Whether an int literal fits int64, a uint literal (``kind`` UINT) uint64."""
    text = literal.rstrip("uU")
    negative = text.startswith("-")
    digits = text.lstrip("-")
    value = int(digits, 16) if digits[:2].lower() == "0x" else int(digits)
    value = -value if negative else value
    low, high = INT64 if kind == INT else (0, 2**64 - 1)
    return low <= value <= high


def time_literal_converts(name: str, literal: str) -> bool:
    """ValidateDurationLiterals/ValidateTimestampLiterals: a literal argument of ``duration()``
    (``name``) or ``timestamp()`` must convert."""
    from celpy import celtypes

    convert = celtypes.DurationType if name == "duration" else celtypes.TimestampType
    try:
        convert(literal)
    except Exception:  # cel-python raises several kinds for a bad literal
        return False
    return True


def regex_compiles(literal: str) -> bool:
    """ValidateRegexLiterals: a literal ``matches`` pattern must compile (RE2)."""
    from cdigen.policies.cel.regex import regex_problem

    return regex_problem(literal) is None
