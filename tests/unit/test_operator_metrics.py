"""The operator's gauges as a scrape shows them: set from a policy's computed status and the
nodes' labels, and gone with the policy."""

from __future__ import annotations

from prometheus_client import REGISTRY

from nicop.api.labels import MELLANOX_LABEL, OPT_IN_LABEL
from nicop.api.nodes import unmanaged_reason
from nicop.operator import metrics


def value(metric: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(metric, labels)


def status(state: str, **components: str) -> dict[str, object]:
    return {"state": state,
            "appliedStates": [{"name": n, "state": s} for n, s in components.items()]}


def test_cluster_policy_and_its_requested_components() -> None:
    metrics.policy_status("NicClusterPolicy", "nic-cluster-policy", status(
        "notReady", **{"state-OFED": "ready", "state-multus-cni": "notReady",
                       "state-ib-kubernetes": "ignore"}))
    assert value("nicop_policy_ready", kind="NicClusterPolicy", name="nic-cluster-policy") == 0
    assert value("nicop_component_ready", component="state-OFED") == 1
    assert value("nicop_component_ready", component="state-multus-cni") == 0
    assert value("nicop_component_ready", component="state-ib-kubernetes") is None  # not asked

    # multus removed from the spec, the rest ready
    metrics.policy_status("NicClusterPolicy", "nic-cluster-policy", status(
        "ready", **{"state-OFED": "ready", "state-multus-cni": "ignore"}))
    assert value("nicop_policy_ready", kind="NicClusterPolicy", name="nic-cluster-policy") == 1
    assert value("nicop_component_ready", component="state-multus-cni") is None

    metrics.forget_policy("NicClusterPolicy", "nic-cluster-policy")
    assert value("nicop_policy_ready", kind="NicClusterPolicy", name="nic-cluster-policy") is None
    assert value("nicop_component_ready", component="state-OFED") is None


def test_an_unsupported_cluster_policy_instance_has_no_series() -> None:
    metrics.policy_status("NicClusterPolicy", "second", {"state": "ignore", "reason": "x"})
    assert value("nicop_policy_ready", kind="NicClusterPolicy", name="second") is None


def test_node_policies_come_and_go_without_touching_components() -> None:
    metrics.policy_status("NicNodePolicy", "gpu-a", status("error", **{"state-OFED": "error"}))
    metrics.policy_status("NicNodePolicy", "gpu-b", status("ready", **{"state-OFED": "ready"}))
    assert value("nicop_policy_ready", kind="NicNodePolicy", name="gpu-a") == 0
    assert value("nicop_policy_ready", kind="NicNodePolicy", name="gpu-b") == 1
    assert value("nicop_component_ready", component="state-OFED") is None
    metrics.keep_policies("NicNodePolicy", ["gpu-b"])
    assert value("nicop_policy_ready", kind="NicNodePolicy", name="gpu-a") is None
    assert value("nicop_policy_ready", kind="NicNodePolicy", name="gpu-b") == 1
    metrics.keep_policies("NicNodePolicy", [])


def test_nodes_per_upgrade_state_keep_a_zero_for_every_state() -> None:
    metrics.upgrade_states(["upgrade-done", "upgrade-done", "drain-required", "",
                            "upgrade-failed"])
    assert value("nicop_upgrade_nodes", state="upgrade-done") == 2
    assert value("nicop_upgrade_nodes", state="drain-required") == 1
    assert value("nicop_upgrade_nodes", state="upgrade-failed") == 1
    assert value("nicop_upgrade_nodes", state="cordon-required") == 0
    metrics.upgrade_states([])  # upgrades turned off: the labels are gone
    assert value("nicop_upgrade_nodes", state="upgrade-done") == 0
    assert value("nicop_upgrade_nodes", state="upgrade-failed") == 0


def node(name: str, **labels: str) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": labels}}


def test_unmanaged_nic_nodes_leave_out_nodes_opted_out_on_purpose() -> None:
    nodes = [
        node("no-label", **{"feature.node.kubernetes.io/pci-0200_15b3.present": "true"}),
        node("lost-label", **{"nvidia.com/ofed-driver-upgrade-state": "upgrade-done"}),
        node("opted-out", **{MELLANOX_LABEL: "true", OPT_IN_LABEL: "false"}),
        node("managed", **{MELLANOX_LABEL: "true"}),
        node("cpu-only"),
    ]
    unmanaged = [n for n in nodes if unmanaged_reason(n)]
    assert len(unmanaged) == 3  # the status names all three
    metrics.unmanaged_nic_nodes(unmanaged)
    assert value("nicop_unmanaged_nic_nodes") == 2
