"""Coordinated drains for SR-IOV changes on five ConnectX-6 Dx nodes, observed by a watch.

This module runs its own control plane with five nodes (the shared one has four, of which two
are ConnectX-6 Dx), the operator's SR-IOV controllers and, per node, a simulated hardware root,
a config daemon, the SR-IOV device plugin and the kubelet stand-in (see test_sriov_e2e).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.apps_v1 import DeploymentSpec
from lightkube.models.core_v1 import (
    Container,
    PodSpec,
    PodTemplateSpec,
    ResourceRequirements,
)
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.models.policy_v1 import PodDisruptionBudgetSpec
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Namespace, Node, Pod, ServiceAccount
from lightkube.resources.policy_v1 import PodDisruptionBudget
from tests.eventually import eventually
from tests.integration.agent_loop import delete
from tests.integration.operator_process import nicop_plan
from tests.integration.test_sriov_e2e import (
    PF0,
    PREFIX,
    Rig,
    _equals,
    operator_config,
    policy,
    until,
)
from tests.integration.watching import Watch

from nicop.api.labels import CURRENT_STATE, DESIRED_STATE
from nicop.kube.resources import NODE, Obj
from nicop.operator.crds import install_crds
from nicop_sim.cluster import LocalCluster, running_cluster

NODES = [f"node-{i}" for i in range(1, 6)]
OPERATOR_NS = "sriov-operator"
WORK = "work"
ALL = {"kubernetes.io/os": "linux"}


@pytest.fixture(scope="module")
def five(tmp_path_factory: pytest.TempPathFactory, controlplane_bin: Path
         ) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("sriov-cluster"), controlplane_bin,
                         nodes=len(NODES), profiles=["cx6dx"],
                         node_agents=False) as cluster:  # the test runs the daemons itself
        client: Client = cluster.client()
        install_crds(cluster.kubeconfig)
        for ns in (OPERATOR_NS, WORK):
            client.create(Namespace(metadata=ObjectMeta(name=ns)))
        eventually(lambda: _has_default_sa(client), 30, "the default service account")
        yield cluster


def _has_default_sa(client: Client) -> bool:
    try:
        client.get(ServiceAccount, "default", namespace=WORK)
    except ApiError:
        return False
    return True


class CordonWatch:
    """Watches every node; remembers the most nodes cordoned at any one moment."""

    def __init__(self, client: Client) -> None:
        self.cordoned: dict[str, bool] = {}
        self.max_cordoned = 0
        self.ever: set[str] = set()
        self._watch = Watch(lambda: client.watch(Node), self._seen)

    def _seen(self, node: Node) -> None:
        name = node.metadata.name
        self.cordoned[name] = bool(node.spec.unschedulable)
        if self.cordoned[name]:
            self.ever.add(name)
        self.max_cordoned = max(self.max_cordoned, sum(self.cordoned.values()))

    def stop(self) -> None:
        self._watch.stop()


def workload(client: Client, resource: str, replicas: int) -> None:
    """Pods that use a VF each, behind a PDB that allows one of them down at a time."""
    labels = {"app": "vf-user"}
    requests = {f"{PREFIX}/{resource}": "1"}
    client.create(Deployment(
        metadata=ObjectMeta(name="vf-user", namespace=WORK),
        spec=DeploymentSpec(
            replicas=replicas, selector=LabelSelector(matchLabels=labels),
            template=PodTemplateSpec(metadata=ObjectMeta(labels=labels), spec=PodSpec(
                containers=[Container(name="c", image="registry.local/train:1",
                                      resources=ResourceRequirements(
                                          requests=requests, limits=requests))])))))
    client.create(PodDisruptionBudget(
        metadata=ObjectMeta(name="vf-user", namespace=WORK),
        spec=PodDisruptionBudgetSpec(maxUnavailable=1, selector=LabelSelector(
            matchLabels=labels))))
    # A pod without VFs: Drain_Required leaves it alone.
    client.create(Pod(metadata=ObjectMeta(name="bystander", namespace=WORK, labels={"app": "b"}),
                      spec=PodSpec(nodeName=NODES[0],
                                   containers=[Container(name="c", image="busybox")])))
    eventually(lambda: sum(p.status.phase == "Running" for p in client.list(Pod, namespace=WORK))
               == replicas + 1, 90, "the workload running")


def pod_uids(client: Client) -> set[str]:
    return {p.metadata.uid for p in client.list(Pod, namespace=WORK, labels={"app": "vf-user"})}


async def all_synced(rig: Rig, numvfs: int) -> bool:
    for name in NODES:
        if not await rig.synced(name, numvfs):
            return False
        state = await rig.state(name)
        ann = (state or {})["metadata"].get("annotations") or {}
        if (ann.get(DESIRED_STATE), ann.get(CURRENT_STATE)) != ("Idle", "Idle"):
            return False
    return True


async def none_cordoned(rig: Rig) -> bool:
    for name in NODES:
        node: Obj = await rig.api.get(NODE, name)
        if (node.get("spec") or {}).get("unschedulable"):
            return False
    return True


def planned(kubeconfig: Path, path: Path, change: Obj) -> tuple[int, Obj]:
    """`nicop plan -o json` of `change`, as a user runs it: its exit code and the plan."""
    path.write_text(yaml.safe_dump({**change, "apiVersion": "sriovnetwork.openshift.io/v1",
                                    "metadata": {**change["metadata"],
                                                 "namespace": OPERATOR_NS}}))
    proc = nicop_plan(kubeconfig, path, OPERATOR_NS, "-o", "json")
    assert proc.returncode in (0, 2), proc.stdout + proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_numvfs_change_drains_at_most_two_nodes_at_a_time(five: LocalCluster,
                                                           tmp_path: Path) -> None:
    """Also: `nicop plan` of each change says beforehand which nodes reconfigure their VFs,
    that each is drained (and, with disableDrain, that none is), and the pods each drain
    evicts: the VF users, never the bystander."""
    client: Client = five.client()
    resource = f"drain_vf_{uuid.uuid4().hex[:6]}"
    selector = ALL

    async def main() -> None:
        async with Rig(five.kubeconfig, OPERATOR_NS, NODES, plugin_poll=0.5) as rig:
            await rig.apply(operator_config(ALL))
            await rig.apply({"kind": "SriovNetworkPoolConfig", "metadata": {"name": "all"},
                             "spec": {"nodeSelector": {"matchLabels": ALL},
                                      "maxUnavailable": 2}})
            await rig.apply(policy("vfs", 8, [PF0], resource, selector))
            await until(lambda: all_synced(rig, 8), 120, "8 VFs on every node")
            for name in NODES:
                await until(lambda name=name: _equals(rig.allocatable(name, resource), "8"),
                            60, f"8 VFs allocatable on {name}")
            await asyncio.to_thread(workload, client, resource, 10)
            before = await asyncio.to_thread(pod_uids, client)
            code, plan = await asyncio.to_thread(planned, five.kubeconfig, tmp_path / "4.yaml",
                                                 policy("vfs", 4, [PF0], resource, selector))
            assert code == 2 and plan["requests"]["writes"] == 0, plan
            assert [v["node"] for v in plan["vfChanges"]] == NODES
            assert all(v["drain"] and not v["reboot"] and len(v["changes"]) == 1
                       and v["changes"][0].startswith(f"PF {PF0} (")
                       and v["changes"][0].endswith("numVfs 8 -> 4")
                       for v in plan["vfChanges"]), plan["vfChanges"]
            evicted = [p for v in plan["vfChanges"] for p in v["evicts"] + v["blocked"]]
            assert len(evicted) == 10 and all(p.startswith(f"{WORK}/vf-user-") for p in evicted)
            watch = CordonWatch(client)
            try:
                await rig.apply(policy("vfs", 4, [PF0], resource, selector))
                await until(lambda: all_synced(rig, 4), 240, "4 VFs on every node")
                await until(lambda: none_cordoned(rig), 30, "every node uncordoned")
            finally:
                watch.stop()
            assert 1 <= watch.max_cordoned <= 2, f"maxUnavailable 2: {watch.max_cordoned}"
            assert watch.ever == set(NODES), "each node is drained for its change"
            after = await asyncio.to_thread(pod_uids, client)
            assert before - after, "pods using VFs were evicted and replaced"
            bystander = await asyncio.to_thread(client.get, Pod, "bystander", namespace=WORK)
            assert bystander.metadata.uid is not None and bystander.status.phase == "Running", \
                "Drain_Required evicts only pods that use SR-IOV resources"
            for name in NODES:
                await until(lambda name=name: _equals(rig.allocatable(name, resource), "4"),
                            60, f"4 VFs allocatable on {name}")

            # disableDrain: the same kind of change happens without cordoning any node.
            await rig.apply(operator_config(ALL, disableDrain=True))
            code, plan = await asyncio.to_thread(planned, five.kubeconfig, tmp_path / "6.yaml",
                                                 policy("vfs", 6, [PF0], resource, selector))
            assert [v["node"] for v in plan["vfChanges"]] == NODES
            assert not any(v["drain"] or v["evicts"] for v in plan["vfChanges"])
            assert code == 2 and all("disableDrain" in line for line in plan["disruptive"])
            watch = CordonWatch(client)
            try:
                await rig.apply(policy("vfs", 6, [PF0], resource, selector))
                await until(lambda: all_synced(rig, 6), 120, "6 VFs on every node")
            finally:
                watch.stop()
            assert watch.max_cordoned == 0

    try:
        asyncio.run(main())
    finally:
        for kind, name in ((Deployment, "vf-user"), (PodDisruptionBudget, "vf-user"),
                           (Pod, "bystander")):
            delete(client, kind, name, WORK)
