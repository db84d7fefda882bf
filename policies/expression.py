"""A policy's compiled CEL expression and the field it came from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CEL engine is imported where an expression is compiled
    from cdigen.policies.cel import CelProgram


@dataclass(frozen=True)
class Expression:
    """A compiled CEL expression and where it came from (``spec.selector``, ...)."""

    field: str
    program: CelProgram

    @property
    def text(self) -> str:
        """The CEL source."""
        return self.program.text
