"""The NicNodePolicy controller: the driver and device plugins of one group of nodes.

Each NicNodePolicy renders upstream's states state-OFED, state-RDMA-device-plugin and
state-SRIOV-device-plugin for the nodes its `nodeSelector` selects (empty: every node), with
upstream's per-policy names and `ds-owner: nnp-<name>`, and gets a status in NicClusterPolicy's
shape. Two NicNodePolicies may not select one node: both are in error and nothing of theirs is
applied. Where a NicClusterPolicy has the same section and selects a node the NicNodePolicy
selects too, upstream renders both and the second driver pod stays Pending; nicop renders only
the NicClusterPolicy's and says so in both statuses.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from nicop.api.labels import DRIVER_LABEL, MOFED_WAIT_LABEL, OPT_IN_LABEL, POLICY_NAME
from nicop.api.nodes import is_managed, labels_of, unmanaged_reason
from nicop.kube import selectors
from nicop.kube.events import EventRecorder
from nicop.kube.manager import Controller, Manager, Result
from nicop.kube.resources import NIC_CLUSTER_POLICY as NCP
from nicop.kube.resources import NODE, POD, Obj, Resource, key_of
from nicop.operator import metrics, writes
from nicop.operator.nodes import driver_readiness, label_patch, mofed_wait_value
from nicop.operator.state_sync import (
    Applied,
    StateSync,
    build_status,
    moves_placement,
    owner_of,
    write_status,
)
from nicop.operator.states import dra_driver, ofed, rdma_dp, sriov_dp
from nicop.operator.states.base import Context, RenderError, State

NNP = Resource("mellanox.com", "v1alpha1", "NicNodePolicy", "nicnodepolicies", namespaced=False)
NNP_STATES: tuple[State, ...] = (ofed.STATE, rdma_dp.STATE, sriov_dp.STATE, dra_driver.STATE)
KEY = "nicnodepolicies"  # one reconcile for all: overlaps and shared objects span policies
NOT_READY_RECHECK = 30.0


def selects(policy: Obj, node: Obj) -> bool:
    """The policy's nodeSelector matches the node (an empty one matches every node)."""
    return selectors.matches_map((policy.get("spec") or {}).get("nodeSelector"),
                                 labels_of(node))


def nnp_driver_nodes(policies: list[Obj], nodes: list[Obj]) -> set[str]:
    """The nodes a NicNodePolicy's ofedDriver section is for."""
    drivers = [p for p in policies if (p.get("spec") or {}).get("ofedDriver")]
    return {n["metadata"]["name"] for n in nodes if any(selects(p, n) for p in drivers)}


def common_node(policy: Obj, state: State, managed_nodes: list[Obj]) -> str | None:
    """A managed node for which both the NicClusterPolicy (which has `state`'s section) and
    this NicNodePolicy would render `state`, or None."""
    if state not in NNP_STATES or state.section_of(policy) is None:
        return None
    names = sorted(n["metadata"]["name"] for n in managed_nodes if selects(policy, n))
    return names[0] if names else None


def conflict_message(policy: Obj, state: State, node: str) -> str:
    """For the NicClusterPolicy's status."""
    return (f"NicNodePolicy {policy['metadata']['name']} also has {state.path} and selects node "
            f'"{node}": it is rendered from this policy only; keep the section in one of them')


def overlaps(policies: list[Obj], nodes: list[Obj]) -> dict[str, str]:
    """Upstream's error for every policy that shares a node with another, by policy name."""
    by_node: dict[str, list[str]] = defaultdict(list)
    for node in nodes:
        for policy in policies:
            if selects(policy, node):
                by_node[node["metadata"]["name"]].append(policy["metadata"]["name"])
    found: dict[str, list[str]] = defaultdict(list)
    for node_name in sorted(by_node):
        names = sorted(by_node[node_name])
        if len(names) > 1:
            for name in names:
                found[name].append(
                    f'node "{node_name}" is selected by policies: [{", ".join(names)}]')
    return {name: "node selector overlap detected: " + "; ".join(parts)
            for name, parts in found.items()}


class NodePolicyController:
    def __init__(self, manager: Manager, namespace: str, recorder: EventRecorder,
                 **context: Any) -> None:
        self.client = manager.client
        self.namespace = namespace
        self.recorder = recorder
        self.context = context
        self.policies = manager.informer(NNP)
        self.cluster_policies = manager.informer(NCP)
        self.nodes = manager.informer(NODE)
        self.driver_pods = manager.informer(POD, namespace, label_selector=DRIVER_LABEL)
        self.states = StateSync(manager, namespace, recorder)
        self.controller = manager.add(Controller("nicnodepolicy", self.reconcile))
        queue = self.controller.queue
        for informer in (self.policies, self.cluster_policies, self.driver_pods,
                         *self.states.owned.values()):
            informer.on_change(lambda ev, obj, old: queue.add_batched(KEY))
        self.nodes.on_change(self._node_changed)

    def _node_changed(self, event: str, node: Obj, old: Obj | None) -> None:
        if moves_placement(event, node, old):
            self.states.placement_changed()
            self.controller.queue.add_batched(KEY)

    async def reconcile(self, key: str) -> Result | None:
        policies = sorted(self.policies.store.items(), key=lambda p: p["metadata"]["name"])
        await self._delete_orphans({p["metadata"]["name"] for p in policies})
        metrics.keep_policies(NNP.kind, (p["metadata"]["name"] for p in policies))
        if not policies:
            return None  # the cluster policy's objects change often; nothing here to judge
        nodes = self.nodes.store.items()
        managed = [n for n in nodes if is_managed(n)]
        unmanaged = [r for n in nodes if (r := unmanaged_reason(n))]
        cluster = self.cluster_policies.store.get(POLICY_NAME)
        overlap = overlaps(policies, nodes)
        usable = [p for p in policies if p["metadata"]["name"] not in overlap]
        opt_in_used = any(OPT_IN_LABEL in labels_of(n) for n in nodes)
        contexts = {p["metadata"]["name"]: Context(
            p, self.namespace, managed_nodes=[n for n in managed if selects(p, n)],
            opt_in_used=opt_in_used, node_policy=p["metadata"]["name"], **self.context)
            for p in usable}
        co_owners = self._shared_objects(usable, contexts)
        driver_ready = driver_readiness(self.driver_pods.store.items())
        again = False
        for policy in policies:
            name = policy["metadata"]["name"]
            if name in overlap:
                await self._write_status(policy, {
                    "state": "error", "reason": overlap[name],
                    "observedGeneration": policy["metadata"].get("generation", 0)})
                continue
            ctx = contexts[name]
            applied = []
            for state in NNP_STATES:
                section = state.section_of(policy)
                node = common_node(policy, state, managed) if cluster is not None and \
                    state.section_of(cluster) is not None else None
                if node is not None:
                    # Rendered from the NicClusterPolicy only: this policy's copy goes.
                    await self.states.sync(state, ctx, unmanaged, NNP, None)
                    applied.append(Applied(state.name, "error", (
                        f"{state.path} is also in NicClusterPolicy {POLICY_NAME}, which selects "
                        f'node "{node}" that this policy selects too: not rendered from this '
                        "policy; keep the section in one of them")))
                    continue
                applied.append(await self.states.sync(state, ctx, unmanaged, NNP, section,
                                                      co_owners))
            _wait_for_release(applied, ctx.managed_nodes, driver_ready)
            status = build_status(policy, NNP_STATES, applied, unmanaged, [])
            await self._write_status(policy, status)
            again |= status["state"] != "ready"
        return Result(requeue_after=NOT_READY_RECHECK) if again else None

    def _shared_objects(self, policies: list[Obj],
                        contexts: dict[str, Context]) -> dict[str, list[Obj]]:
        """For each object several policies render (a ServiceAccount they share), by
        `Kind/key`: the policies that render it besides each one."""
        renderers: dict[str, list[Obj]] = defaultdict(list)
        for policy in policies:
            for state in NNP_STATES:
                section = state.section_of(policy)
                if section is None:
                    continue
                try:
                    objects = state.render(contexts[policy["metadata"]["name"]], section,
                                           state.path)
                except RenderError:
                    continue  # reported by the state's own sync
                for obj in objects:
                    renderers[f"{obj['kind']}/{key_of(obj)}"].append(policy)
        return {key: ps for key, ps in renderers.items() if len(ps) > 1}

    async def _delete_orphans(self, names: set[str]) -> None:
        """Objects of a NicNodePolicy that is gone (their ownerReference takes them too; this
        does not wait for the garbage collector)."""
        for res, informer in self.states.owned.items():
            for obj in informer.store.items():
                owner = owner_of(obj)
                if owner.startswith("nnp-") and owner[4:] not in names and not any(
                        ref.get("kind") == NNP.kind and ref.get("name") in names
                        for ref in obj["metadata"].get("ownerReferences") or []):
                    await writes.delete(self.client, res, obj)

    async def _write_status(self, policy: Obj, status: Obj) -> None:
        await write_status(self.client, self.policies, NNP, self.recorder, policy, status)


def _wait_for_release(applied: list[Applied], nodes: list[Obj],
                      driver_ready: dict[str, bool]) -> None:
    """The device plugins select mofed.wait=false, which the cluster policy's controller
    writes by the driver's readiness: while a node's label is not yet what that rule wants,
    the driver state is not ready, so the policy is not called ready with plugins still to
    start (or stop) there."""
    waiting = sorted(n["metadata"]["name"] for n in nodes if label_patch(
        n, mofed_wait_value(n, True, driver_ready)) is not None)
    for a in applied:
        if a.name == ofed.STATE.name and a.state == "ready" and waiting:
            a.state = "notReady"
            a.message = (f"{MOFED_WAIT_LABEL} is not yet set by the driver's readiness on "
                         f"{', '.join(waiting)}: the device plugins follow once it is")
