"""Kubernetes resource quantities (``"40Gi"``, ``"100m"``): parsed exactly, as Kubernetes does."""

from __future__ import annotations

import re
from fractions import Fraction

from cdigen.errors import shortened
from cdigen.sizes import BINARY_SUFFIXES, DECIMAL_SUFFIXES

_QUANTITY_RE = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([a-zA-Z]*|[eE][+-]?[0-9]+)$")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def parse_quantity(text: str) -> Fraction:
    """The value of a Kubernetes quantity string (``"40Gi"``, ``"1.5"``, ``"100m"``).

    Raises ValueError on anything Kubernetes' ``resource.ParseQuantity`` would reject, and on
    more than 64 digits.
    Bounded as Kubernetes bounds it: the exponent of ``1e<n>`` must fit an int32; a non-zero
    value is rounded up (away from zero) to a multiple of 1n; a magnitude above 2^63-1 is capped
    there (Kubernetes caps binary quantities so; it also keeps ``1e99999999`` from costing
    a 330-million-bit number here).
    """
    shown = shortened(text, 40)
    match = _QUANTITY_RE.match(text.strip()) if text.strip() == text else None
    if match is None:
        raise ValueError(f"invalid quantity {shown!r}")
    digits, suffix = match.group(1), match.group(2)
    if len(digits) > 64:
        raise ValueError(f"invalid quantity {shown!r}: more than 64 digits")
    number = Fraction(digits)
    if suffix in BINARY_SUFFIXES:
        return _bounded(number * Fraction(1024) ** BINARY_SUFFIXES[suffix])
    if suffix in DECIMAL_SUFFIXES:
        return _bounded(number * Fraction(10) ** DECIMAL_SUFFIXES[suffix])
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        exponent_text = suffix[1:].lstrip("+-").lstrip("0") or "0"
        if len(exponent_text) > 10 or int(exponent_text) > 2**31 - 1:
            raise ValueError(f"invalid quantity {shown!r}: the exponent does not fit an int32")
        exponent = -int(exponent_text) if suffix[1] == "-" else int(exponent_text)
        if number == 0:
            return Fraction(0)
        sign = 1 if number > 0 else -1
        if exponent > 100:  # |number| >= 10^-64: the value is far above the cap
            return sign * Fraction(INT64_MAX)
        if exponent < -100:  # |number| < 10^65: the value is far below 1n
            return sign * _NANO
        return _bounded(number * Fraction(10) ** exponent)
    raise ValueError(f"invalid quantity {shown!r}: unknown suffix {suffix!r}")


_NANO = Fraction(1, 10**9)


def _bounded(value: Fraction) -> Fraction:
    """Round a non-zero value up to a multiple of 1n (away from zero); cap it at 2^63-1."""
    if value == 0:
        return value
    sign = 1 if value > 0 else -1
    magnitude = abs(value)
    nanos = -((-magnitude.numerator * 10**9) // magnitude.denominator)  # ceil
    rounded = Fraction(nanos, 10**9)
    return sign * min(rounded, Fraction(INT64_MAX))


class Quantity:
    """A Kubernetes resource.Quantity: exact; ``==`` compares values; ``<`` is not defined."""

    __slots__ = ("text", "value")

    def __init__(self, value: Fraction, text: str | None = None) -> None:
        self.value = value
        self.text = text if text is not None else _format_fraction(value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Quantity):
            return self.value == other.value
        raise TypeError(f"no such overload: quantity == {type(other).__name__}")

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"


def _format_fraction(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else str(float(value))
