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
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Node
from tests.integration.driver_upgrades import driver_cluster, states, upgrade_operator
from tests.integration.operator_process import NAMESPACE, wait_for
from tests.integration.test_driver_upgrade import (
    POLICY,
    Observer,
    bump,
    start,
    workloads,
)

from nicop_sim.cluster import LocalCluster

NODES = 20
REQUESTOR = "nvidia.doca-driver-upgrade"
OTHER = "foo.bar.com"  # upstream's secondary requestor in its tests
NodeMaintenance = create_namespaced_resource(
    "maintenance.nvidia.com", "v1alpha1", "NodeMaintenance", "nodemaintenances")
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
    """Every NodeMaintenance created, by node (their uids), from a watch."""

    def __init__(self, client: Client) -> None:
        self.by_node: dict[str, set[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(client,), daemon=True)
        self._thread.start()

    def _run(self, client: Client) -> None:
        for _, nm in client.watch(NodeMaintenance, namespace="default"):
            self.by_node.setdefault(nm["spec"]["nodeName"], set()).add(nm["metadata"]["uid"])
            if self._stop.is_set():
                return

    def stop(self) -> None:
        self._stop.set()


def maintenance(client: Client, node: str) -> Any:
    return client.get(NodeMaintenance, f"nvidia-operator-{node}", namespace="default")


def test_requestor_mode_upgrades_each_node_through_one_node_maintenance(
        cluster: tuple[LocalCluster, Client], tmp_path: Path) -> None:
    """20 nodes, maxParallelOperations 3: each node gets exactly one NodeMaintenance and one
    driver restart, never more than 3 nodes are cordoned at once; node-3, already held by
    another requestor, is joined (our ID in additionalRequestors), drained once, and left to
    its owner, whose deletion uncordons it."""
    local, client = cluster
    client.create(MaintenanceOperatorConfig(
        metadata={"name": "default", "namespace": NAMESPACE},
        spec={"maxParallelOperations": 3}))
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
        wait_for(lambda: ready(maintenance(client, "node-3")), 120,
                 "the other requestor's maintenance of node-3 Ready")
        observer = Observer(client)
        bump(client, policy)
        joined = wait_for(lambda: REQUESTOR in (maintenance(client, "node-3")["spec"].get(
            "additionalRequestors") or []) and maintenance(client, "node-3"), 120,
            "the upgrade joining node-3's maintenance")
        assert joined["spec"]["requestorID"] == OTHER
        wait_for(lambda: upgraded_but_node_3_held(client), 600, "the rollout to finish")
        observer.stop()
        requests.stop()
        assert observer.max_cordoned <= 3, observer.max_cordoned
        assert {node: len(uids) for node, uids in requests.by_node.items()} == {
            f"node-{i}": 1 for i in range(1, NODES + 1)}, "one NodeMaintenance per node"
        assert all(len(uids) == 2 for uids in observer.driver_pods.values()), \
            "each node's driver pod is replaced exactly once"
        held = maintenance(client, "node-3")
        assert held["spec"]["requestorID"] == OTHER
        assert not held["spec"].get("additionalRequestors")  # the upgrade left, did not delete
        client.delete(NodeMaintenance, "nvidia-operator-node-3", namespace="default")
        wait_for(lambda: not any(n.spec.unschedulable for n in client.list(Node))
                 and not list(client.list(NodeMaintenance, namespace="default")),
                 120, "node-3 released by its owner and uncordoned")
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
