"""Drains for SR-IOV reconfiguration: the operator's half of the config daemon's handshake.

A config daemon that must change VFs a running pod may hold asks for a drain by setting
`sriovnetwork.openshift.io/desired-state` on its SriovNetworkNodeState (and
`sriovnetwork.openshift.io/state` on its Node) to `Drain_Required` or `Reboot_Required`. This
controller answers on `sriovnetwork.openshift.io/current-state`: `Draining` once the node is
cordoned and its pods are being evicted, `DrainComplete` when they are gone, and `Idle` again
(with the node uncordoned) once the daemon is back to `Idle`.

A drain starts only while the node's SriovNetworkPoolConfig leaves room: a pool's
`maxUnavailable` (an int or a percentage of its nodes, unset: no limit) counts its nodes that are
`Draining` or `DrainComplete`; nodes in no pool share a default pool with maxUnavailable 1.
`Drain_Required` evicts only pods that use an SR-IOV resource; `Reboot_Required` evicts every
pod a drain may evict. Evictions go through the Eviction API, so PodDisruptionBudgets hold.

The SriovOperatorConfig `default` is read here too: `disableDrain` (the handshake is answered
without cordoning or evicting) and `logLevel` (0 info, 1 and 2 debug for the SR-IOV
controllers).

With a maintenance operator (DRAIN_CONTROLLER_ENABLED, upstream's external drainer), the
controller cordons and evicts nothing itself: a node's drain is a NodeMaintenance it asks for (or
joins, when a driver upgrade or another requestor already holds the node, so the node is drained
once for both), `DrainComplete` once that is Ready, and let go when the daemon is back to `Idle`.

Where nicop does better than upstream: a node is cordoned only by this controller and only
uncordoned by it (a node an admin cordoned stays cordoned), any node it cordoned is uncordoned as
soon as its daemon is Idle, gone, or no longer configured, and a drain that cannot finish says
which pod blocks it (annotation `nicop.io/sriov-drain-blocked`, read by the daemon for its
`lastSyncError`, and an Event on the node).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from nicop import logs
from nicop.api.labels import (
    BLOCKED_ANNOTATION,
    CURRENT_STATE,
    DESIRED_STATE,
    DRAIN_COMPLETE,
    DRAIN_REQUIRED,
    DRAINING,
    IDLE,
    REBOOT_REQUIRED,
)
from nicop.api.sriovnetwork import SriovOperatorConfigSpec, operator_settings, pool_settings
from nicop.kube import selectors
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.events import EventRecorder
from nicop.kube.manager import Controller, Manager, Result
from nicop.kube.node_pods import NodePods
from nicop.kube.resources import (
    NODE,
    SRIOV_NODE_STATE,
    SRIOV_OPERATOR_CONFIG,
    SRIOV_POOL_CONFIG,
    Obj,
)
from nicop.operator.drain import evictable, max_unavailable
from nicop.operator.maintenance_requestor import (
    Requestor,
    RequestorOptions,
    sriov_maintenance_spec,
)

log = logging.getLogger(__name__)

NODE_STATE = SRIOV_NODE_STATE
OPERATOR_CONFIG = SRIOV_OPERATOR_CONFIG
POOL_CONFIG = SRIOV_POOL_CONFIG
CONFIG_NAME = "default"

# Set by an external drainer (upstream): the operator then leaves the node's drain to it.
EXTERNAL_DRAINER = "sriovnetwork.openshift.io/use-external-drainer"
# nicop's additions: which nodes this controller cordoned, and what blocks a drain.
CORDONED_ANNOTATION = "nicop.io/sriov-drain-cordoned"

DEFAULT_RESOURCE_PREFIX = "nvidia.com"  # what the NVIDIA Network Operator's chart sets
RESOURCE_PREFIX_ENV = "RESOURCE_PREFIX"  # upstream's variable for it
DEFAULT_POOL = ""  # nodes that match no SriovNetworkPoolConfig
DEFAULT_POOL_MAX_UNAVAILABLE = 1
ACTIVE_RECHECK = 1.0
SRIOV_LOGGERS = ("nicop.operator.sriov", "nicop.operator.sriov_drain",
                 "nicop.operator.sriov_networks")


# ------------------------------------------------------------------------------ operator config

def operator_config(configs: list[Obj], namespace: str) -> Obj | None:
    """The SriovOperatorConfig `default` of the operator namespace, if any."""
    return next((c for c in configs if c["metadata"]["name"] == CONFIG_NAME
                 and c["metadata"].get("namespace") == namespace), None)


def apply_log_level(settings: SriovOperatorConfigSpec) -> None:
    """SriovOperatorConfig.spec.logLevel: 0 logs reconcile outcomes, 1 and 2 every step."""
    wanted = logging.DEBUG if (settings.log_level or 0) > 0 else logging.NOTSET
    for name in SRIOV_LOGGERS:
        logging.getLogger(name).setLevel(wanted)


# ------------------------------------------------------------------------------ pools

class PoolError(Exception):
    """A node matches more than one SriovNetworkPoolConfig; the message names them."""


def pool_of(node: Obj, pools: list[Obj]) -> Obj | None:
    """The SriovNetworkPoolConfig a node belongs to (None: the default pool).

    Pools that only configure OVS offload (no nodeSelector) hold no nodes.
    """
    labels = node["metadata"].get("labels") or {}
    matching = [p for p in pools if (p.get("spec") or {}).get("nodeSelector") is not None
                and _selects(p, labels)]
    if len(matching) > 1:
        names = ", ".join(sorted(p["metadata"]["name"] for p in matching))
        raise PoolError(f"node {node['metadata']['name']} matches more than one "
                        f"SriovNetworkPoolConfig ({names}); change their nodeSelectors so that "
                        "each node is in at most one pool")
    return matching[0] if matching else None


def _selects(pool: Obj, labels: Mapping[str, str]) -> bool:
    try:
        return selectors.matches_label_selector(pool["spec"]["nodeSelector"], labels)
    except selectors.SelectorError as e:
        raise PoolError(f"SriovNetworkPoolConfig {pool['metadata']['name']}: spec.nodeSelector: "
                        f"{e}") from None


def pool_limit(pool: Obj | None, size: int) -> int:
    """How many of a pool's `size` nodes may be drained at once."""
    if pool is None:
        return DEFAULT_POOL_MAX_UNAVAILABLE
    return max_unavailable(pool_settings(pool).max_unavailable, size)


# ------------------------------------------------------------------------------ pods

def uses_resource(pod: Obj, prefix: str) -> bool:
    """Whether a container of the pod requests a resource `<prefix>/...` (an SR-IOV VF)."""
    spec = pod.get("spec") or {}
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        res = c.get("resources") or {}
        for section in ("requests", "limits"):
            if any(k.startswith(prefix + "/") for k in res.get(section) or {}):
                return True
    return False


def resource_prefix(given: str | None = None) -> str:
    """The prefix of the SR-IOV resources: given, else $RESOURCE_PREFIX, else nvidia.com."""
    return given or os.environ.get(RESOURCE_PREFIX_ENV) or DEFAULT_RESOURCE_PREFIX


def _needs_pods(state: Obj) -> bool:
    """The node is drained, or drained for less than the reboot it now needs."""
    ann = _annotations(state)
    return ann.get(CURRENT_STATE) == DRAINING or (
        ann.get(CURRENT_STATE) == DRAIN_COMPLETE and ann.get(DESIRED_STATE) == REBOOT_REQUIRED)


def _annotations(obj: Obj) -> dict[str, str]:
    return obj["metadata"].get("annotations") or {}


# ------------------------------------------------------------------------------ the controller

class SriovDrainController:
    """Answers the config daemons' drain requests within each pool's maxUnavailable."""

    KEY = "sriov-drain"

    def __init__(self, manager: Manager, namespace: str, recorder: EventRecorder, *,
                 prefix: str | None = None, requestor: RequestorOptions | None = None) -> None:
        self.client: ApiClient = manager.client
        self.namespace = namespace
        self.recorder = recorder
        self.prefix = resource_prefix(prefix)
        self.states = manager.informer(NODE_STATE, namespace)
        self.nodes = manager.informer(NODE)
        self.pools = manager.informer(POOL_CONFIG, namespace)
        self.configs = manager.informer(OPERATOR_CONFIG, namespace)
        # Pods only of the nodes being drained.
        self.node_pods = NodePods(manager, lambda ev, obj, old: self.controller.queue.add_batched(
            self.KEY))
        self.controller = manager.add(Controller("sriov-drain", self.reconcile))
        for informer in (self.pools, self.configs):
            informer.on_change(lambda ev, obj, old: self.controller.queue.add(self.KEY))
        self.states.on_change(lambda ev, obj, old: self.controller.queue.add_batched(self.KEY))
        self.nodes.on_change(self._node_changed)
        self._blocked_events: dict[str, str] = {}
        # External drainer: a maintenance operator cordons and drains (NodeMaintenance).
        self.requestor = None if requestor is None else Requestor(
            manager, requestor, lambda: self.controller.queue.add_batched(self.KEY))

    def _node_changed(self, event: str, node: Obj, old: Obj | None) -> None:
        if old is None or node["metadata"].get("labels") != old["metadata"].get("labels") \
                or _annotations(node) != _annotations(old) or node.get("spec") != old.get("spec"):
            self.controller.queue.add_batched(self.KEY)

    # ------------------------------------------------------------------ reconcile
    async def reconcile(self, key: str) -> Result | None:
        settings = operator_settings(operator_config(self.configs.store.items(),
                                                     self.namespace))
        apply_log_level(settings)
        no_drain = bool(settings.disable_drain)
        states = sorted(self.states.store.items(), key=lambda s: s["metadata"]["name"])
        await self.node_pods.keep(s["metadata"]["name"] for s in states
                                  if self.requestor is None and _needs_pods(s))
        active = False
        for state in states:
            active |= await self._step(state, no_drain)
        active |= await self._start_drains(no_drain)
        await self._uncordon_orphans()
        return Result(requeue_after=ACTIVE_RECHECK) if active else None

    async def _step(self, state: Obj, no_drain: bool) -> bool:
        """Move one node state along the handshake; True while a drain is under way."""
        name = state["metadata"]["name"]
        ann = _annotations(state)
        desired, current = ann.get(DESIRED_STATE), ann.get(CURRENT_STATE)
        if desired is None or current is None:
            await self._annotate_state(state, {DESIRED_STATE: desired or IDLE,
                                               CURRENT_STATE: current or IDLE})
            return False
        node = self.nodes.store.get(name)
        if self.requestor is not None:
            return await self._step_requestor(state, desired, current)
        if desired == IDLE:
            if current != IDLE or ann.get(BLOCKED_ANNOTATION):
                if node is not None:
                    await self._uncordon(node)
                log.info("daemon is Idle: %s -> Idle", current, extra=logs.about("Node", name))
                await self._annotate_state(state, {CURRENT_STATE: IDLE, BLOCKED_ANNOTATION: None})
            elif node is not None and _annotations(node).get(CORDONED_ANNOTATION):
                await self._uncordon(node)
            return False
        if node is None:
            return False
        reboot = desired == REBOOT_REQUIRED
        if current == DRAINING:
            return await self._drain(state, node, reboot, no_drain)
        if current == DRAIN_COMPLETE and reboot and not no_drain \
                and not ann.get(EXTERNAL_DRAINER):
            # Drained for Drain_Required, but the daemon now needs a reboot: drain everything.
            left = self._to_evict(node, reboot)
            if left:
                await self._annotate_state(state, {CURRENT_STATE: DRAINING})
            return left is None or bool(left)
        return False

    async def _step_requestor(self, state: Obj, desired: str, current: str) -> bool:
        """The handshake when a NodeMaintenance drains the node: DrainComplete once it is
        Ready; back to Idle once the daemon is and this requestor has let it go."""
        assert self.requestor is not None
        name = state["metadata"]["name"]
        me = self.requestor.requestor_id()
        if desired == IDLE:
            if current != IDLE:
                await self.requestor.release(name, me)
                log.info("daemon is Idle: %s -> Idle, NodeMaintenance let go", current,
                         extra=logs.about("Node", name))
                await self._annotate_state(state, {CURRENT_STATE: IDLE})
            return False
        if current == DRAINING and await self.requestor.request(
                name, me, sriov_maintenance_spec()) and self.requestor.ready(name, me):
            log.info("drained by NodeMaintenance", extra=logs.about("Node", name))
            await self._annotate_state(state, {CURRENT_STATE: DRAIN_COMPLETE})
        return False  # the NodeMaintenance's changes wake this controller

    async def _start_drains(self, no_drain: bool) -> bool:
        """Begin drains of waiting nodes while their pools leave room."""
        if not any(_waits(s) for s in self.states.store.items()):
            return False  # nothing to start: no pass over every node's pool
        pools = self.pools.store.items()
        nodes = self.nodes.store.items()
        pool_names: dict[str, str] = {}  # node -> pool name ("" = default pool)
        problems: dict[str, str] = {}
        for node in nodes:
            try:
                pool = pool_of(node, pools)
            except PoolError as e:
                problems[node["metadata"]["name"]] = str(e)
                continue
            pool_names[node["metadata"]["name"]] = pool["metadata"]["name"] if pool else ""
        sizes: dict[str, int] = {}
        for pool_name in pool_names.values():
            sizes[pool_name] = sizes.get(pool_name, 0) + 1
        busy: dict[str, int] = {}
        waiting: list[Obj] = []
        for state in sorted(self.states.store.items(), key=lambda s: s["metadata"]["name"]):
            ann = _annotations(state)
            name = state["metadata"]["name"]
            if ann.get(CURRENT_STATE) in (DRAINING, DRAIN_COMPLETE):
                pool_name = pool_names.get(name, DEFAULT_POOL)
                busy[pool_name] = busy.get(pool_name, 0) + 1
            elif _waits(state):
                waiting.append(state)
        by_name = {p["metadata"]["name"]: p for p in pools}
        started = False
        for state in waiting:
            name = state["metadata"]["name"]
            found = self.nodes.store.get(name)
            if found is None:
                continue
            node = found
            if name in problems:
                await self._blocked(state, node, problems[name])
                continue
            if no_drain or (self.requestor is None
                            and _annotations(state).get(EXTERNAL_DRAINER) == "true"):
                log.info("drain skipped (%s)", "disableDrain" if no_drain else
                         "external drainer", extra=logs.about("Node", name))
                await self._annotate_state(state, {CURRENT_STATE: DRAIN_COMPLETE})
                continue
            pool_name = pool_names[name]
            limit = pool_limit(by_name.get(pool_name), sizes.get(pool_name, 1))
            if busy.get(pool_name, 0) >= limit:
                log.debug("waiting: pool %r has %d of %d nodes draining", pool_name or "default",
                          busy.get(pool_name, 0), limit, extra=logs.about("Node", name))
                continue
            if self.requestor is not None:
                if not await self.requestor.request(name, self.requestor.requestor_id(),
                                                    sriov_maintenance_spec()):
                    continue  # the node's last NodeMaintenance is still being released
            else:
                await self._cordon(node)
            busy[pool_name] = busy.get(pool_name, 0) + 1
            log.info("draining for %s (pool %s, %d of %d)", _annotations(state)[DESIRED_STATE],
                     pool_name or "default", busy[pool_name], limit,
                     extra=logs.about("Node", name))
            await self._annotate_state(state, {CURRENT_STATE: DRAINING})
            started = True
        return started

    def _to_evict(self, node: Obj, reboot: bool) -> list[Obj] | None:
        """The pods the drain must evict; None until the node's pods are listed."""
        pods = self.node_pods.pods(node["metadata"]["name"])
        if pods is None:
            return None
        return [p for p in pods
                if evictable(p, "") and (reboot or uses_resource(p, self.prefix))]

    async def _drain(self, state: Obj, node: Obj, reboot: bool, no_drain: bool) -> bool:
        """Evict what must go; DrainComplete once it is gone. True while pods remain."""
        name = node["metadata"]["name"]
        if not (node.get("spec") or {}).get("unschedulable") and not no_drain:
            await self._cordon(node)
        blocked: list[str] = []
        remaining = [] if no_drain else self._to_evict(node, reboot)
        if remaining is None:
            return True  # the listing wakes this controller
        for pod in remaining:
            m = pod["metadata"]
            if m.get("deletionTimestamp"):
                continue
            try:
                await self.client.evict(m["name"], m["namespace"])
                log.debug("evicted %s/%s", m["namespace"], m["name"],
                          extra=logs.about("Node", name))
            except ApiError as e:
                if e.code == 429:
                    blocked.append(f"pod {m['namespace']}/{m['name']} (a PodDisruptionBudget "
                                   "allows no disruption now)")
                elif e.code != 404:
                    blocked.append(f"pod {m['namespace']}/{m['name']} ({e.message})")
        if not remaining:
            log.info("drained", extra=logs.about("Node", name))
            await self._annotate_state(state, {CURRENT_STATE: DRAIN_COMPLETE,
                                               BLOCKED_ANNOTATION: None})
            return False
        if blocked:
            await self._blocked(state, node, "eviction refused for " + ", ".join(blocked))
        return True

    async def _blocked(self, state: Obj, node: Obj, reason: str) -> None:
        """Say once (annotation, Event) why the node's drain cannot go on."""
        if _annotations(state).get(BLOCKED_ANNOTATION) == reason:
            return
        await self._annotate_state(state, {BLOCKED_ANNOTATION: reason})
        name = node["metadata"]["name"]
        if self._blocked_events.get(name) != reason:
            self._blocked_events[name] = reason
            log.warning("drain blocked: %s", reason, extra=logs.about("Node", name))
            await self.recorder.emit(node, "Warning", "SriovDrainBlocked", reason)

    async def _uncordon_orphans(self) -> None:
        """Nodes this controller cordoned whose node state is gone, or has no drain to do."""
        for node in self.nodes.store.items():
            if not _annotations(node).get(CORDONED_ANNOTATION):
                continue
            state = self.states.store.get(f"{self.namespace}/{node['metadata']['name']}")
            if state is None or _annotations(state).get(CURRENT_STATE) in (None, IDLE):
                await self._uncordon(node)

    # ------------------------------------------------------------------ writes
    async def _cordon(self, node: Obj) -> None:
        if (node.get("spec") or {}).get("unschedulable"):
            return  # cordoned by someone else: it stays that way after the drain
        await self._patch_node(node, {"spec": {"unschedulable": True}, "metadata": {
            "annotations": {CORDONED_ANNOTATION: "true"}}})

    async def _uncordon(self, node: Obj) -> None:
        if not _annotations(node).get(CORDONED_ANNOTATION):
            return
        log.info("uncordoned", extra=logs.about("Node", node["metadata"]["name"]))
        await self._patch_node(node, {"spec": {"unschedulable": None}, "metadata": {
            "annotations": {CORDONED_ANNOTATION: None}}})

    async def _patch_node(self, node: Obj, body: Obj) -> None:
        updated = await self.client.patch(NODE, node["metadata"]["name"], body)
        self.nodes.assume(updated)

    async def _annotate_state(self, state: Obj, annotations: Mapping[str, Any]) -> None:
        current = _annotations(state)
        if all(current.get(k) == v for k, v in annotations.items()):
            return
        try:
            updated = await self.client.patch(
                NODE_STATE, state["metadata"]["name"],
                {"metadata": {"annotations": dict(annotations)}}, self.namespace)
        except ApiError as e:
            if e.code == 404:
                return
            raise
        self.states.assume(updated)


def _waits(state: Obj) -> bool:
    """The node's daemon asks for a drain that has not begun."""
    ann = _annotations(state)
    return ann.get(CURRENT_STATE) == IDLE and ann.get(DESIRED_STATE) in (DRAIN_REQUIRED,
                                                                          REBOOT_REQUIRED)
