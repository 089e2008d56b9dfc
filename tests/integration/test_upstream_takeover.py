"""Moving from the upstream operator in place (docs/install.md, "Moving from the upstream
operator"): a cluster runs what upstream's operator rendered; its operator is gone (scaled to 0
or uninstalled keeping CRs and DaemonSets); nicop starts with the same NicClusterPolicy. Nothing
is deleted and created again, no driver pod restarts, the policy goes ready, and the next driver
version rolls out node by node through nicop's upgrade controller."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import ConfigMap, Namespace, Node, Pod, ServiceAccount
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding
from lightkube.types import PatchType
from tests.integration.agent_loop import ready
from tests.integration.operator_process import NAMESPACE, OperatorProcess, wait_for

NicClusterPolicy = create_global_resource(
    "mellanox.com", "v1alpha1", "NicClusterPolicy", "nicclusterpolicies")
NFD = "feature.node.kubernetes.io"
MOFED_WAIT = "network.nvidia.com/operator.mofed.wait"
UPGRADE_STATE = "nvidia.com/ofed-driver-upgrade-state"
STATE = "nvidia.network-operator.state"
INIT_IMAGE = "nvcr.io/nvidia/mellanox/network-operator-init-container:network-operator-v25.10.0"
VERSION = "doca3.5.0-26.07-0.7.0.0-0"
NEW_VERSION = "doca3.5.0-26.07-1.0.0.0-0"
RDMA_CONFIG = ('{"configList": [{"resourceName": "rdma", "resourcePrefix": "nvidia.com", '
               '"rdmaHcaMax": 63, "selectors": {"vendors": ["15b3"]}}]}')
POLICY: dict[str, Any] = {
    "apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
    "metadata": {"name": "nic-cluster-policy"},
    "spec": {
        "ofedDriver": {
            "image": "doca-driver", "repository": "nvcr.io/nvidia/mellanox", "version": VERSION,
            "upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": 1,
                              "drain": {"enable": True, "timeoutSeconds": 60,
                                        "deleteEmptyDir": True}},
        },
        "rdmaSharedDevicePlugin": {"image": "k8s-rdma-shared-dev-plugin",
                                   "repository": "ghcr.io/mellanox", "version": "v1.5.3",
                                   "config": RDMA_CONFIG},
    },
}


def fnv_safe(value: str) -> str:
    """apimachinery rand.SafeEncodeString(fmt.Sprint(fnv32a(value))), as upstream names pools."""
    h = 2166136261
    for byte in value.encode():
        h = ((h ^ byte) * 16777619) % 2**32
    return "".join("456789bcdf"[int(d)] for d in str(h))


def owner(policy: Any) -> list[dict[str, Any]]:
    return [{"apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
             "name": "nic-cluster-policy", "uid": policy.metadata.uid, "controller": True,
             "blockOwnerDeletion": True}]


def meta(name: str, state: str, refs: list[dict[str, Any]], labels: dict[str, str] | None = None,
         namespaced: bool = True) -> dict[str, Any]:
    """Upstream's metadata: the state label, ds-owner, the revision annotation and the policy as
    controller owner (Mellanox/network-operator pkg/state/state_skel.go)."""
    m: dict[str, Any] = {"name": name, "labels": {**(labels or {}), STATE: state,
                                                  "ds-owner": "NicClusterPolicy"},
                         "annotations": {"nvidia.network-operator.revision": "2813645717"},
                         "ownerReferences": refs}
    if namespaced:
        m["namespace"] = NAMESPACE
    return m


def upstream_driver_ds(refs: list[dict[str, Any]], os_id: str, os_version: str, kernel: str,
                       arch: str) -> dict[str, Any]:
    """A driver DaemonSet as upstream renders Mellanox/network-operator
    manifests/state-ofed-driver/0050_ofed-driver-ds.yaml with the init container on (its chart's
    default), no policy tolerations, pull secrets or resources, and the default probes."""
    app = f"mofed-{os_id}{os_version}-{fnv_safe(kernel)}"
    hostpaths: list[tuple[str, str, str, str | None]] = [
        ("run-mlnx-ofed", "/run/mellanox/drivers", "/run/mellanox/drivers", None),
        ("etc-network", "/etc/network", "/etc/network", None),
        ("host-etc", "/etc", "/host/etc", None),
        ("host-usr", "/usr", "/host/usr", None),
        ("host-udev", "/lib/udev", "/host/lib/udev", None),
        ("host-run-udev", "/run/udev", "/run/udev", None),
        ("host-lib-modules", "/lib/modules", "/host/lib/modules", None),
        ("drivers-inventory", "/var/opt/mofed-container/inventory", "/mnt/drivers-inventory",
         "DirectoryOrCreate"),
        ("host-ib-core", "/etc/modprobe.d/ib_core.conf", "/etc/modprobe.d/ib_core.conf",
         "FileOrCreate"),
        ("dev-infiniband", "/dev/infiniband", "/dev/infiniband", "DirectoryOrCreate"),
    ]
    mounts: list[dict[str, Any]] = [{"name": n, "mountPath": m} for n, _, m, _ in hostpaths]
    mounts[0]["mountPropagation"] = "Bidirectional"
    mounts[5]["readOnly"] = True
    volumes: list[dict[str, Any]] = [
        {"name": n, "hostPath": {"path": h, **({"type": t} if t else {})}}
        for n, h, _, t in hostpaths]
    volumes += [{"name": "host-proc", "hostPath": {"path": "/proc", "type": "Directory"}},
                {"name": "host-sys", "hostPath": {"path": "/sys", "type": "Directory"}}]

    def probe(command: str, delay: int, period: int, failures: int) -> dict[str, Any]:
        return {"exec": {"command": ["sh", "-c", command]}, "initialDelaySeconds": delay,
                "failureThreshold": failures, "successThreshold": 1, "timeoutSeconds": 10,
                "periodSeconds": period}

    node_name = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": meta(f"{app}-ds", "state-OFED", refs, {
            "app": app, "nvidia.com/ofed-driver": "", "mofed-ds-format-version": "1"}),
        "spec": {
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": {"app": app}},
            "template": {
                "metadata": {"labels": {"app": app, "kernel": kernel,
                                        "nvidia.com/ofed-driver": "",
                                        "ds-owner": "NicClusterPolicy"}},
                "spec": {
                    "priorityClassName": "system-node-critical",
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                     "effect": "NoSchedule"}],
                    "affinity": {"podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [{
                            "labelSelector": {"matchExpressions": [
                                {"key": "nvidia.com/ofed-driver", "operator": "Exists"}]},
                            "topologyKey": "kubernetes.io/hostname"}]}},
                    "serviceAccountName": "ofed-driver",
                    "hostNetwork": True,
                    "initContainers": [{
                        "name": "network-operator-init-container",
                        "imagePullPolicy": "IfNotPresent", "image": INIT_IMAGE,
                        "args": ["--node-name", "$(NODE_NAME)", "--configmap-name",
                                 "ofed-init-container-config", "--configmap-namespace",
                                 NAMESPACE, "--configmap-key", "config.json"],
                        "env": [node_name],
                        "volumeMounts": [
                            {"name": "host-proc", "mountPath": "/host/proc", "readOnly": True},
                            {"name": "host-sys", "mountPath": "/host/sys", "readOnly": True}],
                    }],
                    "containers": [{
                        "image": f"nvcr.io/nvidia/mellanox/doca-driver:{VERSION}-"
                                 f"{os_id}{os_version}-{arch}",
                        "imagePullPolicy": "IfNotPresent",
                        "name": "mofed-container",
                        "securityContext": {"privileged": True,
                                            "seLinuxOptions": {"level": "s0"}},
                        "env": [{"name": "CREATE_IFNAMES_UDEV", "value": "true"},
                                {"name": "NVIDIA_NIC_DRIVERS_INVENTORY_PATH",
                                 "value": "/mnt/drivers-inventory"}],
                        "volumeMounts": mounts,
                        "startupProbe": probe("ls /run/mellanox/drivers/.driver-ready",
                                              30, 10, 120),
                        "livenessProbe": probe("lsmod | grep mlx5_core", 10, 30, 1),
                        "readinessProbe": probe("lsmod | grep mlx5_core", 10, 30, 1),
                    }],
                    "terminationGracePeriodSeconds": 300,
                    "volumes": volumes,
                    "nodeSelector": {
                        f"{NFD}/pci-15b3.present": "true",
                        f"{NFD}/system-os_release.ID": os_id,
                        f"{NFD}/system-os_release.VERSION_ID": os_version,
                        f"{NFD}/kernel-version.full": kernel,
                    },
                },
            },
        },
    }


def upstream_objects(refs: list[dict[str, Any]], nodes: list[Node]) -> list[dict[str, Any]]:
    """What upstream's operator holds for POLICY on these nodes: manifests/state-ofed-driver/
    (ServiceAccount, ClusterRole, ClusterRoleBinding ofed-driver, ConfigMap
    ofed-init-container-config, one DaemonSet per OS and kernel) and
    manifests/state-rdma-shared-device-plugin/ (ConfigMap rdma-devices, DaemonSet
    rdma-shared-dp-ds selecting `app: rdma-shared-dp`)."""
    rbac = "rbac.authorization.k8s.io"
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": meta("ofed-driver", "state-OFED", refs)},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole",
         "metadata": meta("ofed-driver", "state-OFED", refs, namespaced=False),
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding",
         "metadata": meta("ofed-driver", "state-OFED", refs, namespaced=False),
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "ofed-driver"},
         "subjects": [{"kind": "ServiceAccount", "name": "ofed-driver",
                       "namespace": NAMESPACE}]},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": meta("ofed-init-container-config", "state-OFED", refs),
         "data": {"config.json": "{}"}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": meta("rdma-devices", "state-RDMA-device-plugin", refs),
         "data": {"config.json": RDMA_CONFIG}},
        {"apiVersion": "apps/v1", "kind": "DaemonSet",
         "metadata": meta("rdma-shared-dp-ds", "state-RDMA-device-plugin", refs),
         "spec": {
             "selector": {"matchLabels": {"app": "rdma-shared-dp"}},
             "template": {
                 "metadata": {"labels": {"app": "rdma-shared-dp",
                                         "ds-owner": "NicClusterPolicy"}},
                 "spec": {
                     "hostNetwork": True, "priorityClassName": "system-node-critical",
                     "nodeSelector": {f"{NFD}/pci-15b3.present": "true", MOFED_WAIT: "false"},
                     "containers": [{
                         "name": "rdma-shared-dp",
                         "image": "ghcr.io/mellanox/k8s-rdma-shared-dev-plugin:v1.5.2",
                         "securityContext": {"privileged": True}}]}}}},
    ]
    pools = {}
    for node in nodes:
        labels = node.metadata.labels or {}
        if labels.get(f"{NFD}/pci-15b3.present") != "true":
            continue
        key = (labels[f"{NFD}/system-os_release.ID"],
               labels[f"{NFD}/system-os_release.VERSION_ID"],
               labels[f"{NFD}/kernel-version.full"])
        pools.setdefault(key, labels.get("kubernetes.io/arch", "amd64"))
    assert len({os_version for _, os_version, _ in pools}) >= 2, pools  # two OS pools
    for (os_id, os_version, kernel), arch in sorted(pools.items()):
        objects.append(upstream_driver_ds(refs, os_id, os_version, kernel, arch))
    return objects


KINDS = {"ServiceAccount": ServiceAccount, "ClusterRole": ClusterRole,
         "ClusterRoleBinding": ClusterRoleBinding, "ConfigMap": ConfigMap,
         "DaemonSet": DaemonSet}


def get(client: Client, obj: dict[str, Any]) -> Any:
    m = obj["metadata"]
    return client.get(KINDS[obj["kind"]], m["name"], namespace=m.get("namespace"))


def driver_pods(client: Client) -> list[Pod]:
    return [p for p in client.list(Pod, namespace=NAMESPACE,
                                   labels={"nvidia.com/ofed-driver": None})
            if not p.metadata.deletionTimestamp]


def policy_status(client: Client) -> dict[str, Any]:
    return dict(client.get(NicClusterPolicy, "nic-cluster-policy").get("status") or {})


def apply_policy(client: Client, body: dict[str, Any]) -> Any:
    return client.apply(NicClusterPolicy(**body), field_manager="test", force=True)


def label_nodes(client: Client, nodes: list[str], labels: dict[str, str | None]) -> None:
    for name in nodes:
        client.patch(Node, name, {"metadata": {"labels": labels}}, patch_type=PatchType.MERGE)


@pytest.fixture
def upstream_install(client: Client, crds: list[str]) -> Iterator[list[dict[str, Any]]]:
    """The cluster as the upstream operator left it: the policy, its objects, driver pods
    ready on every NIC node, the nodes labelled mofed.wait=false and upgrade-done."""
    try:
        client.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    except ApiError as e:
        if e.status.code != 409:
            raise
    def labelled() -> list[Node]:  # NFD's labels, which the node stand-ins write on start
        nodes = list(client.list(Node))
        versions = {(n.metadata.labels or {}).get(f"{NFD}/system-os_release.VERSION_ID")
                    for n in nodes
                    if (n.metadata.labels or {}).get(f"{NFD}/pci-15b3.present") == "true"
                    and (n.metadata.labels or {}).get(f"{NFD}/kernel-version.full")}
        return nodes if len(versions - {None}) >= 2 else []

    nodes = wait_for(labelled, timeout=60, what="two OS pools of NIC nodes labelled")
    policy = apply_policy(client, POLICY)
    managed = [n.metadata.name for n in nodes
               if (n.metadata.labels or {}).get(f"{NFD}/pci-15b3.present") == "true"]
    label_nodes(client, managed, {MOFED_WAIT: "false", UPGRADE_STATE: "upgrade-done"})
    objects = upstream_objects(owner(policy), nodes)
    for obj in objects:
        client.create(KINDS[obj["kind"]].from_dict(obj) if hasattr(KINDS[obj["kind"]],
                                                                   "from_dict") else obj)
    wait_for(lambda: len(pods := driver_pods(client)) == len(managed) and all(map(ready, pods)),
             timeout=120, what="upstream's driver pods ready on every NIC node")
    yield objects
    client.delete(NicClusterPolicy, "nic-cluster-policy")
    wait_for(lambda: not [o for o in objects if exists(client, o)], timeout=120,
             what="the policy's objects collected")
    label_nodes(client, managed, {MOFED_WAIT: None, UPGRADE_STATE: None})


def exists(client: Client, obj: dict[str, Any]) -> bool:
    try:
        get(client, obj)
        return True
    except ApiError as e:
        if e.status.code == 404:
            return False
        raise


IN_PROGRESS = {"cordon-required", "wait-for-jobs-required", "pod-deletion-required",
               "drain-required", "pod-restart-required", "validation-required",
               "uncordon-required", "upgrade-failed"}


def test_nicop_takes_over_an_upstream_install_in_place(
        client: Client, kubeconfig: Path, tmp_path: Path,
        upstream_install: list[dict[str, Any]]) -> None:
    objects = upstream_install
    uids = {(o["kind"], o["metadata"]["name"]): get(client, o).metadata.uid for o in objects}
    drivers = [o for o in objects if "nvidia.com/ofed-driver" in o["metadata"]["labels"]]
    generations = {o["metadata"]["name"]: get(client, o).metadata.generation for o in drivers}
    pods_before = {p.metadata.uid: p.spec.nodeName for p in driver_pods(client)}

    # The upstream chart's default, which docs/install.md tells to keep.
    operator = OperatorProcess(kubeconfig, NAMESPACE, tmp_path / "operator.log",
                               env={"OFED_INIT_CONTAINER_IMAGE": INIT_IMAGE})
    try:
        operator.wait_ready()
        wait_for(lambda: policy_status(client).get("state") == "ready", timeout=180,
                 what="the policy to be ready on upstream's objects")
        # Every object is upstream's own, updated in place; nicop now manages it.
        for obj in objects:
            current = get(client, obj)
            assert current.metadata.uid == uids[obj["kind"], obj["metadata"]["name"]], obj
        # nicop's driver DaemonSets are upstream's to the field: not even a new generation.
        for obj in drivers:
            assert get(client, obj).metadata.generation == generations[obj["metadata"]["name"]]
        assert {p.metadata.uid: p.spec.nodeName for p in driver_pods(client)} == pods_before
        assert all(c.restartCount == 0 for p in driver_pods(client)
                   for c in p.status.containerStatuses or [])
        config = client.get(ConfigMap, "ofed-init-container-config", namespace=NAMESPACE)
        assert '"safeDriverLoad"' in config.data["config.json"]  # nicop's content, same object

        # The next version: one node at a time (maxParallelUpgrades 1), by nicop's controller.
        worst: list[int] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                states = [(n.metadata.labels or {}).get(UPGRADE_STATE) for n in client.list(Node)]
                worst.append(sum(s in IN_PROGRESS for s in states))
                time.sleep(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        bumped = copy.deepcopy(POLICY)
        bumped["spec"]["ofedDriver"]["version"] = NEW_VERSION
        try:
            apply_policy(client, bumped)

            def upgraded() -> bool:
                pods = driver_pods(client)
                return len(pods) == len(pods_before) and all(
                    NEW_VERSION in p.spec.containers[0].image and ready(p) for p in pods)

            wait_for(upgraded, timeout=300, what="every driver pod on the new version")
            wait_for(lambda: policy_status(client).get("state") == "ready", timeout=120,
                     what="the policy ready after the upgrade")
        finally:
            stop.set()
            sampler.join()
        assert max(worst) == 1, f"nodes upgrading at once: {max(worst)}"
        assert not set(pods_before) & {p.metadata.uid for p in driver_pods(client)}
        for obj in drivers:  # the same DaemonSets carried the new version
            assert get(client, obj).metadata.uid == uids["DaemonSet", obj["metadata"]["name"]]
    finally:
        operator.stop()
