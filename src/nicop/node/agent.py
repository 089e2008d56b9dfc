"""What every node agent process shares: one asyncio loop that runs until SIGTERM or SIGINT and
then stops cleanly (sockets removed), with nicop's logging (text, or one JSON object per line)
and /metrics on the port its DaemonSet declares."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

from nicop import logs
from nicop.node.metrics import serve_metrics


class RegistrationRejected(Exception):
    """The kubelet refused the registration: the agent must stop (the kubelet will not retry).
    Defined here, not with the device plugin server, so that agents without gRPC load none."""


def run_process(main: Callable[[asyncio.Event], Awaitable[None]], log_format: str,
                log_level: str = "info",
                after_log_setup: Callable[[], None] | None = None,
                metrics_port: int = 0) -> str | None:
    """Run `main(stop)` in a fresh event loop until it returns; SIGTERM and SIGINT set `stop`.
    With `metrics_port`, /metrics is served there meanwhile (nicop.node.metrics).

    Returns why the agent had to give up (the kubelet refused it), or None after a clean stop.
    """
    logs.setup(log_level, log_format)
    if after_log_setup is not None:
        after_log_setup()

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        metrics = await serve_metrics(metrics_port)
        try:
            await main(stop)
        finally:
            if metrics is not None:
                metrics.close()

    try:
        asyncio.run(runner())
    except RegistrationRejected as e:
        return str(e)
    return None
