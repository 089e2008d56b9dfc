"""What the driver upgrade modules share: a cluster of their own whose nodes kwok plays (upstream's
driver images), the operator with the clean-up that leaves every node uncordoned and unlabelled,
and the workloads a drain has to move."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource
from lightkube.models.apps_v1 import DeploymentSpec
from lightkube.models.core_v1 import Container, PodSpec, PodTemplateSpec
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.models.policy_v1 import PodDisruptionBudgetSpec
from lightkube.resources.apps_v1 import DaemonSet, Deployment
from lightkube.resources.core_v1 import Namespace, Node, Pod, ServiceAccount
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import CascadeType, PatchType
from tests.eventually import eventually
from tests.integration.operator_process import NAMESPACE, OperatorProcess

from nicop.api.upgrade import HOLDS_SLOT
from nicop.operator.crds import install_crds
from nicop_sim.cluster import LocalCluster, running_cluster

STATE = "nvidia.com/ofed-driver-upgrade-state"
WORK = "work"
NicClusterPolicy = create_global_resource(
    "mellanox.com", "v1alpha1", "NicClusterPolicy", "nicclusterpolicies"
)


@contextlib.contextmanager
def driver_cluster(path: Path, controlplane_bin: Path, nodes: int,
                   profiles: list[str]) -> Iterator[tuple[LocalCluster, Client]]:
    """A control plane with `nodes` nodes, the CRDs, the operator's namespace and `work`."""
    with running_cluster(path, controlplane_bin, nodes=nodes, profiles=profiles,
                         node_agents=False) as cluster:  # upstream's images: kwok plays all
        client: Client = cluster.client()
        install_crds(cluster.kubeconfig)
        client.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
        client.create(Namespace(metadata=ObjectMeta(name=WORK)))
        eventually(lambda: _exists(client, ServiceAccount, "default", WORK), 30,
                   "the default service account of namespace work")
        yield cluster, client


@contextlib.contextmanager
def upgrade_operator(cluster: LocalCluster, client: Client, log: Path,
                     env: dict[str, str] | None = None) -> Iterator[OperatorProcess]:
    """The operator (`env`: its settings); afterwards no policy, workload, driver pod, cordon or
    upgrade label is left for the next test."""
    proc = OperatorProcess(cluster.kubeconfig, NAMESPACE, log, env=env)
    try:
        proc.wait_ready()
        yield proc
    finally:  # also after a failed test: no operator outlives it, the next test starts clean
        proc.stop()
        clean_up(client)


def clean_up(client: Client) -> None:
    """No policy, workload, driver pod, cordon or upgrade label left."""
    with contextlib.suppress(ApiError):
        client.delete(NicClusterPolicy, "nic-cluster-policy")
    for d in client.list(Deployment, namespace=WORK):
        client.delete(Deployment, d.metadata.name, namespace=WORK)
    for p in client.list(PodDisruptionBudget, namespace=WORK):
        client.delete(PodDisruptionBudget, p.metadata.name, namespace=WORK)
    # Not left to the garbage collector: it finds the dependents of a deleted custom resource
    # half a minute later, which every test of a module paid (and may be just done: gone).
    for ds in client.list(DaemonSet, namespace=NAMESPACE):
        with contextlib.suppress(ApiError):
            client.delete(DaemonSet, ds.metadata.name, namespace=NAMESPACE,
                          cascade=CascadeType.BACKGROUND)
    for pod in client.list(Pod, namespace=NAMESPACE):
        with contextlib.suppress(ApiError):
            client.delete(Pod, pod.metadata.name, namespace=NAMESPACE, grace_period=0)
    eventually(lambda: not list(client.list(Pod, namespace=NAMESPACE)), 60, "driver pods gone")
    for node in client.list(Node):
        if node.spec.unschedulable or STATE in (node.metadata.labels or {}):
            client.patch(Node, node.metadata.name, {"spec": {"unschedulable": None},
                                                    "metadata": {"labels": {STATE: None}}})


def deployment(client: Client, name: str, replicas: int, image: str,
               node: str | None = None) -> dict[str, str]:
    """A Deployment of `replicas` pods in `work` (on `node` if given); its pods' labels."""
    labels = {"app": name}
    client.create(Deployment(
        metadata=ObjectMeta(name=name, namespace=WORK),
        spec=DeploymentSpec(
            replicas=replicas, selector=LabelSelector(matchLabels=labels),
            template=PodTemplateSpec(metadata=ObjectMeta(labels=labels), spec=PodSpec(
                nodeSelector={"kubernetes.io/hostname": node} if node else None,
                containers=[Container(name="c", image=image)])))))
    return labels


def budget(client: Client, name: str, labels: dict[str, str], **spec: int) -> None:
    """A PodDisruptionBudget over `labels` (minAvailable=... or maxUnavailable=...)."""
    client.create(PodDisruptionBudget(
        metadata=ObjectMeta(name=name, namespace=WORK),
        spec=PodDisruptionBudgetSpec(selector=LabelSelector(matchLabels=labels), **spec)))


def wait_running(client: Client, count: int) -> None:
    eventually(lambda: [p.status.phase for p in client.list(Pod, namespace=WORK)]
               == ["Running"] * count, 60, f"{count} workload pods running")


def states(client: Client) -> dict[str, str | None]:
    """Each node's driver upgrade state label."""
    return {n.metadata.name: (n.metadata.labels or {}).get(STATE) for n in client.list(Node)}


def _exists(client: Client, kind: type, name: str, namespace: str) -> bool:
    try:
        client.get(kind, name, namespace=namespace)
    except ApiError:
        return False
    return True


class StateWatch:
    """Every upgrade state a node shows while it runs, in the order the API server wrote them
    (one watch stream is ordered by resourceVersion), so a node that went through an upgrade
    and back in between two looks is still seen, and the most nodes in progress at once is
    known. Its failure fails the test."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.seen: dict[str, list[str | None]] = {}
        self.most_in_progress = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        current: dict[str, str | None] = {}
        try:
            for _, node in self.client.watch(Node):
                state = (node.metadata.labels or {}).get(STATE)
                current[node.metadata.name] = state
                states = self.seen.setdefault(node.metadata.name, [])
                if not states or states[-1] != state:
                    states.append(state)
                self.most_in_progress = max(self.most_in_progress,
                                            sum(s in HOLDS_SLOT for s in current.values()))
                if self._stop.is_set():
                    return
        except BaseException as e:  # reported by stop()
            self.error = e

    def started(self) -> StateWatch:
        """Once the watch has told every node as it is now."""
        count = len(list(self.client.list(Node)))
        eventually(lambda: len(self.seen) >= count or self.error, timeout=30,
                   what="the node watch to start")
        return self

    def stop(self) -> dict[str, list[str | None]]:
        self._stop.set()
        # One write wakes the watch so it sees the stop; the annotation means nothing.
        wake = next(iter(self.client.list(Node))).metadata.name
        self.client.patch(Node, wake, {"metadata": {"annotations": {
            "test.nicop.io/wake": str(id(self))}}}, patch_type=PatchType.MERGE)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the node watch did not stop"
        assert self.error is None, f"the node watch failed: {self.error!r}"
        return self.seen
