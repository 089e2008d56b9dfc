"""`nicop plan`: what applying a file would do, computed from the live cluster, nothing written.

Each object of the file goes to the API server as a dry run that replaces the whole object (the
file is the object, as `kubectl apply` of it leaves it): the API server's refusals are its own,
with its defaults filled in. For a NicClusterPolicy or NicNodePolicy the operator's renderers
render the policy as it is and as it would be; what differs is what the operator would create,
change and delete. A driver DaemonSet whose pods would run something else means a driver reload
on each of its nodes, ordered by the upgrade controller's own slot rule
(nicop.operator.upgrade.nodes_to_start) and with each node's drain judged as the controller
judges it (nicop.operator.drain). For a SriovNetworkNodePolicy, the node states the operator
would write and what each node's config daemon would then do to its VFs (drain, reboot). For a
network, the NetworkAttachmentDefinition the operator would render. The JSON form is
docs/plan-schema.json.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import yaml

from nicop.api.kinds import KINDS
from nicop.api.labels import (
    DRIVER_LABEL,
    OPT_IN_LABEL,
    OWNER_LABEL,
    OWNER_VALUE,
    POLICY_NAME,
    REVISION_ANNOTATION,
)
from nicop.api.mellanox import (
    DrainSpec,
    DriverUpgradePolicySpec,
    WaitForCompletionSpec,
    driver_upgrade_policy,
)
from nicop.api.nodes import is_managed, labels_of
from nicop.api.sriovnetwork import operator_settings, pool_settings
from nicop.api.upgrade import (
    DONE,
    FAILED,
    PREFLIGHT_ANNOTATION,
    REQUIRED,
    SKIP_LABEL,
)
from nicop.kube import selectors
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.resources import (
    BUILTIN,
    DAEMONSET,
    DEPLOYMENT,
    NETWORK_ATTACHMENT_DEFINITION,
    NIC_CLUSTER_POLICY,
    NODE,
    POD,
    POD_DISRUPTION_BUDGET,
    SRIOV_NODE_POLICY,
    Obj,
    Resource,
    key_of,
)
from nicop.kube.scheduling import daemon_pod_filter
from nicop.node.sriov_daemon import plan as vf_work
from nicop.operator import networks, sriov_networks
from nicop.operator.drain import evictable, pod_name, refusal
from nicop.operator.node_policy import NNP, NNP_STATES, selects
from nicop.operator.sriov import (
    DEFAULT_DAEMON_NODE_SELECTOR,
    judge,
    labels_match,
    node_state_spec,
    read_policies,
)
from nicop.operator.sriov_drain import (
    NODE_STATE,
    OPERATOR_CONFIG,
    POOL_CONFIG,
    PoolError,
    operator_config,
    pool_of,
    resource_prefix,
    uses_resource,
)
from nicop.operator.state_sync import HOLDS_DATA, own
from nicop.operator.states import STATES
from nicop.operator.states.base import Context, RenderError, State
from nicop.operator.templates import substance, what_runs
from nicop.operator.upgrade import NodeView, nodes_to_start

DRAIN_FIELD = "ofedDriver.upgradePolicy.drain"
# What the API server fills in or keeps for itself: not what a user changes.
SERVER_FIELDS = ("managedFields", "resourceVersion", "generation", "uid", "creationTimestamp",
                 "selfLink")


class PlanError(Exception):
    """The file cannot be planned (not an object, a kind nobody serves)."""


@dataclass
class ObjectChange:
    """One object created, changed, deleted or kept; `diff` is a unified diff of its YAML."""

    action: str  # create | change | delete | keep | unchanged | refused
    kind: str
    name: str
    namespace: str | None = None
    diff: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def title(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"


@dataclass
class NodeReload:
    """One node whose driver would reload, and what its drain would meet."""

    node: str
    batch: int | None  # 1-based; None: it never starts (see `waiting`)
    evicts: list[str] = field(default_factory=list)
    waits_for: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)  # pods a PodDisruptionBudget keeps, why
    refused: str | None = None  # a pod the drain may not take: the node fails at once
    preflight: str | None = None  # the driver agent refuses to reload the node now
    waiting: str | None = None


@dataclass
class DriverRollout:
    """The driver reload of one pool (the NicClusterPolicy's or a NicNodePolicy's)."""

    policy: str
    daemonset: str
    automatic: bool
    max_parallel_upgrades: int
    max_unavailable: Any
    drain: bool
    batches: list[list[str]] = field(default_factory=list)
    nodes: list[NodeReload] = field(default_factory=list)
    new_nodes: list[str] = field(default_factory=list)  # no driver pod yet: first load


@dataclass
class VfChange:
    """One node whose VFs an SR-IOV policy change would reconfigure."""

    node: str
    changes: list[str]  # per PF, what changes (the config daemon's own words)
    drain: bool
    reboot: bool
    undrained: bool = False  # VFs in use change without a drain (disableDrain)
    evicts: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)


@dataclass
class Plan:
    objects: list[ObjectChange] = field(default_factory=list)  # the file's
    operator: list[ObjectChange] = field(default_factory=list)  # what the operator renders
    restarts: list[str] = field(default_factory=list)
    rollouts: list[DriverRollout] = field(default_factory=list)
    vf_changes: list[VfChange] = field(default_factory=list)
    requests: dict[str, int] = field(default_factory=dict)

    @property
    def refused(self) -> list[ObjectChange]:
        return [c for c in self.objects if c.action == "refused"]

    @property
    def disruptive(self) -> list[str]:
        """What would disturb running workloads or nodes, one line each."""
        found = []
        for r in self.rollouts:
            reload = [n.node for n in r.nodes]
            if r.automatic and reload:
                found.append(f"{r.policy}: the driver reloads on {len(reload)} nodes")
            evicted = sum(len(n.evicts) for n in r.nodes)
            if r.automatic and evicted:
                found.append(f"{r.policy}: {evicted} pods are evicted")
            if r.new_nodes:
                found.append(f"{r.policy}: the driver is loaded for the first time on "
                             f"{len(r.new_nodes)} nodes")
        for v in self.vf_changes:
            if v.undrained:
                found.append(f"node {v.node}: VFs pods may use are reconfigured without a "
                             "drain (SriovOperatorConfig disableDrain)")
            elif v.reboot or v.drain:
                found.append(f"node {v.node} is {'rebooted' if v.reboot else 'drained'} to "
                             "reconfigure its VFs" + (f" ({len(v.evicts)} pods evicted)"
                                                      if v.evicts else ""))
        found += [f"{c.title} is deleted" for c in self.operator if c.action == "delete"
                  and c.kind in (DAEMONSET.kind, DEPLOYMENT.kind)]
        return found

    def to_json(self) -> Obj:
        return {
            "schemaVersion": 1,
            "objects": [_change_json(c) for c in self.objects],
            "operatorObjects": [_change_json(c) for c in self.operator
                                if c.action != "unchanged"],
            "podRestarts": self.restarts,
            "driverRollouts": [_rollout_json(r) for r in self.rollouts],
            "vfChanges": [{"node": v.node, "changes": v.changes, "drain": v.drain,
                           "reboot": v.reboot, "undrained": v.undrained, "evicts": v.evicts,
                           "blocked": v.blocked}
                          for v in self.vf_changes],
            "disruptive": self.disruptive,
            "refused": [f"{c.title}: {c.note}" for c in self.refused],
            "requests": self.requests,
        }

    def exit_code(self) -> int:
        """0 nothing disruptive, 2 disruptive, 1 the API server would refuse part of it."""
        if self.refused:
            return 1
        return 2 if self.disruptive else 0


def _rollout_json(r: DriverRollout) -> Obj:
    return {"policy": r.policy, "daemonSet": r.daemonset, "automatic": r.automatic,
            "maxParallelUpgrades": r.max_parallel_upgrades, "maxUnavailable": r.max_unavailable,
            "drain": r.drain, "batches": r.batches, "newNodes": r.new_nodes,
            "nodes": [{"node": n.node, "batch": n.batch, "evicts": n.evicts,
                       "waitsFor": n.waits_for, "blocked": n.blocked, "refused": n.refused,
                       "preflight": n.preflight, "waiting": n.waiting} for n in r.nodes]}


def _change_json(c: ObjectChange) -> Obj:
    return {"action": c.action, "kind": c.kind, "name": c.name,
            **({"namespace": c.namespace} if c.namespace else {}),
            **({"diff": c.diff} if c.diff else {}), **({"note": c.note} if c.note else {})}


def resource_for(obj: Obj) -> Resource:
    """The Resource of a file's object: a built-in kind or one of nicop's CRDs."""
    if not isinstance(obj, dict) or not obj.get("apiVersion") or not obj.get("kind") \
            or not (obj.get("metadata") or {}).get("name"):
        raise PlanError("every object needs apiVersion, kind and metadata.name")
    key = f"{obj['apiVersion']}/{obj['kind']}"
    if key in BUILTIN:
        return BUILTIN[key]
    for model in KINDS:
        info = model.crd
        if info.api_version == obj["apiVersion"] and info.kind == obj["kind"]:
            return Resource(info.group, info.version, info.kind, info.plural,
                            namespaced=info.namespaced)
    raise PlanError(f"{obj['kind']} {obj['metadata']['name']}: nicop does not plan {key}")


# ------------------------------------------------------------------ reading


@dataclass
class Cluster:
    """What the plan reads once: nodes, pods, PodDisruptionBudgets."""

    nodes: list[Obj]
    pods: list[Obj]
    budgets: list[Obj]

    def pods_on(self) -> dict[str, list[Obj]]:
        by_node: dict[str, list[Obj]] = defaultdict(list)
        for pod in self.pods:
            by_node[(pod.get("spec") or {}).get("nodeName") or ""].append(pod)
        return by_node


async def read(client: ApiClient) -> Cluster:
    nodes, _ = await client.list(NODE)
    pods, _ = await client.list(POD)
    budgets, _ = await client.list(POD_DISRUPTION_BUDGET)
    return Cluster(nodes, pods, budgets)


# ------------------------------------------------------------------ the file's objects


async def dry_run(client: ApiClient, obj: Obj) -> tuple[Obj | None, Obj | None, ObjectChange]:
    """The live object, the object as the API server would store it (None: refused), and the
    change between them."""
    res = resource_for(obj)
    meta = obj["metadata"]
    namespace = meta.get("namespace") if res.namespaced else None
    change = ObjectChange("create", obj["kind"], meta["name"], namespace)
    live = await client.get_or_none(res, meta["name"], namespace)
    try:
        if live is None:
            stored = await client.create(obj, res=res, dry_run=True)
        else:
            replacing = {**obj, "metadata": {**meta, "resourceVersion":
                                             live["metadata"]["resourceVersion"]}}
            stored = await client.update(replacing, res=res, dry_run=True)
    except ApiError as e:
        if e.code in (400, 403, 409, 422):
            change.action, change.note = "refused", e.message
            if "immutable" in e.message:
                change.note += " (an immutable field: only deleting and creating it again " \
                               "changes it)"
            return live, None, change
        raise
    if live is not None:
        change.diff = diff(live, stored)
        change.action = "change" if change.diff else "unchanged"
    return live, stored, change


def comparable(obj: Obj) -> Obj:
    """The object without its status and what the API server keeps for itself."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in SERVER_FIELDS}
    return {**{k: v for k, v in obj.items() if k != "status"}, "metadata": meta}


def diff(old: Obj | None, new: Obj | None) -> list[str]:
    def text(obj: Obj | None) -> list[str]:
        if obj is None:
            return []
        return yaml.safe_dump(comparable(obj), sort_keys=True).splitlines()
    return list(difflib.unified_diff(text(old), text(new), "live", "planned", n=2,
                                     lineterm=""))


# ------------------------------------------------------------------ what the operator renders


def render(policy: Obj | None, states: Iterable[State], ctx_of: Callable[[Obj], Context],
           kind: Resource, errors: dict[str, str] | None = None
           ) -> dict[tuple[str, str], tuple[State, Obj]]:
    """Every object the operator renders for `policy`, by (kind, key); a state it cannot
    render goes into `errors` (state name -> why) with no object."""
    if policy is None:
        return {}
    ctx = ctx_of(policy)
    objects = {}
    for state in states:
        section = state.section_of(policy)
        if section is None:
            continue
        try:
            rendered = state.render(ctx, section, state.path)
        except RenderError as e:
            if errors is not None:
                errors[state.name] = str(e)
            continue
        for obj in rendered:
            own(obj, state, ctx, kind, [])
            objects[obj["kind"], key_of(obj)] = (state, obj)
    return objects


def operator_changes(old: dict[tuple[str, str], tuple[State, Obj]],
                     new: dict[tuple[str, str], tuple[State, Obj]]) -> list[ObjectChange]:
    changes = []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key), new.get(key)
        obj = (after or before)[1]  # type: ignore[index]
        meta = obj["metadata"]
        change = ObjectChange("unchanged", obj["kind"], meta["name"], meta.get("namespace"))
        if before is None:
            change.action = "create"
        elif after is None:
            kept = any(obj["kind"] == k.kind for k in HOLDS_DATA)
            change.action = "keep" if kept else "delete"
            if kept:
                change.note = "kept: nicop never deletes what holds data"
        elif _revision(before[1]) != _revision(after[1]):
            change.action, change.diff = "change", diff(before[1], after[1])
        changes.append(change)
    return changes


def _revision(obj: Obj) -> str:
    return str(obj["metadata"]["annotations"][REVISION_ANNOTATION])


def restarts(old: dict[tuple[str, str], tuple[State, Obj]],
             new: dict[tuple[str, str], tuple[State, Obj]], cluster: Cluster) -> list[str]:
    """The non-driver workloads whose pods would be replaced, with how many run now."""
    found = []
    for key, (_, obj) in sorted(new.items()):
        if obj["kind"] not in (DAEMONSET.kind, DEPLOYMENT.kind) or key not in old \
                or DRIVER_LABEL in labels_of(obj):
            continue
        before = old[key][1]
        if substance(before["spec"]["template"]) == substance(obj["spec"]["template"]):
            continue
        running = _pods_of(cluster, obj)
        why = "its selector changes, so it is recreated" if before["spec"].get(
            "selector") != obj["spec"].get("selector") else "its pod template changes"
        found.append(f"{obj['kind']} {key_of(obj)}: {why}; its {len(running)} running pods "
                     "are replaced")
    return found


def _pods_of(cluster: Cluster, workload: Obj) -> list[Obj]:
    meta = workload["metadata"]
    selector = (workload.get("spec") or {}).get("selector")
    return [p for p in cluster.pods if p["metadata"].get("namespace") == meta.get("namespace")
            and selectors.matches_label_selector(selector, labels_of(p))]


# ------------------------------------------------------------------ driver rollouts


def driver_rollouts(old: dict[tuple[str, str], tuple[State, Obj]],
                    new: dict[tuple[str, str], tuple[State, Obj]], policy: Obj,
                    cluster: Cluster, namespace: str, owner: str) -> list[DriverRollout]:
    """For each driver DaemonSet whose pods would run something else: its nodes' reloads."""
    rollouts = []
    for key, (_, ds) in sorted(new.items()):
        if ds["kind"] != DAEMONSET.kind or DRIVER_LABEL not in labels_of(ds):
            continue
        before = old.get(key)
        if before is not None and what_runs(before[1]["spec"]["template"]) == what_runs(
                ds["spec"]["template"]):
            continue
        # The policy as the API server stored it (its dry run): valid for the model too.
        upgrade = driver_upgrade_policy(policy)
        rollout = DriverRollout(
            f"{policy['kind']} {policy['metadata']['name']}", key_of(ds), upgrade.auto_upgrade,
            upgrade.max_parallel_upgrades, upgrade.max_unavailable,
            (upgrade.drain or DrainSpec()).enable)
        pods = {p["spec"].get("nodeName"): p for p in cluster.pods
                if p["metadata"].get("namespace") == namespace
                and DRIVER_LABEL in labels_of(p)
                and labels_of(p).get(OWNER_LABEL, OWNER_VALUE) == owner}
        fits = daemon_pod_filter(ds["spec"]["template"].get("spec") or {})
        nodes = sorted((n for n in cluster.nodes if n["metadata"]["name"] in pods),
                       key=lambda n: n["metadata"]["name"])
        rollout.new_nodes = sorted(n["metadata"]["name"] for n in cluster.nodes
                                   if n["metadata"]["name"] not in pods and fits(n))
        plan_reloads(rollout, nodes, pods, cluster, upgrade)
        rollouts.append(rollout)
    return rollouts


def plan_reloads(rollout: DriverRollout, nodes: list[Obj], pods: dict[str, Obj],
                 cluster: Cluster, upgrade: DriverUpgradePolicySpec) -> None:
    """Each node's drain, and the batches the upgrade controller would start them in."""
    by_node = cluster.pods_on()
    waits_for = (upgrade.wait_for_completion or WaitForCompletionSpec()).pod_selector
    drain = upgrade.drain or DrainSpec()
    reloads = {}
    for node in nodes:
        name = node["metadata"]["name"]
        reload = NodeReload(name, None)
        preflight = (node["metadata"].get("annotations") or {}).get(PREFLIGHT_ANNOTATION)
        if preflight:
            reload.preflight = preflight
        on_node = by_node.get(name, [])
        if waits_for:
            reload.waits_for = [pod_name(p) for p in on_node if selectors.matches_string(
                waits_for, labels_of(p)) and (p.get("status") or {}).get("phase")
                not in ("Succeeded", "Failed")]
        if rollout.drain:
            reload.evicts, reload.blocked, reload.refused = drain_of(
                [p for p in on_node if evictable(p, drain.pod_selector or "")],
                cluster.budgets, drain)
            if reload.blocked:
                timeout = drain.timeout_seconds
                reload.waiting = (f"the drain fails after {timeout} s and the node keeps its "
                                  "slot, cordoned, until its driver is Ready" if timeout
                                  else "the drain has no timeout: the node waits, cordoned")
        if node["metadata"].get("labels", {}).get(SKIP_LABEL) == "true":
            reload.waiting = f"skipped: the node has {SKIP_LABEL}=true"
        reloads[name] = reload
    rollout.nodes = list(reloads.values())
    if not rollout.automatic:
        for r in rollout.nodes:
            r.waiting = ("autoUpgrade is off: the new driver loads when the node's driver pod "
                         "is deleted")
        return
    stuck = {n for n, r in reloads.items() if r.blocked or r.refused or r.preflight}
    views = [NodeView(n, pods[n["metadata"]["name"]], False) for n in nodes]
    rollout.batches = batches(views, rollout.max_parallel_upgrades, rollout.max_unavailable,
                              stuck)
    for number, batch in enumerate(rollout.batches, 1):
        for name in batch:
            reloads[name].batch = number


def drain_of(pods: list[Obj], budgets: list[Obj], drain: DrainSpec | None
             ) -> tuple[list[str], list[str], str | None]:
    """What a drain of these pods meets: the pods evicted, those a PodDisruptionBudget keeps
    (with the budget), and a pod `kubectl drain` would refuse under the driver's `drain`
    settings (None: no such check, as the SR-IOV drain)."""
    allowed = {key_of(b): int((b.get("status") or {}).get("disruptionsAllowed", 0))
               for b in budgets}
    left = dict(allowed)
    evicts: list[str] = []
    blocked: list[str] = []
    for pod in pods:
        if drain is not None and (why := refusal(pod, drain.force, drain.delete_empty_dir,
                                                 DRAIN_FIELD)):
            return evicts, blocked, f"pod {pod_name(pod)} {why}"
        budget = _budget_of(pod, budgets)
        if budget is not None and left[key_of(budget)] <= 0:
            blocked.append(f"{pod_name(pod)} (PodDisruptionBudget {key_of(budget)} allows "
                           f"{allowed[key_of(budget)]} disruptions)")
            continue
        if budget is not None:
            left[key_of(budget)] -= 1
        evicts.append(pod_name(pod))
    return evicts, blocked, None


def _budget_of(pod: Obj, budgets: list[Obj]) -> Obj | None:
    namespace = pod["metadata"].get("namespace")
    for budget in budgets:
        if budget["metadata"].get("namespace") == namespace and selectors.matches_label_selector(
                (budget.get("spec") or {}).get("selector"), labels_of(pod)):
            return budget
    return None


def batches(views: list[NodeView], max_parallel: int, max_unavailable: Any,
            stuck: set[str]) -> list[list[str]]:
    """The nodes in the order and groups the upgrade controller lets them start, if every
    node took as long: each round the nodes its slot rule starts; a node in `stuck` (its drain
    blocked or refused, its reload refused by the agent) fails and keeps its slot cordoned,
    as upgrade-failed does."""
    for view in views:
        if view.state in ("", DONE):
            view.state = REQUIRED
    rounds = []
    while started := nodes_to_start(views, max_parallel, max_unavailable):
        rounds.append([v.name for v in started])
        for view in started:
            if view.name in stuck:
                view.node = {**view.node, "spec": {**(view.node.get("spec") or {}),
                                                   "unschedulable": True}}
                view.state = FAILED
            else:
                view.state = DONE
    return rounds


# ------------------------------------------------------------------ the whole plan


async def plan(client: ApiClient, objects: list[Obj], namespace: str) -> Plan:
    cluster = await read(client)
    result = Plan()
    for obj in objects:
        live, stored, change = await dry_run(client, obj)
        result.objects.append(change)
        if stored is None:
            continue
        if obj["kind"] == NIC_CLUSTER_POLICY.kind and obj["apiVersion"] == \
                NIC_CLUSTER_POLICY.api_version:
            _policy_effects(result, cluster, live, stored, change, namespace,
                            NIC_CLUSTER_POLICY)
        elif obj["kind"] == NNP.kind and obj["apiVersion"] == NNP.api_version:
            _policy_effects(result, cluster, live, stored, change, namespace, NNP)
        elif obj["kind"] == SRIOV_NODE_POLICY.kind and \
                obj["apiVersion"] == SRIOV_NODE_POLICY.api_version:
            await _sriov_effects(client, result, cluster, stored, change, namespace)
        elif nad := _rendered_nad(stored, change, namespace):
            result.operator.append(await _nad_change(client, nad))
    result.requests = {"reads": sum(n for (verb, _), n in client.requests.items()
                                    if verb in ("get", "list")),
                       "dryRuns": sum(n for (verb, _), n in client.requests.items()
                                      if verb == "dry-run"),
                       "writes": client.writes(exclude=())}
    return result


def _policy_effects(result: Plan, cluster: Cluster, live: Obj | None, stored: Obj,
                    change: ObjectChange, namespace: str, kind: Resource) -> None:
    opt_in_used = any(OPT_IN_LABEL in labels_of(n) for n in cluster.nodes)
    managed = [n for n in cluster.nodes if is_managed(n)]
    if kind == NNP:
        name = stored["metadata"]["name"]
        owner, states = f"nnp-{name}", NNP_STATES

        def ctx_of(policy: Obj) -> Context:
            return Context(policy, namespace, [n for n in managed if selects(policy, n)],
                           opt_in_used=opt_in_used, node_policy=name)
    else:
        owner, states = OWNER_VALUE, STATES

        def ctx_of(policy: Obj) -> Context:
            return Context(policy, namespace, managed, opt_in_used=opt_in_used)
    if stored["metadata"]["name"] != POLICY_NAME and kind == NIC_CLUSTER_POLICY:
        return  # the operator ignores it (its status says so)
    before = render(live, states, ctx_of, kind)
    errors: dict[str, str] = {}
    after = render(stored, states, ctx_of, kind, errors)
    if errors:
        # The operator puts such a state in error and leaves its objects as they are (it
        # deletes only what a section it renders no longer has): nothing of it changes.
        after.update({key: value for key, value in before.items() if value[0].name in errors})
        change.action = "refused"
        change.note = "; ".join(f"the operator cannot render {name}: {why} (its objects stay "
                                "as they are, the component in error)"
                                for name, why in sorted(errors.items()))
    result.operator += operator_changes(before, after)
    result.restarts += restarts(before, after, cluster)
    result.rollouts += driver_rollouts(before, after, stored, cluster, namespace, owner)


# ------------------------------------------------------------------ networks


def _rendered_nad(network: Obj, change: ObjectChange, namespace: str) -> Obj | None:
    """The NetworkAttachmentDefinition the operator would render for a network CR (None for
    other kinds); a network the operator would refuse marks `change` refused."""
    kind = network["kind"]
    try:
        if kind in networks.KINDS and network["apiVersion"] == \
                networks.KINDS[kind].resource.api_version:
            return networks.render_nad(networks.KINDS[kind], network)
        if kind in sriov_networks.KINDS and network["apiVersion"] == \
                sriov_networks.KINDS[kind].resource.api_version:
            return sriov_networks.render_nad(sriov_networks.KINDS[kind], network, namespace,
                                             resource_prefix())
    except networks.NetworkError as e:
        change.action, change.note = "refused", f"the operator would refuse it: {e}"
    return None


async def _nad_change(client: ApiClient, nad: Obj) -> ObjectChange:
    """The rendered NAD against the live one, by the revision the operator writes on it."""
    meta = nad["metadata"]
    change = ObjectChange("create", nad["kind"], meta["name"], meta["namespace"])
    live = await client.get_or_none(NETWORK_ATTACHMENT_DEFINITION, meta["name"],
                                    meta["namespace"])
    if live is not None:
        same = (live["metadata"].get("annotations") or {}).get(REVISION_ANNOTATION) == \
            meta["annotations"][REVISION_ANNOTATION]
        change.action = "unchanged" if same else "change"
        if not same:
            change.diff = diff(live, nad)
            change.note = "pods attached already keep their interface; new pods get this"
    return change


# ------------------------------------------------------------------ SR-IOV


async def _sriov_effects(client: ApiClient, result: Plan, cluster: Cluster, stored: Obj,
                         change: ObjectChange, namespace: str) -> None:
    """The node states the operator would write with the policy replaced, and what each node's
    config daemon would then do (nicop.node.sriov_daemon.plan: the same comparison)."""
    states = {s["metadata"]["name"]: s for s in (await client.list(NODE_STATE, namespace))[0]}
    config = operator_config((await client.list(OPERATOR_CONFIG, namespace))[0], namespace)
    pools = (await client.list(POOL_CONFIG, namespace))[0]
    live = [p for p in (await client.list(SRIOV_NODE_POLICY, namespace))[0]]
    name = stored["metadata"]["name"]
    planned = [p for p in live if p["metadata"]["name"] != name] + [stored]
    settings = operator_settings(config)
    selector = settings.config_daemon_node_selector or DEFAULT_DAEMON_NODE_SELECTOR
    nodes = sorted((n for n in cluster.nodes if labels_match(selector, n)),
                   key=lambda n: n["metadata"]["name"])
    found = {n: ((s.get("status") or {}).get("interfaces") or []) for n, s in states.items()}
    accepted, refused = judge(read_policies(planned), nodes, found)
    if name in refused:
        change.action, change.note = "refused", f"the operator would refuse it: {refused[name][1]}"
        return
    accepted_before, _ = judge(read_policies(live), nodes, found)
    by_node = cluster.pods_on()
    no_drain = bool(settings.disable_drain)
    prefix = resource_prefix()
    for node in nodes:
        node_name = node["metadata"]["name"]
        interfaces = found.get(node_name, [])
        if not interfaces:
            continue  # the config daemon has not reported this node's PFs: nothing to apply
        try:
            rdma_mode = pool_settings(pool_of(node, pools)).rdma_mode
        except PoolError:
            rdma_mode = None
        before = node_state_spec(accepted_before, node, interfaces, rdma_mode)
        after = node_state_spec(accepted, node, interfaces, rdma_mode)
        if before == after:
            continue
        applied = {i["pciAddress"]: i for i in before.get("interfaces") or []}
        work = vf_work(after, interfaces, applied)
        if not work:
            continue
        vf = VfChange(node_name, work.describe().split("; "), work.drain and not no_drain,
                      work.reboot, undrained=work.drain and no_drain)
        if vf.drain:
            pods = [p for p in by_node.get(node_name, [])
                    if evictable(p, "") and (work.reboot or uses_resource(p, prefix))]
            vf.evicts, vf.blocked, _ = drain_of(pods, cluster.budgets, None)
        result.vf_changes.append(vf)


async def apply(client: ApiClient, objects: list[Obj]) -> None:
    """Write the objects as the plan's dry runs did: created, or replaced whole."""
    for obj in objects:
        res = resource_for(obj)
        meta = obj["metadata"]
        live = await client.get_or_none(res, meta["name"],
                                        meta.get("namespace") if res.namespaced else None)
        if live is None:
            await client.create(obj, res=res)
        else:
            await client.update({**obj, "metadata": {**meta, "resourceVersion":
                                                     live["metadata"]["resourceVersion"]}},
                                res=res)


# ------------------------------------------------------------------ text


def text(result: Plan) -> list[str]:
    """The plan for a person, one line each."""
    lines = []
    for c in result.objects:
        lines.append(f"{c.title}: {_ACTIONS[c.action]}" + (f": {c.note}" if c.note else ""))
        lines += [f"    {d}" for d in c.diff[2:]]
    changed = [c for c in result.operator if c.action != "unchanged"]
    if changed:
        lines.append("")
        lines.append("The operator would:")
        for c in changed:
            lines.append(f"  {c.action} {c.title}" + (f" ({c.note})" if c.note else ""))
            lines += [f"      {d}" for d in c.diff[2:] if not _revision_line(d)]
    for line in result.restarts:
        lines.append(f"  restart pods: {line}")
    for r in result.rollouts:
        lines += ["", _rollout_title(r)]
        if r.batches:
            lines.append("  nodes start in this order as slots free (name order); the batches "
                         "are the rounds if every node took as long")
        for number, batch in enumerate(r.batches, 1):
            lines.append(f"  batch {number}: {', '.join(batch)}")
        for n in r.nodes:
            lines += _node_lines(n)
        if r.new_nodes:
            lines.append(f"  first driver load (no driver pod yet): {', '.join(r.new_nodes)}")
    if result.vf_changes:
        lines += ["", "SR-IOV: the config daemons would reconfigure these nodes' VFs:"]
    for v in result.vf_changes:
        how = "reboot" if v.reboot else "drain" if v.drain else \
            "no drain: disableDrain" if v.undrained else "no drain: no VFs yet"
        lines.append(f"  {v.node} ({how}): {'; '.join(v.changes)}")
        if v.evicts:
            lines.append(f"    evicts {', '.join(v.evicts)}")
        if v.blocked:
            lines.append(f"    drain blocked: {', '.join(v.blocked)}")
    lines.append("")
    if result.refused:
        lines.append("Refused by the API server: nothing would be applied as written.")
    elif disruptive := result.disruptive:
        lines.append("Disruptive: " + "; ".join(disruptive))
    else:
        lines.append("Nothing disruptive.")
    return lines


def _revision_line(line: str) -> bool:
    """A diff line of the revision annotation nicop hashes the rest into: noise for a person."""
    return REVISION_ANNOTATION in line


_ACTIONS = {"create": "created", "change": "changed", "unchanged": "unchanged",
            "refused": "refused by the API server", "delete": "deleted", "keep": "kept"}


def _rollout_title(r: DriverRollout) -> str:
    if not r.automatic:
        return (f"Driver of {r.policy} ({r.daemonset}): {len(r.nodes)} nodes run the old driver "
                "until their driver pod is deleted (autoUpgrade is off)")
    limit = f", maxUnavailable {r.max_unavailable}" if r.max_unavailable not in (None, "") \
        else ""
    return (f"Driver reload of {r.policy} ({r.daemonset}): {len(r.nodes)} nodes, "
            f"maxParallelUpgrades {r.max_parallel_upgrades}{limit}, drain "
            f"{'on' if r.drain else 'off'}")


def _node_lines(n: NodeReload) -> list[str]:
    out = []
    if n.evicts:
        out.append(f"evicts {', '.join(n.evicts)}")
    if n.waits_for:
        out.append(f"waits for {', '.join(n.waits_for)} to complete")
    if n.blocked:
        out.append(f"drain blocked: {', '.join(n.blocked)}")
    if n.refused:
        out.append(f"drain refused: {n.refused}; the node fails at once")
    if n.preflight:
        out.append(f"the driver agent refuses the reload now: {n.preflight}")
    if n.waiting:
        out.append(n.waiting)
    return [f"  {n.node}: {'; '.join(out)}"] if out else []
