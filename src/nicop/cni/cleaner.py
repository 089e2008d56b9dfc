"""Frees addresses whose pod is gone: the same pod name, namespace and UID no longer exist.

A pod deleted while the node was down, or a DEL the runtime never sent, would otherwise hold
its address forever. An allocation is released only after its pod was missing on `checks`
consecutive rounds, so a pod that is being created (whose ADD ran before the API shows it to
this node's cache) keeps its address. A pod of the same name with another UID (a StatefulSet
pod recreated elsewhere) does not keep the old pod's address alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from prometheus_client import Counter

from nicop.cni.ipam import Ipam
from nicop.cni.store import Reservation
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.resources import POD

log = logging.getLogger(__name__)

RELEASED = Counter("nicop_ipam_stale_released_total", "Allocations freed by the cleaner",
                   ["pool"])


class Cleaner:
    def __init__(self, client: ApiClient, ipam: Ipam, interval: float = 60.0,
                 checks: int = 3) -> None:
        self.client = client
        self.ipam = ipam
        self.interval = interval
        self.checks = max(1, checks)
        self.misses: dict[tuple[str, str, str], int] = {}

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.check()
            except (ApiError, OSError) as e:
                log.warning("stale allocation check failed: %s; retrying in %.0fs", e,
                            self.interval)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)

    async def check(self) -> int:
        """One round: count each allocation whose pod is missing; free those missing long
        enough. Returns how many were freed."""
        seen: set[tuple[str, str, str]] = set()
        for pool, entries in self.ipam.store.snapshot().items():
            for res in entries:
                key = (pool, res.container_id, res.interface_name)
                seen.add(key)
                if not res.pod_name or not res.pod_namespace:
                    continue
                pod = await self.client.get_or_none(POD, res.pod_name, res.pod_namespace)
                uid = (pod or {}).get("metadata", {}).get("uid", "")
                if pod is not None and (not res.pod_uuid or uid == res.pod_uuid):
                    self.misses.pop(key, None)
                else:
                    self.misses[key] = self.misses.get(key, 0) + 1
        freed = 0
        for key, count in list(self.misses.items()):
            if key not in seen:
                del self.misses[key]
            elif count >= self.checks:
                pool, container_id, ifname = key
                gone = await asyncio.to_thread(self._release, pool, container_id, ifname)
                del self.misses[key]
                if gone is not None:
                    freed += 1
                    RELEASED.labels(pool).inc()
                    log.info("freed %s in pool %s: pod %s/%s (uid %s) is gone", gone.ip_address,
                             pool, gone.pod_namespace, gone.pod_name, gone.pod_uuid or "-")
        known = self.ipam.pools.known()
        for pool, entries in self.ipam.store.snapshot().items():
            if not entries and pool not in known:
                await asyncio.to_thread(self.ipam.store.remove_pool, pool)
        if freed:
            await asyncio.to_thread(self.ipam.update_metrics)
        return freed

    def _release(self, pool: str, container_id: str, ifname: str) -> Reservation | None:
        with self.ipam.lock:
            return self.ipam.store.release(pool, container_id, ifname)
