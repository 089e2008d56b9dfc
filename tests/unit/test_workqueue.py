"""The work queue collapses repeated events and backs off failing keys."""

from __future__ import annotations

import asyncio

from nicop.kube.workqueue import WorkQueue


def test_a_key_added_many_times_is_processed_once() -> None:
    async def scenario() -> list[str]:
        q = WorkQueue("t1")
        for _ in range(5):
            q.add("a")
        q.add("b")
        got = [await q.get(), await q.get()]
        assert len(q) == 0
        return got

    assert asyncio.run(scenario()) == ["a", "b"]


def test_a_key_added_while_processing_comes_back_after_done() -> None:
    async def scenario() -> None:
        q = WorkQueue("t2")
        q.add("a")
        key = await q.get()
        q.add("a")  # an event arrives while "a" is reconciled
        assert len(q) == 0, "never handed to a second worker at the same time"
        q.done(key)
        assert await asyncio.wait_for(q.get(), 1) == "a"

    asyncio.run(scenario())


def test_failures_back_off_exponentially_and_forget_resets() -> None:
    async def scenario() -> None:
        q = WorkQueue("t3", base_delay=0.01, max_delay=0.05)
        delays = [q.add_rate_limited("a") for _ in range(5)]
        assert delays == [0.01, 0.02, 0.04, 0.05, 0.05]
        q.forget("a")
        assert q.add_rate_limited("a") == 0.01
        assert await asyncio.wait_for(q.get(), 1) == "a"

    asyncio.run(scenario())


def test_add_after_keeps_the_earliest_time() -> None:
    async def scenario() -> None:
        q = WorkQueue("t4")
        q.add_after("a", 0.05)
        q.add_after("a", 10)
        assert await asyncio.wait_for(q.get(), 1) == "a"
        q.shutdown()

    asyncio.run(scenario())


def test_a_burst_waits_longer_for_a_key_whose_reconcile_is_slow() -> None:
    """A reconcile whose cost grows with the cluster (every node, every reconcile) runs at
    most once per twice its own duration on bursts, so it does not also run more often."""
    async def scenario() -> None:
        q = WorkQueue("t5")
        loop = asyncio.get_running_loop()
        for key, took in (("slow", 1.0), ("fast", 0.01)):
            q.add(key)
            assert await q.get() == key
            q.done(key, took)
        start = loop.time()
        q.add_batched("slow")
        q.add_batched("fast")
        got = []
        for _ in range(2):
            got.append((await asyncio.wait_for(q.get(), 10), loop.time() - start))
        assert [key for key, _ in got] == ["fast", "slow"]
        assert got[0][1] >= 0.5 and got[1][1] >= 2.0
        q.shutdown()

    asyncio.run(scenario())
