"""The plugins' logs: text or one JSON object per line, on stderr."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from cdigen.logs import LEVELS

LOG_LEVELS = LEVELS  # cdigen --log-level's
LOG_FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per log line: time, level, logger, msg."""

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as JSON."""
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def setup_logging(level: str, fmt: str) -> None:
    """Send the plugin's logs to stderr at ``level`` as ``text`` or ``json`` lines."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s cdigen-plugin %(levelname)s: %(message)s")
        )
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler], force=True)
