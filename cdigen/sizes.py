"""Amounts of memory: one parser for every flag that takes bytes (``topo import --memory``,
``dra serve --memory-step``, ``--default-share``, ...), so that a spelling one flag takes is
taken by all, and the canonical quantity text of a byte count.

Two spellings are accepted:

* a Kubernetes quantity, as the API server reads one (``24Gi``, ``1536Mi``, ``24G``, ``1e9``,
  plain bytes): what a ResourceClaim's ``capacity.requests.memory`` says. This is the part of
  Kubernetes' grammar a whole byte count can use (the core cannot import the CEL engine's full
  parser, :func:`cdigen.policies.cel.parse_quantity`; tests/unit/test_sizes.py holds the two to the
  same values);
* a size with a ``B``, as nvidia-smi and people write it (``24GiB``, ``24GB``, ``512B``; the
  letters in any case): binary with ``i``, decimal without, as in Kubernetes.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

from cdigen.errors import InputError, shortened

# Kubernetes: <number><suffix>, suffix a binary SI (Ki..Ei), a decimal SI (n u m k M G T P E)
# or a decimal exponent (e3, E-2)
_QUANTITY = re.compile(
    r"^\+?(\d+(?:\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d{1,3})?$"
)
_WITH_B = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgtpe]?)(i?)b$", re.IGNORECASE)
# the binary suffixes and their powers of 1024: the one table (the CEL engine parses with it too)
BINARY_SUFFIXES = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
DECIMAL_SUFFIXES = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_POWERS = "kmgtpe"
_MOST = 2**63 - 1  # Kubernetes caps a quantity there
HINT = "write it as Kubernetes does (1Gi, 1536Mi, 24G), with a B (1GiB, 24GB), or in bytes"
_TEXT_SUFFIXES = sorted(((s, 10 * p) for s, p in BINARY_SUFFIXES.items()), key=lambda s: -s[1])


def _value(text: str) -> Fraction | None:
    match = _WITH_B.match(text.strip())
    if match:
        number, unit, binary = match.groups()
        power = _POWERS.index(unit.lower()) + 1 if unit else 0
        return Fraction(number) * Fraction(1024 if binary else 1000) ** power
    match = _QUANTITY.match(text)
    if not match:
        return None
    number, suffix = Fraction(match.group(1)), match.group(2) or ""
    if suffix in BINARY_SUFFIXES:
        return number * Fraction(1024) ** BINARY_SUFFIXES[suffix]
    if suffix in DECIMAL_SUFFIXES:
        return number * Fraction(10) ** DECIMAL_SUFFIXES[suffix]
    return number * Fraction(10) ** int(suffix[1:])


def parse_bytes(text: str, where: str) -> int:
    """``text`` as a positive whole number of bytes; a one-line InputError naming ``where``
    (the flag) otherwise."""
    value = _value(text) if len(text) <= 100 else None  # no 10^6-digit arithmetic
    if value is None or value < 1 or value.denominator != 1 or value > _MOST:
        raise InputError(
            f"{shortened(text, 40)!r} is not a positive whole quantity of bytes",
            where=where,
            hint=HINT,
        )
    return int(value)


@functools.lru_cache(maxsize=4096, typed=True)
def quantity_text(count: int) -> str:
    """``85899345920`` -> ``"80Gi"``: the canonical Kubernetes quantity of a byte count (each
    made once: ``dra why`` says the same few amounts for every device of a cluster)."""
    for suffix, shift in _TEXT_SUFFIXES:
        if count >= 1 << shift and count % (1 << shift) == 0:
            return f"{count >> shift}{suffix}"
    return str(count)
