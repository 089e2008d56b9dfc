"""Keeps a node's pool of ResourceSlices in step with its devices.

The devices are read again every `interval` seconds while they change, less often while the
host is at rest (nicop.node.pacing), as the device plugins rescan; the API is
written only when they changed (or the last write failed), and read back every `resync` seconds
so that a slice someone deleted or edited comes back. The slices are owned by their Node, so
they go with it. An API server without device taints (DRADeviceTaints off) drops them from what
it stores: the publisher then stops sending them, rather than rewrite the pool at every resync.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from nicop.kube.client import ApiClient, ApiError
from nicop.kube.resources import NODE, RESOURCE_SLICE
from nicop.node.dra.slices import PoolContent, SlicePlan, plan, without_taints
from nicop.node.pacing import Pacer

log = logging.getLogger(__name__)

PoolSource = Callable[[], PoolContent]  # read again at every rescan


class SlicePublisher:
    """Publishes `source()` as the pool of `driver` on `node_name`."""

    def __init__(self, client: ApiClient, driver: str, node_name: str, source: PoolSource, *,
                 interval: float = 1.0, resync: float = 60.0) -> None:
        self.client = client
        self.driver = driver
        self.node_name = node_name
        self.source = source
        self.interval = interval
        self.resync = resync
        self.published = asyncio.Event()
        """Set once the pool has been written (or found right) the first time."""
        self._poked = asyncio.Event()
        self.taints = True  # whether the API server keeps device taints

    async def sync(self, content: PoolContent) -> SlicePlan:
        """One round: read the pool, write what differs from `content`."""
        node = await self.client.get(NODE, self.node_name)
        current, _ = await self.client.list(
            RESOURCE_SLICE,
            field_selector=f"spec.nodeName={self.node_name},spec.driver={self.driver}")
        if not self.taints:
            content = without_taints(content)
        writes = plan(self.driver, self.node_name, content, current, owner=node)
        for obj in writes.create:
            self._check_taints(obj, await self.client.create(obj, res=RESOURCE_SLICE))
        for obj in writes.update:
            self._check_taints(obj, await self.client.update(obj))
        for name in writes.delete:
            await self.client.delete(RESOURCE_SLICE, name)
        if not writes.noop:
            log.info("%s: node %s publishes %d devices (pool generation %d)", self.driver,
                     self.node_name, len(content.devices), writes.generation)
        return writes

    def _check_taints(self, sent: dict[str, Any], stored: dict[str, Any]) -> None:
        def tainted(obj: dict[str, Any]) -> bool:
            return any(d.get("taints") for d in obj["spec"].get("devices") or [])

        if self.taints and tainted(sent) and not tainted(stored):
            self.taints = False
            log.warning("%s: the API server drops device taints (feature gate DRADeviceTaints "
                        "off): devices whose link is down are published without them",
                        self.driver)

    def poke(self) -> None:
        """Something the devices are read with changed (a node label, a VF plan or policy):
        read them now, not at the next paced scan."""
        self._poked.set()

    async def _wait(self, stop: asyncio.Event, delay: float) -> None:
        """Until `stop`, a poke or `delay` seconds, whichever comes first."""
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._poked.wait())]
        try:
            await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        self._poked.clear()

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop`: publish on every change of the devices, and check every `resync`."""
        published: PoolContent | None = None
        checked = 0.0
        loop = asyncio.get_running_loop()
        pacer = Pacer(self.interval)
        while not stop.is_set():
            content = await asyncio.to_thread(self.source)
            if content != published or loop.time() - checked >= self.resync:
                try:
                    await self.sync(content)
                    published, checked = content, loop.time()
                    self.published.set()
                except ApiError as e:  # the API server restarting, a conflict: next round
                    log.warning("%s: cannot publish the slices of node %s: %s", self.driver,
                                self.node_name, e)
                    published = None
            await self._wait(stop, pacer.after(content) if published is not None
                             else self.interval)

    async def withdraw(self) -> None:
        """Delete the node's slices of this driver (the plugin is removed from the node). When
        the API refuses (the plugin's RBAC went first), the kubelet deletes them 30 s after the
        plugin unregistered."""
        try:
            current, _ = await self.client.list(
                RESOURCE_SLICE,
                field_selector=f"spec.nodeName={self.node_name},spec.driver={self.driver}")
            for obj in current:
                await self.client.delete(RESOURCE_SLICE, obj["metadata"]["name"])
        except ApiError as e:
            log.warning("%s: cannot delete the slices of node %s (%s); the kubelet deletes them "
                        "30 s after the plugin unregistered", self.driver, self.node_name, e)

