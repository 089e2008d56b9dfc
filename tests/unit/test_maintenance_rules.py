"""The pure rules of NodeMaintenance: limits as counts of nodes, which pods a drain takes, and the
driver upgrade policy as a NodeMaintenance spec."""

from __future__ import annotations

import pytest

from nicop.operator.maintenance import drainable, scaled
from nicop.operator.maintenance_requestor import RequestorOptions, maintenance_spec


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
    spec = maintenance_spec({"drain": {"enable": True, "force": True, "podSelector": "app=x",
                                       "timeoutSeconds": 90, "deleteEmptyDir": True},
                             "waitForCompletion": {"podSelector": "job=train",
                                                   "timeoutSeconds": 600}})
    assert spec == {
        "drainSpec": {"force": True, "timeoutSeconds": 90, "deleteEmptyDir": True,
                      "podSelector": "app=x,nvidia.com/ofed-driver-upgrade-drain.skip!=true"},
        "waitForPodCompletion": {"podSelector": "job=train", "timeoutSeconds": 600}}
    assert maintenance_spec({"drain": {"enable": False}}) == {}


def test_requestor_mode_is_read_from_upstreams_variables() -> None:
    assert RequestorOptions.from_env({}) is None
    assert RequestorOptions.from_env({"MAINTENANCE_OPERATOR_ENABLED": "True"}) is None
    assert RequestorOptions.from_env({
        "MAINTENANCE_OPERATOR_ENABLED": "true", "MAINTENANCE_OPERATOR_REQUESTOR_ID": "a.b",
        "MAINTENANCE_OPERATOR_NODE_MAINTENANCE_PREFIX": "network-operator"}) == \
        RequestorOptions("a.b", "default", "network-operator")
