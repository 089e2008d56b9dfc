"""Values derived from each cached object, derived again only when the object changed.

A level-triggered reconcile reads every node (or pod) of the cache on every pass; what it derives
from one (is the node managed, why not, which upgrade pool, is its driver ready) changes only when
that object does. The informer replaces an object on every watch event and assumed write, each
with a new resourceVersion, so (name, resourceVersion) tells whether a kept value still holds.
An object without a resourceVersion is always derived anew.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

T = TypeVar("T")
Obj = dict[str, Any]


class PerObject(Generic[T]):
    def __init__(self, derive: Callable[[Obj], T]) -> None:
        self._derive = derive
        self._kept: dict[tuple[str | None, str], tuple[str | None, T]] = {}

    def each(self, objs: Iterable[Obj]) -> list[tuple[Obj, T]]:
        """Each object with its value; the values of objects not passed are forgotten (pass the
        whole cache each time)."""
        old, kept = self._kept, {}
        pairs = []
        for obj in objs:
            meta = obj["metadata"]
            key = (meta.get("namespace"), meta["name"])
            version = meta.get("resourceVersion")
            hit = old.get(key)
            value = hit[1] if hit is not None and version is not None and hit[0] == version \
                else self._derive(obj)
            kept[key] = (version, value)
            pairs.append((obj, value))
        self._kept = kept
        return pairs
