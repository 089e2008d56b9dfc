"""The mofed.wait label the operator keeps on every node (which nodes are managed:
nicop.api.nodes)."""

from __future__ import annotations

from collections.abc import Iterable

from nicop.api.labels import DRIVER_CONTAINER, MOFED_WAIT_LABEL
from nicop.api.nodes import is_managed, labels_of
from nicop.kube.resources import Obj


def mofed_wait_value(node: Obj, ofed_configured: bool, driver_ready: dict[str, bool]) -> str | None:
    """The value of network.nvidia.com/operator.mofed.wait this node should carry, or None.

    With a driver section, "false" only once the node's driver container is Ready. Without one,
    managed nodes get "false" (the inbox driver is used) and a node still running an old driver
    pod keeps "true" until it is gone.
    """
    name = node["metadata"]["name"]
    if ofed_configured:
        if not is_managed(node):
            return None
        return "false" if driver_ready.get(name) else "true"
    if name in driver_ready:
        return "true"
    return "false" if is_managed(node) else None


def label_patch(node: Obj, wanted: str | None) -> dict[str, dict[str, str | None]] | None:
    """The merge patch that sets the mofed.wait label to `wanted`, or None if already so."""
    current = labels_of(node).get(MOFED_WAIT_LABEL)
    if current == wanted:
        return None
    return {"labels": {MOFED_WAIT_LABEL: wanted}}


def driver_readiness(driver_pods: Iterable[Obj]) -> dict[str, bool]:
    """By node that runs a driver pod: whether one of them has its driver container Ready."""
    ready: dict[str, bool] = {}
    for pod in driver_pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            ready[node] = ready.get(node, False) or container_ready(pod, DRIVER_CONTAINER)
    return ready


def container_ready(pod: Obj, name: str) -> bool:
    """The pod's container `name` is Ready and the pod is not being deleted."""
    if pod["metadata"].get("deletionTimestamp"):
        return False
    return any(c.get("name") == name and c.get("ready")
               for c in (pod.get("status") or {}).get("containerStatuses") or [])
