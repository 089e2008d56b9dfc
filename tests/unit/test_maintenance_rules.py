"""The pure rules of NodeMaintenance: limits as counts of nodes, which pods a drain takes, and the
driver upgrade policy as a NodeMaintenance spec."""

from __future__ import annotations

import pytest

from nicop.api.mellanox import DriverUpgradePolicySpec
from nicop.operator.drain import scaled
from nicop.operator.maintenance import drainable
from nicop.operator.maintenance_requestor import (
    RequestorOptions,
    holders,
    maintenance_spec,
    sriov_maintenance_spec,
)
from nicop.operator.upgrade import maintenance_blocked


@pytest.mark.parametrize(("value", "round_up", "count"), [
    (3, True, 3), ("3", True, 3), ("10%", True, 2), ("10%", False, 1), ("50%", False, 7),
    ("0%", True, 0),
])
def test_limits_scale_as_kubernetes_int_or_percent(value: object, round_up: bool,
                                                   count: int) -> None:
    """maxParallelOperations rounds a percentage up, maxUnavailable down (15 nodes here), as
    the maintenance operator calls GetScaledValueFromIntOrPercent."""
    assert scaled(value, 15, round_up) == count


def pod(labels: dict[str, str] | None = None, requests: dict[str, str] | None = None,
        owner: str = "ReplicaSet") -> dict[str, object]:
    return {"metadata": {"name": "p", "namespace": "work", "labels": labels or {},
                         "ownerReferences": [{"kind": owner, "name": "x"}]},
            "spec": {"containers": [{"name": "c", "resources": {"requests": requests or {}}}]},
            "status": {"phase": "Running"}}


def test_a_drain_takes_what_its_selector_and_eviction_filters_name() -> None:
    """podEvictionFilters are ORed regexes over the containers' resource requests (the
    maintenance operator README's nvidia.com/gpu-* and nvidia.com/rdma* filters)."""
    drain = {"podSelector": "app!=keep",
             "podEvictionFilters": [{"byResourceNameRegex": "nvidia.com/gpu-*"},
                                    {"byResourceNameRegex": "nvidia.com/rdma*"}]}
    assert drainable(pod(requests={"nvidia.com/rdma_shared_device_a": "1"}), drain)
    assert not drainable(pod(requests={"cpu": "1"}), drain)
    assert not drainable(pod({"app": "keep"}, {"nvidia.com/rdma_shared_device_a": "1"}), drain)
    assert not drainable(pod(requests={"nvidia.com/rdma_a": "1"}, owner="DaemonSet"), drain)
    assert drainable(pod(requests={"cpu": "1"}), {"podSelector": ""})


def test_the_upgrade_policy_becomes_the_maintenance_spec() -> None:
    """drain and waitForCompletion carried over as k8s-operator-libs converts them
    (convertV1Alpha1ToMaintenance); the drain-skip label keeps the operator's own pod; a
    disabled drain asks for none, where upstream would still drain."""
    spec = maintenance_spec(DriverUpgradePolicySpec.model_validate({
        "drain": {"enable": True, "force": True, "podSelector": "app=x", "timeoutSeconds": 90,
                  "deleteEmptyDir": True},
        "waitForCompletion": {"podSelector": "job=train", "timeoutSeconds": 600}}))
    assert spec == {
        "drainSpec": {"force": True, "timeoutSeconds": 90, "deleteEmptyDir": True,
                      "podSelector": "app=x,nvidia.com/ofed-driver-upgrade-drain.skip!=true"},
        "waitForPodCompletion": {"podSelector": "job=train", "timeoutSeconds": 600}}
    assert maintenance_spec(DriverUpgradePolicySpec.model_validate(
        {"drain": {"enable": False}, "waitForCompletion": {}})) == {}
    # Unset, the drain is on with upstream's 300 s.
    assert maintenance_spec(DriverUpgradePolicySpec()) == {"drainSpec": {
        "force": False, "timeoutSeconds": 300, "deleteEmptyDir": False,
        "podSelector": "nvidia.com/ofed-driver-upgrade-drain.skip!=true"}}


def test_requestor_mode_is_read_from_upstreams_variables() -> None:
    assert RequestorOptions.from_env({}) is None
    assert RequestorOptions.from_env({"MAINTENANCE_OPERATOR_ENABLED": "True"}) is None
    assert RequestorOptions.from_env({
        "MAINTENANCE_OPERATOR_ENABLED": "true", "MAINTENANCE_OPERATOR_REQUESTOR_ID": "a.b",
        "MAINTENANCE_OPERATOR_NODE_MAINTENANCE_PREFIX": "network-operator"}) == \
        RequestorOptions("a.b", "default", "network-operator")


def test_sriov_drains_use_upstreams_drain_controller_variables() -> None:
    """Names and defaults of network-operator's pkg/drain GetRequestorOptsFromEnvs (namespace
    `default`); the name prefix follows the driver upgrade's so that both meet on one object."""
    assert RequestorOptions.sriov_from_env({"MAINTENANCE_OPERATOR_ENABLED": "true"}) is None
    assert RequestorOptions.sriov_from_env({"DRAIN_CONTROLLER_ENABLED": "true"}) == \
        RequestorOptions("nvidia.sriov-drain", "default", "nvidia-operator")
    assert RequestorOptions.sriov_from_env({
        "DRAIN_CONTROLLER_ENABLED": "true",
        "DRAIN_CONTROLLER_REQUESTOR_ID": "primary-drain.requestor.com",
        "DRAIN_CONTROLLER_REQUESTOR_NAMESPACE": "maint",
        "MAINTENANCE_OPERATOR_NODE_MAINTENANCE_PREFIX": "network-operator"}) == \
        RequestorOptions("primary-drain.requestor.com", "maint", "network-operator")
    assert sriov_maintenance_spec() == {"drainSpec": {
        "force": True, "podSelector": "nvidia.com/ofed-driver-upgrade-drain.skip!=true",
        "timeoutSeconds": 90, "deleteEmptyDir": True}}


def test_an_owner_that_deleted_its_node_maintenance_no_longer_holds_the_node() -> None:
    """The shared-requestor flow of k8s-operator-libs' requestor tests: `foo.bar.com` owns the
    object, the upgrade joined it; once the owner deleted it only the joined requestor holds
    the node (the maintenance operator releases it when that one leaves)."""
    nm = {"metadata": {"name": "nvidia-operator-node-1", "namespace": "default"},
          "spec": {"requestorID": "foo.bar.com", "nodeName": "node-1",
                   "additionalRequestors": ["nvidia.operator.com"]}}
    assert holders(nm) == ["foo.bar.com", "nvidia.operator.com"]
    nm["metadata"]["deletionTimestamp"] = "2026-12-05T08:00:00Z"
    assert holders(nm) == ["nvidia.operator.com"]


def test_a_blocked_node_maintenance_drain_names_the_refused_pods() -> None:
    nm = {"metadata": {"name": "nvidia-operator-node-7", "namespace": "default"},
          "status": {"drain": {"waitForEviction": [
              "work/train-1", "work/stuck-2 (The disruption budget stuck needs 1 healthy pods "
              "and has 1 currently)"]}}}
    assert maintenance_blocked(nm) == (
        "NodeMaintenance default/nvidia-operator-node-7: work/stuck-2 (The disruption budget "
        "stuck needs 1 healthy pods and has 1 currently)")
    nm["status"]["drain"]["waitForEviction"] = ["work/train-1"]
    assert maintenance_blocked(nm) is None
