"""`kubectl nicop` and `nicop bundle` against the real control plane with the operator and the
InfiniBand example policy: the plugin runs through kubectl itself, and the support archive holds
what support asks for first (the items of upstream's sosreport, scripts/sosreport/README.md in
Mellanox/network-operator), never a Secret value, and is still written when the user may read
only part of the cluster."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.generic_resource import create_global_resource
from lightkube.models.core_v1 import Container, EnvVar, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule, RoleRef, Subject
from lightkube.resources.core_v1 import (
    ConfigMap,
    Namespace,
    Node,
    Pod,
    Secret,
    ServiceAccount,
)
from lightkube.resources.rbac_authorization_v1 import (
    ClusterRole,
    ClusterRoleBinding,
    Role,
    RoleBinding,
)
from lightkube.types import PatchType
from tests import browser
from tests.eventually import eventually
from tests.integration.operator_process import NAMESPACE, OperatorProcess
from tests.integration.test_status_live import apply_example_policy, remove_policy
from tests.integration.test_status_live import state as policy_state

import nicop
from nicop.operator.crds import install_crds
from nicop_sim.cluster import running_cluster
from nicop_sim.replay import differences

BIN = Path(sys.executable).parent  # where the package installed nicop and kubectl-nicop
PLANTED_PASSWORD = "planted-ufm-password-7f3a"
PLANTED_TOKEN = "planted-token-9c1e.b4d2-e5f6"
PLANTED_ENV = "planted-env-token-0a8b"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
NicClusterPolicy = create_global_resource("mellanox.com", "v1alpha1", "NicClusterPolicy",
                                          "nicclusterpolicies")
IGNORED_POLICY = NicClusterPolicy(metadata=ObjectMeta(name="my-policy"), spec={})
LEFTOVER = "nvidia.com/rdma_leftover"


@pytest.fixture(scope="module")
def policy(client: Client, operator: OperatorProcess) -> Iterator[None]:
    apply_example_policy(client)
    yield
    remove_policy(client)


def kubectl(controlplane_bin: Path, *args: str,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """kubectl with nicop's install directory on PATH, where kubectl looks for plugins."""
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run([str(controlplane_bin / "kubectl"), *args], capture_output=True,
                          text=True, env={**os.environ, "PATH": path, **(env or {})},
                          timeout=300)


def bundle(kubeconfig: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "nicop"), "bundle", "-o", str(out), "--kubeconfig", str(kubeconfig),
         "-n", NAMESPACE, "--log-lines", "50"],
        capture_output=True, text=True, timeout=300)


def unpack(path: Path) -> dict[str, str]:
    with tarfile.open(path) as tar:
        return {m.name.split("/", 1)[1]: (tar.extractfile(m) or open(os.devnull, "rb"))
                .read().decode() for m in tar.getmembers()}


# ------------------------------------------------------------------ kubectl nicop


def test_kubectl_nicop_status_through_kubectl(
    controlplane_bin: Path, kubeconfig: Path, policy: None, tmp_path: Path
) -> None:
    assert (BIN / "kubectl-nicop").exists(), "the package installs kubectl-nicop"
    proc = kubectl(controlplane_bin, "nicop", "status", "-o", "json",
                   "--kubeconfig", str(kubeconfig), "-n", NAMESPACE)
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert document["policy"]["state"] == "ready"
    assert {n["name"] for n in document["nodes"]} == {"node-1", "node-2", "node-3", "node-4"}

    # $KUBECONFIG and --context as kubectl takes them: the file's current context is wrong.
    admin = yaml.safe_load(kubeconfig.read_text())
    good = admin["contexts"][0]
    admin["contexts"].append({"name": "elsewhere", "context": {
        **good["context"], "cluster": "nowhere"}})
    admin["clusters"].append({"name": "nowhere", "cluster": {"server": "https://127.0.0.1:9"}})
    admin["current-context"] = "elsewhere"
    two = tmp_path / "two-contexts"
    two.write_text(yaml.safe_dump(admin))
    wide = kubectl(controlplane_bin, "nicop", "status", "-o", "wide", "--context",
                   good["name"], "-n", NAMESPACE, env={"KUBECONFIG": str(two)})
    assert wide.returncode == 0, wide.stderr
    assert "nic-cluster-policy: ready" in wide.stdout
    assert "kubectl label node node-4 feature.node.kubernetes.io/pci-15b3.present=true" in \
        wide.stdout
    wrong = kubectl(controlplane_bin, "nicop", "status", "-n", NAMESPACE,
                    env={"KUBECONFIG": str(two)})
    assert wrong.returncode == 1 and "cannot reach the API server" in wrong.stderr

    # diagnose keeps its exit code through kubectl: node-4's unlabelled NIC fails.
    diagnose = kubectl(controlplane_bin, "nicop", "diagnose", "-o", "yaml",
                       "--kubeconfig", str(kubeconfig), "-n", NAMESPACE)
    assert diagnose.returncode == 1, diagnose.stderr
    assert yaml.safe_load(diagnose.stdout)["result"] == "fail"

    helped = kubectl(controlplane_bin, "nicop", "--help")
    assert helped.returncode == 0
    assert "kubectl nicop diagnose node worker-3" in helped.stdout
    assert "kubectl nicop plan -f nicclusterpolicy.yaml" in helped.stdout


# ------------------------------------------------------------------ nicop bundle


@pytest.fixture
def planted(client: Client) -> Iterator[None]:
    """A Secret, a ConfigMap holding a kubeconfig with a token, and a pod whose environment
    carries one, in the operator's namespace."""
    client.create(Secret(metadata=ObjectMeta(name="ufm-credentials", namespace=NAMESPACE),
                         stringData={"username": "admin", "password": PLANTED_PASSWORD}))
    client.create(ConfigMap(metadata=ObjectMeta(name="ufm-kubeconfig", namespace=NAMESPACE),
                            data={"kubeconfig": "users:\n- name: ufm\n  user:\n    token: "
                                                f"{PLANTED_TOKEN}\n"}))
    client.create(Pod(metadata=ObjectMeta(name="ufm-client", namespace=NAMESPACE),
                      spec=PodSpec(containers=[Container(
                          name="c", image="busybox",
                          env=[EnvVar(name="UFM_API_TOKEN", value=PLANTED_ENV)])])))
    yield
    client.delete(Secret, "ufm-credentials", namespace=NAMESPACE)
    client.delete(ConfigMap, "ufm-kubeconfig", namespace=NAMESPACE)
    client.delete(Pod, "ufm-client", namespace=NAMESPACE, grace_period=0)


@pytest.fixture
def faults(client: Client) -> Iterator[None]:
    """Two faults besides node-4's unlabelled NIC: a NicClusterPolicy the operator ignores for
    its name, and a pod that asks upstream's default RDMA resource, which nothing offers here."""
    client.apply(IGNORED_POLICY, field_manager="test")
    client.create(Pod(metadata=ObjectMeta(name="rdma-trainer", namespace="default"),
                      spec=PodSpec(containers=[Container(
                          name="c", image="registry.local/train:1",
                          resources=ResourceRequirements(requests={"rdma/hca": "1"},
                                                         limits={"rdma/hca": "1"}))])))
    yield
    client.delete(Pod, "rdma-trainer", namespace="default", grace_period=0)
    client.delete(NicClusterPolicy, "my-policy")


def test_the_bundle_holds_every_item_and_no_secret(
    kubeconfig: Path, policy: None, planted: None, faults: None, tmp_path: Path
) -> None:
    """Also its HTML page, in the archive and beside it: rendered by headless Chromium, it shows
    each of the three planted faults with its fix, logs nothing to the console, and (like every
    file) holds no planted secret. Its screenshot is left in test-artifacts/."""
    out = tmp_path / "support.tar.gz"
    proc = bundle(kubeconfig, out)
    assert proc.returncode == 0, proc.stderr
    assert "[1/7]" in proc.stderr and "[7/7] logs of" in proc.stderr  # progress, on stderr
    files = unpack(out)
    manifest = json.loads(files["manifest.json"])
    assert sorted(files) == manifest["files"]

    policies = {p["metadata"]["name"]: p for p in yaml.safe_load(
        files["resources/nicclusterpolicies.mellanox.com.yaml"])}
    assert policies["nic-cluster-policy"]["status"]["state"] == "ready"
    for kind in ("nicnodepolicies.mellanox.com", "sriovnetworknodestates.sriovnetwork."
                 "openshift.io", "sriovnetworknodepolicies.sriovnetwork.openshift.io",
                 "ippools.nv-ipam.nvidia.com", "cidrpools.nv-ipam.nvidia.com",
                 "network-attachment-definitions.k8s.cni.cncf.io"):
        assert isinstance(yaml.safe_load(files[f"resources/{kind}.yaml"]), list), kind
    daemonsets = yaml.safe_load(files[f"namespaces/{NAMESPACE}/daemonsets.yaml"])
    assert any(ds["metadata"]["name"] == "rdma-shared-dp-ds" for ds in daemonsets)
    assert isinstance(yaml.safe_load(files[f"namespaces/{NAMESPACE}/events.yaml"]), list)
    assert isinstance(yaml.safe_load(files["nodes/events.yaml"]), list)
    summary = {n["name"]: n for n in yaml.safe_load(files["nodes/summary.yaml"])}
    assert summary["node-1"]["labels"]["feature.node.kubernetes.io/pci-15b3.present"] == "true"
    assert "allocatable" in summary["node-1"] and not summary["node-4"]["managed"]
    assert json.loads(files["status.json"])["policy"]["state"] == "ready"
    assert json.loads(files["diagnose.json"])["result"] == "fail"  # node-4's unlabelled NIC
    assert "node node-4 has a Mellanox NIC" in files["diagnose.txt"]
    versions = yaml.safe_load(files["versions.yaml"])
    assert versions["nicop"] == nicop.__version__ and versions["kubernetes"].startswith("v1.")
    assert any("k8s-rdma-shared-dev-plugin" in image
               for images in versions["workloads"].values() for image in images.values())
    assert set(versions["drivers"]) == {"node-1", "node-2", "node-3"}

    # Logs: every container of the namespace is either in the archive or listed with why not.
    pods = yaml.safe_load(files[f"namespaces/{NAMESPACE}/pods.yaml"])
    missing = {m["item"]: m["reason"] for m in manifest["notCollected"]}
    for pod in pods:
        if not pod["spec"].get("nodeName"):
            continue
        name = pod["metadata"]["name"]
        for c in pod["spec"]["containers"]:
            item = f"log of {NAMESPACE}/{name} container {c['name']}"
            assert f"logs/{name}/{c['name']}.log" in files or missing.get(item), item
    # The operator runs outside the cluster here: the manifest says where its log is not.
    assert "runs outside the cluster" in missing["operator log"]

    # The Secret is listed by name, and no planted value is anywhere.
    secrets = yaml.safe_load(files[f"namespaces/{NAMESPACE}/secrets.yaml"])
    assert {"name": "ufm-credentials", "type": "Opaque", "keys": ["password", "username"]} in \
        secrets
    page = tmp_path / "support.html"
    assert page.read_text() == files["report.html"]
    for name, text in files.items():
        for value in (PLANTED_PASSWORD, PLANTED_TOKEN, PLANTED_ENV):
            assert value not in text, f"{value} in {name}"

    ARTIFACTS.mkdir(exist_ok=True)
    shown = browser.render(page, ARTIFACTS / "bundle-report.png")
    assert shown.console == [], shown.console
    text = html.unescape(re.sub(r"<[^>]+>", " ", shown.dom))
    for fault, fix in (
        ("node node-4 has a Mellanox NIC",
         "kubectl label node node-4 feature.node.kubernetes.io/pci-15b3.present=true"),
        ("NicClusterPolicy my-policy is ignored", "set metadata.name to nic-cluster-policy"),
        ("pod default/rdma-trainer is Pending", "nicop diagnose pod default/rdma-trainer"),
    ):
        assert fault in text and fix in text, (fault, fix)
    assert "node-3" in text and "state-OFED" in text  # the nodes and components


@pytest.fixture
def reader_kubeconfig(client: Client, controlplane_bin: Path, kubeconfig: Path,
                      tmp_path: Path) -> Iterator[Path]:
    """A ServiceAccount that may read nodes, NicClusterPolicies and the operator namespace's
    pods and DaemonSets, and nothing else (no Secrets, events, logs or other CRs)."""
    name = f"reader-{uuid.uuid4().hex[:6]}"
    client.create(ServiceAccount(metadata=ObjectMeta(name=name, namespace=NAMESPACE)))
    client.create(ClusterRole(metadata=ObjectMeta(name=name), rules=[
        PolicyRule(apiGroups=[""], resources=["nodes"], verbs=["get", "list"]),
        PolicyRule(apiGroups=["mellanox.com"], resources=["nicclusterpolicies"],
                   verbs=["get", "list"])]))
    client.create(ClusterRoleBinding(
        metadata=ObjectMeta(name=name),
        roleRef=RoleRef(apiGroup="rbac.authorization.k8s.io", kind="ClusterRole", name=name),
        subjects=[Subject(kind="ServiceAccount", name=name, namespace=NAMESPACE)]))
    client.create(Role(metadata=ObjectMeta(name=name, namespace=NAMESPACE), rules=[
        PolicyRule(apiGroups=[""], resources=["pods"], verbs=["get", "list"]),
        PolicyRule(apiGroups=["apps"], resources=["daemonsets"], verbs=["get", "list"])]))
    client.create(RoleBinding(
        metadata=ObjectMeta(name=name, namespace=NAMESPACE),
        roleRef=RoleRef(apiGroup="rbac.authorization.k8s.io", kind="Role", name=name),
        subjects=[Subject(kind="ServiceAccount", name=name, namespace=NAMESPACE)]))
    proc = subprocess.run([str(controlplane_bin / "kubectl"), "--kubeconfig", str(kubeconfig),
                           "create", "token", name, "-n", NAMESPACE, "--duration=1h"],
                          capture_output=True, text=True, check=True)
    admin = yaml.safe_load(kubeconfig.read_text())
    path = tmp_path / "reader.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": admin["clusters"],
        "users": [{"name": name, "user": {"token": proc.stdout.strip()}}],
        "contexts": [{"name": name, "context": {"cluster": admin["clusters"][0]["name"],
                                                "user": name}}],
        "current-context": name}))
    yield path
    client.delete(RoleBinding, name, namespace=NAMESPACE)
    client.delete(Role, name, namespace=NAMESPACE)
    client.delete(ClusterRoleBinding, name)
    client.delete(ClusterRole, name)
    client.delete(ServiceAccount, name, namespace=NAMESPACE)


def test_a_user_who_may_read_only_part_still_gets_a_bundle(
    reader_kubeconfig: Path, policy: None, tmp_path: Path
) -> None:
    out = tmp_path / "partial.tar.gz"
    proc = bundle(reader_kubeconfig, out)
    assert proc.returncode == 0, proc.stderr
    files = unpack(out)
    manifest = json.loads(files["manifest.json"])
    missing: dict[str, Any] = {m["item"]: m["reason"] for m in manifest["notCollected"]}
    for item in (f"list secrets in namespace {NAMESPACE}", f"list events in namespace "
                 f"{NAMESPACE}", f"list configmaps in namespace {NAMESPACE}",
                 "list ippools", "list sriovnetworknodestates"):
        assert item in missing and missing[item].startswith("403 Forbidden"), item
    assert any(item.startswith("log of ") and "403" in reason
               for item, reason in missing.items())
    assert "not collected: list secrets" in proc.stderr  # said at the end, too
    # What it may read is there.
    policies = {p["metadata"]["name"]: p for p in yaml.safe_load(
        files["resources/nicclusterpolicies.mellanox.com.yaml"])}
    assert policies["nic-cluster-policy"]["status"]["state"] == "ready"
    assert {n["name"] for n in yaml.safe_load(files["nodes/summary.yaml"])} == {
        "node-1", "node-2", "node-3", "node-4"}
    assert f"namespaces/{NAMESPACE}/daemonsets.yaml" in files
    assert json.loads(files["status.json"])["errors"]


# ------------------------------------------------------------------ nicop discover


def discover(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "nicop"), "discover", "--kubeconfig", str(kubeconfig), "-n", NAMESPACE,
         *args], capture_output=True, text=True, timeout=300)


def rdma_selectors(suggestion: str) -> dict[str, dict[str, Any]]:
    policy = next(d for d in yaml.safe_load_all(suggestion) if d["kind"] == "NicClusterPolicy")
    config = json.loads(policy["spec"]["rdmaSharedDevicePlugin"]["config"])
    return {r["resourceName"]: r["selectors"] for r in config["configList"]}


def test_discover_selects_a_nic_model_the_policy_misses_and_then_matches_what_runs(
    kubeconfig: Path, policy: None, client: Client, tmp_path: Path
) -> None:
    """The cluster's nodes: a DGX with ConnectX-7 InfiniBand ports (1021), two ConnectX-6 Dx
    Ethernet nodes (101d) and one more without NFD's label. The policy runs no agent that
    reports NICs (no SR-IOV daemon, no DRA plugin), so discovery pods of nicop's image ask the
    nodes (node-4 at least: earlier modules may have left another node's report). The
    InfiniBand example policy selects only 1021: the suggestion keeps that resource and adds
    101d as a RoCE resource, saying why; applied with --apply (its plan only restarts the
    plugin's pods), a second discover suggests the policy that runs, and its plan is empty."""
    first = discover(kubeconfig, "-o", str(tmp_path / "first.yaml"))
    assert first.returncode == 0, first.stderr
    # node-4 runs no agent; earlier modules may have left reports of other nodes
    assert re.search(r"asking \d nodes with a discovery pod: .*node-4", first.stderr)
    suggestion = (tmp_path / "first.yaml").read_text()
    notes = [line for line in suggestion.splitlines() if line.startswith("# ")]
    assert "# NIC model 15b3:1021 (infiniband): on 1 node (node-1)" in notes, notes
    assert "# NIC model 15b3:101d (ethernet): on 3 nodes (node-2, node-3, node-4)" in notes, notes
    assert "# 15b3:1021 (infiniband): already selected by RDMA resource rdma" in notes, notes
    selectors = rdma_selectors(suggestion)
    assert selectors["rdma"]["deviceIDs"] == ["1021"]
    assert selectors["rdma_roce"] == {"vendors": ["15b3"], "deviceIDs": ["101d"],
                                      "linkTypes": ["ethernet"]}
    assert not list(client.list(Pod, namespace=NAMESPACE,
                                labels={"app.kubernetes.io/name": "nicop-discover"}))

    applied = discover(kubeconfig, "--apply")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "Nothing disruptive." in applied.stdout and "applied" in applied.stdout
    assert "restart pods: DaemonSet nvidia-network-operator/rdma-shared-dp-ds" in applied.stdout

    again = discover(kubeconfig, "-o", str(tmp_path / "again.yaml"))
    assert again.returncode == 0, again.stderr
    assert rdma_selectors((tmp_path / "again.yaml").read_text()) == selectors
    plan = subprocess.run(
        [str(BIN / "nicop"), "plan", "-f", str(tmp_path / "again.yaml"), "-o", "json",
         "--kubeconfig", str(kubeconfig), "-n", NAMESPACE],
        capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    planned = json.loads(plan.stdout)
    assert [o["action"] for o in planned["objects"]] == ["unchanged"], planned["objects"]
    assert planned["operatorObjects"] == [] and planned["podRestarts"] == []
    assert planned["disruptive"] == []


# ------------------------------------------------------------------ nicop bundle replay


def test_bundle_replay_gives_a_cluster_whose_status_is_the_bundles(
    controlplane_bin: Path, tmp_path: Path
) -> None:
    """A bundle of a demo cluster of its own (this module's shared one carries what earlier
    modules left: SR-IOV node states of their rigs, slices): the InfiniBand example policy on a
    DGX, two ConnectX-6 Dx nodes and one whose NIC NFD has not labelled, and on node-2 the
    resource a plugin that ran once leaves in the node's capacity. Replayed: a second local
    cluster with those nodes, their labels, resources and simulated hardware, the policy, and
    the operator. Its `nicop status -o json` equals the bundle's apart from the fields the
    replay names (when it was read, the operator process, generated pod names, the policy's
    generation); what the bundle does not hold is said first."""
    out = tmp_path / "support.tar.gz"
    with running_cluster(tmp_path / "original", controlplane_bin, nodes=4) as original:
        client = original.client()
        install_crds(original.kubeconfig)
        client.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
        operator = OperatorProcess(original.kubeconfig, NAMESPACE, tmp_path / "operator.log")
        try:
            operator.wait_ready()
            apply_example_policy(client)
            client.patch(Node.Status, "node-2", {"status": {
                "capacity": {LEFTOVER: "4"}, "allocatable": {LEFTOVER: "4"}}},
                patch_type=PatchType.MERGE)
            eventually(lambda: policy_state(client) == "ready", 90, "the policy at rest")
            assert bundle(original.kubeconfig, out).returncode == 0
        finally:
            operator.stop()
    state = tmp_path / "replay"
    try:
        replayed = subprocess.run(
            [str(BIN / "nicop"), "bundle", "replay", str(out), "--state-dir", str(state),
             "--timeout", "150"], capture_output=True, text=True, timeout=400)
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
        assert replayed.stdout.startswith("Not in a bundle, so not replayed:\n  - workload pods")
        assert "The replay's status matches the bundle's (apart from collectedAt, operator, " \
               "policy.generation, policy.observedGeneration, nodes[].driver.pod)" in \
            replayed.stdout, replayed.stdout
        status = subprocess.run(
            [str(BIN / "nicop"), "status", "-o", "json", "--kubeconfig",
             str(state / "kubeconfig"), "-n", NAMESPACE], capture_output=True, text=True,
            timeout=60)
        assert status.returncode == 0, status.stderr
        bundled = json.loads(unpack(out)["status.json"])
        assert differences(bundled, json.loads(status.stdout)) == []
        nodes = {n["name"]: n for n in json.loads(status.stdout)["nodes"]}
        assert set(nodes) == {"node-1", "node-2", "node-3", "node-4"}
        assert {"name": LEFTOVER, "capacity": 4, "allocatable": 4, "inUse": 0} in \
            nodes["node-2"]["resources"]
    finally:
        subprocess.run([str(BIN / "nicop"), "cluster", "down", "--state-dir", str(state)],
                       capture_output=True, text=True, timeout=120)
