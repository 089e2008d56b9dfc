"""Controllers and the manager that runs them: informers first, then reconcile workers.

A controller is a work queue plus a `reconcile(key)` coroutine. Informer handlers map events to
keys; the reconcile reads the informer caches and writes with server-side apply. Errors requeue
the key with exponential backoff; a Result can ask for a later look (e.g. while pods start).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram

from nicop.kube.client import ApiClient
from nicop.kube.informer import Informer, Transform, without_managed_fields
from nicop.kube.leader import LeaderElector
from nicop.kube.resources import Resource
from nicop.kube.serve import serve
from nicop.kube.workqueue import WorkQueue

log = logging.getLogger(__name__)

RECONCILES = Counter("nicop_reconcile_total", "Reconciles by controller and result",
                     ["controller", "result"])
RECONCILE_SECONDS = Histogram("nicop_reconcile_seconds", "Reconcile duration", ["controller"])
# A reconcile slower than this is logged: a controller that seems stuck says where it sits.
SLOW_RECONCILE = 10.0
LEADING = Gauge("nicop_leader", "1 while this process leads and reconciles (caches synced)")


@dataclass
class Result:
    requeue_after: float | None = None


Reconcile = Callable[[str], Awaitable[Result | None]]


class Controller:
    def __init__(self, name: str, reconcile: Reconcile, workers: int = 1) -> None:
        self.name = name
        self.reconcile = reconcile
        self.workers = workers
        self.queue = WorkQueue(name)

    async def run(self) -> None:
        await asyncio.gather(*(self._worker() for _ in range(self.workers)))

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            start = time.perf_counter()
            try:
                result = await self.reconcile(key)
            except Exception:
                delay = self.queue.add_rate_limited(key)
                RECONCILES.labels(self.name, "error").inc()
                log.exception("reconcile failed; retrying in %.2fs", delay,
                              extra={"controller": self.name, "key": key})
            else:
                self.queue.forget(key)
                RECONCILES.labels(self.name, "success").inc()
                if result and result.requeue_after is not None:
                    self.queue.add_after(key, result.requeue_after)
            finally:
                took = time.perf_counter() - start
                RECONCILE_SECONDS.labels(self.name).observe(took)
                if took >= SLOW_RECONCILE:
                    log.warning("reconcile took %.1fs", took,
                                extra={"controller": self.name, "key": key})
                self.queue.done(key, took)


class Manager:
    """Owns the client, the shared informers and the controllers of one process."""

    def __init__(
        self,
        client: ApiClient,
        *,
        elector: LeaderElector | None = None,
        health_address: tuple[str, int] | None = None,
        transforms: dict[Resource, Transform] | None = None,
    ) -> None:
        """`transforms` trim the cached objects of a kind to what the controllers read."""
        self.client = client
        self.transforms = transforms or {}
        self.elector = elector
        self.health_address = health_address
        self.informers: dict[tuple[Resource, str | None, str | None, str | None, bool],
                             Informer] = {}
        self.controllers: list[Controller] = []
        self.serving = False  # standing by for the lease, or leading with caches synced
        self.server: asyncio.Server | None = None
        # Moved whenever a node's labels or taints change: one for every controller of the
        # process, as a label one controller writes into the shared node cache can move what
        # another's objects select (see placement_changed).
        self.placement_epoch = 0

    def placement_changed(self) -> None:
        """Something that decides where DaemonSets run changed: results kept per epoch are
        stale."""
        self.placement_epoch += 1

    def informer(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        metadata_only: bool = False,
        optional: bool = False,
    ) -> Informer:
        """The shared informer for these parameters (created on first ask); `optional`: a
        built-in kind some clusters do not serve (see Informer)."""
        key = (res, namespace, label_selector, field_selector, metadata_only)
        if key not in self.informers:
            self.informers[key] = Informer(
                self.client, res, namespace, label_selector=label_selector,
                field_selector=field_selector, metadata_only=metadata_only,
                transform=self.transforms.get(res, without_managed_fields), optional=optional,
            )
        return self.informers[key]

    @property
    def ready(self) -> bool:
        """/readyz: serving, and the API server answering (the lease attempts of a standby; for
        the leader, every informer's watch)."""
        if not self.serving:
            return False
        if self.elector is not None and not self.elector.is_leader:
            return self.elector.reachable
        return all(i.connected for i in self.informers.values())

    def add(self, controller: Controller) -> Controller:
        self.controllers.append(controller)
        return controller

    async def run(self) -> None:
        """Serve health, wait for leadership, sync caches, then reconcile until cancelled.

        A standby waiting for the lease is ready (it is healthy and can take over), so a
        Deployment of several replicas rolls; `nicop_leader` tells which one works.
        """
        if self.health_address:
            self.server = await serve(*self.health_address, ready=lambda: self.ready)
        tasks: list[asyncio.Task[None]] = []
        try:
            if self.elector:
                self.serving = True
                await self.elector.acquire()
                self.serving = False
                tasks.append(asyncio.create_task(self.elector.keep()))
            tasks += [asyncio.create_task(i.run()) for i in self.informers.values()]
            await asyncio.gather(*(i.synced.wait() for i in self.informers.values()))
            self.serving = True
            LEADING.set(1)
            log.info("caches synced; starting %d controllers", len(self.controllers))
            tasks += [asyncio.create_task(c.run()) for c in self.controllers]
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # re-raise (e.g. LostLeadership)
        finally:
            self.serving = False
            LEADING.set(0)
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            for c in self.controllers:
                c.queue.shutdown()
            if self.elector:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.elector.release())
            if self.server:
                self.server.close()
