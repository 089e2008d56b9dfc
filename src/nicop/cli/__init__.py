"""The `nicop` command: every agent, the local cluster, status and diagnosis.

One module per area registers its commands on the shared app; each command imports what it
needs when it runs, so an agent's probe or `--help` starts fast.
"""

from __future__ import annotations

from nicop.cli import agents, bundle, cluster, driver, inspect, operator, sim  # noqa: F401
from nicop.cli.common import app


def main() -> None:
    app()


__all__ = ["app", "main"]
