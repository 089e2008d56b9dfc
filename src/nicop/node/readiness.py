"""An agent's readiness: what its /readyz answers, and a file in its own container.

The agent knows when it is ready (its resources registered with the kubelet, its socket
serving, its first sync done). Its DaemonSet's readiness probe asks /readyz on the agent's
metrics port (nicop.node.metrics): an HTTP GET from the kubelet costs the node nothing, where an
exec probe started a process every period. The file is for `nicop probe-ready`, the exec probe
of a container without that port: the DaemonSet names it in `$NICOP_READY_FILE` (the agent and
its probe share the container's environment); without it there is nothing to write. The file
exists while the agent is ready; why it is not is in its log.
"""

from __future__ import annotations

import contextlib
import logging
import os

from nicop.api.agents import READY_FILE_ENV
from nicop.node.host import Mounts

log = logging.getLogger(__name__)


def _real(path: str | None) -> str | None:
    path = path or os.environ.get(READY_FILE_ENV)
    return Mounts.from_env().real(path) if path else None


_answer = False  # this process's agent's readiness (one Readiness an agent)


def answer() -> bool:
    """Whether this process's agent said it is ready: what its /readyz serves."""
    return _answer


class Readiness:
    def __init__(self, path: str | None = None) -> None:
        self.path = _real(path)
        self._ready: bool | None = None

    def set(self, ready: bool, why: str = "") -> None:
        """Create or remove the file; logged when the answer changes."""
        global _answer
        if ready == self._ready:
            return
        self._ready = ready
        _answer = ready
        if ready:
            log.info("ready")
        elif why:
            log.info("not ready: %s", why)
        if self.path is None:
            return
        if ready:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path, "w"):
                pass
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def clear(self) -> None:
        self.set(False)


def probe(path: str | None = None) -> tuple[bool, str]:
    """(ready, why) for `nicop probe-ready`."""
    real = _real(path)
    if real is None:
        return False, f"${READY_FILE_ENV} is not set: this container's agent reports no readiness"
    if os.path.exists(real):
        return True, "ready"
    return False, "the agent is not ready (see its log)"
