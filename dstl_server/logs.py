"""Structured logging: JSON lines on stderr, quiet (WARNING) by default.

python-json-logger writes the lines. Each holds ``ts`` (ISO 8601, UTC),
``level`` (lower case), ``logger`` and ``msg``, then the record's structured
fields: ids, keys and durations go there, not into the text::

    log.warning("persist failed", extra={"job_id": job, "log_id": log_id, "duration_s": s})

(``extra={"fields": {...}}`` works too: its keys are lifted to the top level.)
An exception's traceback is ``exc``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from pythonjsonlogger.json import JsonFormatter

#: the fields every line starts with, in this order
_HEAD = ("ts", "level", "logger", "msg")


class DstlJsonFormatter(JsonFormatter):
    """python-json-logger's formatter with dstl's field names (see the module doc)."""

    def __init__(self) -> None:
        super().__init__(
            ["levelname", "name", "message"],
            rename_fields={
                "levelname": "level",
                "name": "logger",
                "message": "msg",
                "exc_info": "exc",
            },
            timestamp="ts",
        )

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        fields = log_data.pop("fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                log_data.setdefault(str(key), value)
        log_data["level"] = str(log_data.get("level", "")).lower()
        head = {key: log_data.pop(key) for key in _HEAD if key in log_data}
        return {**head, **log_data}


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(DstlJsonFormatter())
    root = logging.getLogger("dstl_server")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
