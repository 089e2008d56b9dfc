"""A node's devices as ResourceSlices (resource.k8s.io/v1), and what to change in the API to get
from the slices there to the slices wanted.

One pool per node and driver, named after the node. Devices are ordered by name and cut into
slices of at most 128 (64 when they consume counters), so the same devices always give the same
slices. Counter sets, which a slice cannot hold beside devices, come first in slices of their
own, 8 to a slice. A pool with no devices is still published (one empty slice): the scheduler
then knows the driver runs on the node.

Slices get deterministic names, `<driver>-<node>-<index>`, rather than the kubelet plugin
helper's `generateName`: a create retried after a lost response then fails with AlreadyExists
instead of leaving a second copy of the pool, server-side apply can address each slice by name,
and `kubectl get resourceslices` shows which node and driver a slice belongs to.

The pool's generation moves only when what the newest generation in the API publishes is no
longer right (devices changed, or a slice was edited): the scheduler drops slices of older
generations, so a bump for nothing would make the node's pool briefly incomplete. A slice that
was only deleted comes back in the generation it had.

A device taint's `timeAdded` is the API server's (it sets it when a taint arrives without one):
it is kept from the slices there and not compared, so an unchanged taint writes nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nicop.api import dra

MAX_NAME = 253  # a ResourceSlice's name is a DNS subdomain


@dataclass(frozen=True)
class PoolContent:
    """What a node's pool publishes, in API form: devices, and the counter sets they consume."""

    devices: list[dict[str, Any]]
    counter_sets: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class SlicePlan:
    """The writes that turn the slices in the API into the wanted ones."""

    generation: int
    create: list[dict[str, Any]] = field(default_factory=list)
    update: list[dict[str, Any]] = field(default_factory=list)  # carry the resourceVersion read
    delete: list[str] = field(default_factory=list)

    @property
    def noop(self) -> bool:
        return not (self.create or self.update or self.delete)


def slice_name(driver: str, node: str, index: int) -> str:
    """`<driver>-<node>-<index>`; a node name too long for that is cut and given a hash."""
    name = f"{driver}-{node}-{index}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    keep = MAX_NAME - len(f"{driver}--{digest}-{index}")
    return f"{driver}-{node[:keep].rstrip('.-')}-{digest}-{index}"


def build_slices(
    driver: str, node: str, content: PoolContent, generation: int,
    owner: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The pool's slices: its counter sets ordered by name, 8 per slice, then its devices
    ordered by name, at most 128 per slice (64 when any consumes counters).

    `owner` is the Node object (name and uid) to own the slices, so they go with the Node.
    """
    counter_sets = sorted(content.counter_sets, key=lambda c: str(c["name"]))
    step = dra.MAX_COUNTER_SETS_PER_SLICE
    chunks: list[dict[str, Any]] = [
        {"sharedCounters": [dict(c) for c in counter_sets[i:i + step]]}
        for i in range(0, len(counter_sets), step)]
    ordered = sorted(content.devices, key=lambda d: str(d["name"]))
    step = (dra.MAX_DEVICES_PER_SLICE_WITH_COUNTERS
            if any(d.get("consumesCounters") for d in ordered) else dra.MAX_DEVICES_PER_SLICE)
    chunks += [{"devices": [dict(d) for d in ordered[i:i + step]]}
               for i in range(0, len(ordered), step)]
    chunks = chunks or [{"devices": []}]
    metadata_extra: dict[str, Any] = {}
    if owner is not None:
        meta = owner.get("metadata", owner)
        metadata_extra["ownerReferences"] = [{
            "apiVersion": "v1", "kind": "Node", "name": meta["name"], "uid": meta["uid"],
            "controller": True,
        }]
    return [
        {
            "apiVersion": dra.RESOURCE_API,
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name(driver, node, i), **metadata_extra},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": generation,
                         "resourceSliceCount": len(chunks)},
                **chunk,
            },
        }
        for i, chunk in enumerate(chunks)
    ]


def plan(
    driver: str, node: str, content: PoolContent,
    current: Sequence[Mapping[str, Any]], owner: Mapping[str, Any] | None = None,
) -> SlicePlan:
    """What to create, update and delete so that the node's pool holds `content`.

    `current` are the ResourceSlices in the API (others' slices among them are ignored). The
    generation stays when every slice of the newest generation there is already one of the
    wanted slices (then only missing slices are created and older ones replaced), and goes up by
    one otherwise, so the scheduler never takes a mix of old and new slices for the pool.
    """
    ours = [s for s in current if _spec(s).get("driver") == driver
            and _spec(s).get("nodeName") == node and _pool(s).get("name") == node]
    generation = max((int(_pool(s).get("generation", 0)) for s in ours), default=0)
    content = _with_taint_times(content, ours)
    wanted = {s["metadata"]["name"]: s for s in build_slices(driver, node, content, generation)}
    newest = [s for s in ours if _pool(s).get("generation") == generation]
    if not newest or any(s["metadata"]["name"] not in wanted
                         or _managed(s) != _managed(wanted[s["metadata"]["name"]])
                         for s in newest):
        generation += 1
    return _writes(generation, build_slices(driver, node, content, generation, owner), ours)


def _writes(
    generation: int, wanted: list[dict[str, Any]], ours: Sequence[Mapping[str, Any]]
) -> SlicePlan:
    """Create what is missing, update what differs, delete what is not wanted."""
    by_name = {s["metadata"]["name"]: s for s in ours}
    result = SlicePlan(generation)
    for obj in wanted:
        existing = by_name.pop(obj["metadata"]["name"], None)
        if existing is None:
            result.create.append(obj)
        elif _managed(existing) != _managed(obj):
            version = existing["metadata"].get("resourceVersion")
            if version:
                obj["metadata"]["resourceVersion"] = version
            result.update.append(obj)
    result.delete.extend(sorted(by_name))
    return result


def _with_taint_times(content: PoolContent, ours: Sequence[Mapping[str, Any]]) -> PoolContent:
    """`content` with each taint's timeAdded as the slices in the API have it."""
    added = {_taint_key(d["name"], t): t["timeAdded"]
             for s in ours for d in _spec(s).get("devices") or []
             for t in d.get("taints") or [] if t.get("timeAdded")}
    if not added:
        return content

    def timed(name: str, taint: Mapping[str, Any]) -> dict[str, Any]:
        time = added.get(_taint_key(name, taint))
        return {**taint, "timeAdded": time} if time else dict(taint)

    devices = [{**d, "taints": [timed(d["name"], t) for t in d["taints"]]}
               if d.get("taints") else d for d in content.devices]
    return PoolContent(devices, content.counter_sets)


def without_taints(content: PoolContent) -> PoolContent:
    return PoolContent([{k: v for k, v in d.items() if k != "taints"} for d in content.devices],
                       content.counter_sets)


def _taint_key(device: str, taint: Mapping[str, Any]) -> tuple[Any, ...]:
    return device, taint.get("key"), taint.get("value"), taint.get("effect")


def _untimed(devices: Sequence[Mapping[str, Any]]) -> list[Any]:
    """Devices as compared: taints without the API server's timeAdded."""
    return [{**d, "taints": [{k: v for k, v in t.items() if k != "timeAdded"}
                             for t in d["taints"]]} if d.get("taints") else d
            for d in devices]


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def _pool(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _spec(obj).get("pool") or {}


def _managed(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    """The fields this module sets, to tell whether a slice needs writing."""
    spec = _spec(obj)
    return (spec.get("driver"), spec.get("nodeName"), dict(_pool(obj)),
            _untimed(spec.get("devices") or []), spec.get("sharedCounters") or [])
