"""Checks of the cluster as a whole: the operator, the policy, pods the scheduler cannot place."""

from __future__ import annotations

from nicop import status as st
from nicop.api import nodes as node_rules
from nicop.api.labels import (
    LEASE_NAME,
    MELLANOX_LABEL,
    NETWORKS_ANNOTATION,
    OPT_IN_LABEL,
    POLICY_NAME,
    STATE_LABEL,
)
from nicop.diagnose.check import Check, Snapshot, registered
from nicop.diagnose.node import node_checks
from nicop.diagnose.pod import network_checks, sorted_events
from nicop.kube.resources import (
    Obj,
)


@registered("operator", "cluster")
def _operator_checks(snap: Snapshot) -> list[Check]:
    return [operator_check(snap)]


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


@registered("policy", "cluster")
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


@registered("pending pods", "cluster")
def pending_pod_checks(snap: Snapshot) -> list[Check]:
    """Pods waiting for RDMA devices or secondary networks, with the scheduler's reason."""
    reasons: dict[tuple[str, str], str] = {}
    for event in sorted_events(snap.get("events") or []):
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


@registered("bound pods", "cluster")
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
        broken = [c for c in network_checks(snap, pod, "cluster")[1] if c.result == "fail"]
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


@registered("nodes", "cluster")
def _nodes_checks(snap: Snapshot) -> list[Check]:
    """Whether any node is managed, then the checks of every node with a Mellanox NIC."""
    checks = []
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
