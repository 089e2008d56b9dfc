"""nicop on a real node: the operator's DaemonSets run as containers a real kubelet started
through containerd and runc (nicop_sim.realnode), on a ConnectX-6 Dx whose hardware is
simulated. What a user checks on a node, checked here: the kubelet's probes, the allocatable it
writes, devices inside a workload's container, restarts after a crash, device plugins after a
kubelet restart, and a machine left as it was when the cluster goes."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node, Pod
from tests.integration.operator_process import NAMESPACE, OperatorProcess, wait_for

from nicop.api.install import install_crds
from nicop_sim.cluster import LocalCluster, running_cluster

ROOT = Path(__file__).resolve().parent.parent.parent
NODE = "real-1"
RESOURCE = "nvidia.com/rdma_roce"  # the ConnectX-6 Dx's pool in the demo policy
NicClusterPolicy = create_global_resource(
    "mellanox.com", "v1alpha1", "NicClusterPolicy", "nicclusterpolicies")


def policy() -> dict[str, Any]:
    """The demo's policy with nicop's image for every component it has (no secondary
    network yet)."""
    body = yaml.safe_load((ROOT / "examples/nicclusterpolicy-demo.yaml").read_text())
    del body["spec"]["secondaryNetwork"]
    return dict(body)


def kubectl(cluster: LocalCluster, *args: str, timeout: float = 60) -> str:
    done = subprocess.run([str(cluster.bin_dir / "kubectl"), "--kubeconfig",
                           str(cluster.kubeconfig), *args], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


def pods_on(client: Client, node: str, namespace: str = NAMESPACE) -> list[Pod]:
    return [p for p in client.list(Pod, namespace=namespace, fields={"spec.nodeName": node})
            if not p.metadata.deletionTimestamp]


def ready(pod: Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def allocatable(client: Client, resource: str = RESOURCE) -> str | None:
    return (client.get(Node, NODE).status.allocatable or {}).get(resource)


def plugin_registrations(address: str) -> float:
    """What nicop's RDMA plugin on the real node counts of its kubelet registrations (its
    /metrics on the pod's address: the node's, reached over the node's veth)."""
    with urllib.request.urlopen(f"http://{address}:9531/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.search(r'^nicop_device_plugin_registrations_total\{resource="'
                      + re.escape(RESOURCE) + r'"\} ([0-9.e+]+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.fixture(scope="module")
def deployed(real_cluster: LocalCluster, real_client: Client,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """nicop's CRDs and operator on the cluster, the policy applied and ready."""
    install_crds(real_client)
    try:
        real_client.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    except ApiError as e:
        if e.status.code != 409:
            raise
    operator = OperatorProcess(real_cluster.kubeconfig, NAMESPACE,
                               tmp_path_factory.mktemp("op") / "operator.log")
    try:
        operator.wait_ready()
        real_client.apply(NicClusterPolicy(**policy()), field_manager="test", force=True)
        wait_for(lambda: (real_client.get(NicClusterPolicy, "nic-cluster-policy").get("status")
                          or {}).get("state") == "ready", timeout=240,
                 what="the policy ready, with the real node's components")
        yield real_cluster
        real_client.delete(NicClusterPolicy, "nic-cluster-policy")
        wait_for(lambda: not pods_on(real_client, NODE), timeout=120,
                 what="the policy's pods gone from the real node")
    finally:
        operator.stop()


def test_nicops_agents_run_on_the_real_node_ready_by_the_kubelets_probes(
        deployed: LocalCluster, real_client: Client) -> None:
    """The driver agent (loading the simulated driver) and the RDMA shared device plugin, in
    nicop's image, Ready from the probes the real kubelet ran; the kubelet put the plugin's
    pool in the node's allocatable."""
    pods = pods_on(real_client, NODE)
    names = {p.metadata.labels.get("app", "") for p in pods}
    assert any(n.startswith("mofed-ubuntu24.04") for n in names), names
    assert "rdma-shared-dp" in names, names
    for pod in pods:
        assert ready(pod), pod.metadata.name
        for status in pod.status.containerStatuses or []:
            assert status.ready and status.started, (pod.metadata.name, status)
            assert status.containerID.startswith("containerd://")
    node = real_client.get(Node, NODE)
    assert node.status.nodeInfo.containerRuntimeVersion.startswith("containerd://")
    assert node.status.nodeInfo.kubeletVersion.startswith("v1.")
    assert allocatable(real_client) == "63"


def test_a_workload_gets_its_rdma_devices_in_its_container(
        deployed: LocalCluster, real_client: Client) -> None:
    """The classic pod asking for the RDMA resource: `kubectl exec` shows the uverbs and umad
    devices of both ports inside its container, as the plugin's Allocate told the kubelet."""
    pod = Pod.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "rdma-workload", "namespace": "default"},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE}, "containers": [{
            "name": "app", "image": "nicop:0.1.0", "command": ["sleep", "3600"],
            "resources": {"limits": {RESOURCE: "1"}, "requests": {RESOURCE: "1"}}}]}})
    real_client.create(pod)
    try:
        wait_for(lambda: ready(real_client.get(Pod, "rdma-workload", namespace="default")),
                 timeout=60, what="the workload running")
        devices = kubectl(deployed, "exec", "-n", "default", "rdma-workload", "--",
                          "ls", "/dev/infiniband").split()
        assert {"uverbs0", "uverbs1", "umad0", "umad1", "rdma_cm"} <= set(devices), devices
    finally:
        real_client.delete(Pod, "rdma-workload", namespace="default", grace_period=0)


def test_a_killed_agent_is_restarted_by_the_kubelet_and_its_resource_comes_back(
        deployed: LocalCluster, real_client: Client) -> None:
    (plugin,) = [p for p in pods_on(real_client, NODE)
                 if p.metadata.labels.get("app") == "rdma-shared-dp"]
    restarts = plugin.status.containerStatuses[0].restartCount
    container_pid = container_process(deployed, plugin.status.containerStatuses[0].containerID)
    subprocess.run(["kill", "-9", str(container_pid)], check=True)

    def back() -> bool:
        pod = real_client.get(Pod, plugin.metadata.name, namespace=NAMESPACE)
        status = pod.status.containerStatuses[0]
        return status.restartCount == restarts + 1 and ready(pod) and \
            allocatable(real_client) == "63"

    wait_for(back, timeout=120, what="the plugin restarted by the kubelet, its pool back")


def test_a_restarted_kubelet_gets_the_device_plugins_registered_again(
        deployed: LocalCluster, real_client: Client) -> None:
    address = real_client.get(Node, NODE).status.addresses[0].address
    before = plugin_registrations(address)
    kubelet = node_process(deployed, "kubelet")
    subprocess.run(["kill", str(kubelet)], check=True)  # the node restarts it
    wait_for(lambda: node_process(deployed, "kubelet") not in (None, kubelet), timeout=30,
             what="a new kubelet")
    wait_for(lambda: plugin_registrations(address) > before, timeout=60,
             what="the RDMA plugin registered with the new kubelet")
    wait_for(lambda: allocatable(real_client) == "63", timeout=60,
             what="the pool in allocatable again")


def node_process(cluster: LocalCluster, name: str) -> int | None:
    """The real node's process `name` (kubelet, containerd), found by its configuration under
    the node's state directory."""
    state = str(cluster.real_node(NODE).state)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].decode().endswith(f"/{name}") and state.encode() in b" ".join(argv):
            return int(entry.name)
    return None


def container_process(cluster: LocalCluster, container_id: str) -> int:
    """The host PID of a container of the real node (crictl, in the node's namespaces)."""
    node_pid = node_process(cluster, "containerd")
    assert node_pid is not None
    crictl = cluster_runtime_bin() / "crictl"
    out = subprocess.run(
        ["nsenter", "-t", str(node_pid), "-m", "-n", str(crictl), "--runtime-endpoint",
         "unix:///run/containerd/containerd.sock", "inspect",
         container_id.removeprefix("containerd://")],
        check=True, capture_output=True, text=True).stdout
    return int(json.loads(out)["info"]["pid"])


def cluster_runtime_bin() -> Path:
    from nicop_sim.cluster import default_runtime_dir

    return default_runtime_dir()


# ---------------------------------------------------------------------------------- cleanup

SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
           "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/ipv4/ip_forward")


def machine(mark: str) -> dict[str, Any]:
    """What a real node could leave behind on this machine: processes, cgroups, links and
    network namespaces named or placed by `mark` (the cluster's nicop-<digest>), every mount of
    this machine's namespace, and the kernel settings a kubelet or a CNI plugin may change."""
    processes = sorted(
        f"{p.name} {_read(p / 'comm').strip()}" for p in Path("/proc").iterdir()
        if p.name.isdigit() and mark in _read(p / "cgroup"))
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {
        "processes": processes,
        "cgroups": sorted(str(d) for h in Path("/sys/fs/cgroup").iterdir() if h.is_dir()
                          for d in h.glob(f"{mark}*")),
        "links": sorted(line.split(":")[1].strip().split("@")[0]
                        for line in links.splitlines() if mark[6:10] in line),
        "netns": sorted(n for n in netns.split() if mark in n),
        "mounts": sorted(line.split()[4] for line in _read(Path("/proc/self/mountinfo"))
                         .splitlines()),
        "sysctls": {k: _read(Path("/proc/sys") / k).strip() for k in SYSCTLS},
    }


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_cluster_down_leaves_the_machine_as_it_was(
        controlplane_bin: Path, image: Path, runtime_bin: Path, tmp_path: Path) -> None:
    """A cluster with a real node running a pod, then `down`: no process, mount, cgroup, link,
    network namespace or kernel setting of it stays."""
    state = tmp_path / "c"
    mark = f"nicop-{LocalCluster(state)._digest}"
    before = machine(mark)
    with running_cluster(state, controlplane_bin, nodes=0, real_nodes=1) as cluster:
        client = cluster.client()
        client.create(Pod.from_dict({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "nicop:0.1.0",
                                     "command": ["sleep", "3600"]}]}}))
        wait_for(lambda: ready(client.get(Pod, "p", namespace="default")), timeout=60,
                 what="a pod running on the real node")
        during = machine(mark)
        assert {n.split()[1] for n in during["processes"]} >= {"kubelet", "containerd", "pause"}
        assert during["cgroups"] and during["links"] and during["netns"]
    after = machine(mark)
    assert after == before, {k: (before[k], after[k]) for k in before if before[k] != after[k]}
