"""A de-duplicating work queue with per-key exponential backoff.

A key is in the queue at most once; a key added while it is being processed is processed again
afterwards (never by two workers at once). Many events for one object collapse into one
reconcile of its current state: the level-triggered contract.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from prometheus_client import Gauge

from nicop.backoff import doubling

QUEUE_DEPTH = Gauge("nicop_workqueue_depth", "Keys waiting in a work queue", ["queue"])
# How long events of the many (nodes, pods) are gathered before their one reconcile: at
# least BATCH_DELAY, and BATCH_SPACING times as long as the key's last reconcile took, so
# that a reconcile whose cost grows with the cluster does not also run more often there
# (bench_policy_scale, 1000 nodes: spacing 2 gave 169 policy reconciles and 10 s of CPU to
# ready, spacing 4 gave 106 and 7.5 s, the status a second later).
BATCH_DELAY = 0.5
BATCH_SPACING = 4.0


class WorkQueue:
    def __init__(self, name: str, base_delay: float = 0.05, max_delay: float = 60.0) -> None:
        self.name = name
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._queue: OrderedDict[str, None] = OrderedDict()
        self._processing: set[str] = set()
        self._dirty: set[str] = set()
        self._failures: dict[str, int] = {}
        self._took: dict[str, float] = {}  # seconds the key's last reconcile took, if long
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._nonempty = asyncio.Event()
        self._depth = QUEUE_DEPTH.labels(name)

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, key: str) -> None:
        """Queue `key` now (no-op when already queued; re-queued after if being processed)."""
        timer = self._timers.pop(key, None)
        if timer:
            timer.cancel()
        if key in self._processing:
            self._dirty.add(key)
            return
        if key not in self._queue:
            self._queue[key] = None
            self._depth.set(len(self._queue))
            self._nonempty.set()

    def add_after(self, key: str, delay: float) -> None:
        """Queue `key` after `delay` seconds, unless something queues it sooner."""
        if delay <= 0:
            self.add(key)
            return
        old = self._timers.get(key)
        loop = asyncio.get_running_loop()
        if old and old.when() <= loop.time() + delay:
            return
        if old:
            old.cancel()
        self._timers[key] = loop.call_later(delay, self._fire, key)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def add_batched(self, key: str) -> None:
        """Queue `key` after a short while: a burst of events (a thousand nodes relabelled,
        pods turning ready one by one) costs one reconcile, not one per event."""
        self.add_after(key, max(BATCH_DELAY, BATCH_SPACING * self._took.get(key, 0.0)))

    def add_rate_limited(self, key: str) -> float:
        """Queue after a delay that doubles with each consecutive failure of `key`."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = doubling(self.base_delay, failures, self.max_delay)
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        """The key succeeded: its next failure starts again from the base delay."""
        self._failures.pop(key, None)

    async def get(self) -> str:
        while not self._queue:
            self._nonempty.clear()
            await self._nonempty.wait()
        key, _ = self._queue.popitem(last=False)
        self._depth.set(len(self._queue))
        self._processing.add(key)
        return key

    def done(self, key: str, took: float = 0.0) -> None:
        """`key` was processed, in `took` seconds."""
        if BATCH_SPACING * took > BATCH_DELAY:
            self._took[key] = took
        else:
            self._took.pop(key, None)
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def shutdown(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
