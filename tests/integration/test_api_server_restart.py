"""The API server stopped and started again (as in a control plane upgrade) while the operator
reconciles a NicClusterPolicy and an SR-IOV node policy, on a cluster of its own whose nodes run
nicop's agents from the operator's DaemonSets.

Everyone reconnects: the operator (its lease, informers and queues), the agents and the node
stand-ins. What converges is checked from the outside: each object once, every status written,
the agents following changes made after the restart, and the operator's /readyz answering 503
while it cannot see the cluster and 200 again once it does.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Namespace, Node, Pod
from tests.eventually import eventually
from tests.integration.agent_loop import allocatable, pods, ready
from tests.integration.operator_process import NAMESPACE, OperatorProcess

from nicop.operator.crds import install_crds
from nicop_sim.cluster import LocalCluster, running_cluster

NODES = ["node-1", "node-2", "node-3"]
SRIOV_NODE = "node-2"  # ConnectX-6 Dx
PF = "0000:3b:00.0"
GROUP = "sriovnetwork.openshift.io"
NicClusterPolicy = create_global_resource("mellanox.com", "v1alpha1", "NicClusterPolicy",
                                          "nicclusterpolicies")
NodePolicy = create_namespaced_resource(GROUP, "v1", "SriovNetworkNodePolicy",
                                        "sriovnetworknodepolicies")
NodeState = create_namespaced_resource(GROUP, "v1", "SriovNetworkNodeState",
                                       "sriovnetworknodestates")
OperatorConfig = create_namespaced_resource(GROUP, "v1", "SriovOperatorConfig",
                                            "sriovoperatorconfigs")
RDMA_CONFIG = {"configList": [{"resourceName": "rdma", "resourcePrefix": "nvidia.com",
                               "rdmaHcaMax": 63, "selectors": {"vendors": ["15b3"]}}]}
POLICY = {"apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
          "metadata": {"name": "nic-cluster-policy"},
          "spec": {"rdmaSharedDevicePlugin": {"image": "nicop",
                                              "config": json.dumps(RDMA_CONFIG)}}}


def node_policy(vfs: int) -> Any:
    return NodePolicy(metadata=ObjectMeta(name="restart-vfs", namespace=NAMESPACE), spec={
        "resourceName": "cx6dx_vf", "nodeSelector": {"kubernetes.io/hostname": SRIOV_NODE},
        "numVfs": vfs, "nicSelector": {"pfNames": ["enp59s0f0np0"]}, "linkType": "eth"})


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory, controlplane_bin: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("restart-cluster"), controlplane_bin,
                         nodes=len(NODES)) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def oclient(own: LocalCluster) -> Client:
    client: Client = own.client()
    install_crds(own.kubeconfig)
    client.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    return client


@dataclass
class Sample:
    at: float
    api_ready: bool
    operator: int  # the HTTP status of the operator's /readyz


@dataclass
class Prober:
    """Asks the API server's and the operator's /readyz every 0.1 s, in a thread."""

    cluster: LocalCluster
    operator: OperatorProcess
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.samples.append(Sample(time.monotonic(), self.cluster.api_ready(),
                                       self.operator.get("/readyz")[0]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def numvfs(cluster: LocalCluster) -> int:
    return int((cluster.node_root(SRIOV_NODE) /
                f"sys/bus/pci/devices/{PF}/sriov_numvfs").read_text())


def converged(client: Client, cluster: LocalCluster, vfs: int) -> bool:
    policy = client.get(NicClusterPolicy, "nic-cluster-policy")
    status = policy.get("status") or {}
    if status.get("state") != "ready" or \
            status.get("observedGeneration") != policy.metadata.generation:
        return False
    state = client.get(NodeState, SRIOV_NODE, namespace=NAMESPACE)
    return bool((state.get("status") or {}).get("syncStatus") == "Succeeded"
                and numvfs(cluster) == vfs
                and allocatable(client, SRIOV_NODE, "nvidia.com/cx6dx_vf") == vfs
                and all(allocatable(client, n, "nvidia.com/rdma") == 63 for n in NODES))


def unready_agents(client: Client) -> dict[str, list[tuple[str, int]]]:
    """DaemonSet -> (node, restarts) of each of its pods that is not ready, where any is not."""
    unready = {}
    for ds in client.list(DaemonSet, namespace=NAMESPACE):
        waiting = [(p.spec.nodeName, sum(c.restartCount for c in p.status.containerStatuses or []))
                   for p in pods(client, NAMESPACE, ds.spec.selector.matchLabels) if not ready(p)]
        if waiting or ds.status.numberReady != ds.status.desiredNumberScheduled:
            unready[ds.metadata.name] = waiting
    return unready


def test_the_operator_and_agents_reconnect_and_converge_after_an_api_server_restart(
        oclient: Client, own: LocalCluster, tmp_path: Path) -> None:
    client = oclient
    # The chart's lease (15 s) gives 10 s to renew; a stop waits up to 10 s for the old API
    # server to finish, so the outage can outlast that here: 30 s keeps leadership through it.
    operator = OperatorProcess(own.kubeconfig, NAMESPACE, tmp_path / "operator.log",
                               lease_duration=30)
    operator.wait_ready()
    prober = Prober(own, operator)
    try:
        client.apply(NicClusterPolicy(**POLICY), field_manager="test", force=True)
        client.apply(node_policy(4), field_manager="test", force=True)
        eventually(lambda: client.list(DaemonSet, namespace=NAMESPACE), timeout=60,
                   what="the operator to start reconciling")
        restarted = time.monotonic()
        own.restart("kube-apiserver")
        back = time.monotonic()
        eventually(lambda: converged(client, own, 4), timeout=240,
                   what="the policy ready, 4 VFs made and advertised after the restart")

        # The agents follow what changes after the restart: their watches are back.
        client.apply(node_policy(2), field_manager="test", force=True)
        eventually(lambda: converged(client, own, 2), timeout=180,
                   what="2 VFs after the node policy changed")
        limits = {"nvidia.com/rdma": "1"}
        client.create(Pod(metadata=ObjectMeta(name="after-restart", namespace="default"),
                          spec=PodSpec(containers=[Container(
                              name="app", image="mellanox/rping-test",
                              resources=ResourceRequirements(requests=limits, limits=limits))])))
        eventually(lambda: client.get(Pod, "after-restart", namespace="default").status.phase
                   == "Running", timeout=60, what="a workload pod to run after the restart")
        eventually(lambda: operator.get("/readyz")[0] == 200, timeout=30,
                   what="the operator ready at the end")
        # An agent tells its readiness through a probe every 10 s: wait for the last answers.
        deadline = time.monotonic() + 60
        while (unready := unready_agents(client)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not unready, f"agents (node, restarts) not ready a minute later: {unready}"
    finally:
        prober.stop()

    assert operator.proc.poll() is None, "the operator kept running through the outage"
    assert operator.log.read_text().count("became leader") == 1, "leadership kept throughout"
    down = [s for s in prober.samples if restarted <= s.at <= back and not s.api_ready]
    assert down, "the probe saw the API server down"
    assert any(s.operator == 503 for s in down), \
        "the operator's /readyz said 503 while the API server was down"
    assert all(s.operator == 200 for s in prober.samples if s.at < restarted), \
        "ready before the restart"
    assert prober.samples[-1].operator == 200

    # Each object once: one pod per DaemonSet and node, one node state per node.
    for ds in client.list(DaemonSet, namespace=NAMESPACE):
        per_node = Counter(p.spec.nodeName for p in pods(client, NAMESPACE,
                                                         ds.spec.selector.matchLabels))
        assert all(n == 1 for n in per_node.values()), (ds.metadata.name, per_node)
    states = [s.metadata.name for s in client.list(NodeState, namespace=NAMESPACE)]
    assert sorted(states) == sorted(n.metadata.name for n in client.list(Node))
    # No status lost: every node state synced, the operator config Ready.
    for state in client.list(NodeState, namespace=NAMESPACE):
        assert (state.get("status") or {}).get("syncStatus") == "Succeeded", state.metadata.name
    config = client.get(OperatorConfig, "default", namespace=NAMESPACE)
    assert any(c["type"] == "Ready" and c["status"] == "True"
               for c in (config.get("status") or {}).get("conditions") or []), config.get("status")
