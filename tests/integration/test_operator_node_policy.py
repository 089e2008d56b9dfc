"""NicNodePolicies on the real control plane: each node group runs its own components."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import ConfigMap, Node, Pod
from tests.eventually import eventually
from tests.integration.driver_upgrades import StateWatch
from tests.integration.operator_process import NAMESPACE, OperatorProcess
from tests.integration.test_operator_policy import (
    apply_policy,
    delete_policy,
    example,
    nicop_objects,
    policy_status,
)

from nicop.api.upgrade import IN_PROGRESS
from nicop.operator.states.base import name_hash

NicNodePolicy = create_global_resource(
    "mellanox.com", "v1alpha1", "NicNodePolicy", "nicnodepolicies")
GPU, STORAGE = "node-role.kubernetes.io/gpu", "node-role.kubernetes.io/storage"
GROUPS = {"node-1": GPU, "node-2": STORAGE, "node-3": STORAGE}
KERNEL = "feature.node.kubernetes.io/kernel-version.full"
OS_ID = "feature.node.kubernetes.io/system-os_release.ID"
OS_VERSION = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
UPGRADE_STATE = "nvidia.com/ofed-driver-upgrade-state"
NEW_DRIVER = "doca3.5.0-26.07-1.0.0.0-0"


def apply_nnp(client: Client, body: dict[str, Any]) -> None:
    client.apply(NicNodePolicy(**body), field_manager="test", force=True)


def nnp_status(client: Client, name: str) -> dict[str, Any]:
    return dict(client.get(NicNodePolicy, name).get("status") or {})


def delete_nnp(client: Client, name: str) -> None:
    try:
        client.delete(NicNodePolicy, name)
    except ApiError as e:
        if e.status.code != 404:
            raise


def pod_nodes(client: Client, ds: str) -> set[str]:
    """The nodes the DaemonSet's pods run on."""
    return {p.spec.nodeName for p in client.list(Pod, namespace=NAMESPACE)
            if any(r.kind == "DaemonSet" and r.name == ds
                   for r in p.metadata.ownerReferences or [])}


def driver_pods(client: Client, daemonsets: set[str]) -> dict[str, Pod]:
    """The pods of these DaemonSets by uid."""
    return {p.metadata.uid: p for p in client.list(Pod, namespace=NAMESPACE)
            if any(r.kind == "DaemonSet" and r.name in daemonsets
                   for r in p.metadata.ownerReferences or [])}


def upgrade_states(client: Client) -> dict[str, str | None]:
    """The driver upgrade state of the nodes of the two groups."""
    return {n: (client.get(Node, n).metadata.labels or {}).get(UPGRADE_STATE) for n in GROUPS}


def driver_ds(client: Client, node: str, policy: str) -> str:
    """Upstream's driver DaemonSet name for the node's pool in a NicNodePolicy
    (Mellanox/network-operator manifests/state-ofed-driver/0050_ofed-driver-ds.yaml)."""
    labels = client.get(Node, node).metadata.labels
    return (f"mofed-{labels[OS_ID]}{labels[OS_VERSION]}-{name_hash(labels[KERNEL])}"
            f"-{name_hash(policy)}-ds")


@pytest.fixture
def node_groups(client: Client) -> Iterator[None]:
    for node, label in GROUPS.items():
        client.patch(Node, node, {"metadata": {"labels": {label: ""}}})
    yield
    for name in ("gpu-nodes", "storage-nodes", "all-nodes"):
        delete_nnp(client, name)
    delete_policy(client)
    for node, label in GROUPS.items():
        client.patch(Node, node, {"metadata": {"labels": {label: None}}})
    eventually(lambda: not nicop_objects(client), 120, "every policy's objects to be collected")


def test_node_groups_run_their_policys_components_and_conflicts_are_reported(
    client: Client, operator: OperatorProcess, node_groups: None
) -> None:
    """Upstream's "NCP + NNP deployment flow" (Mellanox/network-operator-docs
    docs/customizations/nic-node-policy.rst): multus in the NicClusterPolicy, a driver and the
    RDMA plugin for the GPU nodes, a driver and the SR-IOV plugin for the storage nodes. Names
    and the overlap message are upstream's (Mellanox/network-operator
    pkg/policyoverlap/overlap.go, pkg/state/state_skel.go)."""
    cluster = example("nicclusterpolicy-infiniband.yaml")
    multus = cluster["spec"]["secondaryNetwork"]["multus"]
    cluster["spec"] = {"secondaryNetwork": {"multus": multus}}
    apply_policy(client, cluster)
    apply_nnp(client, example("nicnodepolicy-gpu-nodes.yaml"))
    apply_nnp(client, example("nicnodepolicy-storage-nodes.yaml"))
    for name in ("gpu-nodes", "storage-nodes"):
        eventually(lambda n=name: nnp_status(client, n).get("state") == "ready", 120,  # type: ignore[misc]
                   f"NicNodePolicy {name} to become ready")
    eventually(lambda: policy_status(client).get("state") == "ready", 60, "the cluster policy")

    gpu_hash, storage_hash = name_hash("gpu-nodes"), name_hash("storage-nodes")
    gpu_driver = driver_ds(client, "node-1", "gpu-nodes")
    storage_drivers = {driver_ds(client, n, "storage-nodes") for n in ("node-2", "node-3")}
    rdma, sriov = f"rdma-shared-dp-ds-{gpu_hash}", \
        f"network-operator-sriov-device-plugin-{storage_hash}"
    # Each node runs exactly what its policy names; node-4 (no NIC label) runs none of it.
    assert pod_nodes(client, gpu_driver) == {"node-1"}
    assert set().union(*(pod_nodes(client, d) for d in storage_drivers)) == {"node-2", "node-3"}
    assert pod_nodes(client, rdma) == {"node-1"}
    assert pod_nodes(client, sriov) == {"node-2", "node-3"}
    assert pod_nodes(client, "kube-multus-ds") == {"node-1", "node-2", "node-3", "node-4"}
    daemonsets = {d.metadata.name: d for d in client.list(DaemonSet, namespace=NAMESPACE)}
    assert set(daemonsets) == {"kube-multus-ds", gpu_driver, rdma, sriov, *storage_drivers}
    assert daemonsets[rdma].spec.template.spec.nodeSelector[GPU] == ""
    assert daemonsets[rdma].spec.selector.matchLabels == {"app": "rdma-shared-dp-gpu-nodes"}
    assert daemonsets[sriov].spec.template.spec.nodeSelector[STORAGE] == ""
    assert daemonsets[gpu_driver].spec.template.spec.nodeSelector[GPU] == ""
    assert daemonsets[gpu_driver].spec.template.metadata.labels["ds-owner"] == "nnp-gpu-nodes"
    config_maps = {c.metadata.name for c in client.list(ConfigMap, namespace=NAMESPACE)}
    assert {"rdma-devices-gpu-nodes", "network-operator-sriovdp-config-storage-nodes"} <= \
        config_maps
    status = nnp_status(client, "gpu-nodes")
    assert {s["name"]: s["state"] for s in status["appliedStates"]} == {
        "state-OFED": "ready", "state-RDMA-device-plugin": "ready",
        "state-SRIOV-device-plugin": "ignore", "state-DRA-driver": "ignore"}
    # Each pool upgrades by its own policy's upgradePolicy: a new version in gpu-nodes moves
    # node-1 through the upgrade states to the new driver; the storage nodes' drivers stay.
    eventually(lambda: upgrade_states(client) == dict.fromkeys(GROUPS, "upgrade-done"), 60,
               "every driver node upgrade-done")
    storage_pods = driver_pods(client, storage_drivers)
    bumped = example("nicnodepolicy-gpu-nodes.yaml")
    bumped["spec"]["ofedDriver"]["version"] = NEW_DRIVER

    def upgraded() -> bool:
        pods = list(driver_pods(client, {gpu_driver}).values())  # none while it is replaced
        return (len(pods) == 1 and f":{NEW_DRIVER}-" in pods[0].spec.containers[0].image
                and upgrade_states(client)["node-1"] == "upgrade-done"
                and not client.get(Node, "node-1").spec.unschedulable)

    states = StateWatch(client).started()  # every state node-1 shows, none missed between looks
    apply_nnp(client, bumped)
    eventually(upgraded, 180, "node-1 upgraded to the new driver")
    seen = set(states.stop()["node-1"])
    assert seen & set(IN_PROGRESS), f"node-1 went through the upgrade states, saw {seen}"
    assert driver_pods(client, storage_drivers) == storage_pods, "storage drivers untouched"
    assert upgrade_states(client) == dict.fromkeys(GROUPS, "upgrade-done")

    # A third policy selecting every node overlaps both: all three are in error, unchanged.
    uids = {d.metadata.name: d.metadata.uid for d in daemonsets.values()}
    apply_nnp(client, {"apiVersion": "mellanox.com/v1alpha1", "kind": "NicNodePolicy",
                       "metadata": {"name": "all-nodes"},
                       "spec": {"sriovDevicePlugin": example(
                           "nicnodepolicy-storage-nodes.yaml")["spec"]["sriovDevicePlugin"]}})
    eventually(lambda: nnp_status(client, "all-nodes").get("state") == "error", 60,
               "the overlapping policy's error")
    reason = nnp_status(client, "all-nodes")["reason"]
    assert reason.startswith('node selector overlap detected: node "node-1" is selected by '
                             "policies: [all-nodes, gpu-nodes]; node \"node-2\" is selected by "
                             "policies: [all-nodes, storage-nodes]")
    eventually(lambda: nnp_status(client, "gpu-nodes").get("state") == "error", 60,
               "the overlapped policy's error")
    assert not [d for d in client.list(DaemonSet, namespace=NAMESPACE)
                if d.metadata.name.startswith(f"network-operator-sriov-device-plugin-"
                                              f"{name_hash('all-nodes')}")]
    delete_nnp(client, "all-nodes")
    eventually(lambda: nnp_status(client, "gpu-nodes").get("state") == "ready", 60,
               "gpu-nodes ready again")

    # The cluster policy takes the RDMA plugin too: the GPU nodes' copy goes, both statuses say
    # which policy, section and node.
    cluster["spec"]["rdmaSharedDevicePlugin"] = example(
        "nicnodepolicy-gpu-nodes.yaml")["spec"]["rdmaSharedDevicePlugin"]
    apply_policy(client, cluster)
    eventually(lambda: {s["name"]: s["state"] for s in nnp_status(client, "gpu-nodes").get(
        "appliedStates", [])}.get("state-RDMA-device-plugin") == "error", 60,
        "the section conflict in the node policy")
    rdma_state = next(s for s in nnp_status(client, "gpu-nodes")["appliedStates"]
                      if s["name"] == "state-RDMA-device-plugin")
    assert "NicClusterPolicy nic-cluster-policy" in rdma_state["message"]
    assert '"node-1"' in rdma_state["message"]
    eventually(lambda: any("NicNodePolicy gpu-nodes also has spec.rdmaSharedDevicePlugin"
                         in c["message"] for c in policy_status(client).get("conditions", [])),
               60, "the section conflict in the cluster policy")
    eventually(lambda: not pod_nodes(client, rdma), 60, "the node policy's RDMA plugin to go")
    del cluster["spec"]["rdmaSharedDevicePlugin"]
    apply_policy(client, cluster)

    # Deleting one node policy removes its objects only.
    delete_nnp(client, "storage-nodes")
    eventually(lambda: not {sriov, *storage_drivers} & {
        d.metadata.name for d in client.list(DaemonSet, namespace=NAMESPACE)}, 60,
        "the storage policy's DaemonSets to go")
    eventually(lambda: "network-operator-sriovdp-config-storage-nodes" not in {
        c.metadata.name for c in client.list(ConfigMap, namespace=NAMESPACE)}, 60,
        "the storage policy's ConfigMap to go")
    eventually(lambda: nnp_status(client, "gpu-nodes").get("state") == "ready", 60,
               "gpu-nodes ready")
    left = {d.metadata.name: d.metadata.uid for d in client.list(DaemonSet, namespace=NAMESPACE)}
    assert {k: uids[k] for k in ("kube-multus-ds", gpu_driver)} == \
        {k: left[k] for k in ("kube-multus-ds", gpu_driver)}
    assert pod_nodes(client, gpu_driver) == {"node-1"}
