"""Moving from the upstream operator in place (docs/install.md, "Moving from the upstream
operator"), on the objects upstream's operator really created (tests/data/upstream-install: an
InfiniBand policy with nv-ipam on two OS pools). Its operator is gone; its objects, pods and IP
pools stay; nicop's CRDs and operator come, with the same NicClusterPolicy. Nothing is deleted
or created again, no pod is replaced and no driver reloaded, the policy goes ready, and the next
driver version rolls out node by node through nicop's upgrade controller. Deleting the policy
afterwards keeps the CRDs and every pool."""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.types import PatchType
from tests.eventually import eventually
from tests.integration.agent_loop import ready
from tests.integration.driver_upgrades import StateWatch
from tests.integration.operator_process import NAMESPACE, OperatorProcess

from nicop.operator.crds import install_crds

INSTALL = Path(__file__).parent.parent / "data" / "upstream-install"
NicClusterPolicy = create_global_resource(
    "mellanox.com", "v1alpha1", "NicClusterPolicy", "nicclusterpolicies")
IPPool = create_namespaced_resource("nv-ipam.nvidia.com", "v1alpha1", "IPPool", "ippools")
CIDRPool = create_namespaced_resource("nv-ipam.nvidia.com", "v1alpha1", "CIDRPool", "cidrpools")
NFD = "feature.node.kubernetes.io"
MOFED_WAIT = "network.nvidia.com/operator.mofed.wait"
UPGRADE_STATE = "nvidia.com/ofed-driver-upgrade-state"
STATE = "nvidia.network-operator.state"
DRIVER = "nvidia.com/ofed-driver"
REVISION = "deployment.kubernetes.io/revision"
UPSTREAM_MANAGER = "network-operator"  # upstream's operator writes as its own field manager
NEW_VERSION = "doca3.5.0-26.07-1.0.0.0-0"
IN_PROGRESS = {"cordon-required", "wait-for-jobs-required", "pod-deletion-required",
               "drain-required", "pod-restart-required", "validation-required",
               "uncordon-required", "upgrade-failed"}


def policy_body() -> dict[str, Any]:
    return dict(yaml.safe_load((INSTALL / "nicclusterpolicy.yaml").read_text()))


def upstream_objects(policy_uid: str) -> list[dict[str, Any]]:
    """The install's objects, their owner references pointing at this cluster's policy."""
    objects = []
    for path in sorted((INSTALL / "objects").iterdir()):
        obj = yaml.safe_load(path.read_text())
        for ref in obj["metadata"].get("ownerReferences") or []:
            ref["uid"] = policy_uid
        objects.append(obj)
    return objects


def key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def live(client: Client, obj: dict[str, Any]) -> Any:
    m = obj["metadata"]
    return client.get(type(from_dict(obj)), m["name"], namespace=m.get("namespace"))


def exists(client: Client, obj: dict[str, Any]) -> bool:
    try:
        live(client, obj)
        return True
    except ApiError as e:
        if e.status.code == 404:
            return False
        raise


def workload_pods(client: Client) -> dict[str, Pod]:
    """Every pod of the install, by UID."""
    return {p.metadata.uid: p for p in client.list(Pod, namespace=NAMESPACE)
            if not p.metadata.deletionTimestamp}


def driver_pods(client: Client) -> list[Pod]:
    return [p for p in workload_pods(client).values() if DRIVER in (p.metadata.labels or {})]


def policy_state(client: Client) -> str | None:
    return (client.get(NicClusterPolicy, "nic-cluster-policy").get("status") or {}).get("state")


def apply_policy(client: Client, body: dict[str, Any]) -> Any:
    return client.apply(NicClusterPolicy(**body), field_manager="test", force=True)


def block(first: str, size: int, index: int) -> tuple[str, str]:
    start = ipaddress.ip_address(first) + index * size
    return str(start), str(start + size - 1)


def pools(node_names: list[str]) -> list[Any]:
    """An IPPool and a CIDRPool with a block and a prefix for every node, in an order nv-ipam's
    controller could have left (not the one a fresh carve gives), so a re-carve would show."""
    order = list(reversed(node_names))
    ip_allocations = [{"nodeName": n, "startIP": block("192.168.0.1", 100, i)[0],
                       "endIP": block("192.168.0.1", 100, i)[1]} for i, n in enumerate(order)]
    cidr_allocations = [{"nodeName": n, "prefix": f"10.10.{i + 5}.0/24",
                         "gateway": f"10.10.{i + 5}.1"} for i, n in enumerate(order)]
    return [
        IPPool(metadata=ObjectMeta(name="pool1", namespace=NAMESPACE),
               spec={"subnet": "192.168.0.0/16", "perNodeBlockSize": 100,
                     "gateway": "192.168.0.1"},
               status={"allocations": ip_allocations}),
        CIDRPool(metadata=ObjectMeta(name="pool2", namespace=NAMESPACE),
                 spec={"cidr": "10.10.0.0/16", "gatewayIndex": 1, "perNodeNetworkPrefix": 24},
                 status={"allocations": cidr_allocations}),
    ]


def allocations(client: Client) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each pool's UID and what each node holds of it (the list's order means nothing)."""
    return {f"{p.kind}/{p.metadata.name}": (p.metadata.uid, {
        a["nodeName"]: {k: v for k, v in a.items() if k != "nodeName"}
        for a in p.status["allocations"]})
        for kind in (IPPool, CIDRPool) for p in client.list(kind, namespace=NAMESPACE)}


@pytest.fixture
def upstream_install(client: Client, crds: list[str]) -> Iterator[list[dict[str, Any]]]:
    """The cluster as the upstream operator leaves it: its policy, every object it created
    (written by its field manager), pods ready from them, nodes labelled mofed.wait=false and
    upgrade-done, and two IP pools with allocations."""
    try:
        client.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    except ApiError as e:
        if e.status.code != 409:
            raise
    nodes = [n for n in client.list(Node)
             if (n.metadata.labels or {}).get(f"{NFD}/pci-15b3.present") == "true"]
    managed = [n.metadata.name for n in nodes]
    policy = apply_policy(client, policy_body())
    objects = upstream_objects(policy.metadata.uid)
    for obj in objects:  # the nv-ipam CRDs exist (nicop's): upstream's state applied them over
        client.apply(from_dict(obj), field_manager=UPSTREAM_MANAGER, force=True)
    for node in managed:
        client.patch(Node, node, {"metadata": {"labels": {
            MOFED_WAIT: "false", UPGRADE_STATE: "upgrade-done"}}}, patch_type=PatchType.MERGE)
    for pool in pools(sorted(n.metadata.name for n in client.list(Node))):
        client.create(pool)
        client.patch(type(pool).Status, pool.metadata.name, {"status": pool.status},
                     namespace=NAMESPACE, patch_type=PatchType.MERGE,
                     field_manager=UPSTREAM_MANAGER)

    def settled() -> bool:
        for obj in objects:
            if obj["kind"] == "DaemonSet":
                s = live(client, obj).status
                if not s or not s.desiredNumberScheduled or s.numberReady != \
                        s.desiredNumberScheduled:
                    return False
            elif obj["kind"] == "Deployment":
                s = live(client, obj).status
                if not s or (s.readyReplicas or 0) != live(client, obj).spec.replicas:
                    return False
        return True

    eventually(settled, timeout=180, what="upstream's pods ready on every node")
    try:
        yield objects
    finally:
        # Should a check have failed before the policy was deleted: the CRDs stay with the
        # cluster (other tests use them), whoever owns them.
        for name in ("ippools.nv-ipam.nvidia.com", "cidrpools.nv-ipam.nvidia.com"):
            client.patch(CustomResourceDefinition, name, {"metadata": {
                "ownerReferences": None}}, patch_type=PatchType.MERGE)
        try:
            client.delete(NicClusterPolicy, "nic-cluster-policy")
        except ApiError as e:
            if e.status.code != 404:
                raise
        for kind, name in ((IPPool, "pool1"), (CIDRPool, "pool2")):
            try:
                client.delete(kind, name, namespace=NAMESPACE)
            except ApiError as e:
                if e.status.code != 404:
                    raise
        eventually(lambda: not [o for o in objects if o["kind"] != "CustomResourceDefinition"
                              and exists(client, o)], timeout=120,
                   what="the policy's objects collected")
        for node in managed:
            client.patch(Node, node, {"metadata": {"labels": {
                MOFED_WAIT: None, UPGRADE_STATE: None}}}, patch_type=PatchType.MERGE)


def test_nicop_takes_over_a_real_upstream_install_in_place(
        client: Client, kubeconfig: Path, tmp_path: Path,
        upstream_install: list[dict[str, Any]]) -> None:
    objects = upstream_install
    before = {key(o): live(client, o).metadata for o in objects}
    pods_before = {uid: (p.spec.nodeName, p.metadata.labels.get("app") or
                         p.metadata.labels.get("name")) for uid, p in workload_pods(client).items()}
    pools_before = allocations(client)
    assert len(pods_before) >= 10 and len(pools_before) == 2
    # The procedure: nicop's CRDs over upstream's (its chart or `nicop crds install`), then
    # its operator with the chart's driver init container (upstream's default).
    install_crds(kubeconfig)
    init_image = next(c["image"] for o in objects if key(o)[1].startswith("mofed-")
                      for c in o["spec"]["template"]["spec"]["initContainers"])
    states = StateWatch(client).started()
    operator = OperatorProcess(kubeconfig, NAMESPACE, tmp_path / "operator.log",
                               env={"OFED_INIT_CONTAINER_IMAGE": init_image})
    try:
        operator.wait_ready()
        eventually(lambda: policy_state(client) == "ready", timeout=180,
                   what="the policy to be ready on upstream's objects")
        # The two CRDs upstream's nv-ipam state made are adopted as nicop's: not the state's,
        # not owned by the policy.
        eventually(lambda: all(not c.metadata.ownerReferences and STATE not in (
            c.metadata.labels or {}) for c in (live(client, o) for o in objects
                                               if o["kind"] == "CustomResourceDefinition")),
                   timeout=30, what="the nv-ipam CRDs adopted")
        for obj in objects:  # every object upstream's, kept; no workload template rewritten
            meta = live(client, obj).metadata
            assert meta.uid == before[key(obj)].uid, key(obj)
            if obj["kind"] == "DaemonSet":  # a new generation would be a new template
                assert meta.generation == before[key(obj)].generation, key(obj)
            elif obj["kind"] == "Deployment":  # a new template would be a new ReplicaSet
                eventually(lambda o=obj: live(client, o).status.observedGeneration ==
                           live(client, o).metadata.generation, timeout=30,
                           what=f"{key(obj)} observed")
                assert meta.annotations[REVISION] == before[key(obj)].annotations[REVISION]
        assert allocations(client) == pools_before
        pods = workload_pods(client)
        assert set(pods) == set(pods_before)
        assert all(c.restartCount == 0 for p in pods.values()
                   for c in p.status.containerStatuses or [])

        # Someone edits a driver DaemonSet's template in form only (a label, an annotation, a
        # probe): no node reloads its driver; its pods count as current.
        driver_ds = next(o for o in objects if key(o)[1].startswith("mofed-ubuntu22.04"))
        client.patch(DaemonSet, driver_ds["metadata"]["name"], [
            {"op": "add", "path": "/spec/template/metadata/labels/team", "value": "infra"},
            {"op": "add", "path": "/spec/template/metadata/annotations",
             "value": {"example.com/owner": "infra"}},
            {"op": "replace", "path": "/spec/template/spec/containers/0/livenessProbe/"
                                      "periodSeconds", "value": 60}],
            namespace=NAMESPACE, patch_type=PatchType.JSON)

        def counted_current() -> bool:
            s = live(client, driver_ds).status
            return bool(s.desiredNumberScheduled and s.observedGeneration ==
                        live(client, driver_ds).metadata.generation and
                        s.updatedNumberScheduled == s.desiredNumberScheduled)

        eventually(counted_current, timeout=60, what="the driver pods counted current")
        eventually(lambda: policy_state(client) == "ready", timeout=60,
                   what="the policy ready after the edit")
        assert set(workload_pods(client)) == set(pods_before)
        seen = states.stop()
        assert {n: s for n, s in seen.items() if set(s) - {"upgrade-done", None}} == {}, \
            "a node left upgrade-done during the takeover"

        # The next version: node by node, at most maxParallelUpgrades (2) at a time.
        states = StateWatch(client).started()
        bumped = copy.deepcopy(policy_body())
        bumped["spec"]["ofedDriver"]["version"] = NEW_VERSION
        apply_policy(client, bumped)
        drivers_before = {p.metadata.uid for p in driver_pods(client)}

        def upgraded() -> bool:
            pods = driver_pods(client)
            return len(pods) == len(drivers_before) and all(
                NEW_VERSION in p.spec.containers[0].image and ready(p) for p in pods)

        eventually(upgraded, timeout=300, what="every driver pod on the new version")
        eventually(lambda: policy_state(client) == "ready", timeout=120,
                   what="the policy ready after the upgrade")
        seen = states.stop()
        assert not drivers_before & {p.metadata.uid for p in driver_pods(client)}
        assert all("upgrade-done" in s and set(s) & IN_PROGRESS for n, s in seen.items()
                   if n in {p.spec.nodeName for p in driver_pods(client)}), seen
        assert 1 <= states.most_in_progress <= 2, \
            f"nodes upgrading at once: {states.most_in_progress}"
        for obj in objects:  # the same DaemonSets carried the new version
            assert live(client, obj).metadata.uid == before[key(obj)].uid

        # Deleting the policy removes what it rendered; the CRDs and every pool stay.
        client.delete(NicClusterPolicy, "nic-cluster-policy")
        eventually(lambda: not any(exists(client, o) for o in objects
                                 if o["kind"] in ("DaemonSet", "Deployment")),
                   timeout=120, what="the policy's workloads collected")
        for obj in objects:
            if obj["kind"] == "CustomResourceDefinition":
                assert live(client, obj).metadata.uid == before[key(obj)].uid
        assert {k: v[1] for k, v in allocations(client).items()} == {
            k: v[1] for k, v in pools_before.items()}
    finally:
        operator.stop()
