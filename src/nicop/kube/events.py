"""Kubernetes Events on the objects nicop manages, so `kubectl describe` tells the story.

A repeat of the same reason and message on the same object bumps the count of the existing
Event instead of creating another one, like client-go's event correlator.
"""

from __future__ import annotations

import logging
import time

from nicop.kube.client import ApiClient, ApiError
from nicop.kube.resources import EVENT, Obj
from nicop.kube.times import stamp

log = logging.getLogger(__name__)


class EventRecorder:
    def __init__(self, client: ApiClient, component: str = "nicop-operator") -> None:
        self.client = client
        self.component = component
        # (uid, type, reason, message) -> (event name, namespace, count)
        self._seen: dict[tuple[str, str, str, str], tuple[str, str, int]] = {}

    async def emit(self, obj: Obj, type_: str, reason: str, message: str) -> None:
        """Record an Event; failures are logged, never raised (events are best effort)."""
        m = obj["metadata"]
        namespace = m.get("namespace") or "default"
        now = stamp()
        key = (m.get("uid", ""), type_, reason, message)
        try:
            if key in self._seen:
                name, ns, count = self._seen[key]
                await self.client.patch(EVENT, name, {"count": count + 1, "lastTimestamp": now},
                                        ns)
                self._seen[key] = (name, ns, count + 1)
                return
            name = f"{m['name']}.{time.time_ns():x}"
            await self.client.create({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": {
                    "apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                    "name": m["name"], "namespace": m.get("namespace"), "uid": m.get("uid"),
                    "resourceVersion": m.get("resourceVersion"),
                },
                "type": type_, "reason": reason, "message": message, "count": 1,
                "firstTimestamp": now, "lastTimestamp": now,
                "source": {"component": self.component},
                "reportingComponent": self.component,
            })
            self._seen[key] = (name, namespace, 1)
        except ApiError as e:
            log.warning("could not record event %s on %s: %s", reason, m.get("name"), e)
