"""One rule for waiting after failures: the delay doubles with each consecutive failure, from
`base`, up to `cap`. Kept in one place so the operator's queue, its watches, the driver upgrade's
retries and the config daemon's attempts cannot drift apart."""

from __future__ import annotations

import math


def doubling(base: float, failures: int, cap: float = math.inf) -> float:
    """The delay after `failures` consecutive failures (0 → `base`, 1 → 2 * `base`, ...)."""
    if failures < 0:
        raise ValueError(f"failures must be 0 or more, not {failures}")
    return min(base * 2.0 ** min(failures, 64), cap)
