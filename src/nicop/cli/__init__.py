"""The `nicop` command: every agent, status and diagnosis.

One module per area registers its commands on the shared app; each command imports what it
needs when it runs, so an agent's probe or `--help` starts fast. Other distributions add
commands through the entry point group `nicop.cli` (nicop-sim: the local cluster, the demo and
the simulated nodes).
"""

from __future__ import annotations

from importlib.metadata import entry_points

from nicop.cli import (  # noqa: F401
    agents,
    bundle,
    discover,
    driver,
    inspect,
    operator,
    plan,
    upgrade,
)
from nicop.cli.common import app

for _extension in entry_points(group="nicop.cli"):
    _extension.load()


def main() -> None:
    app()


__all__ = ["app", "main"]
