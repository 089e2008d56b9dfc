"""How often an agent rescans the host.

sysfs gives no notice when a link, VF or driver changes, so the agents poll. A host at rest is
scanned less and less often (the wait doubles up to ten times the agent's poll interval, at most
QUIET_LONGEST), and as soon as a scan sees something new, quickly again: a quiet DGX costs each
agent about a tenth of the CPU that a scan every half second did (bench_node_footprint), and a
change is seen within QUIET_LONGEST at worst.
"""

from __future__ import annotations

QUIET_LONGEST = 5.0  # seconds between scans of a host at rest
QUIET_FACTOR = 10  # ... or this many poll intervals, if fewer


class Pacer:
    def __init__(self, base: float) -> None:
        self.base = base
        self.longest = max(base, min(QUIET_LONGEST, QUIET_FACTOR * base))
        self.delay = base
        self._last: object = None

    def after(self, seen: object) -> float:
        """Seconds to wait before the next scan, given what this one saw."""
        self.delay = self.base if seen != self._last else min(self.longest, self.delay * 2)
        self._last = seen
        return self.delay
