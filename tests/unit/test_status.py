"""`nicop status` on a recorded cluster snapshot: what it reports, and that -o json keeps to the
documented schema."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from rich.console import Console
from typer.testing import CliRunner

from nicop import diagnose, status
from nicop.cli import app
from nicop.kube.resources import quantity

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs" / "status-schema.json").read_text())
NS = "nvidia-network-operator"
NOW = "2026-09-01T12:00:00Z"
VERSION = "doca3.5.0-26.07-0.7.0.0-0"
MOFED_WAIT = "network.nvidia.com/operator.mofed.wait"
UPGRADE = "nvidia.com/ofed-driver-upgrade-state"
NFD = "feature.node.kubernetes.io"
RDMA_CONFIG = json.dumps({"configList": [{"resourceName": "rdma", "resourcePrefix": "nvidia.com",
                                          "rdmaHcaMax": 63, "selectors": {"vendors": ["15b3"]}}]})
SRIOV_CONFIG = json.dumps({"resourceList": [{"resourceName": "cx6dx_vf",
                                             "resourcePrefix": "nvidia.com",
                                             "selectors": {"vendors": ["15b3"]}}]})

Obj = dict[str, Any]


def _node(name: str, os_version: str, labels: Obj, *, allocatable: Obj | None = None,
          annotations: Obj | None = None, taints: list[Obj] | None = None) -> Obj:
    resources = {"cpu": "128", "memory": "1Ti", "pods": "110", **(allocatable or {})}
    return {
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", f"{NFD}/system-os_release.ID": "ubuntu",
            f"{NFD}/system-os_release.VERSION_ID": os_version,
            f"{NFD}/kernel-version.full": "6.8.0-45-generic", **labels},
            "annotations": annotations or {}},
        "spec": {"taints": taints} if taints else {},
        "status": {"capacity": resources, "allocatable": resources,
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _pod(name: str, node: str | None, *, namespace: str = "default", labels: Obj | None = None,
         owner: str | None = None, requests: Obj | None = None, ready: bool = True,
         phase: str = "Running", container: str = "c", image: str = "busybox",
         container_state: Obj | None = None, restarts: int = 0,
         annotations: Obj | None = None, init_requests: Obj | None = None) -> Obj:
    meta: Obj = {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                 "labels": labels or {}, "annotations": annotations or {}}
    if owner:
        meta["ownerReferences"] = [{"kind": "DaemonSet", "name": owner, "controller": True}]
    spec: Obj = {"containers": [{"name": container, "image": image,
                                 "resources": {"requests": requests or {},
                                               "limits": requests or {}}}]}
    if init_requests:
        spec["initContainers"] = [{"name": "init", "image": image,
                                   "resources": {"requests": init_requests}}]
    if node:
        spec["nodeName"] = node
    return {
        "metadata": meta, "spec": spec,
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [] if phase == "Pending" else [{
                "name": container, "image": image, "ready": ready, "restartCount": restarts,
                "state": container_state or {"running": {}}}],
        },
    }


def _daemonset(name: str, state: str, node_selector: Obj) -> Obj:
    return {
        "metadata": {"name": name, "namespace": NS,
                     "labels": {"nvidia.network-operator.state": state}},
        "spec": {"template": {"spec": {
            "nodeSelector": {"kubernetes.io/os": "linux", **node_selector},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                             "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": MOFED_WAIT, "operator": "Exists"}]}]}}},
        }}},
    }


def _driver_image(os_version: str) -> str:
    return f"nvcr.io/nvidia/mellanox/doca-driver:{VERSION}-ubuntu{os_version}-amd64"


def cluster_snapshot() -> Obj:
    """A four-node cluster with the usual troubles: node-2's driver crash-loops (so its device
    plugins wait), node-3 is tainted so the RDMA plugin cannot run there and all its VFs are in
    use, node-4 has a ConnectX NIC that NFD labelled by class and vendor only."""
    managed = {f"{NFD}/pci-15b3.present": "true"}
    nodes = [
        _node("node-1", "22.04", {**managed, MOFED_WAIT: "false", UPGRADE: "upgrade-done"},
              allocatable={"nvidia.com/rdma": "63", "nvidia.com/gpu": "8"},
              annotations={"nicop.io/ipam-usage": json.dumps(
                  {"rdma-pool": {"allocated": 3, "size": 254}})}),
        _node("node-2", "24.04", {**managed, MOFED_WAIT: "true", UPGRADE: "upgrade-failed"},
              annotations={"nicop.io/ofed-driver-upgrade-failure":
                           "driver container restarted 11 times"}),
        _node("node-3", "24.04", {**managed, MOFED_WAIT: "false", UPGRADE: "upgrade-done"},
              allocatable={"nvidia.com/cx6dx_vf": "8"},
              annotations={"nicop.io/ipam-usage": json.dumps(
                  {"rdma-pool": {"allocated": 1, "size": 254}})},
              taints=[{"key": "example.com/dedicated", "value": "storage",
                       "effect": "NoSchedule"}]),
        _node("node-4", "24.04", {f"{NFD}/pci-0200_15b3.present": "true"}),
    ]
    driver = {"nvidia.com/ofed-driver": ""}
    pods = [
        _pod("nicop-operator-7d9f8", "node-1", namespace=NS,
             labels={"app.kubernetes.io/name": "network-operator"}),
        _pod("mofed-ubuntu22.04-ds-aaaaa", "node-1", namespace=NS, labels=driver,
             owner="mofed-ubuntu22.04-3f2a1b0c-ds", container="mofed-container",
             image=_driver_image("22.04")),
        _pod("mofed-ubuntu24.04-ds-bbbbb", "node-2", namespace=NS, labels=driver,
             owner="mofed-ubuntu24.04-3f2a1b0c-ds", container="mofed-container",
             image=_driver_image("24.04"), ready=False, restarts=4,
             container_state={"waiting": {"reason": "CrashLoopBackOff"}}),
        _pod("mofed-ubuntu24.04-ds-ccccc", "node-3", namespace=NS, labels=driver,
             owner="mofed-ubuntu24.04-3f2a1b0c-ds", container="mofed-container",
             image=_driver_image("24.04")),
        _pod("rdma-shared-dp-ds-11111", "node-1", namespace=NS, owner="rdma-shared-dp-ds",
             container="rdma-shared-dp"),
        _pod("network-operator-sriov-device-plugin-22222", "node-3", namespace=NS,
             owner="network-operator-sriov-device-plugin", container="kube-sriovdp"),
        _pod("network-operator-sriov-device-plugin-33333", "node-1", namespace=NS,
             owner="network-operator-sriov-device-plugin", container="kube-sriovdp"),
        _pod("train-0", "node-1", requests={"nvidia.com/rdma": "1", "nvidia.com/gpu": "8"},
             init_requests={"nvidia.com/rdma": "2"}),
        _pod("train-1", "node-1", requests={"nvidia.com/rdma": "1"}),
        _pod("done-0", "node-1", requests={"nvidia.com/rdma": "5"}, phase="Succeeded",
             ready=False),
        _pod("vf-user", "node-3", requests={"nvidia.com/cx6dx_vf": "8"}),
        _pod("bad-rdma", None, phase="Pending", ready=False,
             requests={"rdma/hca_shared_devices_b": "1"}),
        _pod("lost-net", "node-1",
             annotations={"k8s.v1.cni.cncf.io/networks": "missing-net, default/hostdev-net@net1"}),
    ]
    policy = {
        "metadata": {"name": "nic-cluster-policy", "generation": 2},
        "spec": {
            "ofedDriver": {"image": "doca-driver", "repository": "nvcr.io/nvidia/mellanox",
                           "version": VERSION, "upgradePolicy": {"autoUpgrade": True}},
            "rdmaSharedDevicePlugin": {"image": "k8s-rdma-shared-dev-plugin",
                                       "config": RDMA_CONFIG},
            "sriovDevicePlugin": {"image": "sriov-network-device-plugin",
                                  "config": SRIOV_CONFIG},
        },
        "status": {
            "state": "notReady", "observedGeneration": 2,
            "appliedStates": [
                {"name": "state-OFED", "state": "notReady",
                 "message": "DaemonSet nvidia-network-operator/mofed-ubuntu24.04-3f2a1b0c-ds: "
                            "1 of 2 pods available, 2 updated"},
                {"name": "state-SRIOV-device-plugin", "state": "ready"},
                {"name": "state-RDMA-device-plugin", "state": "ready"},
                {"name": "state-ib-kubernetes", "state": "ignore"},
            ],
            "conditions": [{"type": "Ready", "status": "False", "reason": "ComponentsNotReady",
                            "message": "not ready: state-OFED; node node-4 has a Mellanox NIC"}],
        },
    }
    node_state = {
        "metadata": {"name": "node-3", "namespace": NS},
        "spec": {"interfaces": [{"pciAddress": "0000:3b:00.0", "name": "ens1f0",
                                 "numVfs": 8}]},
        "status": {"syncStatus": "Succeeded", "lastSyncError": "", "interfaces": [
            {"pciAddress": "0000:3b:00.0", "name": "ens1f0", "totalvfs": 8,
             "Vfs": [{"pciAddress": f"0000:3b:00.{i + 2}", "vfID": i} for i in range(8)]}]},
    }
    pool = {
        "metadata": {"name": "rdma-pool", "namespace": NS},
        "spec": {"subnet": "192.168.0.0/16", "perNodeBlockSize": 254},
        "status": {"allocations": [
            {"nodeName": n, "startIP": f"192.168.{i}.1", "endIP": f"192.168.{i}.254"}
            for i, n in enumerate(("node-1", "node-2", "node-3"))]},
    }
    nad = {"metadata": {"name": "hostdev-net", "namespace": "default", "annotations": {
        "k8s.v1.cni.cncf.io/resourceName": "nvidia.com/cx6dx_vf"}}}
    event = {
        "type": "Warning", "reason": "FailedScheduling", "count": 3,
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "bad-rdma"},
        "lastTimestamp": "2026-09-01T11:59:00Z",
        # As kube-scheduler 1.3x words it, claims of dynamic resource allocation included.
        "message": "0/4 nodes are available: 4 Insufficient rdma/hca_shared_devices_b. no new "
                   "claims to deallocate, preemption: 0/4 nodes are available: 4 No preemption "
                   "victims found for incoming pod.",
    }
    return {
        "collectedAt": NOW, "namespace": NS,
        "lease": {"metadata": {"name": "12620820.mellanox.com", "namespace": NS},
                  "spec": {"holderIdentity": "nicop-operator-7d9f8",
                           "leaseDurationSeconds": 15,
                           "renewTime": "2026-09-01T11:59:57.000000Z"}},
        "nodes": nodes, "pods": pods, "policies": [policy],
        "daemonSets": [
            _daemonset("mofed-ubuntu22.04-3f2a1b0c-ds", "state-OFED",
                       {f"{NFD}/system-os_release.VERSION_ID": "22.04"}),
            _daemonset("mofed-ubuntu24.04-3f2a1b0c-ds", "state-OFED",
                       {f"{NFD}/system-os_release.VERSION_ID": "24.04"}),
            _daemonset("rdma-shared-dp-ds", "state-RDMA-device-plugin", {MOFED_WAIT: "false"}),
            _daemonset("network-operator-sriov-device-plugin", "state-SRIOV-device-plugin",
                       {MOFED_WAIT: "false"}),
        ],
        "nodeStates": [node_state], "ipPools": [pool], "cidrPools": [], "errors": [],
        "nads": [nad], "events": [event],
    }


def validate(document: Obj) -> None:
    errors = sorted(Draft202012Validator(SCHEMA).iter_errors(document), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def by_name(items: list[Obj]) -> dict[str, Obj]:
    return {i["name"]: i for i in items}


# ------------------------------------------------------------------ the schema


def test_the_schema_is_a_valid_draft_2020_12_schema_with_every_field_described() -> None:
    Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"

    undocumented = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for name, sub in (node.get("properties") or {}).items():
                if "description" not in sub:
                    undocumented.append(f"{path}.{name}")
            for key, sub in node.items():
                walk(sub, f"{path}.{key}")
        elif isinstance(node, list):
            for i, sub in enumerate(node):
                walk(sub, f"{path}[{i}]")

    walk(SCHEMA, "$")
    assert not undocumented


def test_json_output_of_a_troubled_cluster_validates_against_the_schema() -> None:
    summary = status.summarize(cluster_snapshot())
    validate(json.loads(json.dumps(summary)))


def test_json_output_of_an_empty_cluster_validates_too() -> None:
    snap = {"collectedAt": NOW, "namespace": NS, "lease": None, "nodes": [], "pods": [],
            "policies": [], "daemonSets": [], "nodeStates": [], "ipPools": [],
            "cidrPools": [], "errors": ["cannot list pods: 403 Forbidden: no"]}
    summary = status.summarize(snap)
    validate(summary)
    assert summary["policy"] is None and summary["operator"]["leader"] is None


def test_the_schema_rejects_what_it_does_not_document() -> None:
    summary = status.summarize(cluster_snapshot())
    summary["nodes"][0]["surprise"] = 1
    assert list(Draft202012Validator(SCHEMA).iter_errors(summary))


# ------------------------------------------------------------------ what the status says


def test_nodes_show_management_driver_version_readiness_and_upgrade_state() -> None:
    nodes = by_name(status.summarize(cluster_snapshot())["nodes"])
    assert nodes["node-1"]["managed"] and nodes["node-1"]["driver"]["version"] == VERSION
    assert nodes["node-1"]["driver"]["ready"] and nodes["node-1"]["mofedWait"] == "false"
    broken = nodes["node-2"]["driver"]
    assert not broken["ready"] and broken["restarts"] == 4
    assert broken["problem"] == "CrashLoopBackOff"
    assert nodes["node-2"]["upgradeState"] == "upgrade-failed"
    assert nodes["node-2"]["mofedWait"] == "true"
    # The missing-label pitfall: node-4 has the NIC but is not managed, and the fix is named.
    assert nodes["node-4"]["mellanoxNic"] and not nodes["node-4"]["managed"]
    assert "kubectl label node node-4 feature.node.kubernetes.io/pci-15b3.present=true" in \
        nodes["node-4"]["unmanagedReason"]
    assert nodes["node-4"]["driver"] is None


def test_resources_count_what_running_pods_request_as_the_scheduler_does() -> None:
    nodes = by_name(status.summarize(cluster_snapshot())["nodes"])
    rdma = by_name(nodes["node-1"]["resources"])
    # train-0 takes max(1, init 2) = 2, train-1 takes 1, the finished pod nothing.
    assert rdma["nvidia.com/rdma"] == {"name": "nvidia.com/rdma", "capacity": 63,
                                       "allocatable": 63, "inUse": 3}
    assert "nvidia.com/gpu" not in rdma  # the GPU operator's resource is not ours to show
    # Resources the policy configures show up, at 0, on managed nodes that lack them.
    assert by_name(nodes["node-2"]["resources"])["nvidia.com/rdma"]["allocatable"] == 0
    assert nodes["node-4"]["resources"] == []
    vfs = by_name(nodes["node-3"]["resources"])["nvidia.com/cx6dx_vf"]
    assert (vfs["allocatable"], vfs["inUse"]) == (8, 8)
    assert nodes["node-3"]["sriov"] == {"syncStatus": "Succeeded", "lastSyncError": None,
                                        "vfsConfigured": 8, "vfsWanted": 8,
                                        "servedBy": None}
    assert nodes["node-1"]["sriov"] is None


def test_each_node_says_whether_dra_or_the_device_plugin_serves_its_sriov_resources() -> None:
    """Labelled for the SR-IOV device plugin: device-plugin; with a DRA driver pod that serves
    SR-IOV resources (draDriver.sriovResources) on it: dra, in the table too."""
    snap = cluster_snapshot()
    node = next(n for n in snap["nodes"] if n["metadata"]["name"] == "node-3")
    node["metadata"]["labels"]["sriovnetwork.openshift.io/device-plugin"] = "Enabled"
    assert by_name(status.summarize(snap)["nodes"])["node-3"]["sriov"]["servedBy"] == (
        "device-plugin")
    node["metadata"]["labels"]["sriovnetwork.openshift.io/device-plugin"] = "Disabled"
    snap["pods"].append(_pod("nicop-dra-driver-ds-x1", "node-3", namespace=NS,
                             owner="nicop-dra-driver-ds", container="dra-plugin",
                             labels={"nicop.io/sriov-resources-by-dra": "true"}))
    summary = status.summarize(snap)
    validate(json.loads(json.dumps(summary)))
    assert by_name(summary["nodes"])["node-3"]["sriov"]["servedBy"] == "dra"
    console = Console(record=True, width=250)
    console.print(status.render(summary))
    assert "8/8 by DRA" in console.export_text()


def test_operator_leader_policy_components_pools_and_upgrade_progress() -> None:
    summary = status.summarize(cluster_snapshot())
    leader = summary["operator"]["leader"]
    assert leader["identity"] == "nicop-operator-7d9f8" and leader["active"]
    assert leader["secondsSinceRenewal"] == 3
    assert [p["name"] for p in summary["operator"]["pods"]] == ["nicop-operator-7d9f8"]
    assert summary["operator"]["pods"][0]["leader"]
    components = by_name(summary["policy"]["components"])
    assert components["state-OFED"]["state"] == "notReady"
    assert "1 of 2 pods available" in components["state-OFED"]["message"]
    pool = summary["ipamPools"][0]
    assert (pool["name"], pool["kind"], pool["allocated"], pool["size"]) == \
        ("rdma-pool", "IPPool", 4, 508)
    assert by_name(pool["nodes"])["node-2"]["allocated"] is None  # publishes no usage
    assert summary["driverUpgrade"] == {
        "done": 2, "inProgress": 0, "waiting": 0, "failed": 1,
        "failedNodes": [{"name": "node-2", "reason": "driver container restarted 11 times",
                         "attempts": 0}]}


def test_an_expired_lease_is_no_leader() -> None:
    snap = cluster_snapshot()
    snap["lease"]["spec"]["renewTime"] = "2026-09-01T11:58:00.000000Z"
    leader = status.summarize(snap)["operator"]["leader"]
    assert not leader["active"] and leader["secondsSinceRenewal"] == 120


def test_other_policy_names_are_listed_as_ignored() -> None:
    snap = cluster_snapshot()
    other = copy.deepcopy(snap["policies"][0])
    other["metadata"]["name"] = "my-policy"
    snap["policies"] = [other]
    summary = status.summarize(snap)
    assert summary["policy"] is None and summary["ignoredPolicies"] == ["my-policy"]


@pytest.mark.parametrize(("image", "version"), [
    (_driver_image("24.04"), VERSION),
    (f"nvcr.io/nvidia/mellanox/doca-driver:{VERSION}-6.8.0-45-generic-ubuntu24.04-amd64",
     VERSION),
    ("registry:5000/doca-driver@sha256:" + "a" * 64, "sha256:" + "a" * 64),
    ("doca-driver:custom", "custom"),
])
def test_driver_version_is_the_tag_without_what_the_operator_appends(image: str,
                                                                      version: str) -> None:
    node = cluster_snapshot()["nodes"][1]
    assert status.driver_version(image, node) == version


def test_quantities_and_requests() -> None:
    assert [quantity(q) for q in ("3", "1k", "2Ki", "x")] == [3, 1000, 2048, 0]
    pod = _pod("p", "n", requests={"rdma/a": "1"}, init_requests={"rdma/a": "4"})
    assert status.pod_requests(pod) == {"rdma/a": 4}


# ------------------------------------------------------------------ rendering and the command


def test_tables_show_the_unlabelled_node_with_its_fix_and_driver_versions() -> None:
    console = Console(record=True, width=250)
    console.print(status.render(status.summarize(cluster_snapshot())))
    text = console.export_text()
    assert "leader nicop-operator-7d9f8" in text
    assert VERSION in text and "CrashLoopBackOff" in text
    assert "kubectl label node node-4 feature.node.kubernetes.io/pci-15b3.present=true" in text
    assert "nvidia.com/rdma 63/3" in text and "8/8" in text
    assert "rdma-pool" in text and "failed: node-2: driver container restarted 11 times" in text
    assert ".driver-ready" in text  # says what "driver ready" stands for


def test_a_drain_that_cannot_finish_shows_the_pod_the_budget_and_the_timeout() -> None:
    """What the upgrade controller writes on a node whose drain an eviction refusal holds up,
    in the table and in `diagnose node`."""
    snap = cluster_snapshot()
    blocked = ("work/db-0 (The disruption budget db needs 1 healthy pods and has 1 currently); "
               "the drain times out at 2026-09-01T12:05:00Z")
    node = snap["nodes"][0]
    node["metadata"]["labels"][UPGRADE] = "drain-required"
    node["metadata"]["annotations"].update({
        "nicop.io/ofed-driver-upgrade-drain-start-time": "2026-09-01T12:00:00Z",
        "nicop.io/ofed-driver-upgrade-drain-blocked": blocked})
    console = Console(record=True, width=400)
    console.print(status.render(status.summarize(snap)))
    assert f"draining node-1 since 2026-09-01T12:00:00Z, cannot evict: {blocked}" in \
        console.export_text()
    checks = diagnose.diagnose(snap, diagnose.Target.parse("node", "node-1"))
    (check,) = [c for c in checks if c.name == "driver upgrade"]
    assert check.result == "warn" and blocked in check.message and "PodDisruptionBudget" in \
        check.fix


def test_the_command_explains_an_unreachable_api_server(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: "
        "'http://127.0.0.1:9'}}]\nusers: [{name: u, user: {}}]\ncontexts: [{name: x, "
        "context: {cluster: c, user: u}}]\ncurrent-context: x\n")
    result = CliRunner().invoke(app, ["status", "-o", "json", "--kubeconfig", str(kubeconfig)])
    assert result.exit_code == 1
    assert "cannot reach the API server" in result.output


def test_watch_is_for_tables_only() -> None:
    result = CliRunner().invoke(app, ["status", "--watch", "-o", "json"])
    assert result.exit_code == 1 and "--watch" in result.output


def test_watch_refreshes_until_interrupted(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = []

    def read_cluster(kubeconfig: Any, collect: Any, context: Any = None) -> Obj:
        reads.append(kubeconfig)
        return cluster_snapshot()

    sleeps = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(status, "read_cluster", read_cluster)
    monkeypatch.setattr("time.sleep", sleep)
    result = CliRunner().invoke(app, ["status", "--watch", "--interval", "5"])
    assert result.exit_code == 0, result.output
    assert len(reads) == 2 and sleeps == [5.0, 5.0]
    assert "node-4" in result.stdout


def test_yaml_output_is_the_json_document(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    monkeypatch.setattr(status, "read_cluster",
                        lambda kubeconfig, collect, context=None: cluster_snapshot())
    as_yaml = CliRunner().invoke(app, ["status", "-o", "yaml"])
    as_json = CliRunner().invoke(app, ["status", "-o", "json"])
    assert as_yaml.exit_code == as_json.exit_code == 0
    assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout)
