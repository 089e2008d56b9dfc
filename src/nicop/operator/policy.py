"""The NicClusterPolicy controller: states rendered, applied and judged, status users can act on.

Every reconcile looks at the whole policy (level-triggered): each state renders its objects;
an object is written only when its content hash differs from the one on the cached copy, and
the status only when it changed, so a policy at rest costs no writes, also after a restart.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from nicop import logs
from nicop.api import upgrade
from nicop.api.labels import (
    DRIVER_CONTAINER,
    DRIVER_LABEL,
    MELLANOX_LABEL,
    MOFED_WAIT_LABEL,
    OPT_IN_LABEL,
    OWNER_LABEL,
    OWNER_VALUE,
    POLICY_NAME,
    REVISION_ANNOTATION,
    STATE_LABEL,
)
from nicop.api.mellanox import NicClusterPolicy
from nicop.api.nodes import is_managed, labels_of, unmanaged_reason
from nicop.api.validate import removed_field_warnings
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.events import EventRecorder
from nicop.kube.informer import Informer
from nicop.kube.manager import Controller, Manager, Result
from nicop.kube.resources import (
    CLUSTER_ROLE,
    CLUSTER_ROLE_BINDING,
    CONFIGMAP,
    CRD,
    DAEMONSET,
    DEPLOYMENT,
    NIC_CLUSTER_POLICY,
    NODE,
    PERSISTENT_VOLUME_CLAIM,
    POD,
    SERVICE_ACCOUNT,
    Obj,
    Resource,
    key_of,
    resource_of,
)
from nicop.kube.scheduling import daemon_pod_filter
from nicop.kube.times import stamp
from nicop.operator import nodes as node_rules
from nicop.operator import writes
from nicop.operator.states import STATES
from nicop.operator.states.base import Context, RenderError, State, content_hash
from nicop.operator.states.partial import PartialState
from nicop.operator.writes import WriteFailed

log = logging.getLogger(__name__)

NCP = NIC_CLUSTER_POLICY
OWNED = (SERVICE_ACCOUNT, CONFIGMAP, CLUSTER_ROLE, CLUSTER_ROLE_BINDING, DAEMONSET, DEPLOYMENT,
         CRD, PERSISTENT_VOLUME_CLAIM)
# As upstream: a component's CRDs stay when its section is removed (their CRs would go with
# them); they go with the policy, through its ownerReference.
KEPT_ON_REMOVAL = (CRD,)
NOT_READY_RECHECK = 30.0
MAX_RETRY = 60.0  # seconds between tries of a write the API server keeps refusing


def owned_by(obj: Obj, policy: Obj) -> bool:
    """The object names this policy as its owner. One left by an earlier policy of the same
    name (deleted and created again) would be garbage-collected with that one: adopt it."""
    uid = policy["metadata"].get("uid")
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


@dataclass
class Applied:
    name: str
    state: str  # ready | notReady | ignore | error
    message: str = ""
    refused: bool = False  # the API server refused a write: the spec is not fully handled


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
        self.owned: dict[Resource, Informer] = {
            res: manager.informer(res, namespace if res.namespaced else None,
                                  label_selector=STATE_LABEL)
            for res in OWNED
        }
        self.controller = manager.add(Controller("nicclusterpolicy", self.reconcile))
        self._failures = 0  # reconciles in a row with a refused write
        # Bumped whenever a node's labels or taints change: the nodes a DaemonSet template fits
        # are counted again only then (DaemonSet key -> (epoch, generation, count)). Labels
        # other controllers write into the shared cache themselves (upgrade state, SR-IOV
        # device-plugin) arrive without a change event and are not counted: no template of a
        # policy selects on them.
        self._placement_epoch = 0
        self._fitting: dict[str, tuple[int, int, int]] = {}
        queue = self.controller.queue
        self.policies.on_change(lambda ev, obj, old: queue.add(obj["metadata"]["name"]))
        self.nodes.on_change(self._node_changed)
        # Pods and DaemonSet statuses change in bursts on a big cluster: one reconcile a burst.
        self.driver_pods.on_change(lambda ev, obj, old: queue.add_batched(POLICY_NAME))
        for informer in self.owned.values():
            informer.on_change(lambda ev, obj, old: queue.add_batched(POLICY_NAME))

    def _node_changed(self, event: str, node: Obj, old: Obj | None) -> None:
        """Labels and taints decide what runs where; heartbeats change nothing here."""
        if event != "MODIFIED" or labels_of(node) != labels_of(
                old or {}) or (node.get("spec") or {}).get("taints") != ((old or {}).get(
                "spec") or {}).get("taints"):
            self._placement_epoch += 1
            self.controller.queue.add_batched(POLICY_NAME)

    # ------------------------------------------------------------------ reconcile
    async def reconcile(self, key: str) -> Result | None:
        policy = self.policies.store.get(key)
        if policy is None:
            if key == POLICY_NAME:
                await self._sync_node_labels(None)
            return None
        if key != POLICY_NAME:
            await self._write_status(policy, {
                "state": "ignore",
                "reason": f"Unsupported NicClusterPolicy instance {key}. Only instance with name "
                          f"{POLICY_NAME} is supported",
            })
            return None
        all_nodes = self.nodes.store.items()
        ctx = Context(policy, self.namespace,
                      managed_nodes=[n for n in all_nodes if is_managed(n)],
                      opt_in_used=any(OPT_IN_LABEL in labels_of(n) for n in all_nodes),
                      **self.context)
        unmanaged = [r for n in all_nodes if (r := unmanaged_reason(n))]
        # Labels first: the device plugins' DaemonSets are judged on the nodes they select now.
        label_errors = await self._sync_node_labels(policy)
        # Each state on its own: a write the API server refuses fails that state only.
        applied = [await self._sync_state(state, ctx, unmanaged) for state in STATES]
        status = self._status(policy, applied, unmanaged, label_errors)
        if progress := upgrade.progress(all_nodes):
            status["driverUpgrade"] = progress
        if warnings := removed_fields(policy):
            status["conditions"].append(_condition(
                "RemovedFieldsIgnored", True, "RemovedFields", "; ".join(warnings),
                status["observedGeneration"]))
        await self._write_status(policy, status)
        if any(a.refused for a in applied) or label_errors:
            self._failures += 1  # retried, later each time, until the API server agrees
            return Result(requeue_after=min(MAX_RETRY, 2.0 ** self._failures))
        self._failures = 0
        ready = all(a.state in ("ready", "ignore") for a in applied)
        return None if ready else Result(requeue_after=NOT_READY_RECHECK)

    async def _sync_state(self, state: State, ctx: Context, unmanaged: list[str]) -> Applied:
        try:
            return await self._apply_state(state, ctx, unmanaged)
        except WriteFailed as e:
            log.error("%s: %s", state.name, e, extra=logs.about(NCP.kind, POLICY_NAME))
            await self.recorder.emit(ctx.policy, "Warning", "ApplyFailed", f"{state.name}: {e}")
            return Applied(state.name, "error", str(e), refused=True)

    async def _apply_state(self, state: State, ctx: Context, unmanaged: list[str]) -> Applied:
        section = state.section_of(ctx.policy)
        existing = self._objects_of(state.name)
        if section is None:
            existing = [(res, o) for res, o in existing if res not in KEPT_ON_REMOVAL]
            for res, obj in existing:
                await writes.delete(self.client, res, obj)
            if existing:
                return Applied(state.name, "notReady",
                               f"deleting {len(existing)} objects of the removed section")
            return Applied(state.name, "ignore")
        try:
            objects = state.render(ctx, section, state.path)
        except RenderError as e:
            return Applied(state.name, "error", str(e))
        wanted = set()
        for obj in objects:
            self._own(obj, state, ctx.policy)
            res = resource_of(obj)
            wanted.add((res, key_of(obj)))
            cached = self.owned[res].store.get(key_of(obj))
            revision = obj["metadata"]["annotations"][REVISION_ANNOTATION]
            if cached is None or (cached["metadata"].get("annotations") or {}).get(
                REVISION_ANNOTATION
            ) != revision or not owned_by(cached, ctx.policy):
                stored, recreated = await writes.apply(self.client, obj)
                self.owned[res].assume(stored)
                if recreated:
                    await self.recorder.emit(ctx.policy, "Warning", "Recreated",
                                             f"{state.name}: {recreated}")
        stale = [(res, o) for res, o in existing if (res, key_of(o)) not in wanted]
        for res, obj in stale:
            await writes.delete(self.client, res, obj)
        if stale:
            return Applied(state.name, "notReady", f"deleting {len(stale)} stale objects")
        problems = [p for obj in objects if (p := self._not_ready(obj, ctx, unmanaged))]
        # What nicop does not do for this section is said whether or not it is ready.
        gaps = state.unsupported(section, state.path) if isinstance(state, PartialState) else []
        if problems:
            return Applied(state.name, "notReady", "; ".join(problems + gaps))
        return Applied(state.name, "ready", "; ".join(gaps))

    def _own(self, obj: Obj, state: State, policy: Obj) -> None:
        """Label, annotate and owner-reference a rendered object (the revision hashes the rest)."""
        m = obj["metadata"]
        m.setdefault("labels", {}).update({STATE_LABEL: state.name, OWNER_LABEL: OWNER_VALUE})
        m.setdefault("annotations", {})[REVISION_ANNOTATION] = content_hash(obj)
        pm = policy["metadata"]
        m["ownerReferences"] = [{
            "apiVersion": NCP.api_version, "kind": NCP.kind, "name": pm["name"],
            "uid": pm["uid"], "controller": True, "blockOwnerDeletion": True,
        }]

    def _objects_of(self, state_name: str) -> list[tuple[Resource, Obj]]:
        return [
            (res, obj)
            for res, informer in self.owned.items()
            for obj in informer.store.items()
            if (obj["metadata"].get("labels") or {}).get(STATE_LABEL) == state_name
        ]

    def _not_ready(self, obj: Obj, ctx: Context, unmanaged: list[str]) -> str | None:
        """Why a rendered object is not ready yet, in words a user can act on; None if ready."""
        res = resource_of(obj)
        cached = self.owned[res].store.get(key_of(obj))
        where = f"{obj['kind']} {key_of(obj)}"
        if cached is None:
            return f"{where} is being created"
        status = cached.get("status") or {}
        generation = cached["metadata"].get("generation", 0)
        if res in (DAEMONSET, DEPLOYMENT) and status.get("observedGeneration", 0) < generation:
            return f"{where} is being updated"
        if res == CRD:
            established = any(c.get("type") == "Established" and c.get("status") == "True"
                              for c in status.get("conditions") or [])
            return None if established else f"{where} is not established yet"
        if res == PERSISTENT_VOLUME_CLAIM:
            phase = status.get("phase", "Pending")
            if phase == "Bound":
                return None
            storage_class = cached["spec"].get("storageClassName") or "the default class"
            return (f"{where} is {phase}: no volume of storage class {storage_class} is bound "
                    "to it (is there a provisioner for that class?)")
        if res == DEPLOYMENT:
            want = cached["spec"].get("replicas", 1)
            have = status.get("readyReplicas", 0)
            return None if have >= want else f"{where}: {have} of {want} replicas ready"
        if res != DAEMONSET:
            return None
        desired = status.get("desiredNumberScheduled", 0)
        available = status.get("numberAvailable", 0)
        updated = status.get("updatedNumberScheduled", 0)
        if desired == 0:
            return f"{where} matches no node: " + self._why_no_node(cached, ctx, unmanaged)
        if available != desired or updated != desired:
            return f"{where}: {available} of {desired} pods available, {updated} updated" + \
                _driver_image_note(obj)
        # Ready by its status, unless nodes it should run on are not counted yet (e.g. a node
        # whose driver just became ready): asked last, as it looks at every node.
        expected = self._nodes_fitting(cached)
        if desired < expected:
            return (f"{where}: scheduled on {desired} of the {expected} nodes it should run on "
                    "(the DaemonSet controller has not caught up yet)")
        return None

    def _nodes_fitting(self, ds: Obj) -> int:
        """How many nodes the DaemonSet's template fits, counted again only when its
        generation or a node's labels or taints changed."""
        key, generation = key_of(ds), ds["metadata"].get("generation", 0)
        known = self._fitting.get(key)
        if known is not None and known[:2] == (self._placement_epoch, generation):
            return known[2]
        fits = daemon_pod_filter(ds["spec"]["template"].get("spec") or {})
        count = sum(map(fits, self.nodes.store.items()))
        self._fitting[key] = (self._placement_epoch, generation, count)
        return count

    def _why_no_node(self, ds: Obj, ctx: Context, unmanaged: list[str]) -> str:
        managed = ctx.managed_nodes
        if not managed:
            reason = (f"no node is managed (0 nodes have label {MELLANOX_LABEL}=true or "
                      f"{OPT_IN_LABEL}=true)")
        else:
            selector = ds["spec"]["template"]["spec"].get("nodeSelector") or {}
            reason = f"none of the {len(managed)} managed nodes match its nodeSelector"
            for label, value in selector.items():
                count = sum(labels_of(n).get(label) == value for n in managed)
                if count == 0:
                    reason = f"0 of {len(managed)} managed nodes have {label}={value}"
                    if label == MOFED_WAIT_LABEL:
                        reason += " (waiting for the driver container to be ready)"
                    break
        return "; ".join([reason, *unmanaged])

    # ------------------------------------------------------------------ node labels
    async def _sync_node_labels(self, policy: Obj | None) -> list[str]:
        """Keep mofed.wait on every node as the driver state says; remove it without a policy.
        Returns the writes the API server refused, each naming its node."""
        ofed = policy is not None and bool((policy.get("spec") or {}).get("ofedDriver"))
        ready: dict[str, bool] = {}
        for pod in self.driver_pods.store.items():
            node = pod.get("spec", {}).get("nodeName")
            if node:
                ready[node] = ready.get(node, False) or _container_ready(pod, DRIVER_CONTAINER)
        errors = []
        for node in self.nodes.store.items():
            wanted = node_rules.mofed_wait_value(node, ofed, ready) if policy else None
            patch = node_rules.label_patch(node, wanted)
            if patch is None:
                continue
            name = node["metadata"]["name"]
            try:
                self.nodes.assume(await self.client.patch(NODE, name, {"metadata": patch}))
                self._placement_epoch += 1  # the watch will bring no change: it is assumed
            except (ApiError, OSError) as e:
                message = f"labelling node {name} {MOFED_WAIT_LABEL}={wanted} failed: {e}"
                log.error("%s", message, extra=logs.about("Node", name))
                errors.append(message)
        return errors

    # ------------------------------------------------------------------ status
    def _status(self, policy: Obj, applied: list[Applied], unmanaged: list[str],
                label_errors: list[str]) -> Obj:
        generation = policy["metadata"].get("generation", 0)
        if any(a.refused for a in applied) or label_errors:
            # Part of the spec was not applied: the generation stays the last fully handled one.
            generation = (policy.get("status") or {}).get("observedGeneration", 0)
        not_ready = [a for a in applied if a.state in ("notReady", "error")]
        errors = [a for a in applied if a.state == "error"]
        conditions = []
        for state, a in zip(STATES, applied, strict=True):
            if a.state == "ignore":
                continue
            reason = {"ready": "ComponentReady", "notReady": "ComponentNotReady",
                      "error": "ComponentError"}[a.state]
            conditions.append(_condition(state.condition, a.state == "ready", reason,
                                         a.message or f"{state.name} is {a.state}", generation))
        # The reason names the first failing component (its condition type, Ready -> Error).
        failing = {a.name: s.condition for s, a in zip(STATES, applied, strict=True)}
        if errors:
            ready_reason = failing[errors[0].name].removesuffix("Ready") + "Error"
        elif label_errors:
            ready_reason = "NodeLabelsError"
        else:
            ready_reason = "ComponentsNotReady" if not_ready else "AllComponentsReady"
        parts = [f"error: {a.name}: {a.message}" for a in errors] + label_errors
        waiting = [a.name for a in not_ready if a.state != "error"]
        if waiting:
            parts.append("not ready: " + ", ".join(waiting))
        message = "; ".join(parts) or "all components are ready"
        if unmanaged:
            message += "; " + "; ".join(unmanaged)
        ok = not not_ready and not label_errors
        conditions.append(_condition("Ready", ok, ready_reason, message, generation))
        return {
            "state": "error" if errors or label_errors else "notReady" if not_ready else "ready",
            "appliedStates": [
                {"name": a.name, "state": a.state, **({"message": a.message} if a.message else {})}
                for a in applied
            ],
            "conditions": conditions,
            "observedGeneration": generation,
        }

    async def _write_status(self, policy: Obj, status: Obj) -> None:
        old = policy.get("status") or {}
        old_conditions = {c["type"]: c for c in old.get("conditions") or []}
        for c in status.get("conditions", []):
            previous = old_conditions.get(c["type"])
            if previous and previous.get("status") == c["status"]:
                c["lastTransitionTime"] = previous.get("lastTransitionTime",
                                                       c["lastTransitionTime"])
        if _comparable(old) == _comparable(status):
            return
        # Lists and keys nicop no longer sets must disappear: null them in the merge patch.
        patch = {**{k: None for k in old if k not in status}, **status}
        # Into the cache at once: the next reconcile compares with what the server now holds,
        # not with an older status the watch has yet to replace.
        self.policies.assume(await self.client.patch(NCP, policy["metadata"]["name"],
                                                     {"status": patch}, subresource="status"))
        if old.get("state") != status["state"]:
            ready = status["state"] == "ready"
            message = next((str(c["message"]) for c in status.get("conditions", [])
                            if c["type"] == "Ready"), str(status.get("reason", status["state"])))
            await self.recorder.emit(policy, "Normal" if ready else "Warning",
                                     "Ready" if ready else "NotReady", message)
            log.info("policy state %s", status["state"],
                     extra=logs.about(NCP.kind, policy["metadata"]["name"]))


def _condition(type_: str, ok: bool, reason: str, message: str, generation: int) -> Obj:
    return {"type": type_, "status": "True" if ok else "False", "reason": reason,
            "message": message, "observedGeneration": generation, "lastTransitionTime": stamp()}


def _comparable(status: Obj) -> Obj:
    """The status without what changes on every write (transition times)."""
    conditions = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                  for c in status.get("conditions") or []]
    return {**status, "conditions": conditions}


def removed_fields(policy: Obj) -> list[str]:
    """Warnings for upstream fields that were removed but that an old CR still sets."""
    try:
        return removed_field_warnings(NicClusterPolicy.model_validate(policy))
    except ValidationError:  # the API server validated it; a model mismatch is not fatal here
        log.warning("policy does not match the model", exc_info=True)
        return []


def _driver_image_note(ds: Obj) -> str:
    """For a driver DaemonSet, the image its pods need: with forcePrecompiled the precompiled
    tag, which nicop does not look up in the registry, so a missing one is named here."""
    if DRIVER_LABEL not in (ds["metadata"].get("labels") or {}):
        return ""
    containers = ds["spec"]["template"]["spec"].get("containers") or []
    ref = next((c.get("image") for c in containers if c.get("name") == DRIVER_CONTAINER), None)
    return f" (driver image {ref})" if ref else ""


def _container_ready(pod: Obj, name: str) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    return any(c.get("name") == name and c.get("ready")
               for c in (pod.get("status") or {}).get("containerStatuses") or [])
