"""Applying a state's rendered objects for one policy, deleting its stale ones, judging readiness.

NicClusterPolicy and NicNodePolicy share this: a policy's objects are told apart by their state
label and their `ds-owner` label (`NicClusterPolicy` or `nnp-<name>`), as upstream's. An object
is written only when its content hash differs from the one on the cached copy, so a policy at
rest costs no writes, also after a restart.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nicop import logs
from nicop.api.kinds import KINDS
from nicop.api.labels import (
    DRIVER_CONTAINER,
    DRIVER_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    MELLANOX_LABEL,
    MOFED_WAIT_LABEL,
    OPT_IN_LABEL,
    OWNER_LABEL,
    OWNER_VALUE,
    REVISION_ANNOTATION,
    STATE_LABEL,
)
from nicop.api.nodes import labels_of
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.events import EventRecorder
from nicop.kube.informer import Informer
from nicop.kube.manager import Manager
from nicop.kube.resources import (
    CLUSTER_ROLE,
    CLUSTER_ROLE_BINDING,
    CONFIGMAP,
    CRD,
    DAEMONSET,
    DEPLOYMENT,
    DEVICE_CLASS,
    NIC_CLUSTER_POLICY,
    NODE,
    PERSISTENT_VOLUME_CLAIM,
    SERVICE_ACCOUNT,
    Obj,
    Resource,
    key_of,
    resource_of,
)
from nicop.kube.scheduling import daemon_pod_filter
from nicop.kube.times import stamp
from nicop.operator import metrics, writes
from nicop.operator.states.base import Context, RenderError, State, content_hash
from nicop.operator.states.partial import PartialState
from nicop.operator.templates import substance
from nicop.operator.writes import WriteFailed

log = logging.getLogger(__name__)

OWNED = (SERVICE_ACCOUNT, CONFIGMAP, CLUSTER_ROLE, CLUSTER_ROLE_BINDING, DAEMONSET, DEPLOYMENT,
         CRD, PERSISTENT_VOLUME_CLAIM, DEVICE_CLASS)
# Kinds older clusters lack (resource.k8s.io/v1 came with Kubernetes 1.34): only a policy with
# draDriver needs them, so without them the operator still serves every other component.
MAY_BE_UNSERVED = (DEVICE_CLASS,)
# Kinds that hold what users made or stored: a CRD's custom resources (every IP pool goes with
# the nv-ipam CRDs), a PVC's files. A state never deletes them; one it no longer renders stays
# and is named in its message.
HOLDS_DATA = (CRD, PERSISTENT_VOLUME_CLAIM)
WORKLOADS = (DAEMONSET, DEPLOYMENT)
# CRDs nicop installs with its own (the chart's crds/, `nicop crds install`): found with a
# state's label (upstream's nv-ipam state applies them itself), they are adopted, not kept
# as the state's.
OWN_CRDS = frozenset(model.crd.name for model in KINDS)


def owned_by(obj: Obj, policy: Obj) -> bool:
    """The object names this policy as its owner. One left by an earlier policy of the same
    name (deleted and created again) would be garbage-collected with that one: adopt it."""
    uid = policy["metadata"].get("uid")
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def made_by_nicop(obj: Obj) -> bool:
    """Whether nicop rendered this object (another operator's, never rendered by nicop, is
    not nicop's to delete)."""
    return (obj["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE


def owner_of(obj: Obj) -> str:
    """The `ds-owner` of a rendered object; objects from before the label are the cluster
    policy's."""
    return str((obj["metadata"].get("labels") or {}).get(OWNER_LABEL, OWNER_VALUE))


def moves_placement(event: str, node: Obj, old: Obj | None) -> bool:
    """Whether a node event can change what runs where: a node added or gone, its labels or
    taints changed; heartbeats and status updates do not."""
    return event != "MODIFIED" or labels_of(node) != labels_of(old or {}) or (
        (node.get("spec") or {}).get("taints") != ((old or {}).get("spec") or {}).get("taints"))


def owner_reference(kind: Resource, policy: Obj, controller: bool = True) -> Obj:
    pm = policy["metadata"]
    ref: Obj = {"apiVersion": kind.api_version, "kind": kind.kind, "name": pm["name"],
                "uid": pm["uid"]}
    if controller:
        ref.update({"controller": True, "blockOwnerDeletion": True})
    return ref


def own(obj: Obj, state: State, ctx: Context, kind: Resource, co_owners: list[Obj]) -> None:
    """Label, annotate and owner-reference a rendered object (the revision hashes the rest)."""
    m = obj["metadata"]
    m.setdefault("labels", {}).update({STATE_LABEL: state.name, OWNER_LABEL: ctx.owner})
    others = sorted(co_owners, key=lambda o: o["metadata"]["name"])
    # Co-owners are hashed in, so one more or less rewrites the owner references.
    m.setdefault("annotations", {})[REVISION_ANNOTATION] = content_hash(
        [obj, [o["metadata"]["uid"] for o in others]] if others else obj)
    if obj["kind"] == CRD.kind:
        return  # a CRD never goes with the policy (see StateSync._release_from_policy)
    m["ownerReferences"] = [owner_reference(kind, ctx.policy), *(
        owner_reference(kind, o, controller=False) for o in others)]


@dataclass
class Applied:
    name: str
    state: str  # ready | notReady | ignore | error
    message: str = ""
    refused: bool = False  # the API server refused a write: the spec is not fully handled


class StateSync:
    """The objects every policy renders (cached by state label), written and judged."""

    def __init__(self, manager: Manager, namespace: str, recorder: EventRecorder) -> None:
        self.manager = manager
        self.client = manager.client
        self.recorder = recorder
        self.nodes = manager.informer(NODE)
        self.owned: dict[Resource, Informer] = {
            res: manager.informer(res, namespace if res.namespaced else None,
                                  label_selector=STATE_LABEL, optional=res in MAY_BE_UNSERVED)
            for res in OWNED
        }
        # The nodes a DaemonSet template fits, counted again only when a node's labels or
        # taints changed (the manager's placement epoch moved): DaemonSet key -> (epoch,
        # generation, count).
        self._fitting: dict[str, tuple[int, int, int]] = {}

    def placement_changed(self) -> None:
        self.manager.placement_changed()

    def objects_of(self, state_name: str, owner: str) -> list[tuple[Resource, Obj]]:
        return [
            (res, obj)
            for res, informer in self.owned.items()
            for obj in informer.store.items()
            if (obj["metadata"].get("labels") or {}).get(STATE_LABEL) == state_name
            and owner_of(obj) == owner
        ]

    async def sync(self, state: State, ctx: Context, unmanaged: list[str], kind: Resource,
                   section: Obj | None, co_owners: Mapping[str, list[Obj]] | None = None
                   ) -> Applied:
        """Apply `section` of the policy `ctx.policy` (of `kind`); None removes its objects.

        `co_owners` names, by `Kind/key`, the policies of the same kind that render the same
        object (a ServiceAccount several NicNodePolicies share): it is owned by all of them,
        written by the first by name, and goes when the last of them goes."""
        try:
            return await self._apply(state, ctx, unmanaged, kind, section, co_owners or {})
        except WriteFailed as e:
            name = ctx.policy["metadata"]["name"]
            log.error("%s: %s", state.name, e, extra=logs.about(kind.kind, name))
            await self.recorder.emit(ctx.policy, "Warning", "ApplyFailed", f"{state.name}: {e}")
            return Applied(state.name, "error", str(e), refused=True)

    async def _apply(self, state: State, ctx: Context, unmanaged: list[str], kind: Resource,
                     section: Obj | None, co_owners: Mapping[str, list[Obj]]) -> Applied:
        existing = self.objects_of(state.name, ctx.owner)
        if section is None:
            gone, left = await self._remove(state, ctx, existing, set())
            if gone:
                return Applied(state.name, "notReady",
                               f"deleting {gone} objects of the removed section")
            return Applied(state.name, "ignore", "; ".join(left))
        try:
            objects = state.render(ctx, section, state.path)
        except RenderError as e:
            return Applied(state.name, "error", str(e))
        name = ctx.policy["metadata"]["name"]
        wanted = set()
        for obj in objects:
            others = [o for o in co_owners.get(f"{obj['kind']}/{key_of(obj)}") or []
                      if o["metadata"]["uid"] != ctx.policy["metadata"]["uid"]]
            if any(o["metadata"]["name"] < name for o in others):
                continue  # written by the first of its owners by name
            own(obj, state, ctx, kind, others)
            res = resource_of(obj)
            wanted.add((res, key_of(obj)))
            cached = self.owned[res].store.get(key_of(obj))
            if self._up_to_date(res, cached, obj, ctx.policy):
                continue
            if cached is not None and res in WORKLOADS:
                await self._keep_running_pods(state, ctx, obj, cached)
            stored, recreated = await writes.apply(self.client, obj)
            if res == CRD:
                stored = await self._release_from_policy(stored, ctx.policy)
            self.owned[res].assume(stored)
            if recreated:
                await self.recorder.emit(ctx.policy, "Warning", "Recreated",
                                         f"{state.name}: {recreated}")
        gone, left = await self._remove(state, ctx, existing, wanted)
        if gone:
            return Applied(state.name, "notReady", f"deleting {gone} stale objects")
        problems = [p for obj in objects if (p := self._not_ready(obj, ctx, unmanaged))]
        # What nicop does not do for this section is said whether or not it is ready.
        gaps = state.unsupported(section, state.path) if isinstance(state, PartialState) else []
        if problems:
            return Applied(state.name, "notReady", "; ".join(problems + gaps + left))
        return Applied(state.name, "ready", "; ".join(gaps + left))

    @staticmethod
    def _up_to_date(res: Resource, cached: Obj | None, obj: Obj, policy: Obj) -> bool:
        """The cached object holds this rendering (its revision) and, but for a CRD (which
        never goes with the policy), names the policy as its owner."""
        if cached is None:
            return False
        revision = (cached["metadata"].get("annotations") or {}).get(REVISION_ANNOTATION)
        if revision != obj["metadata"]["annotations"][REVISION_ANNOTATION]:
            return False
        return res == CRD or owned_by(cached, policy)

    async def _keep_running_pods(self, state: State, ctx: Context, obj: Obj,
                                 cached: Obj) -> None:
        """Write the running pod template back instead of the rendered one when the two
        differ only in what restarts no pod (labels, annotations, probes, API defaults):
        adopting another operator's workload, or a rendering that changed in form only,
        replaces no pod and reloads no driver. Compared as the API server would store the
        write (a dry run), so defaults count as what they are."""
        try:
            planned = await self.client.apply(obj, dry_run=True)
        except (ApiError, OSError):
            return  # the write itself says what is wrong (or recreates a selector)
        running = cached["spec"]["template"]
        if substance(planned["spec"]["template"]) != substance(running):
            return
        kept = copy.deepcopy(running)
        (kept.get("metadata") or {}).pop("creationTimestamp", None)
        obj["spec"]["template"] = kept
        if planned["spec"]["template"] != running:
            where = writes.describe(obj)
            log.info("%s: kept the running pod template; the rendered one differs only in "
                     "labels, annotations or probes", where,
                     extra=_about(ctx))
            await self.recorder.emit(
                ctx.policy, "Normal", "PodsKept",
                f"{state.name}: {where} keeps its running pod template: the policy changes "
                "only labels, annotations or probes there, which restarts no pod; they take "
                "effect with the next change of what its containers run")

    async def _release_from_policy(self, crd: Obj, policy: Obj) -> Obj:
        """A CRD does not go with the policy: garbage collection of the policy would take
        every custom resource of the kind with it (upstream owns its CRDs by the policy)."""
        if not owned_by(crd, policy):
            return crd
        refs = [r for r in crd["metadata"].get("ownerReferences") or []
                if r.get("uid") != policy["metadata"]["uid"]]
        return await self.client.patch(CRD, crd["metadata"]["name"],
                                       {"metadata": {"ownerReferences": refs or None}})

    async def _remove(self, state: State, ctx: Context, existing: list[tuple[Resource, Obj]],
                      wanted: set[tuple[Resource, str]]) -> tuple[int, list[str]]:
        """Delete the state's objects nicop made and no longer renders; keep, and name, those
        that hold data or that another operator made. Returns how many went and what stays."""
        gone, left = 0, []
        for res, obj in existing:
            if (res, key_of(obj)) in wanted:
                continue
            what = writes.describe(obj)
            if res == CRD and obj["metadata"]["name"] in OWN_CRDS:
                await self._adopt_own_crd(state, ctx, obj)
            elif res in HOLDS_DATA:
                if res == CRD:
                    obj = await self._release_from_policy(obj, ctx.policy)
                    self.owned[res].assume(obj)
                left.append(f"{what} is kept: nicop never deletes what holds data (a CRD's "
                            "custom resources, a volume's files); delete it yourself once "
                            "unused")
            elif not made_by_nicop(obj):
                left.append(f"{what} is left in place: another operator made it and nicop "
                            "does not render it; delete it yourself once unused")
            else:
                await writes.delete(self.client, res, obj)
                gone += 1
        return gone, left

    async def _adopt_own_crd(self, state: State, ctx: Context, crd: Obj) -> None:
        """One of nicop's own CRDs that a state of another operator labelled and owned: it
        becomes a plain nicop CRD, no state's object and not owned by the policy."""
        meta = crd["metadata"]
        refs = [r for r in meta.get("ownerReferences") or []
                if r.get("uid") != ctx.policy["metadata"]["uid"]]
        await self.client.patch(CRD, meta["name"], {"metadata": {
            "labels": {STATE_LABEL: None, OWNER_LABEL: None},
            "ownerReferences": refs or None}})
        log.info("adopted %s from %s", writes.describe(crd), state.name,
                 extra=_about(ctx))
        await self.recorder.emit(
            ctx.policy, "Normal", "Adopted",
            f"{state.name}: {writes.describe(crd)} is one of nicop's own CRDs: kept, and no "
            "longer owned by the policy, so deleting the policy keeps its custom resources")

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
        if known is not None and known[:2] == (self.manager.placement_epoch, generation):
            return known[2]
        fits = daemon_pod_filter(ds["spec"]["template"].get("spec") or {})
        count = sum(map(fits, self.nodes.store.items()))
        self._fitting[key] = (self.manager.placement_epoch, generation, count)
        return count

    def _why_no_node(self, ds: Obj, ctx: Context, unmanaged: list[str]) -> str:
        managed = ctx.managed_nodes
        if not managed:
            reason = (f"no node is managed (0 nodes have label {MELLANOX_LABEL}=true or "
                      f"{OPT_IN_LABEL}=true)")
            if ctx.node_policy:
                reason = "no managed node matches the policy's nodeSelector"
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


def _about(ctx: Context) -> dict[str, str]:
    """The log fields naming the policy the objects are rendered for."""
    kind = "NicNodePolicy" if ctx.node_policy else NIC_CLUSTER_POLICY.kind
    return logs.about(kind, ctx.policy["metadata"]["name"])


def build_status(policy: Obj, states: Sequence[State], applied: list[Applied],
                 unmanaged: list[str], label_errors: list[str]) -> Obj:
    """The status of a policy (either kind) from its states, in upstream's shape."""
    generation = policy["metadata"].get("generation", 0)
    if any(a.refused for a in applied) or label_errors:
        # Part of the spec was not applied: the generation stays the last fully handled one.
        generation = (policy.get("status") or {}).get("observedGeneration", 0)
    not_ready = [a for a in applied if a.state in ("notReady", "error")]
    errors = [a for a in applied if a.state == "error"]
    conditions = []
    for state, a in zip(states, applied, strict=True):
        if a.state == "ignore":
            continue
        reason = {"ready": "ComponentReady", "notReady": "ComponentNotReady",
                  "error": "ComponentError"}[a.state]
        conditions.append(condition(state.condition, a.state == "ready", reason,
                                     a.message or f"{state.name} is {a.state}", generation))
    # The reason names the first failing component (its condition type, Ready -> Error).
    failing = {a.name: s.condition for s, a in zip(states, applied, strict=True)}
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
    conditions.append(condition("Ready", ok, ready_reason, message, generation))
    return {
        "state": "error" if errors or label_errors else "notReady" if not_ready else "ready",
        "appliedStates": [
            {"name": a.name, "state": a.state, **({"message": a.message} if a.message else {})}
            for a in applied
        ],
        "conditions": conditions,
        "observedGeneration": generation,
    }


async def write_status(client: ApiClient, policies: Informer, kind: Resource,
                       recorder: EventRecorder, policy: Obj, status: Obj) -> None:
    """Write a policy's status when it changed (transition times kept), with an Event when
    its state changes."""
    metrics.policy_status(kind.kind, policy["metadata"]["name"], status)
    old = policy.get("status") or {}
    old_conditions = {c["type"]: c for c in old.get("conditions") or []}
    for c in status.get("conditions", []):
        previous = old_conditions.get(c["type"])
        if previous and previous.get("status") == c["status"]:
            c["lastTransitionTime"] = previous.get("lastTransitionTime",
                                                   c["lastTransitionTime"])
    if comparable(old) == comparable(status):
        return
    # Lists and keys nicop no longer sets must disappear: null them in the merge patch.
    patch = {**{k: None for k in old if k not in status}, **status}
    # Into the cache at once: the next reconcile compares with what the server now holds,
    # not with an older status the watch has yet to replace.
    policies.assume(await client.patch(kind, policy["metadata"]["name"],
                                       {"status": patch}, subresource="status"))
    if old.get("state") != status["state"]:
        ready = status["state"] == "ready"
        message = next((str(c["message"]) for c in status.get("conditions", [])
                        if c["type"] == "Ready"), str(status.get("reason", status["state"])))
        await recorder.emit(policy, "Normal" if ready else "Warning",
                            "Ready" if ready else "NotReady", message)
        log.info("policy state %s", status["state"],
                 extra=logs.about(kind.kind, policy["metadata"]["name"]))


def condition(type_: str, ok: bool, reason: str, message: str, generation: int) -> Obj:
    return {"type": type_, "status": "True" if ok else "False", "reason": reason,
            "message": message, "observedGeneration": generation, "lastTransitionTime": stamp()}


def comparable(status: Obj) -> Obj:
    """The status without what changes on every write (transition times)."""
    conditions = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                  for c in status.get("conditions") or []]
    return {**status, "conditions": conditions}


def _driver_image_note(ds: Obj) -> str:
    """For a driver DaemonSet, the image its pods need: with forcePrecompiled the precompiled
    tag, which nicop does not look up in the registry, so a missing one is named here."""
    if DRIVER_LABEL not in (ds["metadata"].get("labels") or {}):
        return ""
    containers = ds["spec"]["template"]["spec"].get("containers") or []
    ref = next((c.get("image") for c in containers if c.get("name") == DRIVER_CONTAINER), None)
    return f" (driver image {ref})" if ref else ""
