"""Semantic versions as the Kubernetes CEL ``semver()`` library reads them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering
from typing import Any

_SEMVER_RE = re.compile(
    r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z.-]+)?$"
)


@total_ordering
@dataclass(frozen=True)
class Semver:
    """A semantic version; comparisons follow semver precedence (build metadata ignored)."""

    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()

    def _key(self) -> tuple[Any, ...]:
        pre_key: tuple[Any, ...] = (
            (1,)
            if not self.pre
            else (0, *((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.pre))
        )
        return (self.major, self.minor, self.patch, pre_key)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            return NotImplemented
        return self._key() < other._key()

    def __str__(self) -> str:
        pre = f"-{'.'.join(self.pre)}" if self.pre else ""
        return f"{self.major}.{self.minor}.{self.patch}{pre}"


def parse_semver(text: str, normalize: bool = False) -> Semver:
    """Parse a strict semver; with ``normalize``, accept ``v1.2``, ``8.0`` and leading zeros."""
    candidate = text
    if normalize:
        candidate = candidate.strip().removeprefix("v")
        core, sep, rest = candidate.partition("-")
        if "+" in core:
            core, plus, build = core.partition("+")
            rest = rest or ""
            sep_build = plus + build
        else:
            sep_build = ""
        parts = core.split(".")
        if 1 <= len(parts) <= 3 and all(p.isdigit() for p in parts):
            parts = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
            candidate = ".".join(parts) + (sep + rest if sep else "") + sep_build
    match = _SEMVER_RE.match(candidate)
    if match is None:
        raise ValueError(f"invalid semver {text!r}")
    pre = tuple(match.group(4).split(".")) if match.group(4) else ()
    return Semver(int(match.group(1)), int(match.group(2)), int(match.group(3)), pre)
