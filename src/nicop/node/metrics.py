"""Where a node agent serves Prometheus `/metrics` (and `/healthz`, `/readyz`).

Every agent container declares a port named `metrics` (`nicop.api.agents.METRICS_PORTS`) and
gets it as `--metrics-port`. The agent listens on its pod's IP (`$POD_IP`, from the downward
API's status.podIP), which for a hostNetwork pod is its node's address: exactly what a
PodMonitor scrapes. Binding that address rather than every address lets several nodes share one
machine: the node stand-ins give each simulated node a loopback address of its own as its pods'
IP (`nicop_sim.node.node_address`), so the same port on every node does not collide. Without
$POD_IP (an agent started by hand) it listens on every address.

Metrics are secondary to the agent's work: a port that cannot be bound is logged as an error and
the agent runs on without them.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from nicop.api.agents import POD_IP_ENV
from nicop.kube.serve import serve
from nicop.node import readiness

log = logging.getLogger(__name__)


def bind_address() -> str:
    """The pod's IP when the DaemonSet gives it, else every address."""
    return os.environ.get(POD_IP_ENV) or "0.0.0.0"


async def serve_metrics(port: int, ready: Callable[[], bool] = readiness.answer
                        ) -> asyncio.Server | None:
    """Serve /metrics on `port` of the pod's IP, and /readyz with the agent's readiness (its
    DaemonSet's readiness probe); None when `port` is 0 or cannot be bound."""
    if not port:
        return None
    host = bind_address()
    try:
        server = await serve(host, port, ready)
    except OSError as e:
        log.error("cannot serve /metrics and /readyz on %s:%d: %s; running without metrics, "
                  "and not ready to the DaemonSet's probe", host, port, e.strerror or e)
        return None
    log.info("serving /metrics on %s:%d", host, port)
    return server
