"""The objects a controller deploys for a component outside the NicClusterPolicy (the SR-IOV
config daemon and device plugin, the CNI daemon): applied when their content changes, judged by
their rollout, deleted when the component is no longer wanted.

Each object carries `nicop.io/component: <name>`; informers on that label hold what exists, so a
component at rest costs no API writes (the revision annotation hashes the rendered content).
"""

from __future__ import annotations

from collections.abc import Callable

from nicop.api.labels import MANAGED_BY_LABEL, MANAGED_BY_VALUE, REVISION_ANNOTATION
from nicop.kube.client import ApiClient
from nicop.kube.manager import Manager
from nicop.kube.resources import (
    CLUSTER_ROLE,
    CLUSTER_ROLE_BINDING,
    CONFIGMAP,
    DAEMONSET,
    SERVICE_ACCOUNT,
    Obj,
    Resource,
    key_of,
    resource_of,
)
from nicop.operator import writes
from nicop.operator.states.base import content_hash

COMPONENT_LABEL = "nicop.io/component"
KINDS = (SERVICE_ACCOUNT, CONFIGMAP, CLUSTER_ROLE, CLUSTER_ROLE_BINDING, DAEMONSET)


class Components:
    """Components of one controller; `changed(name)` is called when an object of one changes."""

    def __init__(self, manager: Manager, namespace: str, names: tuple[str, ...],
                 changed: Callable[[str], None]) -> None:
        self.client: ApiClient = manager.client
        self.names = names
        self.informers = {
            res: manager.informer(res, namespace if res.namespaced else None,
                                  label_selector=COMPONENT_LABEL)
            for res in KINDS
        }

        def handler(event: str, obj: Obj, old: Obj | None) -> None:
            name = (obj["metadata"].get("labels") or {}).get(COMPONENT_LABEL)
            if name in names:
                changed(name)

        for informer in self.informers.values():
            informer.on_change(handler)

    def objects_of(self, name: str) -> list[tuple[Resource, Obj]]:
        return [(res, obj) for res, informer in self.informers.items()
                for obj in informer.store.items()
                if (obj["metadata"].get("labels") or {}).get(COMPONENT_LABEL) == name]

    async def sync(self, name: str, objects: list[Obj], owner: Obj | None = None) -> list[str]:
        """Make the component exactly `objects`; returns why it is not ready yet (empty: ready).

        Namespaced objects get `owner` as their controller, so deleting it deletes them too. A
        write the API server refuses raises WriteFailed, naming the object.
        """
        wanted = set()
        for obj in objects:
            meta = obj["metadata"]
            meta.setdefault("labels", {})[COMPONENT_LABEL] = name
            meta.setdefault("labels", {})[MANAGED_BY_LABEL] = MANAGED_BY_VALUE
            if owner is not None and meta.get("namespace"):
                om = owner["metadata"]
                meta["ownerReferences"] = [{
                    "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": om["name"],
                    "uid": om["uid"], "controller": True, "blockOwnerDeletion": True}]
            meta.setdefault("annotations", {})[REVISION_ANNOTATION] = content_hash(obj)
            res = resource_of(obj)
            wanted.add((res, key_of(obj)))
            cached = self.informers[res].store.get(key_of(obj))
            if cached is None or (cached["metadata"].get("annotations") or {}).get(
                    REVISION_ANNOTATION) != meta["annotations"][REVISION_ANNOTATION]:
                self.informers[res].assume((await writes.apply(self.client, obj))[0])
        problems = []
        for res, obj in self.objects_of(name):
            if (res, key_of(obj)) not in wanted:
                await writes.delete(self.client, res, obj)
                problems.append(f"deleting {obj['kind']} {key_of(obj)}")
        for obj in objects:
            if resource_of(obj) == DAEMONSET:
                cached = self.informers[DAEMONSET].store.get(key_of(obj))
                if problem := rollout_problem(cached, obj):
                    problems.append(problem)
        return problems

    async def remove(self, name: str) -> bool:
        """Delete every object of the component; True if there was any."""
        found = self.objects_of(name)
        for res, obj in found:
            await writes.delete(self.client, res, obj)
        return bool(found)


def rollout_problem(cached: Obj | None, rendered: Obj) -> str | None:
    """Why a DaemonSet is not rolled out on every node it selects, or None when it is."""
    where = f"DaemonSet {key_of(rendered)}"
    if cached is None:
        return f"{where} is being created"
    status = cached.get("status") or {}
    if status.get("observedGeneration", 0) < cached["metadata"].get("generation", 0):
        return f"{where} is being updated"
    desired = status.get("desiredNumberScheduled", 0)
    available = status.get("numberAvailable", 0)
    updated = status.get("updatedNumberScheduled", 0)
    if available != desired or updated != desired:
        return f"{where}: {available} of {desired} pods available, {updated} updated"
    return None
