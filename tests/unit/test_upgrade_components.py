"""What keeps a node cordoned after its driver reload: the DaemonSets that wait for the driver
(nodeSelector mofed.wait=false, as the operator renders the device plugins) and place a pod on
the node, until that pod is ready there; and its device resources, until they are as
allocatable as before the reload."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from nicop.api.labels import MELLANOX_LABEL, MOFED_WAIT_LABEL
from nicop.api.upgrade import ALLOCATABLE_ANNOTATION
from nicop.kube.times import stamp, utcnow
from nicop.operator.upgrade import (
    DEVICES_SETTLE,
    components_pending,
    devices_missing,
    devices_of,
    devices_settled,
)

NS = "nvidia-network-operator"


def node(**labels: str) -> dict[str, Any]:
    return {"metadata": {"name": "node-1", "labels": labels},
            "spec": {"unschedulable": True, "taints": [
                {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}}


def daemonset(name: str, selector: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
            "spec": {"template": {"spec": {"nodeSelector": selector}}}}


def pod(owner: str, ready: bool, namespace: str = NS) -> dict[str, Any]:
    return {"metadata": {"name": f"{owner}-x", "namespace": namespace,
                         "ownerReferences": [{"kind": "DaemonSet", "uid": f"uid-{owner}"}]},
            "status": {"phase": "Running", "containerStatuses": [{"ready": ready}]}}


PLUGIN = daemonset("rdma-shared-dp-ds", {MELLANOX_LABEL: "true", MOFED_WAIT_LABEL: "false"})
MULTUS = daemonset("kube-multus-ds", {MELLANOX_LABEL: "true"})  # does not wait for the driver
NIC_NODE = node(**{MELLANOX_LABEL: "true", MOFED_WAIT_LABEL: "true"})


def test_a_plugin_not_back_yet_keeps_the_node_while_its_driver_label_still_says_wait() -> None:
    assert components_pending(NIC_NODE, [PLUGIN, MULTUS], [], NS) == [
        "DaemonSet rdma-shared-dp-ds"]
    assert components_pending(NIC_NODE, [PLUGIN], [pod("rdma-shared-dp-ds", False)], NS) == [
        "DaemonSet rdma-shared-dp-ds"]


def test_a_ready_plugin_pod_of_the_operator_namespace_lets_the_node_go() -> None:
    assert components_pending(NIC_NODE, [PLUGIN], [pod("rdma-shared-dp-ds", True)], NS) == []
    assert components_pending(NIC_NODE, [PLUGIN], [pod("rdma-shared-dp-ds", True, "work")],
                              NS) == ["DaemonSet rdma-shared-dp-ds"]


def test_components_that_do_not_run_on_the_node_are_not_waited_for() -> None:
    other_nic = daemonset("sriov-device-plugin", {"feature.node.kubernetes.io/sriov": "true",
                                                  MOFED_WAIT_LABEL: "false"})
    unmanaged = node(**{MELLANOX_LABEL: "true"})  # no mofed.wait: plugins never run there
    assert components_pending(NIC_NODE, [other_nic, MULTUS], [], NS) == []
    assert components_pending(unmanaged, [PLUGIN], [], NS) == []


def reloaded(before: str | None, allocatable: dict[str, str]) -> dict[str, Any]:
    """A node after its reload, with the devices noted before it (the annotation's JSON)."""
    annotations = {} if before is None else {ALLOCATABLE_ANNOTATION: before}
    return {"metadata": {"name": "node-1", "annotations": annotations},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", **allocatable}}}


def test_devices_are_the_extended_resources_as_counts() -> None:
    node = reloaded(None, {"nvidia.com/cx6dx_vf": "8", "rdma/rdma_shared": "1k"})
    assert devices_of(node) == {"nvidia.com/cx6dx_vf": 8, "rdma/rdma_shared": 1000}


def test_vfs_still_unhealthy_after_the_reload_keep_the_node_until_they_are_back() -> None:
    """The SR-IOV device plugin's pod stays through a reload, but it reports its VFs unhealthy
    while their PF's link is down: the kubelet's allocatable says so."""
    before = '{"nvidia.com/cx6dx_vf": 8, "rdma/rdma_shared": 10}'
    assert devices_missing(reloaded(before, {"nvidia.com/cx6dx_vf": "0",
                                             "rdma/rdma_shared": "10"})) == [
        "nvidia.com/cx6dx_vf (0 of 8 allocatable)"]
    assert devices_missing(reloaded(before, {"rdma/rdma_shared": "10"})) == [
        "nvidia.com/cx6dx_vf (0 of 8 allocatable)"]
    assert devices_missing(reloaded(before, {"nvidia.com/cx6dx_vf": "8",
                                             "rdma/rdma_shared": "10"})) == []


def test_without_a_note_or_with_a_broken_one_nothing_is_waited_for() -> None:
    assert devices_missing(reloaded(None, {})) == []
    assert devices_missing(reloaded("not json", {})) == []
    assert devices_missing(reloaded("{}", {})) == []


def test_allocatable_counts_only_once_a_kubelet_had_time_to_post_what_the_reload_did() -> None:
    """A real kubelet posts the plugins' unhealthy VFs at its next node status update (10 s):
    right after the driver is Ready, the node's allocatable can still be the one from before
    the reload. It is read as current once the driver has been Ready for DEVICES_SETTLE; a
    node that noted no devices does not wait."""
    noted = reloaded('{"nvidia.com/cx6dx_vf": 8}', {"nvidia.com/cx6dx_vf": "8"})
    just = stamp(utcnow() - timedelta(seconds=2))
    settled = stamp(utcnow() - timedelta(seconds=DEVICES_SETTLE + 1))
    assert not devices_settled(noted, just, DEVICES_SETTLE)
    assert not devices_settled(noted, None, DEVICES_SETTLE)  # the new pod not Ready yet
    assert devices_settled(noted, settled, DEVICES_SETTLE)
    assert devices_settled(reloaded(None, {}), just, DEVICES_SETTLE)
    assert devices_settled(reloaded('{"nvidia.com/rdma": 0}', {}), just, DEVICES_SETTLE)
