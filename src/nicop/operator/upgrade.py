"""Rolling OFED driver upgrades, node by node, with the state kept on the nodes themselves.

Each node carries `nvidia.com/ofed-driver-upgrade-state` and moves
upgrade-required → cordon-required → wait-for-jobs-required → drain-required →
pod-restart-required → uncordon-required → upgrade-done (or upgrade-failed). Every reconcile
reads the cluster and moves each node at most one step, so a restarted operator resumes where
the labels say it was. New nodes start only while both `maxParallelUpgrades` and nicop's
`maxUnavailable` (which counts nodes already unavailable for other reasons) leave room, counted
as upstream counts them: a failed node keeps its slot until its driver recovers.

Each driver pool upgrades by its own policy's `ofedDriver.upgradePolicy`: the NicClusterPolicy's
nodes by it, each NicNodePolicy's nodes (its pods carry `ds-owner: nnp-<name>`) by that
NicNodePolicy's, with slots counted within the pool.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from prometheus_client import Counter

from nicop import logs
from nicop.api.labels import (
    DRIVER_LABEL,
    MOFED_WAIT_LABEL,
    OWNER_LABEL,
    OWNER_VALUE,
    POLICY_NAME,
    SAFE_LOAD_ANNOTATION,
)
from nicop.api.labels import STATE_LABEL as COMPONENT_LABEL
from nicop.api.maintenance import READY
from nicop.api.mellanox import (
    DrainSpec,
    DriverUpgradePolicySpec,
    WaitForCompletionSpec,
)
from nicop.api.nodes import labels_of
from nicop.api.upgrade import (
    ALLOCATABLE_ANNOTATION,
    ATTEMPTS_ANNOTATION,
    CORDON,
    DONE,
    DRAIN,
    DRAIN_BLOCKED_ANNOTATION,
    DRAIN_SKIP_LABEL,
    DRAIN_START_ANNOTATION,
    FAILED,
    FAILED_IN_ANNOTATION,
    FAILURE_ANNOTATION,
    HOLDS_SLOT,
    IN_PROGRESS,
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    LEGACY_STATE_ANNOTATION,
    MANAGED,
    NODE_MAINTENANCE,
    POD_RESTART,
    REQUESTED_ANNOTATION,
    REQUESTOR_MODE_ANNOTATION,
    REQUIRED,
    RETRY_ANNOTATIONS,
    RETRY_AT_ANNOTATION,
    SKIP_LABEL,
    STATE_LABEL,
    UNCORDON,
    WAIT_FOR_JOBS,
    WAIT_START_ANNOTATION,
    attempts,
    held_reload,
)
from nicop.backoff import doubling
from nicop.kube import selectors
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.events import EventRecorder
from nicop.kube.manager import Controller, Manager, Result
from nicop.kube.memo import PerObject
from nicop.kube.node_pods import NodePods
from nicop.kube.resources import CONTROLLER_REVISION, DAEMONSET, NODE, POD, Obj, quantity
from nicop.kube.resources import NIC_CLUSTER_POLICY as NCP
from nicop.kube.scheduling import daemon_pod_filter
from nicop.kube.times import parse, stamp, utcnow
from nicop.operator import metrics
from nicop.operator.drain import evictable, max_unavailable, pod_name
from nicop.operator.drain import refusal as drain_refusal
from nicop.operator.maintenance import reason_of
from nicop.operator.maintenance_requestor import (
    Requestor,
    RequestorOptions,
    maintenance_spec,
)
from nicop.operator.node_policy import NNP, selects
from nicop.operator.states.base import RenderError, typed
from nicop.operator.templates import what_runs

log = logging.getLogger(__name__)

TRANSITIONS = Counter("nicop_upgrade_transitions_total",
                      "Driver upgrade state changes of nodes, by new state", ["state"])

MAX_DRIVER_RESTARTS = 10
# A failed node is retried this many times, after RETRY_BACKOFF seconds doubled each time, then
# waits for `nicop upgrade retry` (operator env NICOP_UPGRADE_RETRIES, NICOP_UPGRADE_RETRY_BACKOFF).
RETRIES = 3
RETRY_BACKOFF = 60.0
# A restarted driver pod not Ready after this long fails its node (NICOP_UPGRADE_READY_TIMEOUT):
# past the 20 minutes upstream's startup probe allows for a build.
READY_TIMEOUT = 1800.0
# How long a node stays cordoned after its driver is ready, for the components that wait for the
# driver (device plugins: mofed.wait) to be ready there again; then it is uncordoned anyway,
# with a Warning naming them.
COMPONENTS_TIMEOUT = 300.0
# A real kubelet posts a change of its allocatable devices at its next node status update (every
# 10 s, nodeStatusUpdateFrequency), after the plugin saw it (nicop's rescan at rest: 5 s). Until
# that long after its driver is ready, a node's allocatable may still show the devices as they
# were before the reload while the plugin already reports them unhealthy: not yet read as back.
DEVICES_SETTLE = 20.0
ACTIVE_RECHECK = 1.0
STEP_CONCURRENCY = 32


def _elapsed(since: str | None) -> float:
    started = parse(since)
    return (utcnow() - started).total_seconds() if started else 0.0


@dataclass
class NodeView:
    """What one reconcile knows about a node that runs a driver pod."""

    node: Obj
    pod: Obj | None  # None while the driver pod is being replaced
    in_sync: bool
    pool: str = OWNER_VALUE  # whose driver pool: NicClusterPolicy or nnp-<name>
    # The DaemonSet's current revision, when the pod runs an older one that runs the same
    # driver (see UpgradeController._relabel).
    relabel: str | None = None
    # Read once: every reconcile looks at every node's state several times.
    name: str = field(init=False)
    labels: dict[str, str] = field(init=False)
    annotations: dict[str, str] = field(init=False)
    state: str = field(init=False)

    def __post_init__(self) -> None:
        self.update(self.node)

    def update(self, node: Obj) -> None:
        """The node as the API server returned it after a write."""
        self.node = node
        meta = node["metadata"]
        self.name = str(meta["name"])
        self.labels = meta.get("labels") or {}
        self.annotations = meta.get("annotations") or {}
        self.state = self.labels.get(STATE_LABEL, "")

    @property
    def unschedulable(self) -> bool:
        return bool((self.node.get("spec") or {}).get("unschedulable"))

    @property
    def wants_upgrade(self) -> bool:
        """Its pod is not the DaemonSet's current one, or a safe load or an upgrade is asked."""
        ann = self.annotations
        return (not self.in_sync or ann.get(SAFE_LOAD_ANNOTATION) == "true"
                or ann.get(REQUESTED_ANNOTATION) == "true")

    @property
    def settled(self) -> bool:
        return (self.state == DONE and self.pod is not None and not self.wants_upgrade
                and LEGACY_STATE_ANNOTATION not in self.annotations)

    @property
    def not_ready(self) -> bool:
        """Its Ready condition says otherwise (a node without one is not counted as down)."""
        conditions = (self.node.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") != "True" for c in conditions)


@dataclass
class Plan:
    """A pool's upgradePolicy as its model, defaults applied (drain on, 300 s); `problem` names
    a field that is not valid (a pod selector Kubernetes would refuse), which holds the pool's
    upgrade."""

    spec: DriverUpgradePolicySpec
    policy: Obj
    drain: DrainSpec = field(init=False)
    wait: WaitForCompletionSpec = field(init=False)
    problem: str | None = None

    def __post_init__(self) -> None:
        self.drain = self.spec.drain or DrainSpec()
        self.wait = self.spec.wait_for_completion or WaitForCompletionSpec()
        for path, selector in (("drain", self.drain.pod_selector),
                               ("waitForCompletion", self.wait.pod_selector)):
            try:
                selectors.parse(selector or "")
            except selectors.SelectorError as e:
                self.problem = (f"spec.ofedDriver.upgradePolicy.{path}.podSelector: {e}; no "
                                "node of this policy is upgraded until it is a valid selector")


def automatic_plan(policy: Obj) -> Plan | None:
    """The pool's plan when its policy asks for automatic upgrades (derived once per version of
    the policy, see UpgradeController._plans); a value the model refuses holds the pool."""
    raw = ((policy.get("spec") or {}).get("ofedDriver") or {}).get("upgradePolicy") or {}
    if not raw.get("autoUpgrade"):
        return None
    try:
        return Plan(typed(DriverUpgradePolicySpec, raw, "spec.ofedDriver.upgradePolicy"), policy)
    except RenderError as e:
        return Plan(DriverUpgradePolicySpec(auto_upgrade=True), policy,
                    problem=f"{e}; no node of this policy is upgraded until it is valid")


def upgrade_slots(views: list[NodeView], max_parallel: int, max_unavailable_value: Any) -> int:
    """How many more nodes may start, counted as upstream's upgrade library counts them
    (k8s-operator-libs pkg/upgrade/common_manager.go, GetUpgradesAvailable): every node past
    upgrade-required and not done holds a slot, an upgrade-failed one included."""
    managed = [v for v in views if v.state in MANAGED]
    in_progress = sum(v.state in HOLDS_SLOT for v in managed)
    waiting = sum(v.state == REQUIRED for v in managed)
    slots = waiting if max_parallel == 0 else max_parallel - in_progress
    limit = max_unavailable(max_unavailable_value, len(managed))
    # Nodes about to be cordoned count as unavailable already.
    unavailable = sum(v.unschedulable or v.not_ready for v in views) + sum(
        v.state == CORDON for v in views)
    slots = min(slots, limit)
    if unavailable >= limit:
        return 0
    if limit < len(managed) and unavailable + slots > limit:
        return limit - unavailable
    return slots


def nodes_to_start(views: list[NodeView], max_parallel: int,
                   max_unavailable_value: Any) -> list[NodeView]:
    """The waiting nodes that move on now, in name order: one per free slot, and a node that
    was cordoned before its upgrade even without one (it costs no further availability), as
    upstream's in-place manager does (k8s-operator-libs pkg/upgrade/upgrade_inplace.go)."""
    free = upgrade_slots(views, max_parallel, max_unavailable_value)
    started = []
    for view in views:
        if view.state != REQUIRED or view.labels.get(SKIP_LABEL) == "true":
            continue
        if free <= 0 and not view.unschedulable:
            continue
        started.append(view)
        free -= 1
    return started


class UpgradeController:
    KEY = "ofed-driver-upgrade"

    def __init__(self, manager: Manager, namespace: str, recorder: EventRecorder,
                 retries: int = RETRIES, retry_backoff: float = RETRY_BACKOFF,
                 ready_timeout: float = READY_TIMEOUT,
                 requestor: RequestorOptions | None = None,
                 devices_settle: float = DEVICES_SETTLE) -> None:
        self.client: ApiClient = manager.client
        self.recorder = recorder
        self.retries = retries
        self.retry_backoff = retry_backoff
        self.ready_timeout = ready_timeout
        self.devices_settle = devices_settle
        self.policies = manager.informer(NCP)
        self.node_policies = manager.informer(NNP)
        self._pools: dict[str, str] = {}  # node -> the pool its driver pod was last seen in
        self._reported: dict[str, str] = {}  # pool -> the plan problem already recorded
        self._automatic = PerObject(automatic_plan)
        self._view_cache: dict[str, NodeView] = {}  # by node name, see _views
        self._revisions_seen: dict[str, str] = {}
        # What each revision's driver runs, by (DaemonSet uid, revision hash).
        self._runs: dict[tuple[str, str], Obj] = {}
        self.nodes = manager.informer(NODE)
        self.driver_pods = manager.informer(POD, namespace, label_selector=DRIVER_LABEL)
        self.revisions = manager.informer(CONTROLLER_REVISION, namespace,
                                          label_selector=DRIVER_LABEL)
        self.namespace = namespace
        self.components = manager.informer(DAEMONSET, namespace, label_selector=COMPONENT_LABEL)
        # Workload pods only of nodes waiting for their jobs or draining.
        self.node_pods = NodePods(manager, lambda ev, obj, old: self.controller.queue.add(
            self.KEY))
        self.controller = manager.add(Controller("ofed-upgrade", self.reconcile))
        # A driver pod's change moves its node on at once (a rollout is a chain of them); with
        # settled nodes skipped, a reconcile costs little even on a big cluster.
        for informer in (self.policies, self.node_policies, self.revisions):
            informer.on_change(lambda ev, obj, old: self.controller.queue.add(self.KEY))
        self.driver_pods.on_change(self._driver_pod_changed)
        self.nodes.on_change(self._node_changed)
        # Requestor mode: a maintenance operator cordons and drains (NodeMaintenance).
        self.requestor = None if requestor is None else Requestor(
            manager, requestor, lambda: self.controller.queue.add(self.KEY))

    def _node_changed(self, event: str, node: Obj, old: Obj | None) -> None:
        """The upgrade's labels and annotations and the node's spec matter, and the allocatable
        devices of a node waiting to be uncordoned; the rest (mofed.wait on every node,
        annotations the cluster's own controllers keep renewing) does not."""
        if old is None or event == "DELETED" or _upgrade_marks(node) != _upgrade_marks(old) \
                or node.get("spec") != old.get("spec") \
                or (labels_of(node).get(STATE_LABEL) == UNCORDON
                    and devices_of(node) != devices_of(old)):
            self.controller.queue.add(self.KEY)

    def _driver_pod_changed(self, event: str, pod: Obj, old: Obj | None) -> None:
        """A driver pod of a node mid-upgrade moves it on at once; those of the other nodes
        (a first rollout: a thousand pods turning ready) are taken a burst at a time."""
        node = self.nodes.store.get((pod.get("spec") or {}).get("nodeName") or "")
        if node and (node["metadata"].get("labels") or {}).get(STATE_LABEL, "") not in ("", DONE):
            self.controller.queue.add(self.KEY)
        else:
            self.controller.queue.add_batched(self.KEY)

    # ------------------------------------------------------------------ reconcile
    async def reconcile(self, key: str) -> Result | None:
        plans = self._plans()
        views = self._views()
        for view in views:
            if view.relabel:
                await self._relabel(view)
        await self.node_pods.keep(v.name for v in views if v.pool in plans
                                  and v.state in (WAIT_FOR_JOBS, DRAIN, UNCORDON))
        # A pool without automatic upgrades: drop its state labels, uncordon what nicop cordoned.
        for view in views:
            if view.pool not in plans and STATE_LABEL in view.labels:
                await self._clean_up(view)
        if not plans:
            metrics.upgrade_states(labels_of(n).get(STATE_LABEL, "")
                                   for n in self.nodes.store.items())
            return None
        # Nodes are independent until new ones are let in, so they move concurrently: a large
        # rollout is bounded by API round trips, not by one node waiting for the next.
        limit = asyncio.Semaphore(STEP_CONCURRENCY)
        held = await self._held(plans)

        async def step(view: NodeView) -> bool:
            async with limit:
                if LEGACY_STATE_ANNOTATION in view.annotations:
                    await self._patch(view, annotations={LEGACY_STATE_ANNOTATION: None})
                if view.labels.get(SKIP_LABEL) == "true" or view.pool in held:
                    return False
                return await self._step(view, plans[view.pool])

        # A settled node (done, its pod current) has nothing to do: no task for it, so a
        # reconcile of a thousand settled nodes stays cheap.
        upgrading = [v for v in views if v.pool in plans]
        moved = any(await asyncio.gather(*(step(v) for v in upgrading if not v.settled)))
        if moved:  # the moves are in the cache: start new ones from there
            upgrading = [v for v in self._views() if v.pool in plans]
        for pool, plan in plans.items():
            if pool not in held:
                moved |= await self._start_new([v for v in upgrading if v.pool == pool], plan)
        # From the views: a node moved now is counted in its new state by the next reconcile,
        # which a move always brings.
        metrics.upgrade_states(v.state for v in views)
        active = moved or any(v.state not in ("", DONE) for v in upgrading)
        return Result(requeue_after=ACTIVE_RECHECK) if active else None

    async def _held(self, plans: dict[str, Plan]) -> set[str]:
        """The pools whose plan has a problem: nothing moves there. Each problem is logged and
        recorded on its policy once (InvalidUpgradePolicy)."""
        held = set()
        for pool, plan in plans.items():
            if plan.problem is None:
                continue
            held.add(pool)
            if self._reported.get(pool) != plan.problem:
                log.error("%s", plan.problem, extra=logs.about(
                    plan.policy["kind"], plan.policy["metadata"]["name"]))
                await self.recorder.emit(plan.policy, "Warning", "InvalidUpgradePolicy",
                                         plan.problem)
            self._reported[pool] = plan.problem
        for pool in set(self._reported) - held:
            del self._reported[pool]
        return held

    def _plans(self) -> dict[str, Plan]:
        """The driver pools whose policy asks for automatic upgrades, by pool (ds-owner)."""
        cluster = self.policies.store.get(POLICY_NAME)
        policies = ([cluster] if cluster else []) + list(self.node_policies.store.items())
        return {OWNER_VALUE if policy["kind"] == NCP.kind else f"nnp-{policy['metadata']['name']}":
                plan for policy, plan in self._automatic.each(policies) if plan is not None}

    def _pool_of(self, node: Obj) -> str:
        """The pool of a node whose driver pod is being replaced: where its pod was last seen,
        else the NicNodePolicy whose driver section selects it when the NicClusterPolicy has
        none (with both, the NicClusterPolicy's driver is the one rendered there)."""
        name = node["metadata"]["name"]
        if name in self._pools:
            return self._pools[name]
        cluster = self.policies.store.get(POLICY_NAME)
        if not ((cluster or {}).get("spec") or {}).get("ofedDriver"):
            for policy in self.node_policies.store.items():
                if (policy.get("spec") or {}).get("ofedDriver") and selects(policy, node):
                    return f"nnp-{policy['metadata']['name']}"
        return OWNER_VALUE

    def _views(self) -> list[NodeView]:
        """A view of every node that runs or ran a driver pod, in name order. A node and pod
        unchanged since the last reconcile keep their view: a rollout reconciles often, and
        most of a big cluster's nodes are the same objects each time."""
        current: dict[str, str] = {}  # DaemonSet uid -> hash of its newest revision
        newest: dict[str, int] = {}
        revisions = self.revisions.store.items()
        for rev in revisions:
            for ref in rev["metadata"].get("ownerReferences") or []:
                if rev.get("revision", 0) >= newest.get(ref["uid"], -1):
                    newest[ref["uid"]] = rev.get("revision", 0)
                    current[ref["uid"]] = (rev["metadata"].get("labels") or {}).get(
                        "controller-revision-hash", "")
        if current != self._revisions_seen:
            self._revisions_seen, self._view_cache = current, {}
            self._runs = {
                (ref["uid"], (rev["metadata"].get("labels") or {}).get(
                    "controller-revision-hash", "")):
                what_runs(((rev.get("data") or {}).get("spec") or {}).get("template") or {})
                for rev in revisions for ref in rev["metadata"].get("ownerReferences") or []}
        cache, self._view_cache = self._view_cache, {}
        pods = {(p.get("spec") or {}).get("nodeName"): p for p in self.driver_pods.store.items()}
        views = []
        for name in sorted(self.nodes.store.keys()):
            node = self.nodes.store.get(name)
            if node is None:
                continue
            pod = pods.get(name)
            view = cache.get(name)
            if view is None or view.pod is None or view.node is not node or view.pod is not pod:
                view = self._view(node, pod, current)
                if view is None:
                    continue
            self._view_cache[name] = view
            views.append(view)
        return views

    def _view(self, node: Obj, pod: Obj | None, current: dict[str, str]) -> NodeView | None:
        # A node mid-upgrade counts even while its driver pod is being replaced.
        if pod is None and STATE_LABEL not in (node["metadata"].get("labels") or {}):
            return None
        if pod is None:
            return NodeView(node, None, False, self._pool_of(node))
        pool = (pod["metadata"].get("labels") or {}).get(OWNER_LABEL, OWNER_VALUE)
        self._pools[node["metadata"]["name"]] = pool
        owner = next((r["uid"] for r in pod["metadata"].get("ownerReferences") or []
                      if r.get("kind") == "DaemonSet"), None)
        pod_hash = (pod["metadata"].get("labels") or {}).get("controller-revision-hash")
        newest = current.get(owner or "")
        if owner is None or pod_hash == newest:
            return NodeView(node, pod, owner is not None, pool)
        ran = self._runs.get((owner, pod_hash or ""))
        same = ran is not None and ran == self._runs.get((owner, newest or ""))
        return NodeView(node, pod, same, pool, relabel=newest if same else None)

    async def _step(self, view: NodeView, plan: Plan) -> bool:
        """Move one node at most one state; True when it moved."""
        state = view.state
        if view.pod is None and state in ("", DONE, REQUIRED, POD_RESTART, FAILED):
            return False  # nothing to compare or restart until the DaemonSet makes a pod
        wants_upgrade = view.wants_upgrade
        if state in ("", DONE):
            if wants_upgrade:
                initial = {INITIAL_UNSCHEDULABLE_ANNOTATION: "true"} if view.unschedulable else {}
                return await self._set(view, REQUIRED, annotations=initial)
            return await self._set(view, DONE) if state == "" else False
        if state == REQUIRED:
            if not wants_upgrade:
                return await self._set(view, DONE)
            if self.requestor is not None and await self.requestor.request(
                    view.name, self.requestor.requestor_id(view.pool),
                    maintenance_spec(plan.spec)):  # the maintenance operator limits how many
                return await self._set(view, NODE_MAINTENANCE,
                                       annotations={REQUESTOR_MODE_ANNOTATION: "true"})
            return False
        if state == NODE_MAINTENANCE:
            me = self.requestor.requestor_id(view.pool) if self.requestor else ""
            nm = self.requestor.held(view.name, me) if self.requestor else None
            if nm is None:
                return await self._set(view, REQUIRED)  # asked again from there
            if reason_of(nm) == READY:
                return await self._set(view, POD_RESTART,
                                       annotations={DRAIN_BLOCKED_ANNOTATION: None})
            blocked = maintenance_blocked(nm)
            if view.annotations.get(DRAIN_BLOCKED_ANNOTATION) != blocked:
                await self._patch(view, annotations={DRAIN_BLOCKED_ANNOTATION: blocked})
            return False
        if state == CORDON:
            await self._patch(view, spec={"unschedulable": True})
            return await self._set(view, WAIT_FOR_JOBS)
        if state == WAIT_FOR_JOBS:
            return await self._wait_for_jobs(view, plan)
        if state == DRAIN:
            return await self._drain(view, plan)
        if state == POD_RESTART:
            return await self._restart_driver(view)
        if state == FAILED:
            if view.in_sync and view.pod and _pod_ready(view.pod):
                return await self._set(view, UNCORDON, annotations={FAILURE_ANNOTATION: None})
            retry_at = view.annotations.get(RETRY_AT_ANNOTATION)
            if retry_at and _elapsed(retry_at) >= 0:
                return await self._retry(view)
            return False
        if state == UNCORDON:
            if not await self._components_back(view):
                return False
            if view.annotations.get(REQUESTOR_MODE_ANNOTATION) == "true":
                # The maintenance operator uncordons once no requestor holds the node.
                await self._release(view)
                return await self._set(view, DONE, annotations={
                    REQUESTOR_MODE_ANNOTATION: None, INITIAL_UNSCHEDULABLE_ANNOTATION: None,
                    REQUESTED_ANNOTATION: None})
            if view.annotations.get(INITIAL_UNSCHEDULABLE_ANNOTATION) != "true":
                await self._patch(view, spec={"unschedulable": False})
            return await self._set(view, DONE, annotations={
                INITIAL_UNSCHEDULABLE_ANNOTATION: None, REQUESTED_ANNOTATION: None})
        return False

    async def _components_back(self, view: NodeView) -> bool:
        """Whether the node may take workloads again: every component that waits for the driver
        (a DaemonSet selecting mofed.wait=false, such as the device plugins) and runs there has
        a ready pod on it, and its device resources are as allocatable as before the reload (a
        plugin whose pod stayed, such as the SR-IOV one, reports its VFs unhealthy while the
        links are down). Uncordoned when the driver alone is ready, the scheduler places pods
        by the node's last allocatable while the devices are still coming back, and the kubelet
        fails them (UnexpectedAdmissionError)."""
        pods = self.node_pods.pods(view.name)
        if pods is None:
            return False  # known once listed; the listing wakes this controller
        ready_at = ready_since(view.pod)
        pending = [*components_pending(view.node, self.components.store.items(), pods,
                                       self.namespace), *devices_missing(view.node)]
        if not pending:  # the active upgrade rechecks every second until settled
            return devices_settled(view.node, ready_at, self.devices_settle)
        if not ready_at or _elapsed(ready_at) < COMPONENTS_TIMEOUT:
            return False
        await self.recorder.emit(view.node, "Warning", "ComponentsNotReady",
                                 f"uncordoned {COMPONENTS_TIMEOUT:.0f}s after its driver was "
                                 f"ready, still waiting for {', '.join(pending)}")
        return True

    async def _start_new(self, views: list[NodeView], plan: Plan) -> bool:
        """Let waiting nodes begin while maxParallelUpgrades and maxUnavailable allow."""
        if self.requestor is not None or not any(v.state == REQUIRED for v in views):
            return False  # nobody waits: no slots to count
        moved = False
        for view in nodes_to_start(views, plan.spec.max_parallel_upgrades,
                                   plan.spec.max_unavailable):
            moved |= await self._set(view, CORDON)
        return moved

    async def _wait_for_jobs(self, view: NodeView, plan: Plan) -> bool:
        selector = plan.wait.pod_selector
        timeout = plan.wait.timeout_seconds
        if selector:
            pods = self.node_pods.pods(view.name)
            if pods is None:
                return False  # known once listed; the listing wakes this controller
            running = [p for p in pods
                       if selectors.matches_string(selector, p["metadata"].get("labels") or {})
                       and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
            started = view.annotations.get(WAIT_START_ANNOTATION)
            if running and not (timeout and _elapsed(started) >= timeout):
                if not started:
                    await self._patch(view, annotations={WAIT_START_ANNOTATION: stamp()})
                    return True
                return False
        return await self._set(view, DRAIN, annotations={WAIT_START_ANNOTATION: None})

    async def _drain(self, view: NodeView, plan: Plan) -> bool:
        if not plan.drain.enable:
            return await self._set(view, POD_RESTART)
        pods = self.node_pods.pods(view.name)
        if pods is None:
            return False  # known once listed; the listing wakes this controller
        started = view.annotations.get(DRAIN_START_ANNOTATION)
        if not started:
            await self._patch(view, annotations={DRAIN_START_ANNOTATION: stamp()})
        selector = plan.drain.pod_selector or ""
        blocked: list[str] = []
        remaining = []
        for pod in pods:
            if not evictable(pod, selector):
                continue
            name = pod_name(pod)
            remaining.append(name)
            if pod["metadata"].get("deletionTimestamp"):
                continue
            refusal = drain_refusal(pod, plan.drain.force, plan.drain.delete_empty_dir,
                                    "ofedDriver.upgradePolicy.drain")
            if refusal:
                return await self._fail(view, f"cannot drain: pod {name} {refusal}")
            try:
                await self.client.evict(pod["metadata"]["name"], pod["metadata"]["namespace"])
            except ApiError as e:
                if e.code == 429:
                    why = "; ".join(e.causes) or "blocked by a PodDisruptionBudget"
                    blocked.append(f"{name} ({why})")
                elif e.code != 404:
                    raise
        if not remaining:
            return await self._set(view, POD_RESTART, annotations={
                DRAIN_START_ANNOTATION: None, DRAIN_BLOCKED_ANNOTATION: None})
        timeout = plan.drain.timeout_seconds
        if timeout and _elapsed(started) >= timeout:
            still = blocked or remaining
            return await self._fail(view, f"drain timed out after {timeout}s; still on the node: "
                                    + ", ".join(still))
        began = parse(started)
        if blocked and began is not None:
            text = ", ".join(blocked) + (
                f"; the drain times out at {stamp(began + timedelta(seconds=timeout))}"
                if timeout else "; the drain has no timeout")
            if view.annotations.get(DRAIN_BLOCKED_ANNOTATION) != text:
                await self._patch(view, annotations={DRAIN_BLOCKED_ANNOTATION: text})
        return not started

    async def _restart_driver(self, view: NodeView) -> bool:
        pod = view.pod
        assert pod is not None
        if not view.in_sync:
            if not pod["metadata"].get("deletionTimestamp"):
                await self._note_devices(view)
                await self.client.delete(POD, pod["metadata"]["name"],
                                         pod["metadata"]["namespace"])
                return True
            return False
        if view.annotations.get(SAFE_LOAD_ANNOTATION):
            await self._note_devices(view)
            await self._patch(view, annotations={SAFE_LOAD_ANNOTATION: None})
            return True
        if _pod_ready(pod):
            return await self._set(view, UNCORDON)
        restarts = max((c.get("restartCount", 0)
                        for c in (pod.get("status") or {}).get("containerStatuses") or []),
                       default=0)
        name = pod["metadata"]["name"]
        if restarts > MAX_DRIVER_RESTARTS:
            return await self._fail(view, f"driver pod {name} restarted {restarts} times "
                                    "without becoming ready")
        if _elapsed(pod["metadata"].get("creationTimestamp")) >= self.ready_timeout:
            held = "; ".join(h["cause"] for h in held_reload(view.node))
            return await self._fail(view, f"driver pod {name} not ready after "
                                    f"{self.ready_timeout:.0f}s"
                                    + (f"; its agent holds the reload: {held}" if held else ""))
        return False

    async def _note_devices(self, view: NodeView) -> None:
        """Before the driver reloads: the node's allocatable devices, to wait for after it (the
        first note stays through retries: it is the node before any reload)."""
        if ALLOCATABLE_ANNOTATION not in view.annotations:
            await self._patch(view, annotations={
                ALLOCATABLE_ANNOTATION: json.dumps(devices_of(view.node), sort_keys=True)})

    async def _fail(self, view: NodeView, reason: str) -> bool:
        """upgrade-failed, with the attempt counted and the next retry due after a back-off
        that doubles; with no retry left the node waits for `nicop upgrade retry`."""
        failed = attempts(view.node) + 1
        retry_at = None
        if failed <= self.retries:
            delay = doubling(self.retry_backoff, failed - 1)
            retry_at = stamp(utcnow() + timedelta(seconds=delay))
            then = f"attempt {failed} of {self.retries + 1}; retried in {delay:.0f}s"
        else:
            then = (f"attempt {failed} of {self.retries + 1}, no automatic retry left; after "
                    f"fixing the cause: nicop upgrade retry {view.name}")
        await self.recorder.emit(view.node, "Warning", "DriverUpgradeFailed",
                                 f"{reason} ({then})")
        log.warning("upgrade failed: %s (%s)", reason, then, extra=logs.about("Node", view.name))
        return await self._set(view, FAILED, annotations={
            FAILURE_ANNOTATION: reason, DRAIN_START_ANNOTATION: None,
            DRAIN_BLOCKED_ANNOTATION: None,
            ATTEMPTS_ANNOTATION: str(failed), RETRY_AT_ANNOTATION: retry_at,
            FAILED_IN_ANNOTATION: view.state})

    async def _retry(self, view: NodeView) -> bool:
        """Back to the state the node failed in; a driver pod that did not get ready starts
        anew (its restarts counted from zero)."""
        state = view.annotations.get(FAILED_IN_ANNOTATION) or POD_RESTART
        pod = view.pod
        if state == POD_RESTART and pod is not None and not pod["metadata"].get(
                "deletionTimestamp"):
            await self.client.delete(POD, pod["metadata"]["name"], pod["metadata"]["namespace"])
        message = f"retrying the driver upgrade from {state} (attempt {attempts(view.node) + 1})"
        await self.recorder.emit(view.node, "Normal", "DriverUpgradeRetry", message)
        log.info("%s", message, extra=logs.about("Node", view.name))
        return await self._set(view, state, annotations={RETRY_AT_ANNOTATION: None,
                                                         FAILURE_ANNOTATION: None})

    async def _set(self, view: NodeView, state: str,
                   annotations: Mapping[str, str | None] | None = None) -> bool:
        log.info("%s -> %s", view.state or "unknown", state, extra=logs.about("Node", view.name))
        annotations = dict(annotations or {})
        if state == DONE:  # a success: attempts count anew
            annotations.update({k: None for k in (*RETRY_ANNOTATIONS, FAILURE_ANNOTATION,
                                                  ALLOCATABLE_ANNOTATION)
                                if k in view.annotations})
        await self._patch(view, labels={STATE_LABEL: state}, annotations=annotations)
        TRANSITIONS.labels(state).inc()
        return True

    async def _patch(self, view: NodeView, *, labels: Mapping[str, str | None] | None = None,
                     annotations: Mapping[str, str | None] | None = None,
                     spec: Obj | None = None) -> None:
        meta: Obj = {}
        if labels:
            meta["labels"] = dict(labels)
        if annotations:
            meta["annotations"] = dict(annotations)
        body: Obj = {"metadata": meta}
        if spec:
            body["spec"] = spec
        updated = await self.client.patch(NODE, view.name, body)
        self.nodes.assume(updated)
        view.update(updated)

    async def _relabel(self, view: NodeView) -> None:
        """The DaemonSet's template changed, but not in what the driver container runs (only
        labels, annotations, probes, placement): the pod is marked as of the current revision
        instead of being restarted, which would reload the driver. The DaemonSet then counts
        it as updated, as `kubectl rollout status` and the policy's readiness read it."""
        assert view.pod is not None and view.relabel is not None
        meta = view.pod["metadata"]
        try:
            pod = await self.client.patch(POD, meta["name"], {"metadata": {"labels": {
                "controller-revision-hash": view.relabel}}}, meta.get("namespace"))
        except ApiError as e:
            if e.code != 404:  # a pod gone meanwhile needs no label
                raise
            return
        self.driver_pods.assume(pod)
        view.relabel = None
        log.info("driver pod %s runs the same driver as revision %s: marked current, not "
                 "restarted", meta["name"], pod["metadata"]["labels"]["controller-revision-hash"],
                 extra=logs.about("Node", view.name))

    async def _release(self, view: NodeView) -> None:
        if self.requestor is not None:
            await self.requestor.release(view.name, self.requestor.requestor_id(view.pool))

    async def _clean_up(self, view: NodeView) -> None:
        """Upgrades off for the node's pool: drop its state label, uncordon it if nicop
        cordoned it."""
        annotations = view.annotations
        spec = None
        if annotations.get(REQUESTOR_MODE_ANNOTATION) == "true":
            await self._release(view)
        elif (view.state in (*IN_PROGRESS, FAILED)
                and annotations.get(INITIAL_UNSCHEDULABLE_ANNOTATION) != "true"):
            spec = {"unschedulable": False}
        await self._patch(view, labels={STATE_LABEL: None}, spec=spec, annotations={
            k: None for k in (INITIAL_UNSCHEDULABLE_ANNOTATION, WAIT_START_ANNOTATION,
                              DRAIN_START_ANNOTATION, DRAIN_BLOCKED_ANNOTATION,
                              FAILURE_ANNOTATION, REQUESTOR_MODE_ANNOTATION,
                              ALLOCATABLE_ANNOTATION, *RETRY_ANNOTATIONS)
            if k in annotations})


# What the upgrade reads of a node's metadata (see _node_changed).
UPGRADE_LABELS = (STATE_LABEL, SKIP_LABEL, DRAIN_SKIP_LABEL)
UPGRADE_ANNOTATIONS = (SAFE_LOAD_ANNOTATION, REQUESTED_ANNOTATION, LEGACY_STATE_ANNOTATION,
                       INITIAL_UNSCHEDULABLE_ANNOTATION, WAIT_START_ANNOTATION,
                       DRAIN_START_ANNOTATION, DRAIN_BLOCKED_ANNOTATION, FAILURE_ANNOTATION,
                       REQUESTOR_MODE_ANNOTATION, ALLOCATABLE_ANNOTATION, *RETRY_ANNOTATIONS)


def _upgrade_marks(node: Obj) -> tuple[str | None, ...]:
    meta = node["metadata"]
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    return (*(labels.get(k) for k in UPGRADE_LABELS),
            *(annotations.get(k) for k in UPGRADE_ANNOTATIONS))


def maintenance_blocked(nm: Obj) -> str | None:
    """What keeps a NodeMaintenance's drain from finishing: its pods that were refused (the
    refusal in brackets, as the maintenance controller reports them), or None."""
    drain = (nm.get("status") or {}).get("drain") or {}
    refused = [p for p in drain.get("waitForEviction") or [] if "(" in p]
    if not refused:
        return None
    meta = nm["metadata"]
    return f"NodeMaintenance {meta['namespace']}/{meta['name']}: " + ", ".join(refused)


def components_pending(node: Obj, daemonsets: list[Obj], pods: list[Obj],
                       namespace: str) -> list[str]:
    """The DaemonSets among `daemonsets` that wait for the driver (select mofed.wait=false), place
    a pod on `node` once its driver is ready, and have no ready pod among its `pods` yet."""
    labels = dict(labels_of(node))
    if MOFED_WAIT_LABEL in labels:
        labels[MOFED_WAIT_LABEL] = "false"  # as it is once the driver is seen ready
    after = {**node, "metadata": {**node["metadata"], "labels": labels}}
    ready = {ref.get("uid") for p in pods if p["metadata"].get("namespace") == namespace
             and _pod_ready(p) for ref in p["metadata"].get("ownerReferences") or []}
    pending = []
    for ds in daemonsets:
        spec = ds["spec"]["template"].get("spec") or {}
        if (spec.get("nodeSelector") or {}).get(MOFED_WAIT_LABEL) != "false" \
                or ds["metadata"].get("deletionTimestamp"):
            continue
        if ds["metadata"].get("uid") not in ready and daemon_pod_filter(spec)(after):
            pending.append(f"DaemonSet {ds['metadata']['name']}")
    return sorted(pending)


def devices_of(node: Obj) -> dict[str, int]:
    """The node's allocatable extended resources (devices: nvidia.com/..., rdma/...), by name."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return {k: quantity(v) for k, v in allocatable.items() if "/" in k}


def devices_noted(node: Obj) -> dict[str, int]:
    """The device resources noted as allocatable before the node's driver reload
    (ALLOCATABLE_ANNOTATION); a hand-edited value that does not parse is none."""
    noted = ((node.get("metadata") or {}).get("annotations") or {}).get(ALLOCATABLE_ANNOTATION)
    try:
        before = json.loads(noted) if noted else {}
    except ValueError:
        return {}
    return {k: v for k, v in before.items() if isinstance(v, int) and v > 0} \
        if isinstance(before, dict) else {}


def ready_since(pod: Obj | None) -> str | None:
    """When the pod's Ready condition last changed (for a ready driver pod: since when)."""
    return next((c.get("lastTransitionTime") for c in ((pod or {}).get("status") or {}).get(
        "conditions") or [] if c.get("type") == "Ready"), None)


def devices_settled(node: Obj, driver_ready_at: str | None, settle: float) -> bool:
    """Whether the node's allocatable devices can be read as they are after its reload: it
    noted none, or its new driver pod has been Ready for `settle` seconds (DEVICES_SETTLE)."""
    return not devices_noted(node) or (
        driver_ready_at is not None and _elapsed(driver_ready_at) >= settle)


def devices_missing(node: Obj) -> list[str]:
    """The device resources that are less allocatable on the node than before its driver
    reload (ALLOCATABLE_ANNOTATION), as "<resource> (<now> of <before> allocatable)"."""
    before = devices_noted(node)
    now = devices_of(node)
    return [f"{name} ({now.get(name, 0)} of {count} allocatable)"
            for name, count in sorted(before.items()) if now.get(name, 0) < count]


def _pod_ready(pod: Obj) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    return status.get("phase") == "Running" and bool(statuses) and all(
        c.get("ready") for c in statuses)
