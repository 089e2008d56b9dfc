"""Binding conditions of planned VFs: the scheduler has allocated a VF that the plugin published
before it was ready (nicop.node.dra.vf_plan) and waits, before it binds the pod, for the
claim's status.devices entry of that VF to say `rdma.nicop.io/VFReady` (or `VFFailed`: the
scheduler then frees the claim and tries other devices). This sets them.

The claims are watched cluster-wide (the plugin's role lists and watches them already); only
those with a result of this driver, on this node's pool, with binding conditions, are looked at.
The entries are written by server-side apply under the plugin's field manager, with the
node-bound rights the prepared devices' status uses; prepare writes the same conditions again
beside Ready, so they stay.

What a device is now is the last scan's: `devices()` gives the node's devices by name as the
publisher last read them. An allocated VF that is neither published ready nor planned any more
(its policy deleted, its PF's link down) fails its binding: it will not come.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from nicop.api import dra
from nicop.kube.client import FIELD_MANAGER, ApiClient, ApiError
from nicop.kube.informer import Informer
from nicop.kube.resources import RESOURCE_CLAIM, Obj
from nicop.kube.times import stamp
from nicop.node.dra.devices import Device

log = logging.getLogger(__name__)

Devices = Callable[[], Mapping[str, Device] | None]  # None until the first scan


def binding_conditions(device: Device | None, node_name: str) -> list[dict[str, str]] | None:
    """The conditions to set for an allocated device with binding conditions; None while the
    answer is not known yet (the VF is still being made)."""
    if device is None:
        why = (f"the device is no longer planned on node {node_name} (its SR-IOV policy was "
               "removed, or its PF's link is down)")
    elif device.planned is None:
        return [_condition(dra.CONDITION_VF_READY, "VFReady",
                           f"the VF is made and bound on node {node_name}")]
    elif device.planned.failure is None:
        return None
    else:
        why = device.planned.failure
    return [_condition(dra.CONDITION_VF_FAILED, "VFNotMade", why)]


def _condition(kind: str, reason: str, message: str) -> dict[str, str]:
    return {"type": kind, "status": "True", "reason": reason, "message": message[:32768],
            "lastTransitionTime": stamp()}


def pending(claim: Obj, node_name: str) -> list[str]:
    """The claim's devices of this driver on this node that wait for their binding conditions."""
    status = claim.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    answered = {(d.get("driver"), d.get("pool"), d.get("device"))
                for d in status.get("devices") or []
                for c in d.get("conditions") or []
                if c.get("type") in (dra.CONDITION_VF_READY, dra.CONDITION_VF_FAILED)
                and c.get("status") == "True"}
    return [r["device"] for r in results
            if r.get("driver") == dra.DRIVER and r.get("pool") == node_name
            and r.get("bindingConditions")
            and (dra.DRIVER, node_name, r["device"]) not in answered]


class Binder:
    """Answers the binding conditions of the claims allocated this node's planned VFs."""

    def __init__(self, client: ApiClient, node_name: str, devices: Devices, *,
                 interval: float = 1.0) -> None:
        self.client = client
        self.node_name = node_name
        self.devices = devices
        self.interval = interval
        self.claims = Informer(client, RESOURCE_CLAIM, transform=_trimmed, optional=True)
        self._changed = asyncio.Event()
        self.claims.on_change(lambda *_: self._changed.set())
        self._answered: set[tuple[str, str, str]] = set()  # see _key

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop`: answer at every claim change and every rescan `interval`."""
        watching = asyncio.create_task(self.claims.run())
        try:
            while not stop.is_set():
                self._changed.clear()
                await self.answer()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), self.interval)
        finally:
            watching.cancel()

    async def answer(self) -> None:
        devices = self.devices()
        if devices is None:
            return
        waiting = set()
        for claim in self.claims.store.items():
            entries = []
            for name in pending(claim, self.node_name):
                waiting.add(_key(claim, name))
                if _key(claim, name) in self._answered:
                    continue  # written; the watch has not brought it back yet
                conditions = binding_conditions(devices.get(name), self.node_name)
                if conditions is not None:
                    entries.append({"driver": dra.DRIVER, "pool": self.node_name,
                                    "device": name, "conditions": conditions})
            if entries:
                await self._write(claim, entries)
        self._answered &= waiting

    async def _write(self, claim: Obj, entries: list[dict[str, Any]]) -> None:
        meta = claim["metadata"]
        try:
            await apply_device_status(self.client, meta, entries)
        except ApiError as e:  # deallocated meanwhile, or the API server away: next round
            log.warning("%s: cannot set the binding conditions of claim %s/%s: %s", dra.DRIVER,
                        meta["namespace"], meta["name"], e)
            return
        for entry in entries:
            self._answered.add(_key(claim, entry["device"]))
            [*_, last] = entry["conditions"]
            log.info("%s: claim %s/%s, device %s: %s (%s)", dra.DRIVER, meta["namespace"],
                     meta["name"], entry["device"], last["type"], last["message"])


async def apply_device_status(client: ApiClient, meta: Obj, entries: list[dict[str, Any]],
                              manager: str = FIELD_MANAGER) -> None:
    """Server-side apply of this driver's entries of a claim's status.devices (other drivers'
    stay theirs); another `manager` keeps apart what another nicop agent writes there."""
    await client.apply({
        "apiVersion": dra.RESOURCE_API, "kind": "ResourceClaim",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "status": {"devices": entries}}, subresource="status", res=RESOURCE_CLAIM,
        manager=manager)


def _key(claim: Obj, device: str) -> tuple[str, str, str]:
    """One allocation of a device to a claim: a claim freed and allocated again is asked anew."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return claim["metadata"].get("uid", ""), str(allocation.get("allocationTimestamp")), device


def _trimmed(claim: Obj) -> Obj:
    """What the binder reads of a claim: its name and status."""
    meta = claim.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion", "uid")
                         if k in meta},
            "status": claim.get("status") or {}}
