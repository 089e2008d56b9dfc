"""An informer whose resourceVersion has expired (410 Gone) relists and reports the difference.

The real API server keeps every event of the last minutes in its watch cache, so a test cannot
make it answer 410 on demand; this test drives the informer with a stand-in for the client's
list and watch calls instead. Everything else about informers is tested against the real server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from nicop.kube.client import ApiError
from nicop.kube.informer import Informer
from nicop.kube.resources import CONFIGMAP


def cm(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}


class ExpiringClient:
    """First list: a and b. First watch: 410. Second list: b (changed) and c. Then quiet."""

    def __init__(self) -> None:
        self.lists = [([cm("a", "1"), cm("b", "2")], "2"), ([cm("b", "5"), cm("c", "6")], "6")]
        self.watch_versions: list[str] = []

    async def list(self, *args: Any, **kwargs: Any) -> tuple[list[dict[str, Any]], str]:
        return self.lists.pop(0)

    async def watch(self, res: Any, rv: str, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        self.watch_versions.append(rv)
        if len(self.watch_versions) == 1:
            raise ApiError(410, "Expired", "too old resource version: 2 (4)")
        await asyncio.sleep(3600)
        yield  # pragma: no cover


def test_expired_watch_relists_and_reports_what_changed_meanwhile() -> None:
    async def scenario() -> list[tuple[str, str]]:
        client = ExpiringClient()
        informer = Informer(client, CONFIGMAP)  # type: ignore[arg-type]
        events: list[tuple[str, str]] = []
        informer.on_change(lambda ev, obj, old: events.append((ev, obj["metadata"]["name"])))
        task = asyncio.create_task(informer.run())
        while len(client.watch_versions) < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        assert client.watch_versions == ["2", "6"], "the new watch starts from the relist"
        assert informer.relists == 2
        assert sorted(informer.store.keys()) == ["ns/b", "ns/c"]
        return events

    events = asyncio.run(scenario())
    assert events == [
        ("ADDED", "a"), ("ADDED", "b"),          # first list
        ("MODIFIED", "b"), ("ADDED", "c"),       # relist after 410
        ("DELETED", "a"),
    ]
