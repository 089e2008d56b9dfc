"""Which nodes a pod may run on, as core/v1 defines it: node selectors, required node affinity,
taints and tolerations, and the tolerations the DaemonSet controller adds to its pods."""

from __future__ import annotations

from collections.abc import Callable

from nicop.kube import selectors
from nicop.kube.resources import Obj

# What the DaemonSet controller tolerates for every DaemonSet pod (and, with hostNetwork,
# network-unavailable too), so nodes with these taints still get its pods.
DAEMON_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
HOST_NETWORK_TOLERATION = {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists",
                           "effect": "NoSchedule"}


def tolerates(tolerations: list[Obj], taint: Obj) -> bool:
    """core/v1 toleration matching."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (
                taint.get("value") or ""):
            return True
    return False


def daemon_pod_filter(pod_spec: Obj) -> Callable[[Obj], bool]:
    """Whether the DaemonSet controller runs a pod of this template on a node: its
    nodeSelector, its required node affinity, and every NoSchedule/NoExecute taint tolerated.
    The template is read once, for asking it of every node of a big cluster."""
    selector = pod_spec.get("nodeSelector") or {}
    required = selectors.node_selector(((pod_spec.get("affinity") or {}).get(
        "nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution"))
    tolerations = [*(pod_spec.get("tolerations") or []), *DAEMON_TOLERATIONS]
    if pod_spec.get("hostNetwork"):
        tolerations.append(HOST_NETWORK_TOLERATION)

    def fits(node: Obj) -> bool:
        labels = (node.get("metadata") or {}).get("labels") or {}
        if not selectors.matches_map(selector, labels) or not required(node):
            return False
        return all(tolerates(tolerations, taint) for taint in (node.get("spec") or {}).get(
            "taints") or [] if taint.get("effect") in ("NoSchedule", "NoExecute"))
    return fits
