"""The maintenance operator's side of NodeMaintenance (maintenance.nvidia.com/v1alpha1), so that a
driver upgrade, an SR-IOV reconfiguration and any other requestor share one cordon and one drain
per node instead of each draining it on its own.

Each NodeMaintenance moves, as the reason of its Ready condition, Pending → Scheduled (within
maxParallelOperations and maxUnavailable of the MaintenanceOperatorConfig `default`) → Cordon →
WaitForPodCompletion → Draining → Ready. Deleting it releases the node (uncordon, finalizer off),
but while it is Ready only once no additional requestor is left. An object Ready for longer than
maxNodeMaintenanceTimeSeconds is deleted (garbage collection of a requestor that went away).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from nicop import logs
from nicop.api import maintenance as m
from nicop.kube import selectors
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.events import EventRecorder
from nicop.kube.manager import Controller, Manager, Result
from nicop.kube.node_pods import NodePods
from nicop.kube.resources import MAINTENANCE_CONFIG, NODE, NODE_MAINTENANCE, Obj, key_of
from nicop.kube.times import parse, stamp, utcnow
from nicop.operator.drain import pod_name, removable, requests_matching, scaled
from nicop.operator.drain import refusal as drain_refusal

log = logging.getLogger(__name__)

ACTIVE_RECHECK = 1.0
STALE_RECHECK = 60.0
UNDER_MAINTENANCE = (m.SCHEDULED, m.CORDON, m.WAIT_FOR_POD_COMPLETION, m.DRAINING, m.READY,
                     m.REQUESTOR_FAILED)


def reason_of(nm: Obj) -> str:
    """The Ready condition's reason: where the maintenance is ("" before it is seen)."""
    for condition in (nm.get("status") or {}).get("conditions") or []:
        if condition.get("type") == m.CONDITION_READY:
            return str(condition.get("reason") or "")
    return ""


def node_unavailable(node: Obj) -> bool:
    """Cordoned or not Ready: already out of service, so maintenance costs no availability."""
    if (node.get("spec") or {}).get("unschedulable"):
        return True
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") != "True" for c in conditions)


def drainable(pod: Obj, drain: Obj) -> bool:
    """Pods the drain deletes: removable, selected by its podSelector, and with
    podEvictionFilters only those requesting a matching resource."""
    if not removable(pod) or not selectors.matches_string(
            drain.get("podSelector") or "", pod["metadata"].get("labels") or {}):
        return False
    filters = [f["byResourceNameRegex"] for f in drain.get("podEvictionFilters") or []
               if f.get("byResourceNameRegex")]
    return not filters or requests_matching(pod, filters)


class MaintenanceController:
    KEY = "node-maintenance"

    def __init__(self, manager: Manager, namespace: str, recorder: EventRecorder) -> None:
        self.client: ApiClient = manager.client
        self.namespace = namespace
        self.recorder = recorder
        self.items = manager.informer(NODE_MAINTENANCE)
        self.configs = manager.informer(MAINTENANCE_CONFIG, namespace)
        self.nodes = manager.informer(NODE)
        self.controller = manager.add(Controller("node-maintenance", self.reconcile))
        self.node_pods = NodePods(manager, lambda ev, obj, old: self.wake())
        for informer in (self.items, self.configs):
            informer.on_change(lambda ev, obj, old: self.wake())
        self.nodes.on_change(self._node_changed)

    def wake(self) -> None:
        self.controller.queue.add(self.KEY)

    def _node_changed(self, event: str, node: Obj, old: Obj | None) -> None:
        """Availability changes what may be scheduled; nothing else of a node matters here."""
        if old is None or node_unavailable(node) != node_unavailable(old):
            self.wake()

    async def reconcile(self, key: str) -> Result | None:
        config = (self.configs.store.get(f"{self.namespace}/{m.CONFIG_NAME}") or {}).get(
            "spec") or {}
        items = sorted(self.items.store.items(), key=key_of)
        for nm in items:
            if nm["metadata"].get("deletionTimestamp"):
                await self._release(nm)
            elif not reason_of(nm):
                await self._set(nm, m.PENDING, "waiting for a slot of maxParallelOperations")
        # A deleted NodeMaintenance another requestor still holds keeps its node, and its slot.
        items = [nm for nm in self.items.store.items()
                 if not nm["metadata"].get("deletionTimestamp")
                 or m.FINALIZER in (nm["metadata"].get("finalizers") or [])]
        await self._schedule(items, config)
        watched = []
        for nm in sorted(self.items.store.items(), key=key_of):
            if nm["metadata"].get("deletionTimestamp"):
                continue
            reason = reason_of(nm)
            if reason in (m.WAIT_FOR_POD_COMPLETION, m.DRAINING):
                watched.append(nm["spec"]["nodeName"])
            await self._step(nm, reason)
        await self.node_pods.keep(watched)
        return await self._collect_garbage(config)

    # ------------------------------------------------------------------ scheduling
    async def _schedule(self, items: list[Obj], config: Obj) -> None:
        """Pending → Scheduled for as many nodes as the limits allow, ranked as upstream: a
        requestor already in maintenance first, then the requestor with fewer pending, then
        the oldest request."""
        pending = [nm for nm in items if reason_of(nm) == m.PENDING]
        if not pending:
            return
        nodes = {n["metadata"]["name"]: n for n in self.nodes.store.items()}
        total = len(nodes)
        busy = {nm["spec"]["nodeName"] for nm in items if reason_of(nm) in UNDER_MAINTENANCE}
        limit = scaled(config.get("maxParallelOperations", 1), total, round_up=True)
        slots = min(max(0, (limit or total) - len(busy)), total)
        unavailable = {name for name, n in nodes.items() if node_unavailable(n)} | busy
        if config.get("maxUnavailable") is not None:
            room = max(0, scaled(config["maxUnavailable"], total, round_up=False)
                       - len(unavailable))
        else:
            room = slots
        active = {nm["spec"]["requestorID"] for nm in items if reason_of(nm) in UNDER_MAINTENANCE}
        waiting: dict[str, int] = {}
        for nm in pending:
            waiting[nm["spec"]["requestorID"]] = waiting.get(nm["spec"]["requestorID"], 0) + 1

        def rank(nm: Obj) -> tuple[Any, ...]:
            requestor = nm["spec"]["requestorID"]
            score = (1000 if requestor in active else 0) + 100 - min(waiting[requestor], 100)
            return (-score, nm["metadata"].get("creationTimestamp", ""), nm["spec"]["nodeName"],
                    requestor, key_of(nm))

        chosen: set[str] = set()
        for nm in sorted(pending, key=rank):
            node = nm["spec"]["nodeName"]
            if slots <= 0:
                break
            if node in busy or node in chosen or node not in nodes:
                continue
            if node not in unavailable:
                if room <= 0:
                    continue
                room -= 1
            slots -= 1
            chosen.add(node)
            await self._set(nm, m.SCHEDULED, "scheduled")

    # ------------------------------------------------------------------ one step
    async def _step(self, nm: Obj, reason: str) -> None:
        spec = nm["spec"]
        node = self.nodes.store.get(spec["nodeName"])
        if reason == m.SCHEDULED:
            finalizers = nm["metadata"].get("finalizers") or []
            if m.FINALIZER not in finalizers:
                nm = await self.client.patch(NODE_MAINTENANCE, nm["metadata"]["name"], {
                    "metadata": {"finalizers": [*finalizers, m.FINALIZER],
                                 "resourceVersion": nm["metadata"]["resourceVersion"]}},
                    nm["metadata"]["namespace"])
            await self._set(nm, m.CORDON, "cordoning the node")
        elif reason == m.CORDON and node is not None:
            if spec.get("cordon", True):
                annotations = nm["metadata"].get("annotations") or {}
                if m.INITIAL_UNSCHEDULABLE_ANNOTATION not in annotations:
                    was = bool((node.get("spec") or {}).get("unschedulable"))
                    nm = await self._annotate(nm, {
                        m.INITIAL_UNSCHEDULABLE_ANNOTATION: str(was).lower()})
                if nm["metadata"]["annotations"][m.INITIAL_UNSCHEDULABLE_ANNOTATION] == "false":
                    await self._unschedulable(spec["nodeName"], True)
            await self._set(nm, m.WAIT_FOR_POD_COMPLETION, "waiting for pods to complete")
        elif reason == m.WAIT_FOR_POD_COMPLETION:
            await self._wait_for_pods(nm)
        elif reason == m.DRAINING:
            await self._drain(nm)

    async def _wait_for_pods(self, nm: Obj) -> None:
        wait = nm["spec"].get("waitForPodCompletion")
        if wait is None:
            await self._set(nm, m.DRAINING, "draining the node")
            return
        pods = self.node_pods.pods(nm["spec"]["nodeName"])
        if pods is None:
            return  # known once listed; the listing wakes this controller
        running = sorted(pod_name(p) for p in pods
                         if selectors.matches_string(wait.get("podSelector") or "",
                                                     p["metadata"].get("labels") or {})
                         and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))
        annotations = nm["metadata"].get("annotations") or {}
        started = annotations.get(m.WAIT_START_ANNOTATION)
        if started is None:
            nm = await self._annotate(nm, {m.WAIT_START_ANNOTATION: stamp()})
            started = stamp()
        timeout = int(wait.get("timeoutSeconds") or 0)
        elapsed = (utcnow() - (parse(started) or utcnow())).total_seconds()
        if running and not (timeout and elapsed >= timeout):
            await self._status(nm, {"waitForCompletion": running})
            return
        await self._status(nm, {"waitForCompletion": None})
        await self._set(nm, m.DRAINING, "draining the node")

    async def _drain(self, nm: Obj) -> None:
        drain = nm["spec"].get("drainSpec")
        if drain is None:
            await self._ready(nm)
            return
        pods = self.node_pods.pods(nm["spec"]["nodeName"])
        if pods is None:
            return
        remaining = sorted((p for p in pods if drainable(p, drain)), key=pod_name)
        status = (nm.get("status") or {}).get("drain") or {}
        evicting = status.get("evictionPods", len(remaining))
        waiting = []
        for pod in remaining:
            waiting.append(pod_name(pod))
            if pod["metadata"].get("deletionTimestamp"):
                continue
            refusal = drain_refusal(pod, bool(drain.get("force")),
                                    bool(drain.get("deleteEmptyDir")), "drainSpec")
            if refusal:
                waiting[-1] += f" ({refusal})"
                continue
            try:
                await self.client.evict(pod["metadata"]["name"], pod["metadata"]["namespace"])
            except ApiError as e:
                if e.code == 429:
                    waiting[-1] += f" ({'; '.join(e.causes) or 'a PodDisruptionBudget'})"
                elif e.code != 404:
                    raise
        progress = 100 if not evicting else max(0, (evicting - len(remaining)) * 100 // evicting)
        await self._status(nm, {"drain": {
            "totalPods": status.get("totalPods", len(pods)), "evictionPods": evicting,
            "drainProgress": progress, "waitForEviction": waiting}})
        if not remaining:
            await self._ready(nm)

    async def _ready(self, nm: Obj) -> None:
        nm = await self._annotate(nm, {m.READY_TIME_ANNOTATION: stamp()})
        await self._set(nm, m.READY, "the node is ready for maintenance")

    # ------------------------------------------------------------------ release
    async def _release(self, nm: Obj) -> None:
        """A deleted NodeMaintenance: once no other requestor shares a Ready one, uncordon the
        node as it was before and let the object go."""
        meta = nm["metadata"]
        if m.FINALIZER not in (meta.get("finalizers") or []):
            return
        if reason_of(nm) in (m.READY, m.REQUESTOR_FAILED) and nm["spec"].get(
                "additionalRequestors"):
            return  # the others still need the node; their removal wakes this controller
        node = nm["spec"]["nodeName"]
        if (meta.get("annotations") or {}).get(m.INITIAL_UNSCHEDULABLE_ANNOTATION) == "false" \
                and self.nodes.store.get(node) is not None:
            await self._unschedulable(node, False)
        finalizers = [f for f in meta.get("finalizers") or [] if f != m.FINALIZER]
        try:
            await self.client.patch(NODE_MAINTENANCE, meta["name"], {"metadata": {
                "finalizers": finalizers or None, "resourceVersion": meta["resourceVersion"]}},
                meta["namespace"])
        except ApiError as e:
            if e.code not in (404, 409):  # gone, or changed: the change brings it back
                raise
        log.info("node %s released", node, extra=logs.about("NodeMaintenance", key_of(nm)))

    async def _collect_garbage(self, config: Obj) -> Result | None:
        """Delete what has been Ready for longer than maxNodeMaintenanceTimeSeconds."""
        limit = timedelta(seconds=int(config.get("maxNodeMaintenanceTimeSeconds", 3600)))
        next_check = None
        busy = False
        for nm in self.items.store.items():
            meta = nm["metadata"]
            annotations = meta.get("annotations") or {}
            busy |= reason_of(nm) not in (m.READY, m.REQUESTOR_FAILED)
            ready = parse(annotations.get(m.READY_TIME_ANNOTATION))
            if ready is None or meta.get("deletionTimestamp") or \
                    annotations.get(m.GC_IGNORE_ANNOTATION) == "true":
                continue
            left = (ready + limit - utcnow()).total_seconds()
            if left <= 0:
                log.info("deleting a stale NodeMaintenance (Ready since %s)", stamp(ready),
                         extra=logs.about("NodeMaintenance", key_of(nm)))
                await self.client.delete(NODE_MAINTENANCE, meta["name"], meta["namespace"])
            else:
                next_check = min(left, next_check or left)
        if busy:
            return Result(requeue_after=ACTIVE_RECHECK)
        if next_check is not None:
            return Result(requeue_after=min(next_check + 1, STALE_RECHECK))
        return None

    # ------------------------------------------------------------------ writes
    async def _set(self, nm: Obj, reason: str, message: str) -> Obj:
        """The Ready condition with `reason` (True only for Ready), and a ConditionChanged
        Event, as the maintenance operator records each step."""
        condition = {"type": m.CONDITION_READY, "status": "True" if reason == m.READY else "False",
                     "reason": reason, "message": message, "lastTransitionTime": stamp(),
                     "observedGeneration": nm["metadata"].get("generation", 1)}
        others = [c for c in (nm.get("status") or {}).get("conditions") or []
                  if c.get("type") != m.CONDITION_READY]
        updated = await self._status(nm, {"conditions": [*others, condition]})
        await self.recorder.emit(nm, "Normal", "ConditionChanged", reason)
        log.info("%s -> %s", reason_of(nm) or "new", reason,
                 extra=logs.about("NodeMaintenance", key_of(nm)))
        return updated

    async def _status(self, nm: Obj, status: Obj) -> Obj:
        meta = nm["metadata"]
        updated = await self.client.patch(NODE_MAINTENANCE, meta["name"], {"status": status},
                                          meta["namespace"], subresource="status")
        self.items.assume(updated)
        return updated

    async def _annotate(self, nm: Obj, annotations: dict[str, str]) -> Obj:
        meta = nm["metadata"]
        updated = await self.client.patch(NODE_MAINTENANCE, meta["name"], {
            "metadata": {"annotations": annotations}}, meta["namespace"])
        self.items.assume(updated)
        return updated

    async def _unschedulable(self, node: str, value: bool) -> None:
        updated = await self.client.patch(NODE, node, {"spec": {"unschedulable": value or None}})
        self.nodes.assume(updated)
