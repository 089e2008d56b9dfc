"""`nicop diagnose` on the real control plane: faults planted the way they happen in clusters
are found, explained, and come with the command that fixes them.

The cluster runs the InfiniBand example policy with the operator. Node-4 is the unlabelled-NIC
pitfall as the test cluster builds it; the other faults are planted per test and undone after.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.types import PatchType
from tests.eventually import eventually
from tests.integration.operator_process import NAMESPACE, OperatorProcess
from tests.integration.test_status_live import (
    NicClusterPolicy,
    apply_example_policy,
    remove_policy,
)
from typer.testing import CliRunner

from nicop.cli import app

MOFED_WAIT = "network.nvidia.com/operator.mofed.wait"
NetworkAttachmentDefinition = create_namespaced_resource(
    "k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition", "network-attachment-definitions")
RDMA = "nvidia.com/rdma"  # what the policy's RDMA shared device plugin advertises


def nicop(kubeconfig: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """Run `nicop <args> -o json` as a user would, and return its exit code and report."""
    result = CliRunner().invoke(app, [*args, "-o", "json", "--kubeconfig", str(kubeconfig),
                                      "--namespace", NAMESPACE])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.stdout)


def check(report: dict[str, Any], subject: str, name: str) -> dict[str, Any]:
    for c in report["checks"]:
        if c["subject"] == subject and c["name"] == name:
            return c  # type: ignore[no-any-return]
    lines = "\n".join(f"{c['result']} {c['subject']} {c['name']}: {c['message']}"
                      for c in report["checks"])
    raise AssertionError(f"no check {subject} {name}; the report:\n{lines}")


def component_state(client: Client, name: str) -> str | None:
    policy = client.get(NicClusterPolicy, "nic-cluster-policy")
    applied = (policy.get("status") or {}).get("appliedStates") or []
    return next((a["state"] for a in applied if a["name"] == name), None)


def pods_of(client: Client, ds: str, node: str) -> list[Pod]:
    return [p for p in client.list(Pod, namespace=NAMESPACE)
            if p.spec is not None and p.spec.nodeName == node
            and any(r.kind == "DaemonSet" and r.name == ds
                    for r in (p.metadata.ownerReferences or []))
            and p.metadata.deletionTimestamp is None]


def driver_pod(client: Client, node: str) -> Pod:
    drivers = client.list(Pod, namespace=NAMESPACE, labels={"nvidia.com/ofed-driver": None})
    pods = [p for p in drivers
            if p.spec is not None and p.spec.nodeName == node
            and p.metadata.deletionTimestamp is None]
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return pods[0]


def label(client: Client, node: str, key: str) -> str | None:
    return (client.get(Node, node).metadata.labels or {}).get(key)


@pytest.fixture(scope="module")
def policy(client: Client, operator: OperatorProcess) -> Iterator[None]:
    apply_example_policy(client)
    yield
    remove_policy(client)


@pytest.fixture
def rdma_on_node_1(client: Client) -> Iterator[None]:
    """node-1 (the DGX) advertises the policy's RDMA resource, as its kubelet would once the
    RDMA shared device plugin registered (kwok has no kubelet: the status is written here)."""
    def set_to(value: str | None) -> None:
        client.patch(Node.Status, "node-1", {"status": {
            "capacity": {RDMA: value}, "allocatable": {RDMA: value}}},
            patch_type=PatchType.MERGE)
    set_to("63")
    yield
    set_to(None)


def test_the_unlabelled_mellanox_node_is_named_with_the_label_command(
    kubeconfig: Path, policy: None
) -> None:
    code, report = nicop(kubeconfig, "diagnose")
    assert code == 1 and report["result"] == "fail"
    unlabelled = check(report, "node/node-4", "managed")
    assert unlabelled["result"] == "fail"
    assert "pci-0200_15b3.present" in unlabelled["message"]
    assert unlabelled["fix"].startswith(
        "kubectl label node node-4 feature.node.kubernetes.io/pci-15b3.present=true")
    # The rest of the cluster is healthy: the operator leads (from outside the cluster here),
    # the drivers are ready and every managed node runs its device plugin.
    operator = check(report, "cluster", "operator")
    assert operator["result"] == "pass" and "runs outside the cluster" in operator["message"]
    assert check(report, "cluster", "policy")["result"] == "pass"
    for node in ("node-1", "node-2", "node-3"):
        assert check(report, f"node/{node}", "driver")["result"] == "pass"
        assert check(report, f"node/{node}", "RDMA shared device plugin")["result"] == "pass"


def test_a_driver_that_is_not_ready(client: Client, kubeconfig: Path, policy: None) -> None:
    # The driver container on node-2 fails its probes: its status says not ready, as the
    # kubelet would write it. kwok leaves a Running pod's status alone, so the fault stays.
    pod = driver_pod(client, "node-2")
    name = pod.metadata.name
    assert pod.status is not None and pod.status.containerStatuses
    image = pod.status.containerStatuses[0].image
    client.patch(Pod.Status, name, {"status": {
        "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
                       {"type": "ContainersReady", "status": "False"},
                       {"type": "PodScheduled", "status": "True"},
                       {"type": "Initialized", "status": "True"}],
        "containerStatuses": [{
            "name": "mofed-container", "image": image, "imageID": "", "ready": False,
            "started": True, "restartCount": 3,
            "state": {"waiting": {"reason": "CrashLoopBackOff",
                                  "message": "back-off 40s restarting failed container"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}],
    }}, namespace=NAMESPACE, patch_type=PatchType.MERGE)
    try:
        # The operator holds the device plugins back: node-2 gets mofed.wait=true and the
        # DaemonSet controller removes the RDMA plugin pod from it.
        eventually(lambda: label(client, "node-2", MOFED_WAIT) == "true", 30, "mofed.wait=true")
        eventually(lambda: not pods_of(client, "rdma-shared-dp-ds", "node-2"), 30,
                   "the RDMA plugin pod to leave node-2")

        code, report = nicop(kubeconfig, "diagnose", "node", "node-2")
        assert code == 1
        driver = check(report, "node/node-2", "driver")
        assert driver["result"] == "fail"
        assert f"pod {NAMESPACE}/{name} is not Ready (CrashLoopBackOff" in driver["message"]
        assert "3 restarts" in driver["message"]
        assert driver["fix"].startswith(
            f"kubectl -n {NAMESPACE} logs {name} -c mofed-container --previous")
        plugin = check(report, "node/node-2", "RDMA shared device plugin")
        assert plugin["result"] == "fail" and "it waits for the driver" in plugin["message"]
        assert check(report, "node/node-2", "mofed.wait")["result"] == "fail"
        # The cluster-wide run says the same, next to the component the policy reports.
        _, cluster = nicop(kubeconfig, "diagnose")
        assert check(cluster, "node/node-2", "driver")["result"] == "fail"
    finally:
        # A new driver pod (the DaemonSet recreates it; kwok makes it ready) heals the node.
        client.delete(Pod, name, namespace=NAMESPACE)
        eventually(lambda: label(client, "node-2", MOFED_WAIT) == "false", 60, "driver ready")
        eventually(lambda: pods_of(client, "rdma-shared-dp-ds", "node-2"), 60, "plugin back")


def test_a_device_plugin_pod_kept_off_a_node_by_a_taint(
    client: Client, kubeconfig: Path, policy: None
) -> None:
    # An admin dedicates node-3 with a taint the policy does not tolerate. Running pods stay
    # (NoSchedule), so the fault shows when the plugin pod is replaced: after a restart, an
    # eviction or, here, a deletion, the DaemonSet controller may not put it back. The
    # DaemonSet then wants one node fewer and looks complete: only a per-node check sees it.
    client.patch(Node, "node-3", {"spec": {"taints": [
        {"key": "example.com/dedicated", "value": "storage", "effect": "NoSchedule"}]}},
        patch_type=PatchType.MERGE)
    try:
        for pod in pods_of(client, "rdma-shared-dp-ds", "node-3"):
            client.delete(Pod, pod.metadata.name, namespace=NAMESPACE)
        eventually(lambda: not pods_of(client, "rdma-shared-dp-ds", "node-3"), 30,
                   "the RDMA plugin pod to be gone from node-3")

        code, report = nicop(kubeconfig, "diagnose", "node", "node-3")
        assert code == 1
        plugin = check(report, "node/node-3", "RDMA shared device plugin")
        assert plugin["result"] == "fail"
        assert "no RDMA shared device plugin pod (rdma-shared-dp-ds) runs on node node-3" in \
            plugin["message"]
        assert "taint example.com/dedicated=storage:NoSchedule" in plugin["message"]
        assert "spec.tolerations of the NicClusterPolicy" in plugin["fix"]
        assert "kubectl taint node node-3 example.com/dedicated-" in plugin["fix"]
        # The DaemonSet counts one node fewer, so the policy still says the plugin is ready.
        eventually(lambda: component_state(client, "state-RDMA-device-plugin") == "ready", 30,
                   "the RDMA plugin component to look ready")
        # The driver on the node is fine: the report does not blame it.
        assert check(report, "node/node-3", "driver")["result"] == "pass"
        code, cluster = nicop(kubeconfig, "diagnose")
        assert code == 1
        assert check(cluster, "node/node-3", "RDMA shared device plugin")["result"] == "fail"
        assert pods_of(client, "rdma-shared-dp-ds", "node-3") == []  # still gone
    finally:
        client.patch(Node, "node-3", {"spec": {"taints": None}}, patch_type=PatchType.MERGE)
        eventually(lambda: pods_of(client, "rdma-shared-dp-ds", "node-3"), 60,
                   "the RDMA plugin pod back on node-3")


def test_a_pod_asking_for_a_resource_no_node_advertises(
    client: Client, kubeconfig: Path, namespace: str, policy: None, rdma_on_node_1: None
) -> None:
    def pod(name: str, resource: str) -> Pod:
        return Pod(metadata=ObjectMeta(name=name, namespace=namespace), spec=PodSpec(
            containers=[Container(name="c", image="busybox", resources=ResourceRequirements(
                requests={resource: "1"}, limits={resource: "1"}))]))

    # The resource name of an upstream README, not what this cluster's plugin advertises.
    client.create(pod("wrong-name", "rdma/hca_shared_devices_a"))
    client.create(pod("right-name", RDMA))

    def complaint() -> bool:
        return any(e.reason == "FailedScheduling" and e.involvedObject.name == "wrong-name"
                   for e in client.list(Event, namespace=namespace))

    eventually(complaint, 30, "the scheduler's FailedScheduling event")
    code, report = nicop(kubeconfig, "diagnose", "pod", f"{namespace}/wrong-name")
    assert code == 1
    subject = f"pod/{namespace}/wrong-name"
    devices = check(report, subject, "devices rdma/hca_shared_devices_a")
    assert devices["result"] == "fail"
    assert "no node advertises rdma/hca_shared_devices_a" in devices["message"]
    assert f"request a resource that exists ({RDMA})" in devices["fix"]
    event = check(report, subject, "event FailedScheduling")
    assert event["result"] == "fail"
    assert "lack rdma/hca_shared_devices_a: no node advertises it" in event["message"]
    assert RDMA in event["fix"]

    # The cluster-wide run points at the pending pod.
    _, cluster = nicop(kubeconfig, "diagnose")
    pending = check(cluster, "cluster", f"pod {namespace}/wrong-name")
    assert pending["fix"] == f"nicop diagnose pod {namespace}/wrong-name"

    # The pod that asks for what exists is placed on the node that has it, and passes.
    eventually(lambda: (client.get(Pod, "right-name", namespace=namespace).spec or
                      PodSpec(containers=[])).nodeName, 30, "right-name to be scheduled")
    code, report = nicop(kubeconfig, "diagnose", "pod", f"{namespace}/right-name")
    assert code == 0, report
    assert check(report, f"pod/{namespace}/right-name", f"devices {RDMA}")["message"] == \
        f"scheduled on node node-1, which has 63 {RDMA}"


def test_a_pod_naming_a_network_that_does_not_exist(
    client: Client, kubeconfig: Path, namespace: str, policy: None
) -> None:
    client.create(NetworkAttachmentDefinition(
        metadata=ObjectMeta(name="ib-net", namespace=namespace),
        spec={"config": json.dumps({"cniVersion": "0.3.1", "name": "ib-net", "type": "ipoib",
                                    "master": "ibp24s0"})}))
    client.create(Pod(
        metadata=ObjectMeta(name="typo", namespace=namespace, annotations={
            "k8s.v1.cni.cncf.io/networks": "ib-net@net1, ib-nett"}),
        spec=PodSpec(containers=[Container(name="c", image="busybox")])))
    code, report = nicop(kubeconfig, "diagnose", "pod", f"{namespace}/typo")
    assert code == 1
    missing = check(report, f"pod/{namespace}/typo", f"network {namespace}/ib-nett")
    assert missing["result"] == "fail"
    assert f"NetworkAttachmentDefinition {namespace}/ib-nett does not exist" in \
        missing["message"]
    assert "IPoIBNetwork" in missing["fix"] and "network-attachment-definitions -A" in \
        missing["fix"]
    assert check(report, f"pod/{namespace}/typo", f"network {namespace}/ib-net")["result"] == \
        "pass"


def test_the_table_output_and_an_unknown_pod(kubeconfig: Path, policy: None) -> None:
    result = CliRunner().invoke(app, ["diagnose", "--kubeconfig", str(kubeconfig),
                                      "--namespace", NAMESPACE])
    assert result.exit_code == 1
    assert "FAIL  managed: node node-4 has a Mellanox NIC" in result.stdout
    assert "fix: kubectl label node node-4" in result.stdout
    code, report = nicop(kubeconfig, "diagnose", "pod", "default/no-such-pod")
    assert code == 1 and report["checks"][0]["message"] == "pod default/no-such-pod does not exist"


def test_a_managed_node_that_loses_its_nfd_label_is_named_with_the_fix(
    client: Client, kubeconfig: Path, policy: None, rdma_on_node_1: None
) -> None:
    """The pitfall as a user met it: pci-15b3.present is removed from a managed node while its
    kubelet still advertises the RDMA devices and it carries the driver's labels. The operator
    lets go of the node; `nicop diagnose` (the whole cluster) fails naming it and the label
    command, before and after the operator has reacted, and `nicop status` says the same."""
    present = "feature.node.kubernetes.io/pci-15b3.present"
    fix = f"kubectl label node node-1 {present}=true"
    client.patch(Node, "node-1", {"metadata": {"labels": {present: None}}},
                 patch_type=PatchType.MERGE)
    try:
        code, report = nicop(kubeconfig, "diagnose")
        assert code == 1
        managed = check(report, "node/node-1", "managed")
        assert managed["result"] == "fail"
        assert "node node-1 shows a Mellanox NIC" in managed["message"]
        assert f"advertises {RDMA}" in managed["message"]
        assert managed["fix"].startswith(fix)
        # The operator takes mofed.wait off the node it no longer manages; the node still
        # advertises its devices, and is still named.
        eventually(lambda: label(client, "node-1", MOFED_WAIT) is None, 30,
                   "the operator to let go of node-1")
        code, report = nicop(kubeconfig, "diagnose")
        assert code == 1 and check(report, "node/node-1", "managed")["fix"].startswith(fix)
        node = next(n for n in nicop(kubeconfig, "status")[1]["nodes"] if n["name"] == "node-1")
        assert not node["managed"] and node["mellanoxNic"]
        assert fix in node["unmanagedReason"]
    finally:
        client.patch(Node, "node-1", {"metadata": {"labels": {present: "true"}}},
                     patch_type=PatchType.MERGE)
        eventually(lambda: label(client, "node-1", MOFED_WAIT) == "false", 60,
                   "node-1's driver ready again")
        eventually(lambda: pods_of(client, "rdma-shared-dp-ds", "node-1"), 60,
                   "the RDMA plugin back on node-1")
