"""The pods of a few nodes, watched only while a controller needs them.

Draining a node or waiting for its jobs needs that node's pods; a watch of every pod in the
cluster would be most of what the operator receives on a big one (every pod of every DaemonSet
changing state), for the handful of nodes a drain covers at a time. So a controller asks for a
node's pods while it drains it (one informer on `spec.nodeName`, as `kubectl drain` lists
them), and says which nodes it still needs after each reconcile; the others stop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from nicop.kube.informer import Handler, Informer, without_managed_fields
from nicop.kube.manager import Manager
from nicop.kube.resources import POD, Obj


class NodePods:
    def __init__(self, manager: Manager, on_change: Handler) -> None:
        """`on_change(event, pod, old)` is called for every change of a watched node's pods,
        the first listing included."""
        self.client = manager.client
        self.transform = manager.transforms.get(POD, without_managed_fields)
        self.on_change = on_change
        self._watching: dict[str, tuple[Informer, asyncio.Task[None]]] = {}

    def pods(self, node: str) -> list[Obj] | None:
        """The node's pods, or None until its watch has listed them once (the listing then
        calls `on_change`, so the caller is woken when they are known)."""
        if node not in self._watching:
            informer = Informer(self.client, POD, field_selector=f"spec.nodeName={node}",
                                transform=self.transform)
            informer.on_change(self.on_change)
            self._watching[node] = (informer, asyncio.create_task(informer.run()))
        informer = self._watching[node][0]
        return informer.store.items() if informer.synced.is_set() else None

    async def keep(self, nodes: Iterable[str]) -> None:
        """Stop watching every node but these."""
        wanted = set(nodes)
        for node in set(self._watching) - wanted:
            _, task = self._watching.pop(node)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def watched(self) -> set[str]:
        return set(self._watching)
