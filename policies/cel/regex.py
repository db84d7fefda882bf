"""Regular expressions as CEL has them: RE2 (google-re2, which cel-python itself uses), so that
a pattern Go's regexp refuses (a lookahead, an unbalanced bracket) is refused here too."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import re2  # type: ignore[import-untyped]  # cel-python depends on google-re2

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # RE2 would write each refused pattern to stderr


@lru_cache(maxsize=256)
def compiled(pattern: str) -> Any:
    """The compiled RE2 pattern (re2.error when RE2 cannot compile it)."""
    return re2.compile(pattern, _OPTIONS)


def regex_problem(pattern: str) -> str | None:
    """Why RE2 cannot compile ``pattern``, or None."""
    try:
        compiled(pattern)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else b""
        text = detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
        return text or "invalid pattern"
    return None
