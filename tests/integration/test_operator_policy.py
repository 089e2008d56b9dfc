"""`nicop operator` on the real control plane: policies become components, with honest status."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import DaemonSet, Deployment
from lightkube.resources.core_v1 import ConfigMap, Event, Node, ServiceAccount
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding
from lightkube.types import PatchType
from tests.eventually import eventually
from tests.integration.operator_process import NAMESPACE, OperatorProcess

ROOT = Path(__file__).resolve().parents[2]
MOFED_WAIT = "network.nvidia.com/operator.mofed.wait"
NicClusterPolicy = create_global_resource(
    "mellanox.com", "v1alpha1", "NicClusterPolicy", "nicclusterpolicies"
)


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / name).read_text())  # type: ignore[no-any-return]


def apply_policy(client: Client, body: dict[str, Any]) -> None:
    client.apply(NicClusterPolicy.from_dict(body) if hasattr(NicClusterPolicy, "from_dict")
                 else NicClusterPolicy(**body), field_manager="test", force=True)


def policy_status(client: Client, name: str = "nic-cluster-policy") -> dict[str, Any]:
    obj = client.get(NicClusterPolicy, name)
    return dict(obj.get("status") or {})


def delete_policy(client: Client, name: str = "nic-cluster-policy") -> None:
    try:
        client.delete(NicClusterPolicy, name)
    except ApiError as e:
        if e.status.code != 404:
            raise


def states(client: Client) -> dict[str, str]:
    return {s["name"]: s["state"] for s in policy_status(client).get("appliedStates", [])}


def nicop_objects(client: Client) -> list[str]:
    found = []
    selector = {"nvidia.network-operator.state": None}
    for kind in (DaemonSet, Deployment, ConfigMap, ServiceAccount):
        for obj in client.list(kind, namespace=NAMESPACE, labels=selector):
            found.append(f"{kind.__name__}/{obj.metadata.name}")
    for cluster_kind in (ClusterRole, ClusterRoleBinding):
        for obj in client.list(cluster_kind, labels=selector):
            found.append(f"{cluster_kind.__name__}/{obj.metadata.name}")
    return sorted(found)


def mofed_wait(client: Client) -> dict[str, str | None]:
    return {n.metadata.name: (n.metadata.labels or {}).get(MOFED_WAIT) for n in client.list(Node)}


@pytest.fixture
def clean(client: Client) -> Iterator[None]:
    yield
    delete_policy(client)
    eventually(lambda: not nicop_objects(client), what="the policy's objects to be collected")


def test_infiniband_policy_goes_ready_and_orders_plugins_after_the_driver(
    client: Client, operator: OperatorProcess, clean: None
) -> None:
    apply_policy(client, example("nicclusterpolicy-infiniband.yaml"))
    eventually(lambda: policy_status(client).get("state") == "ready", 90,
               "the InfiniBand policy to become ready")
    # The way there is told in Events on the policy: first NotReady, then Ready, and no flap
    # back once ready (Event names end in their creation time: they sort in creation order;
    # timestamps have seconds only). The Ready Event follows the status write that says so.
    uid = client.get(NicClusterPolicy, "nic-cluster-policy").metadata.uid

    def reasons() -> list[str]:
        return [e.reason for e in sorted((e for e in client.list(Event, namespace="default")
                                          if e.involvedObject.uid == uid),
                                         key=lambda e: e.metadata.name)]

    eventually(lambda: "Ready" in reasons(), 30, "the policy's Ready Event")
    assert reasons() == ["NotReady", "Ready"]
    assert states(client) == {
        "state-multus-cni": "ready", "state-container-networking-plugins": "ready",
        "state-ipoib-cni": "ready", "state-OFED": "ready",
        "state-SRIOV-device-plugin": "ignore", "state-RDMA-device-plugin": "ready",
        "state-ib-kubernetes": "ready", "state-nv-ipam-cni": "ready",
        "state-nic-feature-discovery": "ignore", "state-doca-telemetry-service": "ignore",
        "state-nic-configuration-operator": "ignore", "state-spectrum-x-operator": "ignore",
        "state-DRA-driver": "ignore",
    }
    objects = nicop_objects(client)
    for name in ("DaemonSet/kube-multus-ds", "DaemonSet/cni-plugins-ds",
                 "DaemonSet/kube-ipoib-cni-ds", "DaemonSet/rdma-shared-dp-ds",
                 "DaemonSet/nv-ipam-node", "Deployment/ib-kubernetes",
                 "Deployment/nv-ipam-controller", "ConfigMap/rdma-devices"):
        assert name in objects
    # One driver DaemonSet per (OS, version, kernel): the DGX node runs 22.04, the others 24.04.
    drivers = [o for o in objects if o.startswith("DaemonSet/mofed-")]
    assert len(drivers) == 2
    # The driver pods are ready on the three managed nodes; the unlabelled node is not managed.
    assert mofed_wait(client) == {"node-1": "false", "node-2": "false", "node-3": "false",
                                  "node-4": None}
    rdma = client.get(DaemonSet, "rdma-shared-dp-ds", namespace=NAMESPACE)
    assert rdma.spec.template.spec.nodeSelector[MOFED_WAIT] == "false"
    assert rdma.status.numberAvailable == 3
    conditions = {c["type"]: c for c in policy_status(client)["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    assert conditions["OFEDDriverReady"]["reason"] == "ComponentReady"
    # The pitfall is named with its fix: node-4's NFD labels the NIC by class and vendor.
    assert ("node node-4 has a Mellanox NIC (feature.node.kubernetes.io/pci-0200_15b3.present)"
            " but no label feature.node.kubernetes.io/pci-15b3.present") in \
        conditions["Ready"]["message"]
    assert "kubectl label node node-4" in conditions["Ready"]["message"]


def test_config_change_rolls_removed_section_is_deleted_and_delete_cleans_up(
    client: Client, operator: OperatorProcess
) -> None:
    policy = example("nicclusterpolicy-infiniband.yaml")
    apply_policy(client, policy)
    eventually(lambda: policy_status(client).get("state") == "ready", 90, "ready")
    before = client.get(DaemonSet, "rdma-shared-dp-ds", namespace=NAMESPACE)
    config_hash = "nvidia.network-operator.config-hash"
    old_hash = before.spec.template.metadata.annotations[config_hash]

    changed = copy.deepcopy(policy)
    changed["spec"]["rdmaSharedDevicePlugin"]["config"] = (
        '{"configList": [{"resourceName": "rdma_ib", "rdmaHcaMax": 10,'
        ' "selectors": {"vendors": ["15b3"]}}]}'
    )
    del changed["spec"]["nvIpam"]
    apply_policy(client, changed)

    def rolled() -> bool:
        ds = client.get(DaemonSet, "rdma-shared-dp-ds", namespace=NAMESPACE)
        return (ds.spec.template.metadata.annotations[config_hash] != old_hash
                and ds.metadata.generation > before.metadata.generation)

    eventually(rolled, what="the RDMA plugin DaemonSet to roll with the new config")
    cm = client.get(ConfigMap, "rdma-devices", namespace=NAMESPACE)
    assert "rdma_ib" in cm.data["config.json"]
    eventually(lambda: not any("nv-ipam" in o for o in nicop_objects(client)),
               what="the nvIpam objects to be deleted")
    eventually(lambda: states(client).get("state-nv-ipam-cni") == "ignore", what="nv-ipam ignore")
    eventually(lambda: policy_status(client).get("state") == "ready", 60, "ready again")

    delete_policy(client)
    eventually(lambda: not nicop_objects(client), what="every object of the policy to be deleted")
    eventually(lambda: set(mofed_wait(client).values()) == {None},
               what="the mofed.wait labels to be removed")


def test_policy_at_rest_makes_no_writes_even_after_a_restart(
    client: Client, operator: OperatorProcess, kubeconfig: Path, tmp_path: Path, clean: None
) -> None:
    body = example("nicclusterpolicy-roce-sriov.yaml")
    # No storage provisioner here: the firmware PVC would stay Pending (a test below covers it).
    del body["spec"]["nicConfigurationOperator"]["nicFirmwareStorage"]
    apply_policy(client, body)
    eventually(lambda: policy_status(client).get("state") == "ready", 90, "the RoCE policy ready")
    time.sleep(2)
    before, reconciled = operator.writes(), operator.reconciles("nicclusterpolicy")
    # An annotation changes the object (an event, a reconcile) but not the spec. (A replace of
    # the object as read used to stand here: the API server stored nothing new, and the test
    # passed without a reconcile to judge.)
    version = client.get(NicClusterPolicy, "nic-cluster-policy").metadata.resourceVersion
    touched = client.patch(NicClusterPolicy, "nic-cluster-policy",
                           {"metadata": {"annotations": {"touched": "yes"}}},
                           patch_type=PatchType.MERGE)
    assert touched.metadata.resourceVersion != version
    eventually(lambda: operator.reconciles("nicclusterpolicy") > reconciled, 30,
               "the policy reconciled after the change")
    assert operator.writes() == before, "an unchanged policy must cause no write"

    restarted = OperatorProcess(kubeconfig, NAMESPACE, tmp_path / "restarted.log")
    operator.stop()
    try:
        restarted.wait_ready(30)
        eventually(lambda: restarted.reconciles("nicclusterpolicy") >= 1, 30,
                   "the restarted operator's first reconcile of the policy")
        assert restarted.writes() == {}, "a restarted operator finds nothing to change"
    finally:
        restarted.stop()
        operator.restart()


def test_only_nic_cluster_policy_is_acted_on(client: Client, operator: OperatorProcess) -> None:
    body = example("nicclusterpolicy-roce-sriov.yaml")
    body["metadata"]["name"] = "another-policy"
    apply_policy(client, body)
    try:
        status = eventually(lambda: policy_status(client, "another-policy") or None,
                            what="status of the ignored policy")
        assert status["state"] == "ignore"
        assert "Only instance with name nic-cluster-policy is supported" in status["reason"]
        assert not nicop_objects(client)
    finally:
        delete_policy(client, "another-policy")


def test_bad_plugin_config_is_an_error_naming_the_field(
    client: Client, operator: OperatorProcess, clean: None
) -> None:
    body = example("nicclusterpolicy-infiniband.yaml")
    # Looks like an object to the schema's check, but is not JSON.
    body["spec"]["rdmaSharedDevicePlugin"]["config"] = '{"configList": [,]}'
    apply_policy(client, body)
    eventually(lambda: states(client).get("state-RDMA-device-plugin") == "error", what="error")
    applied = {s["name"]: s for s in policy_status(client)["appliedStates"]}
    message = applied["state-RDMA-device-plugin"]["message"]
    assert "spec.rdmaSharedDevicePlugin.config" in message and "not valid JSON" in message
    conditions = {c["type"]: c for c in policy_status(client)["conditions"]}
    assert conditions["Ready"]["reason"] == "RDMASharedDevicePluginError"
    assert policy_status(client)["state"] == "error"


def test_a_daemonset_without_nodes_says_why(
    client: Client, operator: OperatorProcess, clean: None
) -> None:
    body = example("nicclusterpolicy-roce-sriov.yaml")
    body["spec"]["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["no-such-node"]}]}]}}
    apply_policy(client, body)

    def message() -> str:
        applied = {s["name"]: s for s in policy_status(client).get("appliedStates", [])}
        return str(applied.get("state-SRIOV-device-plugin", {}).get("message", ""))

    text = eventually(lambda: "matches no node" in message() and message(), what="a reason")
    assert "network-operator-sriov-device-plugin" in text


def test_an_upstream_policy_with_removed_fields_is_applied_with_a_warning(
    client: Client, operator: OperatorProcess, clean: None
) -> None:
    body = yaml.safe_load((ROOT / "tests" / "data" /
                           "upstream-nicclusterpolicy-with-removed-fields.yaml").read_text())
    apply_policy(client, body)

    def warning() -> dict[str, Any] | None:
        for c in policy_status(client).get("conditions", []):
            if c["type"] == "RemovedFieldsIgnored":
                return c  # type: ignore[no-any-return]
        return None

    condition = eventually(warning, what="the removed-fields warning in status")
    for field in ("spec.psp", "spec.nvPeerDriver", "spec.secondaryNetwork.ipamPlugin"):
        assert field in condition["message"]
    assert states(client)["state-OFED"] in ("notReady", "ready")  # the rest is applied as usual


def test_nic_configuration_and_spectrum_x_go_ready_and_say_what_nicop_lacks(
    client: Client, operator: OperatorProcess, clean: None
) -> None:
    """Upstream's nicConfigurationOperator and spectrumXOperator sections (the example, from
    Mellanox/network-operator example/crs/mellanox.com_v1alpha1_nicclusterpolicy_cr-full.yaml and
    its docs) are rendered and reach ready, their pods played by kwok; the status says what nicop
    does not render, and a firmware PVC no provisioner binds is named with its storage class."""
    body = example("nicclusterpolicy-nic-configuration-spectrum-x.yaml")
    storage = body["spec"]["nicConfigurationOperator"].pop("nicFirmwareStorage")
    apply_policy(client, body)
    eventually(lambda: policy_status(client).get("state") == "ready", 90,
               "the NIC configuration and Spectrum-X policy to become ready")
    assert states(client)["state-nic-configuration-operator"] == "ready"
    assert states(client)["state-spectrum-x-operator"] == "ready"
    objects = nicop_objects(client)
    for name in ("Deployment/nic-configuration-operator", "DaemonSet/nic-configuration-daemon",
                 "DaemonSet/spectrum-x-flowcontroller", "ClusterRole/nic-configuration-operator",
                 "ClusterRole/spectrum-x-operator", "ServiceAccount/spectrum-x-operator"):
        assert name in objects
    flow = client.get(DaemonSet, "spectrum-x-flowcontroller", namespace=NAMESPACE)
    assert flow.spec.selector.matchLabels == {"control-plane": "spectrum-x-flowcontroller"}
    assert flow.status.numberAvailable == 3, "the three nodes with a Mellanox NIC label"
    crds = {c.metadata.name: c for c in client.list(CustomResourceDefinition)}
    for name in ("nicdevices.configuration.net.nvidia.com",
                 "spectrumxrailpoolconfigs.spectrumx.nvidia.com"):
        assert any(c.type == "Established" and c.status == "True"
                   for c in crds[name].status.conditions)
    conditions = {c["type"]: c for c in policy_status(client)["conditions"]}
    gap = conditions["NicConfigurationOperatorReady"]["message"]
    assert "spec.nicConfigurationOperator" in gap and "supported NIC firmware" in gap

    body["spec"]["nicConfigurationOperator"]["nicFirmwareStorage"] = storage
    apply_policy(client, body)

    def pending() -> str:
        applied = {s["name"]: s for s in policy_status(client).get("appliedStates", [])}
        return str(applied.get("state-nic-configuration-operator", {}).get("message", ""))

    text = eventually(lambda: "nic-fw-storage-pvc is Pending" in pending() and pending(), 60,
                      "the unbound firmware PVC in status")
    assert "nic-fw-storage-class" in text
