"""The CLI's logging, with :mod:`logging` imported only once something logs.

``import logging`` costs about 8 ms, a twentieth of a whole ``cdigen generate`` at node boot,
which logs nothing unless something goes wrong. :func:`configure` records the level the user
asked for; the handler is installed at once if :mod:`logging` is already imported, and otherwise
by the first :func:`logger` call. Core modules log through :func:`logger`; the wings, which
import :mod:`logging` anyway, are configured at once (``now=True``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging

FORMAT = "cdigen: %(levelname)s: %(message)s"
# `--log-level`'s choices and default, for every command (the serve commands' logs included).
LEVELS = ("debug", "info", "warning", "error")
DEFAULT_LEVEL = "info"
_pending: str | None = None


def configure(level: str, *, now: bool = False) -> None:
    """Log at ``level`` (debug, info, warning, error) to stderr as ``cdigen: LEVEL: message``."""
    global _pending
    _pending = level
    if now or "logging" in sys.modules:
        _install()


def logger(name: str = "cdigen") -> logging.Logger:
    """The logger ``name``, installing the handler :func:`configure` left pending first."""
    import logging

    if _pending is not None:
        _install()
    return logging.getLogger(name)


def _install() -> None:
    global _pending
    import logging

    level, _pending = _pending or DEFAULT_LEVEL, None
    logging.basicConfig(level=getattr(logging, level.upper()), format=FORMAT, stream=sys.stderr)
