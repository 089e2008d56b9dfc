"""What the operator keeps of the pods and nodes it caches.

A cluster has many more pods and nodes than anything else the operator watches, and its
controllers read few of their fields; the cache keeps those (client-go's SetTransform does the
same for Go operators). Add a field here before a controller reads it: `tests/unit/
test_operator_caches.py` runs the readers on trimmed objects.
"""

from __future__ import annotations

from nicop.kube.informer import Transform
from nicop.kube.resources import NODE, POD, Obj, Resource


def _metadata(obj: Obj) -> Obj:
    return {k: v for k, v in obj.get("metadata", {}).items() if k != "managedFields"}


def trim_pod(pod: Obj) -> Obj:
    """Pods: where they run, their owners and labels (drain and upgrade rules), the resources
    their containers ask for (SR-IOV drains), emptyDir volumes (what a drain refuses),
    their phase and each container's readiness and restarts."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    trimmed_spec: Obj = {"nodeName": spec.get("nodeName")}
    for part in ("containers", "initContainers"):
        if spec.get(part):
            trimmed_spec[part] = [{"name": c.get("name"), "resources": c.get("resources") or {}}
                                  for c in spec[part]]
    if volumes := [{"name": v.get("name"), "emptyDir": v["emptyDir"]}
                   for v in spec.get("volumes") or [] if "emptyDir" in v]:
        trimmed_spec["volumes"] = volumes
    trimmed_status: Obj = {"phase": status.get("phase")}
    if ready := [{"type": "Ready", "status": c.get("status"),
                  "lastTransitionTime": c.get("lastTransitionTime")}
                 for c in status.get("conditions") or [] if c.get("type") == "Ready"]:
        trimmed_status["conditions"] = ready  # since when: the upgrade's waits count from it
    if status.get("containerStatuses"):
        trimmed_status["containerStatuses"] = [
            {"name": c.get("name"), "ready": c.get("ready", False),
             "restartCount": c.get("restartCount", 0)} for c in status["containerStatuses"]]
    return {"apiVersion": pod.get("apiVersion"), "kind": pod.get("kind"),
            "metadata": _metadata(pod), "spec": trimmed_spec, "status": trimmed_status}


def trim_node(node: Obj) -> Obj:
    """Nodes: labels and annotations (selectors, upgrade and drain state), spec (taints,
    unschedulable), the type and status of each condition (Ready) and the allocatable device
    resources (extended resources: the upgrade waits for them after a reload); no images,
    addresses, CPU or memory, or heartbeat times."""
    status = node.get("status") or {}
    conditions = [{"type": c.get("type"), "status": c.get("status")}
                  for c in status.get("conditions") or []]
    devices = {k: v for k, v in (status.get("allocatable") or {}).items() if "/" in k}
    return {"apiVersion": node.get("apiVersion"), "kind": node.get("kind"),
            "metadata": _metadata(node), "spec": node.get("spec") or {},
            "status": {"conditions": conditions, "allocatable": devices}}


TRANSFORMS: dict[Resource, Transform] = {POD: trim_pod, NODE: trim_node}
