"""The NicClusterPolicy controller: states rendered, applied and judged, status users can act on.

Every reconcile looks at the whole policy (level-triggered): each state renders its objects;
an object is written only when its content hash differs from the one on the cached copy, and
the status only when it changed, so a policy at rest costs no writes, also after a restart.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from nicop import logs
from nicop.api import upgrade
from nicop.api.labels import (
    DRIVER_LABEL,
    MOFED_WAIT_LABEL,
    POLICY_NAME,
)
from nicop.api.mellanox import NicClusterPolicy
from nicop.api.validate import removed_field_warnings
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.events import EventRecorder
from nicop.kube.manager import Controller, Manager, Result
from nicop.kube.memo import PerObject
from nicop.kube.resources import (
    NIC_CLUSTER_POLICY,
    NODE,
    POD,
    Obj,
)
from nicop.operator import metrics
from nicop.operator import nodes as node_rules
from nicop.operator.node_policy import NNP, common_node, conflict_message, nnp_driver_nodes
from nicop.operator.state_sync import (
    StateSync,
    build_status,
    condition,
    moves_placement,
    write_status,
)
from nicop.operator.states import STATES
from nicop.operator.states.base import Context

log = logging.getLogger(__name__)

NCP = NIC_CLUSTER_POLICY
NOT_READY_RECHECK = 30.0
MAX_RETRY = 60.0  # seconds between tries of a write the API server keeps refusing


class PolicyController:
    def __init__(self, manager: Manager, namespace: str, recorder: EventRecorder,
                 **context: Any) -> None:
        self.client: ApiClient = manager.client
        self.namespace = namespace
        self.recorder = recorder
        self.context = context
        self.policies = manager.informer(NCP)
        self.nodes = manager.informer(NODE)  # labels, and taints: where DaemonSets should run
        self.driver_pods = manager.informer(POD, namespace, label_selector=DRIVER_LABEL)
        self.node_policies = manager.informer(NNP)
        # Labels other controllers write into the shared node cache themselves (upgrade state,
        # SR-IOV device-plugin) arrive without a change event and do not bump the placement
        # epoch: no template of a policy selects on them.
        self.states = StateSync(manager, namespace, recorder)
        self.node_facts = PerObject(node_rules.node_facts)
        self.driver_pod_readiness = PerObject(node_rules.driver_pod_readiness)
        self.controller = manager.add(Controller("nicclusterpolicy", self.reconcile))
        self._failures = 0  # reconciles in a row with a refused write
        self._removed: tuple[tuple[Any, Any], list[str]] = ((None, None), [])
        queue = self.controller.queue
        self.policies.on_change(lambda ev, obj, old: queue.add(obj["metadata"]["name"]))
        self.nodes.on_change(self._node_changed)
        # Pods and DaemonSet statuses change in bursts on a big cluster: one reconcile a burst.
        # NicNodePolicies decide the driver wait label of their nodes and may conflict.
        for informer in (self.driver_pods, self.node_policies, *self.states.owned.values()):
            informer.on_change(lambda ev, obj, old: queue.add_batched(POLICY_NAME))

    def _node_changed(self, event: str, node: Obj, old: Obj | None) -> None:
        if moves_placement(event, node, old):
            self.states.placement_changed()
            self.controller.queue.add_batched(POLICY_NAME)

    # ------------------------------------------------------------------ reconcile
    async def reconcile(self, key: str) -> Result | None:
        policy = self.policies.store.get(key)
        if policy is None:
            metrics.forget_policy(NCP.kind, key)
            if key == POLICY_NAME:
                await self._sync_node_labels(None, self.node_facts.each(self.nodes.store.items()))
            return None
        if key != POLICY_NAME:
            await self._write_status(policy, {
                "state": "ignore",
                "reason": f"Unsupported NicClusterPolicy instance {key}. Only instance with name "
                          f"{POLICY_NAME} is supported",
            })
            return None
        all_nodes = self.nodes.store.items()
        facts = self.node_facts.each(all_nodes)
        ctx = Context(policy, self.namespace,
                      managed_nodes=[n for n, f in facts if f.managed],
                      opt_in_used=any(f.opted_in for _, f in facts), **self.context)
        unmanaged = [f.unmanaged for _, f in facts if f.unmanaged]
        metrics.unmanaged_nic_nodes(n for n, f in facts if f.unmanaged)
        # Labels first: the device plugins' DaemonSets are judged on the nodes they select now.
        label_errors = await self._sync_node_labels(policy, facts)
        # Each state on its own: a write the API server refuses fails that state only.
        applied = [await self.states.sync(state, ctx, unmanaged, NCP, state.section_of(policy))
                   for state in STATES]
        node_policies = self.node_policies.store.items()
        for a, state in zip(applied, STATES, strict=True):
            if state.section_of(policy) is not None and (conflicts := [
                    conflict_message(nnp, state, node) for nnp in node_policies
                    if (node := common_node(nnp, state, ctx.managed_nodes))]):
                a.message = "; ".join([*conflicts, *([a.message] if a.message else [])])
        status = build_status(policy, STATES, applied, unmanaged, label_errors)
        if progress := upgrade.progress(all_nodes):
            status["driverUpgrade"] = progress
        if warnings := self._removed_fields(policy):
            status["conditions"].append(condition(
                "RemovedFieldsIgnored", True, "RemovedFields", "; ".join(warnings),
                status["observedGeneration"]))
        await self._write_status(policy, status)
        if any(a.refused for a in applied) or label_errors:
            self._failures += 1  # retried, later each time, until the API server agrees
            return Result(requeue_after=min(MAX_RETRY, 2.0 ** self._failures))
        self._failures = 0
        ready = all(a.state in ("ready", "ignore") for a in applied)
        return None if ready else Result(requeue_after=NOT_READY_RECHECK)

    # ------------------------------------------------------------------ node labels
    async def _sync_node_labels(self, policy: Obj | None,
                                facts: list[tuple[Obj, node_rules.NodeFacts]]) -> list[str]:
        """Keep mofed.wait on every node (`facts`: each with its facts) as the driver state
        says; remove it without a policy. Returns the writes the API server refused, each
        naming its node."""
        ofed = policy is not None and bool((policy.get("spec") or {}).get("ofedDriver"))
        # A NicNodePolicy's driver holds its nodes' device plugins back alike; its policies
        # keep the label on even without a NicClusterPolicy.
        node_policies = self.node_policies.store.items()
        nnp_drivers = nnp_driver_nodes(node_policies, self.nodes.store.items())
        active = policy is not None or bool(node_policies)
        ready = node_rules.readiness_by_node(
            r for _, r in self.driver_pod_readiness.each(self.driver_pods.store.items()))
        errors = []
        for node, fact in facts:
            name = node["metadata"]["name"]
            wanted = node_rules.wait_value(name, fact.managed, ofed or name in nnp_drivers,
                                           ready) if active else None
            if fact.mofed_wait == wanted:
                continue
            try:
                self.nodes.assume(await self.client.patch(
                    NODE, name, {"metadata": {"labels": {MOFED_WAIT_LABEL: wanted}}}))
                self.states.placement_changed()  # the watch brings no change: it is assumed
            except (ApiError, OSError) as e:
                message = f"labelling node {name} {MOFED_WAIT_LABEL}={wanted} failed: {e}"
                log.error("%s", message, extra=logs.about("Node", name))
                errors.append(message)
        return errors

    def _removed_fields(self, policy: Obj) -> list[str]:
        """removed_fields of this generation of the policy: the model is validated once a
        generation, not on every pass."""
        meta = policy["metadata"]
        generation = (meta.get("uid"), meta.get("generation"))
        if self._removed[0] != generation or generation[1] is None:
            self._removed = (generation, removed_fields(policy))
        return self._removed[1]

    # ------------------------------------------------------------------ status
    async def _write_status(self, policy: Obj, status: Obj) -> None:
        await write_status(self.client, self.policies, NCP, self.recorder, policy, status)


def removed_fields(policy: Obj) -> list[str]:
    """Warnings for upstream fields that were removed but that an old CR still sets."""
    try:
        return removed_field_warnings(NicClusterPolicy.model_validate(policy))
    except ValidationError:  # the API server validated it; a model mismatch is not fatal here
        log.warning("policy does not match the model", exc_info=True)
        return []
