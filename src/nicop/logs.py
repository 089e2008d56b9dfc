"""Logging for every nicop process: text for people, one JSON object per line for machines.

Reconcile lines carry the object's kind, namespace and name (passed as `extra`), so a log
search for one object finds its whole history.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

# Attributes every LogRecord has; anything else was passed with `extra=`.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
# `extra` keys about the object a line is about; "object" is printed as "name" (LogRecord owns
# `name`).
CONTEXT_KEYS = ("kind", "namespace", "object", "controller", "key", "identity", "node")


def about(kind: str, name: str, namespace: str | None = None) -> dict[str, str]:
    """The `extra` of a log line about one object."""
    return {"kind": kind, "object": name, **({"namespace": namespace} if namespace else {})}


def _context(record: logging.LogRecord) -> dict[str, str]:
    return {("name" if k == "object" else k): getattr(record, k)
            for k in CONTEXT_KEYS if hasattr(record, k)}


class JsonFormatter(logging.Formatter):
    """One object per line: ts (UTC, milliseconds), level, logger, msg, the object's context,
    any other `extra`, and the traceback as `error`."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update(_context(record))
        line.update({k: v for k, v in vars(record).items()
                     if k not in _STANDARD and k not in CONTEXT_KEYS})
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        context = " ".join(f"{k}={getattr(record, k)}" for k in CONTEXT_KEYS if hasattr(record, k))
        return f"{text} {context}" if context else text


def setup(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
