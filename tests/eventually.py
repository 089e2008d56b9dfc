"""The one way a test waits: poll a condition until it holds (never a fixed sleep: on a busy
2-core machine any fixed window is either too short or wasted)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


def eventually(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition",
               *, every: float = 0.2, alive: Callable[[], None] | None = None) -> Any:
    """Poll `predicate()` until it returns something truthy, and return that. `alive()`, asked
    each round, raises when what the test waits on has died (a process that exited), so a
    crash fails the test at once with its reason rather than at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if alive is not None:
            alive()
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last value: "
                                 f"{last!r}")
        time.sleep(every)


async def until(check: Callable[[], Any], timeout: float = 60.0, what: str = "condition", *,
                every: float = 0.1, blocking: bool = False) -> Any:
    """eventually() inside a test's event loop, which goes on between polls. `check` may be a
    coroutine function; a `blocking` one (a synchronous API call) runs on a worker thread."""
    deadline = time.monotonic() + timeout
    while True:
        last = await asyncio.to_thread(check) if blocking else check()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last value: "
                                 f"{last!r}")
        await asyncio.sleep(every)
