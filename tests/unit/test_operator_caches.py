"""The operator caches trimmed pods and nodes (nicop.operator.caches); every rule the controllers
apply to a cached pod or node must decide the same on the trimmed copy as on the whole object.

The objects are what the API server returns, managedFields and all; each rule is run on variants
that flip its answer, so a field the trim drops shows up as a different decision.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from nicop.api.nodes import is_managed, unmanaged_reason
from nicop.kube.scheduling import daemon_pod_filter
from nicop.operator.caches import trim_node, trim_pod
from nicop.operator.drain import evictable, refusal
from nicop.operator.nodes import container_ready
from nicop.operator.sriov_drain import uses_resource
from nicop.operator.upgrade import (
    NodeView,
    _pod_ready,
    devices_missing,
    devices_of,
    ready_since,
)

MANAGED_FIELDS = [{"manager": "kube-controller-manager", "operation": "Update",
                   "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:phase": {}}}}]


def pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train-0", "namespace": "ml", "uid": "u1", "resourceVersion": "7",
                     "labels": {"nvidia.com/training-job": "a"},
                     "annotations": {"k8s.v1.cni.cncf.io/networks": "ib"},
                     "ownerReferences": [{"kind": "Job", "name": "train", "uid": "j"}],
                     "managedFields": MANAGED_FIELDS},
        "spec": {"nodeName": "node-1", "restartPolicy": "Never",
                 "containers": [{"name": "app", "image": "pytorch", "env": [{"name": "A"}],
                                 "resources": {"limits": {"nvidia.com/cx7_vf": "1"}},
                                 "volumeMounts": [{"name": "scratch", "mountPath": "/s"}]}],
                 "initContainers": [{"name": "init", "image": "busybox"}],
                 "volumes": [{"name": "scratch", "emptyDir": {}},
                             {"name": "token", "projected": {"sources": []}}]},
        "status": {"phase": "Running", "hostIP": "10.0.0.1", "podIP": "10.1.0.5",
                   "conditions": [{"type": "Initialized", "status": "True"},
                                  {"type": "Ready", "status": "True",
                                   "lastTransitionTime": "2026-01-01T00:00:05Z"}],
                   "containerStatuses": [{"name": "app", "ready": True, "restartCount": 2,
                                          "image": "pytorch", "state": {"running": {}}}]},
    }


def node() -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-1", "resourceVersion": "9",
                     "labels": {"feature.node.kubernetes.io/pci-15b3.present": "true",
                                "kubernetes.io/os": "linux", "kubernetes.io/hostname": "node-1"},
                     "annotations": {"nvidia.com/ofed-driver-upgrade.driver-wait-for-safe-load":
                                     "true"},
                     "managedFields": MANAGED_FIELDS},
        "spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "lastHeartbeatTime": "2026-01-01T00:00:00Z"}],
                   "images": [{"names": ["a"], "sizeBytes": 1}],
                   "nodeInfo": {"kernelVersion": "6.8.0"},
                   "allocatable": {"cpu": "8", "nvidia.com/cx6dx_vf": "4"}},
    }


def variants(make: Callable[[], dict[str, Any]],
             *changes: Callable[[dict[str, Any]], Any]) -> list[dict[str, Any]]:
    """The object `make` builds, and one copy per change applied to it."""
    out = [make()]
    for change in changes:
        variant = make()
        change(variant)
        out.append(variant)
    return out


def pod_variants() -> list[dict[str, Any]]:
    return variants(
        pod,
        lambda p: p["metadata"].update(ownerReferences=[]),
        lambda p: p["metadata"].update(ownerReferences=[{"kind": "DaemonSet", "uid": "d"}]),
        lambda p: p["metadata"].update(annotations={"kubernetes.io/config.mirror": "x"}),
        lambda p: p["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z"),
        lambda p: p["metadata"]["labels"].update({"nvidia.com/ofed-driver-upgrade-drain.skip":
                                                  "true"}),
        lambda p: p["spec"].update(volumes=[{"name": "token", "projected": {}}]),
        lambda p: p["spec"]["containers"][0].update(resources={}),
        lambda p: p["status"].update(phase="Succeeded"),
        lambda p: p["status"]["containerStatuses"][0].update(ready=False),
        lambda p: p["status"].pop("containerStatuses"),
        lambda p: p["status"].pop("conditions"),
    )


@pytest.mark.parametrize("whole", pod_variants())
def test_every_pod_rule_decides_the_same_on_the_trimmed_pod(whole: dict[str, Any]) -> None:
    trimmed = trim_pod(copy.deepcopy(whole))
    for rule in (
        lambda p: evictable(p, ""),
        lambda p: evictable(p, "nvidia.com/training-job=a"),
        ready_since,  # the upgrade's waits after a driver pod is Ready count from it
        lambda p: refusal(p, False, False, "ofedDriver.upgradePolicy.drain"),
        lambda p: refusal(p, True, True, "drainSpec"),
        lambda p: uses_resource(p, "nvidia.com"),
        _pod_ready,
        lambda p: container_ready(p, "app"),
        lambda p: [c.get("restartCount") for c in p["status"].get("containerStatuses") or []],
        lambda p: (p["spec"]["nodeName"], p["metadata"]["name"], p["metadata"]["namespace"],
                   p["metadata"]["labels"], p["metadata"]["ownerReferences"]),
    ):
        assert rule(trimmed) == rule(whole)
    assert "managedFields" not in trimmed["metadata"]


def node_variants() -> list[dict[str, Any]]:
    return variants(
        node,
        lambda n: n["spec"].update(taints=[], unschedulable=True),
        lambda n: n["status"]["conditions"][0].update(status="False"),
        lambda n: n["metadata"]["labels"].pop("feature.node.kubernetes.io/pci-15b3.present"),
        lambda n: n["metadata"]["annotations"].update({
            "nicop.io/ofed-driver-upgrade-allocatable": '{"nvidia.com/cx6dx_vf": 8}'}),
    )


@pytest.mark.parametrize("whole", node_variants())
def test_every_node_rule_decides_the_same_on_the_trimmed_node(whole: dict[str, Any]) -> None:
    """Includes a DaemonSet template whose required nodeAffinity uses a node label and one that
    tolerates the node's taint, as the policy controller judges where DaemonSets should run."""
    trimmed = trim_node(copy.deepcopy(whole))
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{
            "key": "feature.node.kubernetes.io/pci-15b3.present", "operator": "In",
            "values": ["true"]}]}]}}}
    templates = [{"affinity": affinity},
                 {"affinity": affinity, "tolerations": [{"key": "gpu", "operator": "Exists"}]},
                 {"nodeSelector": {"kubernetes.io/os": "linux"}}]
    for template in templates:
        fits = daemon_pod_filter(template)
        assert fits(trimmed) == fits(whole)
    for rule in (is_managed, unmanaged_reason, devices_of, devices_missing,
                 lambda n: (NodeView(n, None, True).not_ready,
                            NodeView(n, None, True).unschedulable,
                            NodeView(n, None, True).annotations, NodeView(n, None, True).state)):
        assert rule(trimmed) == rule(whole)
    assert "managedFields" not in trimmed["metadata"]
    assert "images" not in trimmed["status"]
