"""Lease-based leader election (coordination.k8s.io/v1), as client-go does it.

The leader renews the Lease every `retry_period`; a standby takes it over once the lease record
has not changed for `leaseDurationSeconds` of the standby's own monotonic clock. The times
written in the record (`renewTime`, `acquireTime`) are for people: comparing another replica's
wall clock with ours would let a standby whose clock runs ahead take over from a live leader, or
one whose clock runs behind wait forever. Updates carry the resourceVersion they read, so two
candidates can never both win. A leader that cannot renew within `renew_deadline` stops leading.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable
from typing import Any

from nicop.kube.client import ApiClient, ApiError, Unreachable
from nicop.kube.resources import LEASE, Obj
from nicop.kube.times import micro_stamp, utcnow

log = logging.getLogger(__name__)


class LostLeadership(Exception):
    pass


class LeaderElector:
    def __init__(
        self,
        client: ApiClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], datetime.datetime] = utcnow,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.clock = clock  # this replica's wall clock, only written into the record
        self.is_leader = False
        self.reachable = True
        # The record as last seen, and when (monotonic) it was first seen so.
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self.attempts = 0  # tries to take or renew the lease so far

    async def acquire(self) -> None:
        """Wait until this candidate holds the lease; an API server that does not answer is
        waited for too."""
        while not await self._attempt():
            await asyncio.sleep(self.retry_period)
        self.is_leader = True
        log.info("became leader (%s)", self.identity,
                 extra={"kind": "Lease", "namespace": self.namespace, "object": self.name})

    async def keep(self) -> None:
        """Renew forever; raises LostLeadership when renewing fails for `renew_deadline`."""
        last_renew = asyncio.get_running_loop().time()
        while True:
            await asyncio.sleep(self.retry_period)
            ok = await self._attempt()
            now = asyncio.get_running_loop().time()
            if ok:
                last_renew = now
            elif now - last_renew > self.renew_deadline:
                self.is_leader = False
                raise LostLeadership(f"could not renew lease {self.namespace}/{self.name}")

    async def release(self) -> None:
        """Give the lease up on a clean shutdown, so a standby need not wait for it to expire."""
        if not self.is_leader:
            return
        lease = await self.client.get_or_none(LEASE, self.name, self.namespace)
        if lease and lease["spec"].get("holderIdentity") == self.identity:
            lease["spec"]["holderIdentity"] = ""
            lease["spec"]["leaseDurationSeconds"] = 1
            try:
                await self.client.update(lease)
            except ApiError as e:
                log.warning("could not release lease: %s", e)
        self.is_leader = False

    async def _attempt(self) -> bool:
        """One try to take or renew the lease; `reachable` says whether the API server answered."""
        self.attempts += 1
        try:
            ok = await self._try_acquire_or_renew()
        except (ApiError, OSError) as e:
            self.reachable = not isinstance(e, (Unreachable, OSError))
            log.warning("lease %s/%s: %s", self.namespace, self.name, e)
            return False
        self.reachable = True
        return ok

    async def _try_acquire_or_renew(self) -> bool:
        now = self.clock()
        lease = await self.client.get_or_none(LEASE, self.name, self.namespace)
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_duration),
            "renewTime": micro_stamp(now),
        }
        if lease is None:
            obj: Obj = {
                "apiVersion": LEASE.api_version, "kind": LEASE.kind,
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {**spec, "acquireTime": micro_stamp(now), "leaseTransitions": 0},
            }
            try:
                await self.client.create(obj)
            except ApiError as e:
                if e.code == 409:
                    return False
                raise
            self._observe(obj["spec"])
            return True
        old = lease.get("spec", {})
        self._observe(old)
        holder = old.get("holderIdentity") or ""
        if holder and holder != self.identity:
            duration = old.get("leaseDurationSeconds") or self.lease_duration
            if self._observed_at + duration > asyncio.get_running_loop().time():
                return False
        if holder == self.identity:
            spec["acquireTime"] = old.get("acquireTime", micro_stamp(now))
            spec["leaseTransitions"] = old.get("leaseTransitions", 0)
        else:
            spec["acquireTime"] = micro_stamp(now)
            spec["leaseTransitions"] = old.get("leaseTransitions", 0) + 1
        lease["spec"] = spec
        try:
            await self.client.update(lease)
        except ApiError as e:
            if e.code == 409:
                return False
            raise
        self._observe(spec)
        return True

    def _observe(self, spec: Obj) -> None:
        """Note the record; a change restarts the lease's time on our clock."""
        record = tuple(spec.get(k) for k in ("holderIdentity", "renewTime", "acquireTime",
                                             "leaseTransitions", "leaseDurationSeconds"))
        if record != self._observed:
            self._observed = record
            self._observed_at = asyncio.get_running_loop().time()
