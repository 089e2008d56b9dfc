"""The mofed.wait label the operator keeps on every node (which nodes are managed:
nicop.api.nodes)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from nicop.api.labels import DRIVER_CONTAINER, MOFED_WAIT_LABEL, OPT_IN_LABEL
from nicop.api.nodes import is_managed, labels_of, unmanaged_reason
from nicop.kube.resources import Obj


@dataclass(frozen=True)
class NodeFacts:
    """What the policy controller reads of every node on every pass (nicop.kube.memo keeps
    them until the node changes)."""

    managed: bool
    opted_in: bool  # carries the opt-in label, whatever its value
    unmanaged: str | None  # why a node with a Mellanox NIC is not managed, with the fix
    mofed_wait: str | None  # the label's value now


def node_facts(node: Obj) -> NodeFacts:
    labels = labels_of(node)
    return NodeFacts(is_managed(node), OPT_IN_LABEL in labels, unmanaged_reason(node),
                     labels.get(MOFED_WAIT_LABEL))


def mofed_wait_value(node: Obj, ofed_configured: bool, driver_ready: dict[str, bool]) -> str | None:
    """The value of network.nvidia.com/operator.mofed.wait this node should carry, or None.

    With a driver section, "false" only once the node's driver container is Ready. Without one,
    managed nodes get "false" (the inbox driver is used) and a node still running an old driver
    pod keeps "true" until it is gone.
    """
    return wait_value(node["metadata"]["name"], is_managed(node), ofed_configured, driver_ready)


def wait_value(name: str, managed: bool, ofed_configured: bool,
               driver_ready: dict[str, bool]) -> str | None:
    """mofed_wait_value from what it depends on."""
    if ofed_configured:
        if not managed:
            return None
        return "false" if driver_ready.get(name) else "true"
    if name in driver_ready:
        return "true"
    return "false" if managed else None


def label_patch(node: Obj, wanted: str | None) -> dict[str, dict[str, str | None]] | None:
    """The merge patch that sets the mofed.wait label to `wanted`, or None if already so."""
    current = labels_of(node).get(MOFED_WAIT_LABEL)
    if current == wanted:
        return None
    return {"labels": {MOFED_WAIT_LABEL: wanted}}


def driver_readiness(driver_pods: Iterable[Obj]) -> dict[str, bool]:
    """By node that runs a driver pod: whether one of them has its driver container Ready."""
    return readiness_by_node(driver_pod_readiness(pod) for pod in driver_pods)


def driver_pod_readiness(pod: Obj) -> tuple[str | None, bool]:
    """The node a driver pod runs on, and whether its driver container is Ready."""
    return (pod.get("spec") or {}).get("nodeName"), container_ready(pod, DRIVER_CONTAINER)


def readiness_by_node(pods: Iterable[tuple[str | None, bool]]) -> dict[str, bool]:
    ready: dict[str, bool] = {}
    for node, pod_ready in pods:
        if node:
            ready[node] = ready.get(node, False) or pod_ready
    return ready


def container_ready(pod: Obj, name: str) -> bool:
    """The pod's container `name` is Ready and the pod is not being deleted."""
    if pod["metadata"].get("deletionTimestamp"):
        return False
    return any(c.get("name") == name and c.get("ready")
               for c in (pod.get("status") or {}).get("containerStatuses") or [])
