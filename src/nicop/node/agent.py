"""What every node agent process shares: logging (text, or one JSON object per line), and one
asyncio loop that runs until SIGTERM or SIGINT and then stops cleanly (sockets removed)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nicop.node.deviceplugin.server import RegistrationRejected

# Attributes every LogRecord has; anything else was passed with `extra=` and is logged too.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def setup_logging(log_format: str = "text", level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per request otherwise


def run_process(main: Callable[[asyncio.Event], Awaitable[None]], log_format: str,
                log_level: str = "info") -> str | None:
    """Run `main(stop)` in a fresh event loop until it returns; SIGTERM and SIGINT set `stop`.

    Returns why the agent had to give up (the kubelet refused it), or None after a clean stop.
    """
    setup_logging(log_format, log_level)

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    try:
        asyncio.run(runner())
    except RegistrationRejected as e:
        return str(e)
    return None
