"""What a NicNodePolicy renders and how policies overlap, against upstream's names and messages."""

from __future__ import annotations

from typing import Any

from nicop.api.labels import MELLANOX_LABEL, MOFED_WAIT_LABEL
from nicop.operator.node_policy import _wait_for_release, overlaps
from nicop.operator.state_sync import Applied
from nicop.operator.states import ofed, rdma_dp, sriov_dp
from nicop.operator.states.base import Context

Obj = dict[str, Any]
NFD = "feature.node.kubernetes.io"
NODE = {"metadata": {"name": "n1", "labels": {
    f"{NFD}/pci-15b3.present": "true", f"{NFD}/system-os_release.ID": "ubuntu",
    f"{NFD}/system-os_release.VERSION_ID": "22.04",
    f"{NFD}/kernel-version.full": "5.15.0-91-generic", "pool": "a"}}}
PLUGIN = {"image": "p", "repository": "r", "version": "v1", "config": "{}"}
DRIVER = {"image": "doca-driver", "repository": "nvcr.io/nvidia/mellanox",
          "version": "25.04-0.6.1.0-2"}


def nnp(name: str, selector: dict[str, str] | None = None) -> Obj:
    return {"metadata": {"name": name, "uid": name}, "spec": {
        "nodeSelector": selector or {}, "ofedDriver": DRIVER,
        "rdmaSharedDevicePlugin": PLUGIN, "sriovDevicePlugin": PLUGIN}}


def names(objects: list[Obj], kind: str) -> list[str]:
    return [o["metadata"]["name"] for o in objects if o["kind"] == kind]


def test_node_policy_objects_carry_upstreams_per_policy_names() -> None:
    """Upstream's names for NicNodePolicy `pool-a` on ubuntu 22.04, kernel 5.15.0-91-generic
    (Mellanox/network-operator pkg/state/state_ofed_test.go for the kernel hash,
    pkg/state/state_skel.go for the policy's: its name's FNV-32a through k8s.io/apimachinery
    rand.SafeEncodeString)."""
    policy = nnp("pool-a", {"pool": "a"})
    ctx = Context(policy, "ns", managed_nodes=[NODE], node_policy="pool-a")
    driver = ofed.render(ctx, DRIVER, "spec.ofedDriver")
    rdma = rdma_dp.render(ctx, PLUGIN, "spec.rdmaSharedDevicePlugin")
    sriov = sriov_dp.render(ctx, PLUGIN, "spec.sriovDevicePlugin")
    assert names(driver, "DaemonSet") == ["mofed-ubuntu22.04-6d568d699f-779d97f8c7-ds"]
    assert names(rdma, "DaemonSet") == ["rdma-shared-dp-ds-779d97f8c7"]
    assert names(rdma, "ConfigMap") == ["rdma-devices-pool-a"]
    assert names(sriov, "DaemonSet") == ["network-operator-sriov-device-plugin-779d97f8c7"]
    assert names(sriov, "ConfigMap") == ["network-operator-sriovdp-config-pool-a"]
    for ds in (driver[-1], rdma[-1], sriov[-1]):
        pod = ds["spec"]["template"]
        assert pod["spec"]["nodeSelector"]["pool"] == "a"
        assert pod["metadata"]["labels"]["ds-owner"] == "nnp-pool-a"
    assert rdma[-1]["spec"]["selector"]["matchLabels"] == {"app": "rdma-shared-dp-pool-a"}


def test_cluster_policy_names_are_unchanged() -> None:
    ctx = Context({"metadata": {"name": "nic-cluster-policy"}, "spec": {}}, "ns",
                  managed_nodes=[NODE])
    assert names(rdma_dp.render(ctx, PLUGIN, "p"), "DaemonSet") == ["rdma-shared-dp-ds"]
    assert names(sriov_dp.render(ctx, PLUGIN, "p"), "ConfigMap") == [
        "network-operator-sriovdp-config"]
    assert names(ofed.render(ctx, DRIVER, "p"), "DaemonSet") == [
        "mofed-ubuntu22.04-6d568d699f-ds"]


def test_overlap_is_reported_with_upstreams_message() -> None:
    """Mellanox/network-operator pkg/policyoverlap/overlap.go FormatNodeOverlap: every node
    selected by two or more policies, policy names sorted; an empty selector selects all."""
    n2 = {"metadata": {"name": "n2", "labels": {"pool": "b"}}}
    found = overlaps([nnp("b-pool", {"pool": "b"}), nnp("all"), nnp("a-pool", {"pool": "a"})],
                     [NODE, n2])
    assert found == {
        "all": 'node selector overlap detected: node "n1" is selected by policies: '
               '[a-pool, all]; node "n2" is selected by policies: [all, b-pool]',
        "a-pool": 'node selector overlap detected: node "n1" is selected by policies: '
                  '[a-pool, all]',
        "b-pool": 'node selector overlap detected: node "n2" is selected by policies: '
                  '[all, b-pool]',
    }
    assert overlaps([nnp("a-pool", {"pool": "a"}), nnp("b-pool", {"pool": "b"})],
                    [NODE, n2]) == {}


def test_a_node_whose_driver_is_ready_holds_the_policy_until_its_plugins_may_start() -> None:
    """The device plugins select mofed.wait=false, which the cluster policy's controller sets
    after the driver is ready: until then the node policy is not ready (its plugins have not
    started there yet)."""
    def node(name: str, wait: str) -> Obj:
        return {"metadata": {"name": name,
                             "labels": {MELLANOX_LABEL: "true", MOFED_WAIT_LABEL: wait}}}

    nodes = [node("node-2", "false"), node("node-3", "true"), node("node-4", "true")]
    ready = {"node-2": True, "node-3": True, "node-4": False}
    applied = [Applied(ofed.STATE.name, "ready"), Applied(sriov_dp.STATE.name, "ready")]
    _wait_for_release(applied, nodes, ready)
    assert applied[0].state == "notReady"
    assert "node-3" in applied[0].message and "node-4" not in applied[0].message
    assert applied[1].state == "ready"

    nodes[1] = node("node-3", "false")
    applied = [Applied(ofed.STATE.name, "ready")]
    _wait_for_release(applied, nodes, ready)
    assert applied[0].state == "ready"
