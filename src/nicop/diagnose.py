"""`nicop diagnose`: the troubleshooting checklist, run against one read of the cluster.

Each check says pass, warn or fail, and a failure names its cause and the command or change
that fixes it: the questions people otherwise answer with a dozen kubectl calls (is the
operator running, is this node managed, is its driver loaded, does its device plugin run and
advertise devices, why is this pod Pending). The checks are pure functions of a snapshot
(`nicop.status.collect` plus NADs, the target pod and its events), so they are tested on
recorded snapshots; rendering is separate again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Literal

from rich.console import Group, RenderableType
from rich.text import Text

from nicop import claims
from nicop import status as st
from nicop.api import dra, upgrade
from nicop.api import nodes as node_rules
from nicop.api.labels import (
    DRIVER_CONTAINER,
    LEASE_NAME,
    MELLANOX_LABEL,
    MOFED_WAIT_LABEL,
    OPT_IN_LABEL,
    POLICY_NAME,
    POOL_LABELS,
    RESOURCE_NAME_ANNOTATION,
    STATE_LABEL,
)
from nicop.kube import selectors
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.resources import (
    DEVICE_CLASS,
    EVENT,
    POD,
    RESOURCE_CLAIM_TEMPLATE,
    Obj,
    quantity,
)
from nicop.kube.scheduling import tolerates

Result = Literal["pass", "warn", "fail"]
Snapshot = st.Snapshot

NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
OFED_STATE = "state-OFED"
PLUGIN_NAMES = {"state-RDMA-device-plugin": "RDMA shared device plugin",
                "state-SRIOV-device-plugin": "SR-IOV device plugin"}
PLUGIN_SECTIONS = {"state-RDMA-device-plugin": "rdmaSharedDevicePlugin",
                   "state-SRIOV-device-plugin": "sriovDevicePlugin"}
# Taints every DaemonSet pod tolerates (the DaemonSet controller adds these tolerations).
DAEMONSET_TOLERATED = "node.kubernetes.io/"


@dataclass
class Check:
    """One item of the checklist; `fix` is what to run or change when it is not a pass."""

    subject: str
    name: str
    result: Result
    message: str
    fix: str | None = None


@dataclass(frozen=True)
class Target:
    """What to diagnose: the cluster, one node, or one pod."""

    kind: str = "cluster"
    name: str = ""
    namespace: str = ""

    @classmethod
    def parse(cls, kind: str | None, name: str | None) -> Target:
        """From the command line: nothing, `node NAME` or `pod [NAMESPACE/]NAME`."""
        if kind is None:
            return cls()
        if kind in ("node", "no", "nodes") and name:
            return cls("node", name)
        if kind in ("pod", "po", "pods") and name:
            namespace, _, pod = name.rpartition("/")
            return cls("pod", pod, namespace or "default")
        raise ValueError("expected no argument (the cluster), `node NAME` or "
                         "`pod NAMESPACE/NAME`")

    def __str__(self) -> str:
        if self.kind == "cluster":
            return "cluster"
        if self.kind == "node":
            return f"node/{self.name}"
        return f"pod/{self.namespace}/{self.name}"


# ------------------------------------------------------------------ collection

async def collect(client: ApiClient, namespace: str, target: Target) -> Snapshot:
    """The status snapshot plus NADs, and the pod and its events (or, for the cluster, the
    scheduler's complaints about pending pods)."""
    snap = await st.collect(client, namespace, nads=True)
    errors: list[str] = snap["errors"]
    try:
        if target.kind == "pod":
            snap["pod"] = await client.get_or_none(POD, target.name, target.namespace)
            if ((snap["pod"] or {}).get("spec") or {}).get("resourceClaims"):
                await _collect_claims(client, snap, target.namespace)
            events, _ = await client.list(
                EVENT, target.namespace,
                field_selector=f"involvedObject.kind=Pod,involvedObject.name={target.name}")
        else:
            events, _ = await client.list(EVENT, None,
                                          field_selector="type=Warning,reason=FailedScheduling")
    except ApiError as e:
        errors.append(f"cannot read pods or events: {e.code} {e.reason}: {e.message}")
        events = []
    snap["events"] = events
    return snap


async def _collect_claims(client: ApiClient, snap: Snapshot, namespace: str) -> None:
    """What the scheduler reads to allocate a pod's claims, beyond the claims and slices the
    status snapshot already holds."""
    try:
        snap["claim_templates"], _ = await client.list(RESOURCE_CLAIM_TEMPLATE, namespace)
        snap["device_classes"], _ = await client.list(DEVICE_CLASS, None)
    except ApiError as e:
        snap["errors"].append(f"cannot read DRA claims, slices or classes: {e.code} {e.reason}: "
                              f"{e.message}")


# ------------------------------------------------------------------ entry points

def diagnose(snap: Snapshot, target: Target) -> list[Check]:
    """The checklist for a target, reads that failed first (their part was not checked)."""
    checks = [Check("cluster", "access", "warn", f"{error}; problems there are not seen",
                    "grant your user get/list on that kind (kubectl auth can-i list ...)")
              for error in snap.get("errors") or []]
    if target.kind == "node":
        checks.extend(node_checks(snap, target.name, standalone=True))
    elif target.kind == "pod":
        checks.extend(pod_checks(snap, target.namespace, target.name))
    else:
        checks.extend(cluster_checks(snap))
    return checks


def failed(checks: Iterable[Check]) -> bool:
    return any(c.result == "fail" for c in checks)


def report(snap: Snapshot, target: Target, checks: list[Check]) -> Obj:
    """The report `-o json` prints."""
    counts = {r: sum(c.result == r for c in checks) for r in ("pass", "warn", "fail")}
    overall = "fail" if counts["fail"] else "warn" if counts["warn"] else "pass"
    return {
        "target": str(target),
        "namespace": snap["namespace"],
        "collectedAt": snap["collectedAt"],
        "result": overall,
        "summary": counts,
        "checks": [asdict(c) for c in checks],
    }


# ------------------------------------------------------------------ cluster

def cluster_checks(snap: Snapshot) -> list[Check]:
    checks = [operator_check(snap), *policy_checks(snap), *pending_pod_checks(snap),
              *bound_pod_checks(snap)]
    nodes = sorted(snap.get("nodes") or [], key=st.name_of)
    relevant = [n for n in nodes if node_rules.is_managed(n) or st.has_mellanox_nic(n)
                or st.unmanaged_nic(snap, n)]
    if not any(node_rules.is_managed(n) for n in relevant):
        checks.append(Check(
            "cluster", "mellanox nodes", "fail",
            f"no node has the label {MELLANOX_LABEL}=true (Node Feature Discovery's sign of a "
            "Mellanox NIC) and none is opted in, so nicop manages no node",
            "deploy Node Feature Discovery, or opt nodes in: kubectl label node <node> "
            f"{OPT_IN_LABEL}=true"))
    for node in relevant:
        checks.extend(node_checks(snap, st.name_of(node), standalone=False))
    return checks


def operator_check(snap: Snapshot) -> Check:
    ns = snap["namespace"]
    leader = st.leader_of(snap)
    pods = st.operator_pods(snap)
    unready = [p for p in pods if not st.pod_ready(p)]

    def describe(pod: Obj) -> str:
        problems = [p for c in (pod.get("status") or {}).get("containerStatuses") or []
                    if (p := st.container_problem(c))]
        phase = (pod.get("status") or {}).get("phase", "Unknown")
        return f"{st.name_of(pod)} ({problems[0] if problems else phase})"

    lease = f"Lease {ns}/{LEASE_NAME}"
    if leader and leader["active"]:
        message = (f"leader {leader['identity']} holds the {lease} (renewed "
                   f"{leader['secondsSinceRenewal']}s ago)")
        if not pods:
            message += f"; no operator pod in namespace {ns}: the leader runs outside the cluster"
            return Check("cluster", "operator", "pass", message)
        if unready:
            return Check("cluster", "operator", "warn",
                         message + "; not ready: " + ", ".join(describe(p) for p in unready),
                         f"kubectl -n {ns} describe pod {st.name_of(unready[0])}")
        return Check("cluster", "operator", "pass",
                     message + f"; {len(pods)} operator pod(s) ready")
    if leader:
        cause = (f"the {lease} ran out {leader['secondsSinceRenewal']}s ago (last holder "
                 f"{leader['identity']}): no operator is reconciling")
    else:
        cause = f"nobody holds the {lease}: no operator is reconciling"
    if pods:
        cause += "; operator pods: " + ", ".join(describe(p) for p in pods)
        fix = f"kubectl -n {ns} logs {st.name_of((unready or pods)[0])}"
    else:
        cause += f"; there is no operator pod in namespace {ns}"
        fix = (f"start the operator in namespace {ns} (its Deployment, or `nicop operator "
               f"--namespace {ns}`), or pass --namespace with the namespace it runs in")
    return Check("cluster", "operator", "fail", cause, fix)


def policy_checks(snap: Snapshot) -> list[Check]:
    ns = snap["namespace"]
    checks = []
    for policy in snap.get("policies") or []:
        name = st.name_of(policy)
        if name != POLICY_NAME:
            checks.append(Check(
                "cluster", "policy name", "fail",
                f"NicClusterPolicy {name} is ignored: the operator acts only on one named "
                f"{POLICY_NAME}",
                f"kubectl get nicclusterpolicy {name} -o yaml > policy.yaml; set metadata.name "
                f"to {POLICY_NAME}; kubectl apply -f policy.yaml; kubectl delete "
                f"nicclusterpolicy {name}"))
    policy = st.policy_of(snap)
    if policy is None:
        checks.append(Check(
            "cluster", "policy", "fail",
            f"there is no NicClusterPolicy {POLICY_NAME}, so no driver, device plugin or CNI "
            "is deployed",
            "kubectl apply -f <policy>.yaml (examples/nicclusterpolicy-*.yaml show complete "
            "ones)"))
        return checks
    summary = st.summarize_policy(policy)
    observed = summary["observedGeneration"]
    if observed is None or observed < summary["generation"]:
        checks.append(Check(
            "cluster", "policy", "warn",
            f"the operator has not processed generation {summary['generation']} of the policy "
            f"yet (observed: {observed if observed is not None else 'none'})",
            "see the operator check; the status catches up within seconds of a running "
            "operator"))
    ready, broken = [], []
    for component in summary["components"]:
        if component["state"] in ("ready", "ignore"):
            if component["state"] == "ready":
                ready.append(component["name"])
            continue
        broken.append(component["name"])
        message = component["message"] or f"{component['name']} is {component['state']}"
        if component["state"] == "error":
            fix = (f"correct the field named above: kubectl edit nicclusterpolicy "
                   f"{POLICY_NAME}")
        else:
            fix = (f"kubectl -n {ns} get daemonsets,deployments,pods -l "
                   f"{STATE_LABEL}={component['name']}")
        checks.append(Check("cluster", f"component {component['name']}", "fail",
                            f"{component['state']}: {message}", fix))
    if not broken and summary["components"]:
        checks.append(Check("cluster", "policy", "pass",
                            f"{POLICY_NAME} is {summary['state']}: {len(ready)} components "
                            "ready (" + ", ".join(ready) + ")"))
    return checks


def pending_pod_checks(snap: Snapshot) -> list[Check]:
    """Pods waiting for RDMA devices or secondary networks, with the scheduler's reason."""
    reasons: dict[tuple[str, str], str] = {}
    for event in _sorted_events(snap.get("events") or []):
        involved = event.get("involvedObject") or {}
        reasons[involved.get("namespace", ""), involved.get("name", "")] = str(
            event.get("message", ""))
    checks = []
    for pod in snap.get("pods") or []:
        meta = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") != "Pending" or \
                (pod.get("spec") or {}).get("nodeName"):
            continue
        wants = [r for r in st.pod_requests(pod) if st.is_device_resource(r)]
        if not wants and not (meta.get("annotations") or {}).get(NETWORKS_ANNOTATION):
            continue
        ref = f"{meta.get('namespace')}/{meta.get('name')}"
        why = reasons.get((meta.get("namespace", ""), meta.get("name", "")))
        checks.append(Check(
            "cluster", f"pod {ref}", "warn",
            f"pod {ref} is Pending" + (f": {why}" if why else " (not scheduled yet)"),
            f"nicop diagnose pod {ref}"))
    return checks


def bound_pod_checks(snap: Snapshot) -> list[Check]:
    """Pods that asked for RDMA devices or secondary networks, are bound to a node and still do
    not run (a network that does not exist keeps a pod in ContainerCreating): the network
    checks of `diagnose pod` on each, or a pointer to it."""
    checks = []
    for pod in sorted(snap.get("pods") or [], key=lambda p: str(p.get("metadata"))):
        meta = pod.get("metadata") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        status = pod.get("status") or {}
        if not node or meta.get("deletionTimestamp") or status.get("phase") != "Pending":
            continue
        wants = [r for r in st.pod_requests(pod) if st.is_device_resource(r)]
        if not wants and not (meta.get("annotations") or {}).get(NETWORKS_ANNOTATION):
            continue
        ref = f"{meta.get('namespace')}/{meta.get('name')}"
        _, network_checks = _network_checks(snap, pod, "cluster")
        broken = [c for c in network_checks if c.result == "fail"]
        for c in broken:
            checks.append(Check("cluster", f"pod {ref}", "fail",
                                f"pod {ref} on node {node} does not start: {c.message}", c.fix))
        if broken:
            continue
        waiting = [p for c in status.get("containerStatuses") or []
                   if (p := st.container_problem(c))]
        checks.append(Check(
            "cluster", f"pod {ref}", "warn",
            f"pod {ref} is bound to node {node} but not running ("
            + (waiting[0] if waiting else "Pending") + ")",
            f"nicop diagnose pod {ref}"))
    return checks


# ------------------------------------------------------------------ node

def _node(snap: Snapshot, name: str) -> Obj | None:
    return next((n for n in snap.get("nodes") or [] if st.name_of(n) == name), None)


def node_checks(snap: Snapshot, name: str, *, standalone: bool) -> list[Check]:
    """The checks of one node; `standalone` adds what the cluster checks would otherwise say."""
    subject = f"node/{name}"
    node = _node(snap, name)
    if node is None:
        return [Check(subject, "node", "fail", f"node {name} does not exist",
                      "kubectl get nodes")]
    checks = []
    if not st.node_ready(node):
        checks.append(Check(subject, "node ready", "fail",
                            f"node {name} is NotReady: nothing new starts on it",
                            f"kubectl describe node {name}"))
    checks.extend(_agent_checks(snap, node))
    labels = st.labels_of(node)
    if reason := st.unmanaged_nic(snap, node):
        if labels.get(OPT_IN_LABEL) == "false":
            checks.append(Check(
                subject, "managed", "warn",
                f"node {name} has a Mellanox NIC but is opted out ({OPT_IN_LABEL}=false): nicop "
                "deploys nothing there",
                f"if that is not intended: kubectl label node {name} {OPT_IN_LABEL}-"))
        elif not any(node_rules.CLASS_VENDOR_LABEL.match(k) for k in labels):
            checks.append(_unlabelled_nic_check(node, reason))
        else:
            found = sorted(k for k in labels if node_rules.CLASS_VENDOR_LABEL.match(k))
            checks.append(Check(
                subject, "managed", "fail",
                f"node {name} has a Mellanox NIC (NFD label {found[0] if found else '?'}) but "
                f"not the label {MELLANOX_LABEL}=true the operator selects nodes by, so it gets "
                "no driver, device plugin or CNI, and the policy's DaemonSets leave it out",
                f"kubectl label node {name} {MELLANOX_LABEL}=true (lasting: configure NFD's "
                "pci deviceLabelFields to [vendor], or deploy a NodeFeatureRule for vendor "
                "15b3)"))
        return checks
    if not node_rules.is_managed(node):
        checks.append(Check(
            subject, "managed", "warn",
            f"Node Feature Discovery found no Mellanox NIC on node {name} and it is not opted "
            "in: nicop leaves it alone",
            f"if it has a ConnectX NIC: run NFD, or kubectl label node {name} "
            f"{OPT_IN_LABEL}=true"))
        return checks
    via = (f"{MELLANOX_LABEL}=true" if labels.get(MELLANOX_LABEL) == "true"
           else f"{OPT_IN_LABEL}=true")
    checks.append(Check(subject, "managed", "pass", f"managed ({via})"))
    policy = st.policy_of(snap)
    if policy is None:
        if standalone:
            checks.append(Check(subject, "policy", "fail",
                                f"there is no NicClusterPolicy {POLICY_NAME}: nothing is "
                                "deployed to this node", "kubectl apply -f <policy>.yaml"))
        return checks
    checks.extend(_driver_checks(snap, node, policy))
    checks.append(_mofed_wait_check(snap, node))
    checks.extend(_plugin_checks(snap, node, policy))
    checks.extend(_sriov_checks(snap, node, policy))
    return checks


def _unlabelled_nic_check(node: Obj, reason: str) -> Check:
    """A node that shows its Mellanox NIC in other ways but lost (or never had) the label the
    operator selects by: a failure, with the label command and the NFD hint."""
    name = st.name_of(node)
    message, _, _ = reason.partition("; label it")
    return Check(
        f"node/{name}", "managed", "fail", message,
        f"kubectl label node {name} {MELLANOX_LABEL}=true (lasting: check that Node Feature "
        "Discovery runs on the node and labels vendor 15b3: pci deviceLabelFields [vendor], or "
        "a NodeFeatureRule)")


def _wanted_driver_version(policy: Obj) -> str | None:
    spec = policy.get("spec") or {}
    version = (spec.get("ofedDriver") or {}).get("version") or (spec.get("global") or {}).get(
        "version")
    return str(version) if version else None


def _driver_checks(snap: Snapshot, node: Obj, policy: Obj) -> list[Check]:
    ns = snap["namespace"]
    name = st.name_of(node)
    subject = f"node/{name}"
    spec = (policy.get("spec") or {}).get("ofedDriver")
    if not spec:
        return [Check(subject, "driver", "pass",
                      "the policy has no ofedDriver section: the node's own (inbox) driver is "
                      "used")]
    driver = st.driver_of(snap, node)
    checks = []
    if driver is None:
        pools = [ds for ds in snap.get("daemonSets") or []
                 if st.labels_of(ds).get(STATE_LABEL) == OFED_STATE]
        selecting = [ds for ds in pools if _selector_mismatch(ds, node) == []]
        if not pools:
            cause, fix = ("the operator has not created a driver DaemonSet yet",
                          "see the component state-OFED in `nicop status`")
        elif not selecting:
            values = ", ".join(f"{k}={st.labels_of(node).get(k, '<unset>')}"
                               for k in POOL_LABELS)
            cause = (f"no driver DaemonSet selects it: its OS and kernel labels ({values}) "
                     "match no driver pool")
            fix = ("let NFD label the node's OS and kernel (system-os_release.ID, "
                   "system-os_release.VERSION_ID, kernel-version.full); the operator then "
                   "renders a DaemonSet for its pool")
        else:
            cause, fix = _why_no_pod(snap, selecting[0], node)
        checks.append(Check(subject, "driver", "fail",
                            f"no driver pod on node {name}: {cause}", fix))
    elif driver["heldReload"]:
        for held in driver["heldReload"]:
            checks.append(Check(
                subject, "driver reload", "fail",
                f"the driver agent of pod {ns}/{driver['pod']} holds the driver reload on node "
                f"{name} (the running driver stays loaded): {held['cause']}",
                f"{held['fix']}; the agent checks again every few seconds and reloads once "
                "nothing holds it, with no restart"))
    elif not driver["ready"]:
        pod = driver["pod"]
        restarts = driver["restarts"]
        checks.append(Check(
            subject, "driver", "fail",
            f"driver container {DRIVER_CONTAINER} of pod {ns}/{pod} is not Ready "
            f"({driver['problem'] or 'readiness probe failing'}; {restarts} restarts): the "
            f"driver is not loaded, so nothing on this node can use RDMA. Readiness is the "
            f"container's Ready: its startup probe checks {st.READY_FILE} on the node, which "
            "the API cannot show",
            f"kubectl -n {ns} logs {pod} -c {DRIVER_CONTAINER}"
            + (" --previous" if restarts else "")
            + " (missing kernel headers and unreachable package repositories are the usual "
            "causes)"))
    else:
        wanted = _wanted_driver_version(policy)
        state = st.labels_of(node).get(upgrade.STATE_LABEL)
        auto = bool((spec.get("upgradePolicy") or {}).get("autoUpgrade"))
        if wanted and driver["version"] != wanted:
            fix = ("the upgrade controller replaces it node by node; follow it with "
                   "`nicop status --watch`" if auto else
                   f"kubectl -n {ns} delete pod {driver['pod']} (the DaemonSet uses OnDelete), "
                   "or enable spec.ofedDriver.upgradePolicy.autoUpgrade")
            checks.append(Check(subject, "driver", "warn",
                                f"driver {driver['version']} is ready but the policy asks for "
                                f"{wanted} (upgrade state: {state or 'none'})", fix))
        else:
            checks.append(Check(subject, "driver", "pass",
                                f"driver {driver['version']} ready (pod {driver['pod']})"))
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    blocked = annotations.get(upgrade.DRAIN_BLOCKED_ANNOTATION)
    if st.labels_of(node).get(upgrade.STATE_LABEL) == upgrade.DRAIN and blocked:
        checks.append(Check(
            subject, "driver upgrade", "warn",
            f"the driver upgrade's drain of node {name}, started at "
            f"{annotations.get(upgrade.DRAIN_START_ANNOTATION)}, cannot evict: {blocked}",
            "let the pods go (relax the PodDisruptionBudget named, or scale its workload); the "
            "drain goes on by itself, and past its timeout the node fails and is retried"))
    if st.labels_of(node).get(upgrade.STATE_LABEL) == upgrade.FAILED:
        reason = annotations.get(upgrade.FAILURE_ANNOTATION)
        retry_at = annotations.get(upgrade.RETRY_AT_ANNOTATION)
        then = (f"the operator retries it at {retry_at}" if retry_at else
                "no automatic retry is left")
        pod = driver["pod"] if driver else "<driver pod>"
        checks.append(Check(
            subject, "driver upgrade", "fail",
            f"the driver upgrade failed on node {name}" + (f": {reason}" if reason else "")
            + f" ({upgrade.attempts(node)} failed attempt(s); {then})",
            f"kubectl -n {ns} logs {pod} -c {DRIVER_CONTAINER}; once the cause is fixed, "
            f"`nicop upgrade retry {name}` retries it at once (the node also moves on by itself "
            "once the driver container is Ready)"))
    return checks


def _mofed_wait_check(snap: Snapshot, node: Obj) -> Check:
    name = st.name_of(node)
    value = st.labels_of(node).get(MOFED_WAIT_LABEL)
    subject = f"node/{name}"
    if value == "false":
        return Check(subject, "mofed.wait", "pass",
                     f"{MOFED_WAIT_LABEL}=false: components that wait for the driver may run")
    driver = st.driver_of(snap, node)
    if value == "true":
        if driver is not None and driver["ready"]:
            fix = "the driver is ready but the operator has not updated the label: see the " \
                  "operator check (nicop diagnose)"
        else:
            fix = "make the driver container Ready (see the driver check)"
        return Check(subject, "mofed.wait", "fail",
                     f"{MOFED_WAIT_LABEL}=true: the device plugins and other components that "
                     "wait for the driver stay off this node until its driver container is Ready",
                     fix)
    return Check(subject, "mofed.wait", "fail",
                 f"the node has no {MOFED_WAIT_LABEL} label: the operator has not processed "
                 "it, so no component selects it",
                 "see the operator check (nicop diagnose); the operator labels managed nodes "
                 "within seconds")


def _selector_mismatch(ds: Obj, node: Obj) -> list[tuple[str, str]]:
    """The (label, wanted value) pairs of a DaemonSet's nodeSelector the node does not have."""
    selector = ((ds.get("spec") or {}).get("template") or {}).get("spec", {}).get(
        "nodeSelector") or {}
    labels = st.labels_of(node)
    return [(k, str(v)) for k, v in selector.items() if labels.get(k) != v]


def _why_no_pod(snap: Snapshot, ds: Obj, node: Obj) -> tuple[str, str]:
    """Why a DaemonSet has no pod on a node, and the fix: labels, affinity, taints."""
    ns = snap["namespace"]
    name = st.name_of(node)
    pod_spec = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
    labels = st.labels_of(node)
    for key, wanted in _selector_mismatch(ds, node):
        have = labels.get(key)
        if key == MOFED_WAIT_LABEL:
            return (f"it waits for the driver: the node has {key}="
                    f"{have if have is not None else '<unset>'}, the DaemonSet needs {wanted}",
                    "make the driver container Ready (see the driver check)")
        return (f"the node lacks the label {key}={wanted} the DaemonSet selects "
                f"(it has {have if have is not None else 'none'})",
                f"kubectl label node {name} {key}={wanted}")
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required and not selectors.matches_node_selector(required, node):
        return ("the node does not match the DaemonSet's required nodeAffinity (spec."
                "nodeAffinity of the policy)",
                f"kubectl edit nicclusterpolicy {POLICY_NAME} (spec.nodeAffinity), or label "
                "the node to match it")
    tolerations = pod_spec.get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if str(taint.get("key", "")).startswith(DAEMONSET_TOLERATED):
            continue
        if not tolerates(tolerations, taint):
            key, value, effect = taint.get("key"), taint.get("value"), taint.get("effect")
            shown = f"{key}={value}:{effect}" if value else f"{key}:{effect}"
            return (f"the node has the taint {shown}, which the DaemonSet does not tolerate",
                    f"add {{key: {key}, operator: Exists, effect: {effect}}} to spec.tolerations "
                    f"of the NicClusterPolicy (kubectl edit nicclusterpolicy {POLICY_NAME}), or "
                    f"remove the taint: kubectl taint node {name} {key}-")
    return ("the DaemonSet controller has not created it (yet)",
            f"kubectl -n {ns} describe daemonset {st.name_of(ds)}")


def _plugin_checks(snap: Snapshot, node: Obj, policy: Obj) -> list[Check]:
    ns = snap["namespace"]
    name = st.name_of(node)
    subject = f"node/{name}"
    configured = st.configured_resources(policy)
    checks = []
    for ds in sorted(snap.get("daemonSets") or [], key=st.name_of):
        state = st.labels_of(ds).get(STATE_LABEL, "")
        if state not in PLUGIN_NAMES:
            continue
        what = PLUGIN_NAMES[state]
        pods = [p for p in st.pods_on(snap, name)
                if (p.get("metadata") or {}).get("namespace") == ns
                and st.owner_name(p, "DaemonSet") == st.name_of(ds)]
        if not pods:
            cause, fix = _why_no_pod(snap, ds, node)
            checks.append(Check(subject, what, "fail",
                                f"no {what} pod ({st.name_of(ds)}) runs on node {name}: {cause}; "
                                "pods there get none of its devices", fix))
            continue
        pod = pods[0]
        if not st.pod_ready(pod):
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            problem = next((p for c in statuses if (p := st.container_problem(c))),
                           (pod.get("status") or {}).get("phase", "not ready"))
            checks.append(Check(subject, what, "fail",
                                f"{what} pod {ns}/{st.name_of(pod)} is not ready: {problem}",
                                f"kubectl -n {ns} logs {st.name_of(pod)}"))
            continue
        checks.append(Check(subject, what, "pass",
                            f"{what} pod {st.name_of(pod)} is running"))
        checks.extend(_resource_checks(snap, node, state, configured.get(state) or [],
                                       st.name_of(pod)))
    return checks


def _resource_checks(snap: Snapshot, node: Obj, state: str, names: list[str],
                     pod: str) -> list[Check]:
    if not names:
        return []
    ns = snap["namespace"]
    subject = f"node/{st.name_of(node)}"
    what = PLUGIN_NAMES[state]
    resources = {r["name"]: r for r in st.node_resources(snap, node, names) if r["name"] in names}
    advertised = [r for r in resources.values() if r["capacity"] > 0 or r["allocatable"] > 0]
    if not advertised:
        hint = " (no VFs on this node? see the VFs check)" if "SRIOV" in state else ""
        return [Check(
            subject, "resources", "warn",
            f"the {what} advertises none of {', '.join(names)} on this node: its selectors "
            f"match no device here{hint}",
            f"compare the selectors in spec.{PLUGIN_SECTIONS[state]}.config with the node's "
            f"NICs; the plugin logs what it found: kubectl -n {ns} logs {pod}")]
    checks = []
    for r in advertised:
        if r["allocatable"] == 0:
            checks.append(Check(
                subject, f"resource {r['name']}", "fail",
                f"{r['name']}: {r['capacity']} devices, none allocatable: they are unhealthy "
                "(link down?) or the plugin lost its registration with the kubelet",
                f"kubectl -n {ns} logs {pod}"))
        elif r["inUse"] >= r["allocatable"]:
            checks.append(Check(
                subject, f"resource {r['name']}", "warn",
                f"{r['name']}: all {r['allocatable']} in use; new pods asking for one wait",
                "wait for pods to finish, or raise the count ("
                + ("numVfs in the SriovNetworkNodePolicy" if "SRIOV" in state else
                   "rdmaHcaMax in spec.rdmaSharedDevicePlugin.config") + ")"))
        else:
            checks.append(Check(
                subject, f"resource {r['name']}", "pass",
                f"{r['name']}: {r['allocatable']} allocatable, {r['inUse']} in use"))
    return checks


def _agent_checks(snap: Snapshot, node: Obj) -> list[Check]:
    """The operator's other DaemonSets on this node (the SR-IOV config daemon and device plugin,
    the CNI daemon): each pod running, or why not in the kubelet's words."""
    name, ns = st.name_of(node), snap["namespace"]
    policy_daemonsets = {st.name_of(ds) for ds in snap.get("daemonSets") or []}
    checks = []
    for pod in sorted(st.pods_on(snap, name), key=st.name_of):
        owner = st.owner_name(pod, "DaemonSet")
        if ((pod.get("metadata") or {}).get("namespace") != ns or owner is None
                or owner in policy_daemonsets):
            continue
        if st.pod_ready(pod):
            checks.append(Check(f"node/{name}", owner, "pass", f"pod {st.name_of(pod)} is ready"))
            continue
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        problem = next((p for c in statuses if (p := st.container_problem(c))),
                       (pod.get("status") or {}).get("phase", "not ready"))
        checks.append(Check(f"node/{name}", owner, "fail",
                            f"{owner} pod {ns}/{st.name_of(pod)} is not ready: {problem}",
                            f"kubectl -n {ns} logs {st.name_of(pod)} --previous"))
    return checks


def _sriov_checks(snap: Snapshot, node: Obj, policy: Obj) -> list[Check]:
    name = st.name_of(node)
    subject = f"node/{name}"
    state = st.node_state_of(snap, name)
    info = st.sriov_of(state)
    if state is None or info is None:
        return []
    ns = (state.get("metadata") or {}).get("namespace") or snap["namespace"]
    show = f"kubectl -n {ns} get sriovnetworknodestate {name} -o yaml"
    checks = []
    found = {i.get("pciAddress"): i for i in (state.get("status") or {}).get("interfaces") or []}
    for wanted in (state.get("spec") or {}).get("interfaces") or []:
        have = found.get(wanted.get("pciAddress")) or {}
        total, num = have.get("totalvfs"), int(wanted.get("numVfs") or 0)
        if isinstance(total, int) and num > total:
            pf = wanted.get("name") or wanted.get("pciAddress")
            checks.append(Check(
                subject, "VFs", "fail",
                f"{num} VFs are wanted on PF {pf}, which supports {total}",
                f"lower numVfs to at most {total} in the SriovNetworkNodePolicy selecting {pf} "
                "(or raise SRIOV_NUM_OF_VFS in the NIC firmware with mlxconfig)"))
    sync, error = info["syncStatus"], info["lastSyncError"]
    have, want = info["vfsConfigured"], info["vfsWanted"]
    if sync == "Failed":
        checks.append(Check(subject, "VFs", "fail",
                            f"SR-IOV configuration failed ({have} of {want} VFs): "
                            f"{error or 'no error given'}",
                            f"{show}; correct the SriovNetworkNodePolicy that selects this node"))
    elif have < want:
        if sync == "Succeeded":
            checks.append(Check(subject, "VFs", "fail",
                                f"only {have} of {want} VFs exist although the sync says "
                                "Succeeded", f"{show}; the config daemon's log tells more"))
        else:
            checks.append(Check(subject, "VFs", "warn",
                                f"{have} of {want} VFs configured so far (sync "
                                f"{sync or 'not started'})"
                                + (f"; last error: {error}" if error else ""),
                                f"wait, or watch it: kubectl -n {ns} get "
                                f"sriovnetworknodestate {name} -w"))
    elif want:
        checks.append(Check(subject, "VFs", "pass",
                            f"{have} of {want} VFs configured (sync {sync or 'unknown'})"))
    return checks


# ------------------------------------------------------------------ pod

class NetworksError(ValueError):
    """The networks annotation cannot be read."""


def parse_networks(value: str, default_namespace: str) -> list[Obj]:
    """The networks a pod asks Multus for: `name`, `ns/name`, `name@ifname` separated by
    commas, or a JSON list of {name, namespace, interface}."""
    text = value.strip()
    if not text:
        return []
    out = []
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError as e:
            raise NetworksError(f"not valid JSON: {e}") from None
        if not isinstance(items, list):
            raise NetworksError("the JSON form must be a list of objects")
        for i, item in enumerate(items):
            if not isinstance(item, dict) or not item.get("name"):
                raise NetworksError(f"item {i} has no name")
            out.append({"namespace": item.get("namespace") or default_namespace,
                        "name": str(item["name"]), "interface": item.get("interface")})
        return out
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        interface = None
        if "@" in part:
            part, interface = part.rsplit("@", 1)
        namespace, _, name = part.rpartition("/")
        if not name:
            raise NetworksError(f"{part!r} names no network")
        out.append({"namespace": namespace or default_namespace, "name": name,
                    "interface": interface})
    return out


def _requested(pod: Obj, resource: str) -> int:
    return st.pod_requests(pod).get(resource, 0)


def pod_checks(snap: Snapshot, namespace: str, name: str) -> list[Check]:
    subject = f"pod/{namespace}/{name}"
    pod = snap.get("pod")
    if pod is None:
        return [Check(subject, "pod", "fail", f"pod {namespace}/{name} does not exist",
                      f"kubectl -n {namespace} get pods")]
    status = pod.get("status") or {}
    phase = status.get("phase", "Unknown")
    node = (pod.get("spec") or {}).get("nodeName")
    scheduled = bool(node)
    checks = []
    if phase == "Running" and st.pod_ready(pod):
        checks.append(Check(subject, "pod", "pass", f"Running and ready on node {node}"))
    elif not scheduled:
        checks.append(Check(subject, "pod", "fail",
                            f"{phase}: not scheduled to any node (reasons below)",
                            "see the checks below"))
    else:
        checks.append(Check(subject, "pod", "warn", f"{phase} on node {node}, not ready",
                            f"kubectl -n {namespace} describe pod {name}"))
    nad_resources, network_checks = _network_checks(snap, pod, subject)
    checks.extend(network_checks)
    requests = st.pod_requests(pod)
    wanted = {r: n for r, n in requests.items()
              if n > 0 and (st.is_device_resource(r) or r in nad_resources)}
    for resource, count in sorted(wanted.items()):
        checks.append(_device_check(snap, pod, subject, resource, count))
    checks.extend(_claim_checks(snap, pod, subject))
    checks.extend(_event_checks(snap, pod, subject, scheduled))
    return checks


def _claim_checks(snap: Snapshot, pod: Obj, subject: str) -> list[Check]:
    """Each DRA claim of the pod: allocated, or which node comes closest and what it lacks."""
    namespace = pod["metadata"].get("namespace", "default")
    claims = {(c["metadata"].get("namespace"), c["metadata"]["name"]): c
              for c in snap.get("resourceClaims") or []}
    templates = {t["metadata"]["name"]: t for t in snap.get("claim_templates") or []}
    classes = {c["metadata"]["name"]: c for c in snap.get("device_classes") or []}
    made = {s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    checks = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = f"claim {entry['name']}"
        claim_name = entry.get("resourceClaimName") or made.get(entry["name"])
        claim = claims.get((namespace, claim_name)) if claim_name else None
        template = templates.get(entry.get("resourceClaimTemplateName") or "")
        if claim is None and template is None:
            missing = claim_name or entry.get("resourceClaimTemplateName")
            checks.append(Check(subject, name, "fail",
                                f"the pod's claim {entry['name']} names {missing}, which does "
                                f"not exist in namespace {namespace}",
                                f"kubectl -n {namespace} get resourceclaims,"
                                "resourceclaimtemplates"))
            continue
        allocation = ((claim or {}).get("status") or {}).get("allocation")
        if allocation:
            got = ", ".join(f"{r['request']}: {r['device']} ({r['driver']}, pool {r['pool']})"
                            for r in (allocation.get("devices") or {}).get("results") or [])
            checks.append(Check(subject, name, "pass", f"allocated: {got}"))
            continue
        spec = (claim or {}).get("spec") or ((template or {}).get("spec") or {}).get("spec") or {}
        checks.append(_unallocated_claim_check(snap, subject, name, spec, classes))
    return checks


def _unallocated_claim_check(snap: Snapshot, subject: str, name: str, spec: Obj,
                             classes: dict[str, Obj]) -> Check:
    requests, nodes, unknown = claims.fits(spec, classes, snap.get("resourceSlices") or [],
                                           snap.get("resourceClaims") or [])
    missing = sorted({r.device_class for r in requests if r.device_class not in classes})
    if missing:
        return Check(subject, name, "fail",
                     f"DeviceClass {', '.join(missing)} does not exist: no device can match",
                     "install the DRA driver that provides it, or fix deviceClassName "
                     "(kubectl get deviceclasses)")
    asked = "; ".join(f"{r.name}: {max(r.count, 1)} of {r.device_class}" for r in requests)
    constraints = [c["matchAttribute"] for c in (spec.get("devices") or {}).get(
        "constraints") or [] if c.get("matchAttribute")]
    if constraints:
        asked += f"; the same {', '.join(constraints)}"
    note = f" (not evaluated: {'; '.join(sorted(set(unknown)))})" if unknown else ""
    if any(n.fits for n in nodes):
        where = ", ".join(n.node for n in nodes if n.fits)
        return Check(subject, name, "warn",
                     f"not allocated yet, but node(s) {where} have free devices for it "
                     f"({asked}){note}", "kubectl get events --field-selector "
                     "reason=FailedScheduling")
    if not nodes:
        return Check(subject, name, "fail",
                     f"no node publishes DRA devices ({asked}): no ResourceSlice exists",
                     "check that the DRA drivers run on the nodes (kubectl get resourceslices)")
    shown = "; ".join(f"node {n.node}: {n.why}" for n in nodes[:5])
    shown += "".join(f"; {key}: {meaning}" for key, meaning in dra.TAINT_MEANINGS.items()
                     if f"tainted {key}=" in shown)
    return Check(subject, name, "fail",
                 f"no node can satisfy it ({asked}){note}: {shown}",
                 "wait for pods holding these devices to finish (kubectl get resourceclaims -A),"
                 " relax the claim, or add nodes with such devices")


def _network_checks(snap: Snapshot, pod: Obj, subject: str) -> tuple[set[str], list[Check]]:
    meta = pod.get("metadata") or {}
    annotation = (meta.get("annotations") or {}).get(NETWORKS_ANNOTATION)
    if annotation is None:
        return set(), []
    try:
        networks = parse_networks(str(annotation), str(meta.get("namespace")))
    except NetworksError as e:
        return set(), [Check(
            subject, "networks", "fail",
            f"the {NETWORKS_ANNOTATION} annotation cannot be read: {e}",
            "write a comma-separated list of [namespace/]name[@interface], or a JSON list of "
            '{"name": ..., "namespace": ..., "interface": ...}')]
    nads = {(m.get("namespace"), m.get("name")): n for n in snap.get("nads") or []
            if (m := n.get("metadata") or {})}
    resources: set[str] = set()
    checks = []
    for net in networks:
        ref = f"{net['namespace']}/{net['name']}"
        nad = nads.get((net["namespace"], net["name"]))
        if nad is None:
            elsewhere = sorted(f"{ns}/{n}" for ns, n in nads if n == net["name"])
            if elsewhere:
                fix = (f"name the one that exists ({', '.join(elsewhere)}) in the annotation, or "
                       f"create the network in namespace {net['namespace']}")
            else:
                fix = (f"create it: a HostDeviceNetwork, MacvlanNetwork or IPoIBNetwork "
                       f"(mellanox.com) or a SriovNetwork named {net['name']} with "
                       f"networkNamespace {net['namespace']}; kubectl get "
                       "network-attachment-definitions -A lists the ones that exist")
            checks.append(Check(
                subject, f"network {ref}", "fail",
                f"the pod asks for network {ref}, but NetworkAttachmentDefinition {ref} does not "
                "exist: Multus cannot attach it and the pod stays in ContainerCreating", fix))
            continue
        resource = ((nad.get("metadata") or {}).get("annotations") or {}).get(
            RESOURCE_NAME_ANNOTATION)
        if not resource:
            checks.append(Check(subject, f"network {ref}", "pass",
                                f"NetworkAttachmentDefinition {ref} exists"))
            continue
        resources.add(resource)
        if _requested(pod, resource) > 0:
            checks.append(Check(subject, f"network {ref}", "pass",
                                f"NetworkAttachmentDefinition {ref} exists; the pod requests the "
                                f"{resource} it needs"))
        else:
            checks.append(Check(
                subject, f"network {ref}", "fail",
                f"network {ref} takes a device of {resource} (its {RESOURCE_NAME_ANNOTATION}), "
                "but the pod does not request one: the CNI has no device to give it",
                f'add to the container: resources: {{requests: {{{resource}: "1"}}, limits: '
                f'{{{resource}: "1"}}}} (or deploy the network-resources-injector)'))
    return resources, checks


def _device_check(snap: Snapshot, pod: Obj, subject: str, resource: str, count: int) -> Check:
    node_name = (pod.get("spec") or {}).get("nodeName")
    uid = (pod.get("metadata") or {}).get("uid")
    name = f"devices {resource}"
    if node_name:
        node = _node(snap, node_name)
        alloc = quantity(((node or {}).get("status") or {}).get("allocatable", {}).get(
            resource, 0))
        if alloc == 0:
            return Check(subject, name, "warn",
                         f"scheduled on node {node_name}, which no longer advertises {resource}",
                         f"nicop diagnose node {node_name}")
        return Check(subject, name, "pass",
                     f"scheduled on node {node_name}, which has {alloc} {resource}")
    free = _free_devices(snap, resource, uid)
    if not free:
        return Check(subject, name, "fail",
                     f"the pod asks for {count} {resource}, and no node advertises {resource}: "
                     "the scheduler cannot place it (FailedScheduling: Insufficient "
                     f"{resource})", _no_such_resource_fix(snap, resource))
    fits = [(n, f, a) for n, f, a in free if f >= count]
    shown = ", ".join(f"{n} {f} of {a} free" for n, f, a in free[:5])
    if not fits:
        return Check(subject, name, "fail",
                     f"the pod asks for {count} {resource}, more than any node has free "
                     f"({shown})",
                     "wait for pods that use it to finish, lower the request, or raise the "
                     "count (rdmaHcaMax in the RDMA plugin config, numVfs in the "
                     "SriovNetworkNodePolicy)")
    return Check(subject, name, "pass",
                 f"{len(fits)} node(s) have {count} free {resource}: {shown}")


def _free_devices(snap: Snapshot, resource: str, uid: str | None) -> list[tuple[str, int, int]]:
    """(node, free, allocatable) of the nodes that advertise a resource, most free first."""
    out = []
    for node in snap.get("nodes") or []:
        alloc = quantity(((node.get("status") or {}).get("allocatable") or {}).get(
            resource, 0))
        if alloc <= 0:
            continue
        used = st.in_use(snap, st.name_of(node), exclude_uid=uid).get(resource, 0)
        out.append((st.name_of(node), max(0, alloc - used), alloc))
    out.sort(key=lambda t: (-t[1], t[0]))
    return out


def _no_such_resource_fix(snap: Snapshot, resource: str) -> str:
    advertised = sorted({r for n in snap.get("nodes") or []
                         for r, v in ((n.get("status") or {}).get("allocatable") or {}).items()
                         if st.is_device_resource(r) and quantity(v) > 0})
    configured = sorted({r for names in st.configured_resources(st.policy_of(snap)).values()
                         for r in names})
    if resource in configured:
        return (f"the policy configures {resource} but no device plugin advertises it: run "
                "`nicop diagnose` for the nodes meant to have it")
    options = advertised or configured
    if options:
        return (f"request a resource that exists ({', '.join(options)}), or add {resource} to "
                "the device plugin config of the policy (resourcePrefix/resourceName)")
    return (f"configure a device plugin that advertises {resource} (rdmaSharedDevicePlugin or "
            "sriovDevicePlugin in the NicClusterPolicy)")


_SCHEDULING = re.compile(r"^\s*\d+/\d+ nodes are available:\s*(.*)$")
_INSUFFICIENT = re.compile(r"^(\d+) Insufficient (\S+)$")
_AFFINITY = re.compile(r"^(\d+) node\(s\) didn't match Pod's node affinity/selector$")
_TAINT = re.compile(r"^(\d+) node\(s\) had untolerated taint \{?(.*?)\}?$")
_UNSCHEDULABLE = re.compile(r"^(\d+) node\(s\) were unschedulable$")
# Parts of the scheduler's message that say nothing about this pod (dynamic resource claims).
_NOISE = frozenset({"no new claims to deallocate"})
_NAD_MISSING = re.compile(r"cannot find a network-attachment-definition \((.*?)\) in namespace "
                          r"\((.*?)\)")


def explain_event(snap: Snapshot, pod: Obj, event: Obj) -> tuple[str, str]:
    """An event in words, and what fixes it."""
    reason = str(event.get("reason", ""))
    message = str(event.get("message", "")).strip()
    namespace = (pod.get("metadata") or {}).get("namespace")
    name = (pod.get("metadata") or {}).get("name")
    if reason == "FailedScheduling" and (m := _SCHEDULING.match(message)):
        head = m.group(1).split("preemption:")[0]
        words, fixes = [], []
        for part in (p.strip().rstrip(".,") for p in re.split(r"[.,]\s+", head)):
            if not part or part in _NOISE:
                continue
            if i := _INSUFFICIENT.match(part):
                resource = i.group(2)
                advertised = _free_devices(snap, resource, None)
                if advertised:
                    words.append(f"{i.group(1)} node(s) have no free {resource} (all in use "
                                 "or fewer than requested)")
                    fixes.append(f"wait for pods using {resource} to finish or lower the "
                                 "request")
                else:
                    words.append(f"{i.group(1)} node(s) lack {resource}: no node advertises it")
                    fixes.append(_no_such_resource_fix(snap, resource))
            elif i := _AFFINITY.match(part):
                words.append(f"{i.group(1)} node(s) do not match the pod's nodeSelector or "
                             "node affinity")
                fixes.append("check spec.nodeSelector/affinity of the pod against the node "
                             "labels (kubectl get nodes --show-labels)")
            elif i := _TAINT.match(part):
                words.append(f"{i.group(1)} node(s) have a taint the pod does not tolerate "
                             f"({i.group(2)})")
                fixes.append("add a toleration to the pod, or remove the taint")
            elif i := _UNSCHEDULABLE.match(part):
                words.append(f"{i.group(1)} node(s) are cordoned (a driver upgrade cordons "
                             "nodes while it runs)")
                fixes.append("wait for the upgrade (nicop status), or kubectl uncordon <node>")
            elif part:
                words.append(part)
        text = "the scheduler placed it nowhere: " + "; ".join(words)
        return text, "; ".join(dict.fromkeys(fixes)) or f"kubectl -n {namespace} describe " \
                                                         f"pod {name}"
    if m := _NAD_MISSING.search(message):
        return (f"Multus found no NetworkAttachmentDefinition {m.group(2)}/{m.group(1)}: "
                f"{message}", f"create {m.group(2)}/{m.group(1)} or fix the pod's "
                f"{NETWORKS_ANNOTATION} annotation")
    if reason in ("FailedCreatePodSandBox", "FailedCreatePodSandbox"):
        return (f"the network could not be set up: {message}",
                f"the CNI's log on node {(pod.get('spec') or {}).get('nodeName')} tells more; "
                f"kubectl -n {namespace} describe pod {name}")
    return f"{reason}: {message}", f"kubectl -n {namespace} describe pod {name}"


def _sorted_events(events: list[Obj]) -> list[Obj]:
    def when(e: Obj) -> str:
        return str(e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp")
                   or "")
    return sorted(events, key=when)


def _event_checks(snap: Snapshot, pod: Obj, subject: str, scheduled: bool) -> list[Check]:
    uid = (pod.get("metadata") or {}).get("uid")
    # Events of an earlier pod of the same name are not this pod's story.
    warnings = [e for e in _sorted_events(snap.get("events") or [])
                if e.get("type") == "Warning"
                and (not uid or (e.get("involvedObject") or {}).get("uid") in (None, uid))]
    if not warnings:
        return [Check(subject, "events", "pass", "no warning events")]
    latest: dict[str, Obj] = {}
    for e in warnings:  # the newest of each reason tells the current story
        latest[str(e.get("reason"))] = e
    checks = []
    for reason, event in latest.items():
        if reason == "FailedScheduling" and scheduled:
            continue  # history: it has been placed since
        text, fix = explain_event(snap, pod, event)
        count = event.get("count") or 1
        running = (pod.get("status") or {}).get("phase") == "Running" and st.pod_ready(pod)
        checks.append(Check(subject, f"event {reason}", "warn" if running else "fail",
                            text + (f" ({count} times)" if count > 1 else ""), fix))
    return checks or [Check(subject, "events", "pass", "no current warning events")]


# ------------------------------------------------------------------ rendering

STYLE = {"pass": ("PASS", "green"), "warn": ("WARN", "yellow"), "fail": ("FAIL", "red")}


def render(result: Obj) -> RenderableType:
    """The checklist grouped by subject, each failure with its fix."""
    parts: list[RenderableType] = []
    subject = None
    for check in result["checks"]:
        if check["subject"] != subject:
            subject = check["subject"]
            parts.append(Text(f"\n{subject}", style="bold"))
        label, style = STYLE[check["result"]]
        line = Text("  ")
        line.append(label, style=f"bold {style}")
        line.append(f"  {check['name']}: ", style="bold")
        line.append(check["message"])
        parts.append(line)
        if check["fix"] and check["result"] != "pass":
            fix = Text("        fix: ", style="dim")
            fix.append(check["fix"])
            parts.append(fix)
    counts = result["summary"]
    style = STYLE[result["result"]][1]
    parts.append(Text(f"\n{counts['pass']} passed, {counts['warn']} warnings, "
                      f"{counts['fail']} failed", style=f"bold {style}"))
    return Group(*parts)


def as_lines(checks: Iterable[Check]) -> list[str]:
    """Plain one-line form, for logs and tests."""
    return [f"{c.result.upper()} {c.subject} {c.name}: {c.message}"
            + (f" | fix: {c.fix}" if c.fix else "") for c in checks]

