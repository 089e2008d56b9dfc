"""Driver upgrades in requestor mode, against nicop's own maintenance controller: the upgrade asks
for a NodeMaintenance per node (maintenance.nvidia.com/v1alpha1), the maintenance controller
cordons and drains within MaintenanceOperatorConfig's maxParallelOperations, and a node another
requestor already holds is joined rather than drained twice.

Inputs from k8s-operator-libs' requestor tests (pkg/upgrade/upgrade_state_test.go): requestor IDs
`nvidia.operator.com`-style dotted names, the shared-requestor flow where `foo.bar.com` owns the
node's NodeMaintenance and the upgrade adds itself to additionalRequestors, and the non-owner
that leaves the object in place, only taking its ID out."""

from __future__ import annotations

import copy
import random
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import Container, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import PatchType
from tests.eventually import eventually
from tests.integration.driver_upgrades import WORK, driver_cluster, states, upgrade_operator
from tests.integration.operator_process import NAMESPACE
from tests.integration.test_driver_upgrade import (
    POLICY,
    Observer,
    bump,
    replaced_once,
    start,
    workloads,
)
from tests.integration.watching import Watch

from nicop.api.labels import CURRENT_STATE, DESIRED_STATE, NODE_STATE_ANNOTATION
from nicop_sim.cluster import LocalCluster

NODES = 20
REQUESTOR = "nvidia.doca-driver-upgrade"
OTHER = "foo.bar.com"  # upstream's secondary requestor in its tests
NodeMaintenance = create_namespaced_resource(
    "maintenance.nvidia.com", "v1alpha1", "NodeMaintenance", "nodemaintenances")
SriovNetworkNodeState = create_namespaced_resource(
    "sriovnetwork.openshift.io", "v1", "SriovNetworkNodeState", "sriovnetworknodestates")
SriovOperatorConfig = create_namespaced_resource(
    "sriovnetwork.openshift.io", "v1", "SriovOperatorConfig", "sriovoperatorconfigs")
SriovNetworkPoolConfig = create_namespaced_resource(
    "sriovnetwork.openshift.io", "v1", "SriovNetworkPoolConfig", "sriovnetworkpoolconfigs")
MaintenanceOperatorConfig = create_namespaced_resource(
    "maintenance.nvidia.com", "v1alpha1", "MaintenanceOperatorConfig",
    "maintenanceoperatorconfigs")
ENV = {"NICOP_MAINTENANCE_CONTROLLER": "true", "MAINTENANCE_OPERATOR_ENABLED": "true",
       "MAINTENANCE_OPERATOR_REQUESTOR_ID": REQUESTOR,
       "MAINTENANCE_OPERATOR_REQUESTOR_NAMESPACE": "default"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            controlplane_bin: Path) -> Iterator[tuple[LocalCluster, Client]]:
    with driver_cluster(tmp_path_factory.mktemp("maintenance-cluster"), controlplane_bin, NODES,
                        ["cx6dx", "dgx"]) as cluster:
        yield cluster


class Requests:
    """Every NodeMaintenance created, by node (their uids), and every requestor each node's had,
    from a watch."""

    def __init__(self, client: Client) -> None:
        self.by_node: dict[str, set[str]] = {}
        self.requestors: dict[str, set[str]] = {}
        self._watch = Watch(lambda: client.watch(NodeMaintenance, namespace="default"),
                            self._seen)

    def _seen(self, nm: Any) -> None:
        node = nm["spec"]["nodeName"]
        self.by_node.setdefault(node, set()).add(nm["metadata"]["uid"])
        self.requestors.setdefault(node, set()).update(
            [nm["spec"]["requestorID"], *(nm["spec"].get("additionalRequestors") or [])])

    def stop(self) -> None:
        self._watch.stop()


def maintenance(client: Client, node: str) -> Any:
    return client.get(NodeMaintenance, f"nvidia-operator-{node}", namespace="default")


def test_requestor_mode_upgrades_each_node_through_one_node_maintenance(
        cluster: tuple[LocalCluster, Client], tmp_path: Path) -> None:
    """20 nodes, maxParallelOperations 3: each node gets exactly one NodeMaintenance and one
    driver restart, never more than 3 nodes are cordoned at once; node-3, already held by
    another requestor, is joined (our ID in additionalRequestors), drained once, and left to
    its owner, whose deletion uncordons it."""
    local, client = cluster
    client.apply(MaintenanceOperatorConfig(
        metadata={"name": "default", "namespace": NAMESPACE},
        spec={"maxParallelOperations": 3}), force=True)
    policy = copy.deepcopy(POLICY)
    policy["spec"]["ofedDriver"]["upgradePolicy"]["maxParallelUpgrades"] = 1  # not used here
    with upgrade_operator(local, client, tmp_path / "operator.log", env=ENV):
        workloads(client)
        start(client, policy)
        requests = Requests(client)
        client.create(NodeMaintenance(
            metadata={"name": "nvidia-operator-node-3", "namespace": "default"},
            spec={"requestorID": OTHER, "nodeName": "node-3", "cordon": True,
                  "drainSpec": {"force": True, "deleteEmptyDir": True, "timeoutSeconds": 90}}))
        eventually(lambda: ready(maintenance(client, "node-3")), 120,
                   "the other requestor's maintenance of node-3 Ready")
        observer = Observer(client)
        bump(client, policy)
        eventually(lambda: upgraded_but_node_3_held(client), 600, "the rollout to finish")
        observer.stop()
        requests.stop()
        # The upgrade joined node-3's maintenance (the watch saw it among its requestors; with
        # the node already drained it may join and leave between two looks).
        assert requests.requestors["node-3"] == {OTHER, REQUESTOR}
        assert observer.max_cordoned <= 3, observer.max_cordoned
        assert {node: len(uids) for node, uids in requests.by_node.items()} == {
            f"node-{i}": 1 for i in range(1, NODES + 1)}, "one NodeMaintenance per node"
        assert replaced_once(observer, NODES), \
            "each node's driver pod is replaced exactly once"
        held = maintenance(client, "node-3")
        assert held["spec"]["requestorID"] == OTHER
        assert not held["spec"].get("additionalRequestors")  # the upgrade left, did not delete
        client.delete(NodeMaintenance, "nvidia-operator-node-3", namespace="default")
        eventually(lambda: not any(n.spec.unschedulable for n in client.list(Node))
                   and not list(client.list(NodeMaintenance, namespace="default")),
                   120, "node-3 released by its owner and uncordoned")
    client.delete(MaintenanceOperatorConfig, "default", namespace=NAMESPACE)


def test_requestor_mode_keeps_an_admins_cordon_and_a_blocked_drain_holds_only_its_slot(
        cluster: tuple[LocalCluster, Client], tmp_path: Path) -> None:
    """The direct mode's rollout cases in requestor mode, MaintenanceOperatorConfig
    maxUnavailable 4: node-5, cordoned by an admin before the rollout, counts as unavailable and
    stays cordoned after it; node-7's pod, which its PodDisruptionBudget never lets go, holds
    node-7's NodeMaintenance in Draining, and the node names the budget (what `nicop status` and
    `diagnose` show) while the others finish, never more than 4 nodes cordoned; once the budget
    is gone node-7 finishes too."""
    local, client = cluster
    client.apply(MaintenanceOperatorConfig(
        metadata={"name": "default", "namespace": NAMESPACE},
        spec={"maxParallelOperations": NODES, "maxUnavailable": 4}), force=True)
    with upgrade_operator(local, client, tmp_path / "operator.log", env=ENV):
        workloads(client, pdb_blocks_one_node=True)
        start(client, POLICY)
        client.patch(Node, "node-5", {"spec": {"unschedulable": True}})  # an admin's
        observer = Observer(client)
        bump(client, POLICY)

        def blocked() -> str | None:
            s = states(client)
            annotations = client.get(Node, "node-7").metadata.annotations or {}
            text = annotations.get("nicop.io/ofed-driver-upgrade-drain-blocked")
            others_done = all(v == "upgrade-done" for n, v in s.items() if n != "node-7")
            return text if s["node-7"] == "node-maintenance-required" and others_done else None

        text = eventually(blocked, 600, "the others upgraded, node-7's drain shown as blocked")
        assert "NodeMaintenance default/nvidia-operator-node-7" in text
        assert "work/stuck-" in text and "disruption budget stuck" in text, text
        client.delete(PodDisruptionBudget, "stuck", namespace=WORK)
        eventually(lambda: set(states(client).values()) == {"upgrade-done"}
                   and not list(client.list(NodeMaintenance, namespace="default")), 300,
                   "node-7 upgraded once its budget is gone")
        observer.stop()
        assert observer.max_cordoned <= 4, observer.max_cordoned
        assert [n.metadata.name for n in client.list(Node) if n.spec.unschedulable] == \
            ["node-5"], "the admin's cordon stays; no other is left"
        assert "nicop.io/ofed-driver-upgrade-drain-blocked" not in (
            client.get(Node, "node-7").metadata.annotations or {})
    client.delete(MaintenanceOperatorConfig, "default", namespace=NAMESPACE)


def ready(nm: Any) -> bool:
    return any(c["type"] == "Ready" and c["reason"] == "Ready"
               for c in (nm.get("status") or {}).get("conditions") or [])


def upgraded_but_node_3_held(client: Client) -> bool:
    """Every node upgrade-done, none of the upgrade's NodeMaintenances left, and only node-3
    (its owner's) still cordoned."""
    if set(states(client).values()) != {"upgrade-done"}:
        return False
    left = [nm["metadata"]["name"] for nm in client.list(NodeMaintenance, namespace="default")]
    cordoned = [n.metadata.name for n in client.list(Node) if n.spec.unschedulable]
    return left == ["nvidia-operator-node-3"] and cordoned == ["node-3"]


SRIOV = "nvidia.sriov-drain"
ALL = {"kubernetes.io/os": "linux"}


class Cordons:
    """How often each node was cordoned (schedulable → unschedulable), from a watch."""

    def __init__(self, client: Client) -> None:
        self.count: dict[str, int] = {}
        self._now: dict[str, bool] = {}
        self._watch = Watch(lambda: client.watch(Node), self._seen)

    def _seen(self, node: Any) -> None:
        name, cordoned = node.metadata.name, bool(node.spec.unschedulable)
        if cordoned and not self._now.get(name, False):
            self.count[name] = self.count.get(name, 0) + 1
        self._now[name] = cordoned

    def stop(self) -> None:
        self._watch.stop()


def ask_for_drains(client: Client, desired: str, nodes: list[str]) -> None:
    """What each node's SR-IOV config daemon writes when a policy change needs VFs pods hold."""
    for node in nodes:
        client.patch(SriovNetworkNodeState, node, {"metadata": {"annotations": {
            DESIRED_STATE: desired}}}, namespace=NAMESPACE, patch_type=PatchType.MERGE)
        client.patch(Node, node, {"metadata": {"annotations": {NODE_STATE_ANNOTATION: desired}}})


def finish_reconfigured(client: Client) -> list[str]:
    """The daemons whose drain is complete finish their work and go back to Idle; the nodes
    still waiting for theirs."""
    waiting = []
    for state in client.list(SriovNetworkNodeState, namespace=NAMESPACE):
        ann = state["metadata"].get("annotations") or {}
        name = state["metadata"]["name"]
        if ann.get(DESIRED_STATE) == "Drain_Required":
            if ann.get(CURRENT_STATE) == "DrainComplete":
                ask_for_drains(client, "Idle", [name])
            else:
                waiting.append(name)
        elif ann.get(CURRENT_STATE) != "Idle":
            waiting.append(name)
    return waiting


def test_sriov_drains_join_the_rollouts_node_maintenances_and_an_operator_kill_drains_none_twice(
        cluster: tuple[LocalCluster, Client], tmp_path: Path) -> None:
    """Requestor mode for driver upgrades and SR-IOV drains (DRAIN_CONTROLLER_ENABLED, upstream's
    external drainer), 20 nodes, maxParallelOperations 3. While the driver rollout's
    NodeMaintenances wait, an SR-IOV policy change makes every node's config daemon ask for a
    drain (the test writes the daemons' annotations, as network-operator's drain controller
    tests do, pkg/drain: `simulateDaemonSetAnnotation`, Drain_Required then Idle): each drain
    joins the node's NodeMaintenance as an additional requestor. The operator is SIGKILLed at a
    moment a seed picks and started again. Every node ends with its driver replaced once, its
    SR-IOV drain complete, exactly one NodeMaintenance, and was cordoned exactly once; never
    more than 3 at a time."""
    local, client = cluster
    seed = random.randrange(1000)
    done_before_kill = random.Random(seed).randint(0, 12)
    nodes = [f"node-{i}" for i in range(1, NODES + 1)]
    client.apply(MaintenanceOperatorConfig(
        metadata={"name": "default", "namespace": NAMESPACE},
        spec={"maxParallelOperations": 3}), force=True)
    client.apply(SriovOperatorConfig(metadata={"name": "default", "namespace": NAMESPACE},
                                      spec={"configDaemonNodeSelector": ALL}), force=True)
    # The maintenance operator limits drains; the pool lets every node ask at once.
    client.apply(SriovNetworkPoolConfig(metadata={"name": "all", "namespace": NAMESPACE},
                                         spec={"nodeSelector": {"matchLabels": ALL},
                                               "maxUnavailable": "100%"}), force=True)
    policy = copy.deepcopy(POLICY)
    # A job on every node holds each NodeMaintenance in WaitForPodCompletion until it ends.
    policy["spec"]["ofedDriver"]["upgradePolicy"]["waitForCompletion"] = {
        "podSelector": "job=sync"}
    env = {**ENV, "DRAIN_CONTROLLER_ENABLED": "true", "DRAIN_CONTROLLER_REQUESTOR_ID": SRIOV}
    with upgrade_operator(local, client, tmp_path / "operator.log", env=env) as op:
        workloads(client)
        start(client, policy)
        eventually(lambda: len(list(client.list(SriovNetworkNodeState, namespace=NAMESPACE)))
                   == NODES, 60, "a SriovNetworkNodeState per node")
        for node in nodes:
            client.create(Pod(metadata=ObjectMeta(name=f"sync-{node}", namespace=WORK,
                                                  labels={"job": "sync"}),
                              spec=PodSpec(nodeName=node, containers=[
                                  Container(name="c", image="registry.local/sync:1")])))
        requests, cordons, observer = Requests(client), Cordons(client), Observer(client)
        bump(client, policy)
        eventually(lambda: len(list(client.list(NodeMaintenance, namespace="default"))) == NODES,
                   120, "the rollout's NodeMaintenance of every node")
        ask_for_drains(client, "Drain_Required", nodes)
        eventually(lambda: all(SRIOV in (nm["spec"].get("additionalRequestors") or [])
                             and nm["spec"]["requestorID"] == REQUESTOR
                             for nm in client.list(NodeMaintenance, namespace="default")),
                   120, "every SR-IOV drain joining its node's NodeMaintenance")
        for node in nodes:
            client.delete(Pod, f"sync-{node}", namespace=WORK, grace_period=0)

        def kill_moment() -> bool:
            finish_reconfigured(client)
            return sum(v == "upgrade-done" for v in states(client).values()) >= done_before_kill

        eventually(kill_moment, 300, f"seed {seed}: {done_before_kill} nodes upgraded")
        op.stop(signal.SIGKILL)
        op.restart()
        eventually(lambda: not finish_reconfigured(client)
                   and set(states(client).values()) == {"upgrade-done"}
                   and not list(client.list(NodeMaintenance, namespace="default"))
                   and not any(n.spec.unschedulable for n in client.list(Node)),
                   600, f"seed {seed}: the rollout and every SR-IOV drain to finish")
        requests.stop()
        cordons.stop()
        observer.stop()
        assert observer.max_cordoned <= 3, observer.max_cordoned
        assert {n: len(uids) for n, uids in requests.by_node.items()} == {
            n: 1 for n in nodes}, f"seed {seed}: one NodeMaintenance per node"
        assert requests.requestors == {n: {REQUESTOR, SRIOV} for n in nodes}
        assert cordons.count == {n: 1 for n in nodes}, f"seed {seed}: each node cordoned once"
        assert replaced_once(observer, NODES), \
            f"seed {seed}: each node's driver pod is replaced exactly once"
    for kind, name in ((SriovNetworkPoolConfig, "all"), (SriovOperatorConfig, "default"),
                       (MaintenanceOperatorConfig, "default")):
        client.delete(kind, name, namespace=NAMESPACE)
