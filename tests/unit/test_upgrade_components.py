"""Which components keep a node cordoned after its driver reload: the DaemonSets that wait for
the driver (nodeSelector mofed.wait=false, as the operator renders the device plugins) and
place a pod on the node, until that pod is ready there."""

from __future__ import annotations

from typing import Any

from nicop.api.labels import MELLANOX_LABEL, MOFED_WAIT_LABEL
from nicop.operator.upgrade import components_pending

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
