"""Informers: an in-memory, indexed copy of one kind of object, kept current by list + watch.

Level-triggered controllers read the cache instead of the API server; handlers only enqueue
keys. Watches ask for bookmarks (so a quiet watch still advances its resourceVersion) and a 410
Gone relists, reporting what changed meanwhile as ordinary add/update/delete events.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from nicop.backoff import doubling
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.resources import Obj, Resource, key_of

log = logging.getLogger(__name__)

Handler = Callable[[str, Obj, Obj | None], None]
IndexFunc = Callable[[Obj], Iterable[str]]
Transform = Callable[[Obj], Obj]
WATCH_RETRY_BASE, WATCH_RETRY_CAP = 0.2, 30.0  # seconds: a broken watch's first and longest wait
NOT_SERVED_RECHECK = 30.0  # seconds between lists of an optional kind the API does not serve


def without_managed_fields(obj: Obj) -> Obj:
    """No controller reads managedFields, and they are often the largest part of an object."""
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


class Store:
    """Objects by key, with secondary indexes (e.g. pods by node name)."""

    def __init__(self) -> None:
        self._objects: dict[str, Obj] = {}
        self._index_funcs: dict[str, IndexFunc] = {}
        self._indexes: dict[str, dict[str, set[str]]] = {}

    def add_index(self, name: str, func: IndexFunc) -> None:
        self._index_funcs[name] = func
        self._indexes[name] = {}
        for key, obj in self._objects.items():
            self._index(name, key, obj)

    def _index(self, name: str, key: str, obj: Obj) -> None:
        for value in self._index_funcs[name](obj):
            self._indexes[name].setdefault(value, set()).add(key)

    def _unindex(self, key: str, obj: Obj) -> None:
        for name, func in self._index_funcs.items():
            for value in func(obj):
                keys = self._indexes[name].get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._indexes[name][value]

    def put(self, obj: Obj) -> Obj | None:
        key = key_of(obj)
        old = self._objects.get(key)
        if old is not None:
            self._unindex(key, old)
        self._objects[key] = obj
        for name in self._index_funcs:
            self._index(name, key, obj)
        return old

    def remove(self, key: str) -> Obj | None:
        old = self._objects.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        return old

    def get(self, key: str) -> Obj | None:
        return self._objects.get(key)

    def items(self) -> list[Obj]:
        return [*self._objects.values()]

    def keys(self) -> set[str]:
        return set(self._objects)

    def by_index(self, name: str, value: str) -> list[Obj]:
        return [self._objects[k] for k in self._indexes[name].get(value, ())]

    def __len__(self) -> int:
        return len(self._objects)


class Informer:
    def __init__(
        self,
        client: ApiClient,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        metadata_only: bool = False,
        watch_timeout: int = 300,
        transform: Transform = without_managed_fields,
        optional: bool = False,
    ) -> None:
        """`transform` trims each object before it is cached (as client-go's SetTransform):
        keep only what the informer's readers use, and a big cluster fits in little memory.

        An `optional` kind may not be served by every cluster (resource.k8s.io/v1 before
        Kubernetes 1.34): while the API server answers 404 it is an empty cache, synced and
        connected, listed again every 30 s. Only for built-in kinds: a CRD's kind is briefly
        404 while a restarted API server loads its CRDs, and must not read as empty then."""
        self.optional = optional
        self.client = client
        self.transform = transform
        self.res = res
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.metadata_only = metadata_only
        self.watch_timeout = watch_timeout
        self.store = Store()
        self.synced = asyncio.Event()
        # False from a failed list or watch until the API server answers again: the cache may
        # be behind meanwhile (what /readyz tells).
        self.connected = False
        self.relists = 0
        self._handlers: list[Handler] = []
        self._rv = ""

    def on_change(self, handler: Handler) -> None:
        """Call handler(event, obj, old) for ADDED/MODIFIED/DELETED; it must not block."""
        self._handlers.append(handler)

    def assume(self, obj: Obj) -> None:
        """Put the result of the caller's own write into the cache now, before the watch
        delivers it, so the next reconcile does not act on what it already changed. A newer
        version the watch already brought (someone else's later write) is kept."""
        current = self.store.get(key_of(obj))
        if current is None or _order(obj, current) != -1:
            self.store.put(self.transform(obj))

    def _emit(self, event: str, obj: Obj, old: Obj | None) -> None:
        for handler in self._handlers:
            try:
                handler(event, obj, old)
            except Exception:
                log.exception("informer handler failed", extra={"kind": self.res.kind})

    def _selectors(self) -> dict[str, Any]:
        return {
            "label_selector": self.label_selector,
            "field_selector": self.field_selector,
            "metadata_only": self.metadata_only,
        }

    async def _relist(self) -> None:
        items, self._rv = await self.client.list(self.res, self.namespace, **self._selectors())
        seen = set()
        for obj in map(self.transform, items):
            seen.add(key_of(obj))
            old = self.store.put(obj)
            if old is None:
                self._emit("ADDED", obj, None)
            elif old.get("metadata", {}).get("resourceVersion") != obj["metadata"].get(
                "resourceVersion"
            ):
                self._emit("MODIFIED", obj, old)
        for key in self.store.keys() - seen:
            gone = self.store.remove(key)
            if gone is not None:
                self._emit("DELETED", gone, gone)
        self.relists += 1
        self.connected = True
        self.synced.set()

    async def run(self) -> None:
        """List, then watch forever; relist on 410 Gone, back off on other errors.

        Run again after a stop, it resumes watching from the last resourceVersion it saw.
        """
        failures = 0
        need_list = not self._rv
        while True:
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                async for event, obj in self.client.watch(
                    self.res, self._rv, self.namespace, timeout_seconds=self.watch_timeout,
                    on_open=self._opened, **self._selectors(),
                ):
                    self._rv = obj.get("metadata", {}).get("resourceVersion", self._rv)
                    if event == "BOOKMARK":
                        continue
                    obj = self.transform(obj)
                    if event == "DELETED":
                        self.store.remove(key_of(obj))
                        self._emit("DELETED", obj, obj)
                    else:
                        current = self.store.get(key_of(obj))
                        if current is not None and _order(obj, current) in (-1, 0):
                            continue  # our own write, assumed earlier: nothing new to tell
                        old = self.store.put(obj)
                        self._emit("ADDED" if old is None else "MODIFIED", obj, old)
                failures = 0
            except ApiError as e:
                if e.code == 410:
                    need_list = True
                    continue
                if e.code == 404 and self.optional:
                    self._not_served()
                    need_list = True
                    await asyncio.sleep(NOT_SERVED_RECHECK)
                    continue
                failures = await self._retry_later("failed", e, failures)
            except (OSError, ValueError) as e:  # reset or truncated stream
                failures = await self._retry_later("broke", e, failures)

    async def _retry_later(self, what: str, error: Exception, failures: int) -> int:
        """Wait a doubling while before the next try; the count of failures so far."""
        self.connected = False
        delay = doubling(WATCH_RETRY_BASE, failures, WATCH_RETRY_CAP)
        log.warning("watch of %s %s: %s; retrying in %.1fs", self.res, what, error, delay)
        await asyncio.sleep(delay)
        return failures + 1

    def _not_served(self) -> None:
        """The API server does not serve this optional kind: nothing of it exists."""
        if not self.synced.is_set() or len(self.store):
            log.info("%s is not served by the API server; none exist until it is", self.res)
        for gone in self.store.items():
            self.store.remove(key_of(gone))
            self._emit("DELETED", gone, gone)
        self._rv = ""
        self.connected = True
        self.synced.set()

    def _opened(self) -> None:
        self.connected = True


def _order(obj: Obj, than: Obj) -> int | None:
    """-1, 0 or 1 as obj's resourceVersion is below, equal to or above than's (etcd versions
    are integers); None when either is not a number."""
    try:
        a, b = int(obj["metadata"]["resourceVersion"]), int(than["metadata"]["resourceVersion"])
    except (KeyError, ValueError):
        return None
    return (a > b) - (a < b)
