"""A driver upgrade of 10 nodes whose drain a PodDisruptionBudget blocks on one, every node
change watched: an upgrade-failed node keeps its maxParallelUpgrades slot as upstream's upgrade
library counts it (NVIDIA/k8s-operator-libs pkg/upgrade/common_manager.go,
GetUpgradesInProgress and GetUpgradesAvailable), so the upgrade never has more nodes cordoned
than maxParallelUpgrades. Before the change is applied, `nicop plan` of it names the nodes in
the batches the rollout then really starts them in, and the pod and budget that block node-1.

This module runs its own control plane with 10 nodes and its own operator.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator
from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod
from tests.eventually import eventually
from tests.integration.driver_upgrades import (
    STATE,
    NicClusterPolicy,
    budget,
    deployment,
    driver_cluster,
    states,
    upgrade_operator,
    wait_running,
)
from tests.integration.operator_process import (
    NAMESPACE,
    OperatorProcess,
    audited_writes,
    nicop_plan,
)
from tests.integration.watching import Watch

from nicop_sim.cluster import LocalCluster

NODES = 10
PLAN_SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "plan-schema.json")
                         .read_text())
BLOCKED = "node-1"  # among the first three to start, so its failure happens mid-rollout
OLD, NEW = "doca3.5.0-26.07-0.7.0.0-0", "doca3.5.0-26.07-1.0.0.0-0"


def policy(version: str) -> dict[str, Any]:
    # No maxUnavailable: upstream's network-operator never passes one, so only
    # maxParallelUpgrades limits the rollout.
    return {
        "apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
        "metadata": {"name": "nic-cluster-policy"},
        "spec": {"ofedDriver": {
            "image": "doca-driver", "repository": "nvcr.io/nvidia/mellanox", "version": version,
            "upgradePolicy": {
                "autoUpgrade": True, "maxParallelUpgrades": 3,
                "drain": {"enable": True, "timeoutSeconds": 20, "deleteEmptyDir": True},
            },
        }},
    }


@pytest.fixture(scope="module")
def slots(tmp_path_factory: pytest.TempPathFactory,
          controlplane_bin: Path) -> Iterator[tuple[LocalCluster, Client]]:
    with driver_cluster(tmp_path_factory.mktemp("slots-cluster"), controlplane_bin, NODES,
                        ["cx6dx"]) as slots:
        yield slots


@pytest.fixture
def client(slots: tuple[LocalCluster, Client]) -> Client:
    return slots[1]


@pytest.fixture
def op(slots: tuple[LocalCluster, Client], tmp_path: Path) -> Iterator[OperatorProcess]:
    with upgrade_operator(*slots, tmp_path / "operator.log") as proc:
        yield proc


class CordonWatch:
    """Watches the nodes and records which are cordoned after every change, in the API server's
    order: every moment of the rollout, where sampling on a busy machine could miss the short
    ones; and the order in which the nodes were started (set to cordon-required)."""

    def __init__(self, client: Client) -> None:
        self.moments: list[frozenset[str]] = []
        self.started: list[str] = []
        self._cordoned: dict[str, bool] = {}
        self._watch = Watch(lambda: client.watch(Node), self._seen)

    def _seen(self, node: Node) -> None:
        name = node.metadata.name
        self._cordoned[name] = bool(node.spec.unschedulable)
        self.moments.append(frozenset(n for n, c in self._cordoned.items() if c))
        if (node.metadata.labels or {}).get(STATE) == "cordon-required" \
                and name not in self.started:
            self.started.append(name)

    def stop(self) -> list[frozenset[str]]:
        self._watch.stop()
        return list(self.moments)


def written(path: Path, obj: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(obj))
    return path


def driver_versions(client: Client) -> dict[str, str]:
    return {p.spec.nodeName: p.spec.containers[0].image
            for p in client.list(Pod, namespace=NAMESPACE) if p.spec.nodeName}


def workloads(client: Client) -> None:
    """Ten training pods no PDB protects, and one pod on BLOCKED that its PDB never lets go."""
    deployment(client, "train", 10, "registry.local/train:1")
    budget(client, "stuck", deployment(client, "stuck", 1, "registry.local/db:1", BLOCKED),
           minAvailable=1)
    wait_running(client, 11)


def test_a_failed_node_keeps_its_slot_so_at_most_3_nodes_are_ever_cordoned(
    slots: tuple[LocalCluster, Client], client: Client, op: OperatorProcess, tmp_path: Path
) -> None:
    """10 nodes, maxParallelUpgrades 3, BLOCKED's drain refused by a PodDisruptionBudget until
    its 20 s drain timeout fails it (nicop's documented behaviour: the node stays cordoned in
    upgrade-failed with the reason, until its driver is Ready). At every change of a node through
    the whole rollout, never more than 3 nodes are cordoned; the 9 others finish.

    Before it, `nicop plan` of a label change says nothing is disruptive (exit 0), of a value
    the CRD's validation refuses says so (exit 1), and of the new version lists the batches
    (3, then 2 at a time: BLOCKED keeps its slot), names BLOCKED's pod and its
    PodDisruptionBudget, exits 2, and writes nothing: the API server's audit log holds only dry
    runs from `nicop plan` (its User-Agent), its client counted only reads and dry runs, and the
    policy's spec, generation and labels are unchanged (the operator writes its status
    meanwhile). The rollout then starts the nodes in exactly the planned order."""
    workloads(client)
    client.apply(NicClusterPolicy(**policy(OLD)), field_manager="test", force=True)
    eventually(lambda: set(states(client).values()) == {"upgrade-done"}
               and len(driver_versions(client)) == NODES, 120, "every node upgrade-done at first")
    kubeconfig = slots[0].kubeconfig
    before = client.get(NicClusterPolicy, "nic-cluster-policy").metadata
    relabelled = policy(OLD)
    relabelled["metadata"]["labels"] = {"team": "training"}
    quiet = nicop_plan(kubeconfig, written(tmp_path / "label.yaml", relabelled), NAMESPACE)
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert "NicClusterPolicy nic-cluster-policy: changed" in quiet.stdout
    assert "+    team: training" in quiet.stdout
    assert quiet.stdout.rstrip().endswith("Nothing disruptive."), quiet.stdout
    wrong = policy(NEW)
    wrong["spec"]["ofedDriver"]["upgradePolicy"]["maxParallelUpgrades"] = -1
    refused = nicop_plan(kubeconfig, written(tmp_path / "wrong.yaml", wrong), NAMESPACE)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "NicClusterPolicy nic-cluster-policy: refused by the API server" in refused.stdout
    assert "maxParallelUpgrades" in refused.stdout and "Refused by the API server" in \
        refused.stdout
    planned = nicop_plan(kubeconfig, written(tmp_path / "new.yaml", policy(NEW)), NAMESPACE,
                         "-o", "json")
    assert planned.returncode == 2, planned.stdout + planned.stderr
    plan = json.loads(planned.stdout)
    Draft202012Validator(PLAN_SCHEMA).validate(plan)
    assert plan["requests"]["writes"] == 0 and plan["requests"]["dryRuns"] == 1, plan["requests"]
    # Three plans ran, each with one dry run; the API server logs a request once answered.
    eventually(lambda: len(audited_writes(slots[0].audit_log, "plan")[1]) == 3, 10,
               "the three plans' dry runs in the audit log")
    assert audited_writes(slots[0].audit_log, "plan")[0] == []
    after = client.get(NicClusterPolicy, "nic-cluster-policy")
    assert after.metadata.generation == before.generation and not after.metadata.labels
    assert after.spec["ofedDriver"]["version"] == OLD
    (rollout,) = plan["driverRollouts"]
    names = sorted(states(client))  # the upgrade takes nodes in name order: node-1, node-10, ...
    assert rollout["batches"] == [names[:3], names[3:5], names[5:7], names[7:9], names[9:]]
    blocked = {n["node"]: n["blocked"] for n in rollout["nodes"] if n["blocked"]}
    assert list(blocked) == [BLOCKED], blocked
    assert blocked[BLOCKED][0].startswith("work/stuck-"), blocked
    assert "PodDisruptionBudget work/stuck allows 0 disruptions" in blocked[BLOCKED][0]
    assert sum(len(n["evicts"]) for n in rollout["nodes"]) == 10  # every training pod
    told = nicop_plan(kubeconfig, tmp_path / "new.yaml", NAMESPACE)
    assert told.returncode == 2 and f"  batch 1: {', '.join(names[:3])}" in told.stdout
    assert f"  {BLOCKED}: evicts" in told.stdout or f"  {BLOCKED}: drain blocked" in told.stdout
    watch = CordonWatch(client)
    try:
        client.apply(NicClusterPolicy(**policy(NEW)), field_manager="test", force=True)

        def finished() -> bool:
            s = states(client)
            versions = driver_versions(client)
            others = [n for n in s if n != BLOCKED]
            return (s[BLOCKED] == "upgrade-failed"
                    and all(s[n] == "upgrade-done" and f":{NEW}-" in versions.get(n, "")
                            for n in others)
                    and [n.metadata.name for n in client.list(Node) if n.spec.unschedulable]
                    == [BLOCKED])

        eventually(finished, 300, f"{BLOCKED} to fail and the 9 others to finish")
    finally:
        samples = watch.stop()
    assert watch.started == [n for batch in rollout["batches"] for n in batch], \
        f"started in another order than planned: {watch.started}"
    worst = max(samples, key=len)
    assert len(worst) <= 3, f"more nodes cordoned than maxParallelUpgrades: {sorted(worst)}"
    assert len(worst) == 3, "the rollout did use its 3 slots"
    # While BLOCKED sat failed and cordoned, it held one of the 3 slots.
    assert any(BLOCKED in s and len(s) == 3 for s in samples), samples
    assert f":{OLD}-" in driver_versions(client)[BLOCKED], "its driver was never replaced"
