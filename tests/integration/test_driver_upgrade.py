"""Rolling driver upgrades across 30 nodes running workloads, observed by a watch.

This module runs its own control plane with 30 nodes (the shared one has 4), its own operator,
and a thread that watches every node and remembers the worst moment of the rollout.
"""

from __future__ import annotations

import copy
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget
from tests.eventually import eventually
from tests.integration.driver_upgrades import (
    WORK,
    NicClusterPolicy,
    budget,
    deployment,
    driver_cluster,
    states,
    upgrade_operator,
    wait_running,
)
from tests.integration.operator_process import NAMESPACE, OperatorProcess
from tests.integration.watching import Watch

from nicop_sim.cluster import LocalCluster

NODES = 30
POLICY: dict[str, Any] = {
    "apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
    "metadata": {"name": "nic-cluster-policy"},
    "spec": {"ofedDriver": {
        "image": "doca-driver", "repository": "nvcr.io/nvidia/mellanox",
        "version": "doca3.5.0-26.07-0.7.0.0-0",
        "upgradePolicy": {
            "autoUpgrade": True, "maxParallelUpgrades": 3, "maxUnavailable": "20%",
            # Long enough for a PodDisruptionBudget to let pods go on a busy machine.
            "drain": {"enable": True, "timeoutSeconds": 180, "deleteEmptyDir": True},
        },
    }},
}
NEW_VERSION = "doca3.5.0-26.07-1.0.0.0-0"


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory,
        controlplane_bin: Path) -> Iterator[tuple[LocalCluster, Client]]:
    with driver_cluster(tmp_path_factory.mktemp("upgrade-cluster"), controlplane_bin, NODES,
                        ["cx6dx", "dgx", "bf3"]) as big:
        yield big


@pytest.fixture(scope="module")
def bclient(big: tuple[LocalCluster, Client]) -> Client:
    return big[1]


@pytest.fixture
def op(big: tuple[LocalCluster, Client], tmp_path: Path) -> Iterator[OperatorProcess]:
    with upgrade_operator(*big, tmp_path / "operator.log") as proc:
        yield proc


class Observer:
    """Watches every node; records the most nodes cordoned and unavailable at any moment."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.nodes: dict[str, Any] = {}
        self.max_cordoned = 0
        self.driver_pods: dict[str, set[str]] = {}
        self._watches = [Watch(lambda: client.watch(Node), self._node),
                         Watch(lambda: client.watch(Pod, namespace=NAMESPACE), self._pod)]

    def _node(self, node: Any) -> None:
        self.nodes[node.metadata.name] = node
        cordoned = sum(bool(n.spec.unschedulable) for n in self.nodes.values())
        self.max_cordoned = max(self.max_cordoned, cordoned)

    def _pod(self, pod: Any) -> None:
        if pod.spec.nodeName:
            self.driver_pods.setdefault(pod.spec.nodeName, set()).add(pod.metadata.uid)

    def stop(self) -> None:
        for watch in self._watches:
            watch.stop()


def replaced_once(observer: Observer, nodes: int = NODES) -> bool:
    """Every node's driver pod was replaced exactly once (two pods seen), and every node seen."""
    return {n: len(uids) for n, uids in observer.driver_pods.items()} == {
        f"node-{i}": 2 for i in range(1, nodes + 1)}


def workloads(client: Client, pdb_blocks_one_node: bool = False) -> None:
    """40 training pods behind a PDB; or, with `pdb_blocks_one_node`, the training pods without
    a PDB (so only the planted one can hold a drain up) and one pod no PDB lets go."""
    train = deployment(client, "train", 40, "registry.local/train:1")
    if not pdb_blocks_one_node:
        budget(client, "train", train, maxUnavailable=2)
    else:
        budget(client, "stuck", deployment(client, "stuck", 1, "registry.local/db:1", "node-7"),
               minAvailable=1)
    wait_running(client, 40 + pdb_blocks_one_node)


def start(client: Client, policy: dict[str, Any]) -> None:
    client.apply(NicClusterPolicy(**policy), field_manager="test", force=True)
    eventually(lambda: set(states(client).values()) == {"upgrade-done"}, 120,
               "every node upgrade-done before the bump")


def bump(client: Client, policy: dict[str, Any], version: str = NEW_VERSION) -> dict[str, Any]:
    bumped = copy.deepcopy(policy)
    bumped["spec"]["ofedDriver"]["version"] = version
    client.apply(NicClusterPolicy(**bumped), field_manager="test", force=True)
    return bumped


def rolled_out(client: Client, version: str = NEW_VERSION) -> bool:
    pods = list(client.list(Pod, namespace=NAMESPACE))
    return (len(pods) == NODES
            and all(f":{version}-" in p.spec.containers[0].image for p in pods)
            and set(states(client).values()) == {"upgrade-done"}
            and not any(n.spec.unschedulable for n in client.list(Node)))


def test_rollout_respects_limits_and_finishes(bclient: Client, op: OperatorProcess) -> None:
    workloads(bclient)
    start(bclient, POLICY)
    observer = Observer(bclient)
    bump(bclient, POLICY)
    eventually(lambda: rolled_out(bclient), 300, "the rollout to finish")
    observer.stop()
    assert 1 <= observer.max_cordoned <= 3, "maxParallelUpgrades 3 (and 20% of 30 = 6)"
    assert replaced_once(observer), \
        "each node's driver pod is replaced exactly once"
    # The policy's status follows the node labels at its next reconcile.
    eventually(lambda: (bclient.get(NicClusterPolicy, "nic-cluster-policy").get("status") or {})
               .get("driverUpgrade", {}).get("done") == NODES, 30, "the status to count every node")


def test_a_pdb_that_forbids_eviction_fails_only_its_node(
    bclient: Client, op: OperatorProcess
) -> None:
    policy = copy.deepcopy(POLICY)
    policy["spec"]["ofedDriver"]["upgradePolicy"]["drain"]["timeoutSeconds"] = 15
    workloads(bclient, pdb_blocks_one_node=True)
    start(bclient, policy)
    bump(bclient, policy)
    blocked = eventually(lambda: (bclient.get(Node, "node-7").metadata.annotations or {}).get(
        "nicop.io/ofed-driver-upgrade-drain-blocked"), 60, "node-7's drain shown as blocked")
    # The API server's words name the budget (details.causes of the 429).
    assert "work/stuck-" in blocked and "The disruption budget stuck needs 1 healthy" in blocked
    assert "the drain times out at" in blocked

    def settled() -> bool:
        s = states(bclient)
        return s["node-7"] == "upgrade-failed" and all(
            v == "upgrade-done" for k, v in s.items() if k != "node-7")

    eventually(settled, 300, "node-7 to fail and the rest to finish")
    status = eventually(lambda: (bclient.get(NicClusterPolicy, "nic-cluster-policy")["status"]
                               .get("driverUpgrade") or {}).get("failed") == 1 and
                        bclient.get(NicClusterPolicy, "nic-cluster-policy")["status"], 30, "status")
    failure = status["driverUpgrade"]["failedNodes"][0]
    assert failure["name"] == "node-7"
    assert "work/stuck-" in failure["reason"] and "disruption budget stuck" in failure["reason"]


def test_a_failed_node_is_retried_with_back_off_then_waits_for_nicop_upgrade_retry(
    big: tuple[LocalCluster, Client], bclient: Client, tmp_path: Path
) -> None:
    """node-7's drain cannot finish (a PodDisruptionBudget lets its pod go nowhere): its upgrade
    fails, is retried by itself twice (NICOP_UPGRADE_RETRIES=2, back-off 1 s then 2 s), then
    waits, its attempts shown in the policy's status, `nicop status` and `nicop diagnose`. With
    the budget lifted, `nicop upgrade retry node-7` finishes it without kubectl surgery."""
    env = {"NICOP_UPGRADE_RETRIES": "2", "NICOP_UPGRADE_RETRY_BACKOFF": "1"}
    with upgrade_operator(*big, tmp_path / "operator.log", env=env) as proc:
        policy = copy.deepcopy(POLICY)
        policy["spec"]["ofedDriver"]["upgradePolicy"]["drain"]["timeoutSeconds"] = 3
        workloads(bclient, pdb_blocks_one_node=True)
        start(bclient, policy)
        bump(bclient, policy)

        def out_of_retries() -> dict[str, Any] | None:
            node = bclient.get(Node, "node-7")
            annotations = node.metadata.annotations or {}
            held = (states(bclient)["node-7"] == "upgrade-failed"
                    and annotations.get("nicop.io/ofed-driver-upgrade-attempts") == "3"
                    and "nicop.io/ofed-driver-upgrade-retry-at" not in annotations)
            status = bclient.get(NicClusterPolicy, "nic-cluster-policy").get("status") or {}
            failed = (status.get("driverUpgrade") or {}).get("failedNodes") or []
            return failed[0] if held and failed and failed[0].get("attempts") == 3 else None

        failure = eventually(out_of_retries, 300, "node-7 failed three times, no retry left")
        assert failure["name"] == "node-7" and "nextRetry" not in failure
        assert "work/stuck-" in failure["reason"], failure
        retries = [e for e in bclient.list(Event, namespace="default",
                                           fields={"involvedObject.name": "node-7"})
                   if e.reason == "DriverUpgradeRetry"]
        assert len(retries) == 2, [e.message for e in retries]
        shown = nicop(big[0], "status")
        assert "3 attempt(s); no automatic retry left: nicop upgrade retry node-7" in shown, shown
        report = nicop(big[0], "diagnose", "node", "node-7", code=1)
        assert "3 failed attempt(s); no automatic retry is left" in report, report
        bclient.delete(PodDisruptionBudget, "stuck", namespace=WORK)
        said = nicop(big[0], "upgrade", "retry", "node-7")
        assert "re-armed; the operator retries it from drain-required now" in said, said
        eventually(lambda: rolled_out(bclient), 300, "node-7 upgraded after the retry")
        annotations = bclient.get(Node, "node-7").metadata.annotations or {}
        assert not [k for k in annotations if k.startswith("nicop.io/ofed-driver-upgrade-")]
        assert proc.proc.poll() is None


def nicop(cluster: LocalCluster, *args: str, code: int = 0) -> str:
    """A nicop command against the cluster; its output, one line."""
    done = subprocess.run([sys.executable, "-m", "nicop", *args, "--kubeconfig",
                           str(cluster.kubeconfig)], capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, "COLUMNS": "400"})
    assert done.returncode == code, done.stdout + done.stderr
    return " ".join(done.stdout.split())


def test_operator_restart_mid_rollout_resumes_without_repeating(
    bclient: Client, op: OperatorProcess
) -> None:
    workloads(bclient)
    start(bclient, POLICY)
    observer = Observer(bclient)
    bump(bclient, POLICY)
    in_progress = ("cordon-required", "wait-for-jobs-required", "drain-required",
                   "pod-restart-required", "uncordon-required")

    def under_way() -> bool:
        values = list(states(bclient).values())
        return values.count("upgrade-required") >= 10 and any(v in in_progress for v in values)

    eventually(under_way, 120, "the rollout to be under way")
    op.stop()  # SIGTERM in the middle of the rollout
    time.sleep(2)
    op.restart()
    eventually(lambda: rolled_out(bclient), 300, "the rollout to finish after the restart")
    observer.stop()
    assert replaced_once(observer), \
        "no node is upgraded twice"


def test_a_set_based_drain_selector_evicts_exactly_the_pods_it_names(
    bclient: Client, op: OperatorProcess
) -> None:
    """upgradePolicy.drain.podSelector in Kubernetes' set-based syntax (`app in (train,infer)`,
    as apimachinery's labels.Parse reads it; its selector_test.go tables are in
    tests/unit/test_selectors_upstream.py). Written unclosed first, it holds the rollout with
    an InvalidUpgradePolicy Event and the policy's state-OFED in error, both naming the field;
    once fixed, the rollout runs without an operator restart, and its drains evict the train
    and infer pods and no other."""
    for name, replicas in (("train", 10), ("infer", 5), ("web", 10)):
        deployment(bclient, name, replicas, f"registry.local/{name}:1")
    wait_running(bclient, 25)
    policy = copy.deepcopy(POLICY)
    start(bclient, policy)
    before = {p.metadata.uid: p.metadata.labels["app"] for p in bclient.list(Pod, namespace=WORK)}
    policy["spec"]["ofedDriver"]["upgradePolicy"]["drain"]["podSelector"] = "app in (train,infer"
    bumped = bump(bclient, policy)
    event = eventually(lambda: next((e for e in bclient.list(Event, namespace="default")
                                   if e.reason == "InvalidUpgradePolicy"), None), 60,
                       "the InvalidUpgradePolicy Event")
    assert "upgradePolicy.drain.podSelector" in event.message, event.message
    ofed = eventually(lambda: ofed_error(bclient), 60, "state-OFED in error")
    assert "spec.ofedDriver.upgradePolicy.drain.podSelector: " in ofed, ofed
    assert set(states(bclient).values()) == {"upgrade-done"}, "no node moves while it is held"
    bumped["spec"]["ofedDriver"]["upgradePolicy"]["drain"]["podSelector"] = "app in (train,infer)"
    bclient.apply(NicClusterPolicy(**bumped), field_manager="test", force=True)
    eventually(lambda: rolled_out(bclient), 300, "the rollout to finish")
    after = {p.metadata.uid for p in bclient.list(Pod, namespace=WORK)}
    assert {app for uid, app in before.items() if uid in after} == {"web"}
    assert {app for uid, app in before.items() if uid not in after} == {"train", "infer"}


def ofed_error(client: Client) -> str | None:
    """The message of the policy's state-OFED while it is in error."""
    status = client.get(NicClusterPolicy, "nic-cluster-policy").status or {}
    return next((a.get("message") for a in status.get("appliedStates") or []
                 if a.get("name") == "state-OFED" and a.get("state") == "error"), None)


def test_turning_auto_upgrade_off_stops_and_cleans_up(
    bclient: Client, op: OperatorProcess
) -> None:
    workloads(bclient)
    start(bclient, POLICY)
    bumped = bump(bclient, POLICY)
    eventually(lambda: any(v in ("cordon-required", "wait-for-jobs-required", "drain-required",
                               "pod-restart-required") for v in states(bclient).values()),
               60, "a node in progress")
    bumped["spec"]["ofedDriver"]["upgradePolicy"]["autoUpgrade"] = False
    bclient.apply(NicClusterPolicy(**bumped), field_manager="test", force=True)
    eventually(lambda: set(states(bclient).values()) == {None}, 60, "upgrade labels removed")
    # Evidence the rollout had its chance to go on: the upgrade reconciles the policy (touched
    # here, spec unchanged) once more after the labels went, and still starts no node.
    reconciled = op.reconciles("ofed-upgrade")
    bumped["metadata"]["annotations"] = {"touched": "yes"}
    bclient.apply(NicClusterPolicy(**bumped), field_manager="test", force=True)
    eventually(lambda: op.reconciles("ofed-upgrade") > reconciled, 30,
               "the upgrade reconciled after the change")
    assert set(states(bclient).values()) == {None}, "no node starts after autoUpgrade is off"
    assert not any(n.spec.unschedulable for n in bclient.list(Node)), "nothing left cordoned"


def test_max_unavailable_counts_nodes_already_down_and_keeps_them_cordoned(
    bclient: Client, op: OperatorProcess
) -> None:
    policy = copy.deepcopy(POLICY)
    policy["spec"]["ofedDriver"]["upgradePolicy"].update(maxParallelUpgrades=0, maxUnavailable=4)
    workloads(bclient)
    start(bclient, policy)
    bclient.patch(Node, "node-5", {"spec": {"unschedulable": True}})  # an admin's maintenance
    observer = Observer(bclient)
    bump(bclient, policy)

    def finished() -> bool:
        pods = list(bclient.list(Pod, namespace=NAMESPACE))
        return (len(pods) == NODES and all(NEW_VERSION in p.spec.containers[0].image for p in pods)
                and set(states(bclient).values()) == {"upgrade-done"})

    eventually(finished, 300, "the rollout to finish")
    observer.stop()
    assert observer.max_cordoned <= 4, "node-5 plus at most 3 upgrading nodes"
    cordoned = sorted(n.metadata.name for n in bclient.list(Node) if n.spec.unschedulable)
    assert cordoned == ["node-5"], "a node cordoned before the upgrade stays cordoned"


IN_PROGRESS = ("cordon-required", "wait-for-jobs-required", "drain-required",
               "pod-restart-required", "uncordon-required")


def upgraded_once(observer: Observer, before: dict[str, set[str]]) -> dict[str, int]:
    """Nodes whose driver pod was not replaced exactly once since `before`."""
    return {node: len(uids - before.get(node, set()))
            for node, uids in observer.driver_pods.items()
            if len(uids - before.get(node, set())) != 1}


def test_operator_sigkilled_at_random_moments_of_2_rollouts_upgrades_each_node_once(
    bclient: Client, op: OperatorProcess
) -> None:
    """Two rollouts in a row (as many as `make test`'s time allows), each with the operator
    SIGKILLed at a moment its seed picks (when that many nodes are done and one is under way)
    and started again: every node's driver is replaced exactly once per rollout, never more
    than maxParallelUpgrades nodes are cordoned, and none is left cordoned."""
    workloads(bclient)
    start(bclient, POLICY)
    observer = Observer(bclient)
    eventually(lambda: len(observer.driver_pods) == NODES, 30, "the observer to see every pod")
    try:
        for seed in range(2):
            rng = random.Random(seed)
            done_before_kill = rng.randint(0, NODES - 4)
            version = f"doca3.5.0-26.07-1.0.{seed + 1}.0-0"
            before = {node: set(uids) for node, uids in observer.driver_pods.items()}
            bump(bclient, POLICY, version)

            def kill_moment(version: str = version, done: int = done_before_kill) -> bool:
                now = states(bclient)
                upgraded = {p.spec.nodeName for p in bclient.list(Pod, namespace=NAMESPACE)
                            if f":{version}-" in p.spec.containers[0].image}
                return sum(v == "upgrade-done" and n in upgraded for n, v in now.items()) \
                    >= done and any(v in IN_PROGRESS for v in now.values())

            eventually(kill_moment, 120,
                       f"seed {seed}: {done_before_kill} nodes done, one under way")
            op.stop(signal.SIGKILL)
            op.restart()
            eventually(lambda version=version: rolled_out(bclient, version), 300,
                       f"seed {seed}: the rollout to {version} to finish after the kill")
            eventually(lambda before=before: not upgraded_once(observer, before), 30,
                       f"seed {seed}: the observer to see every new pod")
            assert not upgraded_once(observer, before), f"seed {seed}: not upgraded exactly once"
    finally:
        observer.stop()
    assert 1 <= observer.max_cordoned <= 3, "maxParallelUpgrades 3"
    assert not any(n.spec.unschedulable for n in bclient.list(Node)), "none left cordoned"


def test_etcd_paused_5s_mid_rollout_loses_and_repeats_no_transition(
    bclient: Client, big: tuple[LocalCluster, Client], op: OperatorProcess
) -> None:
    """etcd stopped (SIGSTOP) for 5 s while nodes are being upgraded: the API server's answers
    wait, nothing is lost or done twice. The operator runs with the chart's 15 s lease, whose
    10 s renew deadline outlasts the pause."""
    op.lease_duration = 15
    op.restart()
    workloads(bclient)
    start(bclient, POLICY)
    observer = Observer(bclient)
    eventually(lambda: len(observer.driver_pods) == NODES, 30, "the observer to see every pod")
    before = {node: set(uids) for node, uids in observer.driver_pods.items()}
    bump(bclient, POLICY)
    eventually(lambda: list(states(bclient).values()).count("upgrade-done") >= 6 and any(
        v in IN_PROGRESS for v in states(bclient).values()), 120, "the rollout under way")
    etcd = big[0].state().processes["etcd"].pid
    os.kill(etcd, signal.SIGSTOP)
    try:
        time.sleep(5)  # the fault itself: etcd answers nothing for 5 s
    finally:
        os.kill(etcd, signal.SIGCONT)
    eventually(lambda: rolled_out(bclient), 300, "the rollout to finish after the pause")
    eventually(lambda: not upgraded_once(observer, before), 30, "the observer to see every pod")
    observer.stop()
    assert op.proc.poll() is None, "the operator kept running"
    assert not upgraded_once(observer, before), "every node upgraded exactly once"
    assert 1 <= observer.max_cordoned <= 3
