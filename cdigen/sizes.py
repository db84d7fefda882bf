"""Amounts of memory given on the command line: one parser for every flag that takes bytes
(``topo import --memory``, ``dra serve --memory-step``, ``--default-share``, ...), so that a
spelling one flag takes is taken by all.

Two spellings are accepted:

* a Kubernetes quantity, as the API server parses it (``24Gi``, ``1536Mi``, ``24G``, ``1e9``,
  plain bytes): what a ResourceClaim's ``capacity.requests.memory`` says;
* a size with a ``B``, as nvidia-smi and people write it (``24GiB``, ``24GB``, ``512B``; the
  letters in any case): binary with ``i``, decimal without, as in Kubernetes.
"""

from __future__ import annotations

import re
from fractions import Fraction

from cdigen.errors import InputError, shortened

_WITH_B = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*([kmgtpe]?)(i?)b$", re.IGNORECASE)
_POWERS = "kmgtpe"
HINT = "write it as Kubernetes does (1Gi, 1536Mi, 24G), with a B (1GiB, 24GB), or in bytes"


def _value(text: str) -> Fraction | None:
    from policies.cel.quantity import parse_quantity

    match = _WITH_B.match(text.strip())
    if match:
        number, unit, binary = match.groups()
        power = _POWERS.index(unit.lower()) + 1 if unit else 0
        return Fraction(number) * (1024 if binary else 1000) ** power
    if text.strip() != text:
        return None
    try:
        return parse_quantity(text)
    except ValueError:
        return None


def parse_bytes(text: str, where: str) -> int:
    """``text`` as a positive whole number of bytes; a one-line InputError naming ``where``
    (the flag) otherwise."""
    value = _value(text) if len(text) <= 100 else None  # no 10^6-digit arithmetic
    if value is None or value < 1 or value.denominator != 1:
        raise InputError(
            f"{shortened(text, 40)!r} is not a positive whole quantity of bytes",
            where=where,
            hint=HINT,
        )
    return int(value)
