"""nicop on a real node: the operator's DaemonSets run as containers a real kubelet started
through containerd and runc (nicop_sim.realnode), on a ConnectX-6 Dx whose hardware is
simulated. What a user checks on a node, checked here: the kubelet's probes, the allocatable it
writes, devices inside a workload's container, restarts after a crash, device plugins after a
kubelet restart, and a machine left as it was when the cluster goes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Namespace, Node, Pod
from tests.eventually import eventually
from tests.integration.agent_loop import agents, sample, scrape, stand_ins
from tests.integration.operator_process import NAMESPACE, OperatorProcess

from nicop.api import dra
from nicop.operator.crds import install_crds
from nicop_sim.cluster import LocalCluster, running_cluster
from nicop_sim.hardware import SimulatedHost
from nicop_sim.kubelet import DEVICES_ANNOTATION

ROOT = Path(__file__).resolve().parent.parent.parent
NODE = "real-1"
RESOURCE = "nvidia.com/rdma_roce"  # the ConnectX-6 Dx's pool in the demo policy
NicClusterPolicy = create_global_resource(
    "mellanox.com", "v1alpha1", "NicClusterPolicy", "nicclusterpolicies")


SRIOV = ROOT / "examples/demo/sriov.yaml"  # 4 VFs a port, an nv-ipam pool, roce-vlan100
STAND_IN = "node-1"  # a ConnectX-6 Dx too, run by a node stand-in
NETWORKS = "k8s.v1.cni.cncf.io/networks"
NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"
VF_RESOURCE = "nvidia.com/cx6dx_vf"
ResourceClaim = create_namespaced_resource("resource.k8s.io", "v1", "ResourceClaim",
                                           "resourceclaims")
ResourceSlice = create_global_resource("resource.k8s.io", "v1", "ResourceSlice",
                                       "resourceslices")


def policy() -> dict[str, Any]:
    """The demo's policy (nicop's image for every component, its multus daemon too: no registry
    here serves upstream's) with nicop's DRA driver beside the device plugins."""
    body = yaml.safe_load((ROOT / "examples/nicclusterpolicy-demo.yaml").read_text())
    body["spec"]["draDriver"] = {}
    return dict(body)


def kubectl(cluster: LocalCluster, *args: str, timeout: float = 60,
            stdin: str | None = None) -> str:
    done = subprocess.run([str(cluster.bin_dir / "kubectl"), "--kubeconfig",
                           str(cluster.kubeconfig), *args], capture_output=True, text=True,
                          timeout=timeout, input=stdin)
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


def pods_on(client: Client, node: str, namespace: str = NAMESPACE) -> list[Pod]:
    return [p for p in client.list(Pod, namespace=namespace, fields={"spec.nodeName": node})
            if not p.metadata.deletionTimestamp]


def ready(pod: Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def allocatable(client: Client, resource: str = RESOURCE, node: str = NODE) -> str | None:
    return (client.get(Node, node).status.allocatable or {}).get(resource)


@pytest.fixture(scope="module")
def deployed(real_cluster: LocalCluster, real_client: Client,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """nicop's CRDs and operator on the cluster, the policy applied and ready."""
    install_crds(real_cluster.kubeconfig)
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
        eventually(lambda: (real_client.get(NicClusterPolicy, "nic-cluster-policy").get("status")
                          or {}).get("state") == "ready", timeout=240,
                   what="the policy ready, with the real node's components")
        yield real_cluster
        real_client.delete(NicClusterPolicy, "nic-cluster-policy")
        eventually(lambda: not pods_on(real_client, NODE), timeout=120,
                   what="the policy's pods gone from the real node")
    finally:
        operator.stop()


def test_nicops_agents_run_on_the_real_node_ready_by_the_kubelets_probes(
        deployed: LocalCluster, real_client: Client) -> None:
    """The driver agent (loading the simulated driver), the RDMA shared device plugin, nicop's
    multus daemon and DRA driver, in nicop's image, Ready from the probes the real kubelet ran;
    `kubectl logs` and `kubectl exec` reach each of them; the kubelet put the plugin's pool in
    the node's allocatable."""
    names = every_agent_answers(deployed, real_client)
    assert any(n.startswith("mofed-ubuntu24.04") for n in names), names
    assert {"rdma-shared-dp", "multus", "nicop-dra-driver"} <= names, names
    node = real_client.get(Node, NODE)
    assert node.status.nodeInfo.containerRuntimeVersion.startswith("containerd://")
    assert node.status.nodeInfo.kubeletVersion.startswith("v1.")
    # The plugin is Ready once registered; the kubelet writes the new resource into the node's
    # status at its next status update (every 10 s).
    eventually(lambda: allocatable(real_client) == "63", timeout=30,
               what="the kubelet to put the plugin's 63 devices in the node's allocatable")


def all_ready(pods: list[Pod]) -> list[Pod] | None:
    return pods if all(ready(p) for p in pods) else None


def every_agent_answers(cluster: LocalCluster, client: Client) -> set[str]:
    """Every agent pod on the real node is Ready (a DaemonSet may be rolling a pod anew), its
    containers started by containerd, and `kubectl logs` and `kubectl exec` reach it; their
    `app` labels."""
    pods = eventually(lambda: all_ready(pods_on(client, NODE)), timeout=120,
                      what="every agent pod on the real node Ready")
    for pod in pods:
        name = pod.metadata.name
        for status in pod.status.containerStatuses or []:
            assert status.ready and status.started, (name, status)
            assert status.containerID.startswith("containerd://")
        assert kubectl(cluster, "logs", "-n", NAMESPACE, name, "--all-containers").strip(), name
        assert "Usage" in kubectl(cluster, "exec", "-n", NAMESPACE, name, "--", "nicop",
                                  "--help"), name
    return {p.metadata.labels.get("app", p.metadata.name) for p in pods}


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
        eventually(lambda: ready(real_client.get(Pod, "rdma-workload", namespace="default")),
                   timeout=60, what="the workload running")
        devices = kubectl(deployed, "exec", "-n", "default", "rdma-workload", "--",
                          "ls", "/dev/infiniband").split()
        assert {"uverbs0", "uverbs1", "umad0", "umad1", "rdma_cm"} <= set(devices), devices
    finally:
        real_client.delete(Pod, "rdma-workload", namespace="default", grace_period=0)


@pytest.fixture(scope="module")
def sriov(deployed: LocalCluster, real_client: Client) -> Iterator[None]:
    """examples/demo/sriov.yaml applied: 8 VFs (4 a port) in the allocatable of the real node
    and of a stand-in. Deleted after, and the SR-IOV daemons gone with the VFs they reset."""
    kubectl(deployed, "apply", "-f", str(SRIOV))
    for node in (NODE, STAND_IN):
        eventually(lambda n=node: allocatable(real_client, VF_RESOURCE, n) == "8", timeout=180,
                   what=f"8 VFs in the allocatable of {node}")
    yield
    kubectl(deployed, "delete", "-f", str(SRIOV))
    eventually(lambda: not [p for p in pods_on(real_client, NODE)
                          if p.metadata.name.startswith("sriov-")], timeout=180,
               what="the SR-IOV daemons gone from the real node")


# A workload that ends on SIGTERM: deleted as kubectl does, its networks (the VF) are torn down
# before the pod goes. A forced delete lets the kubelet hand the VF to the next pod before the
# CNI DEL, and that pod's ADD fails once ("already allocated"), as with upstream's sriov-cni.
SLEEP = ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]


def vf_workload(name: str, node: str) -> Pod:
    """A pod on roce-vlan100 with one VF and the port's RDMA devices, pinned to `node`."""
    return Pod.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default",
                     "annotations": {NETWORKS: "roce-vlan100"}},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "containers": [{
            "name": "app", "image": "nicop:0.1.0", "command": SLEEP,
            "resources": {"limits": {VF_RESOURCE: "1", RESOURCE: "1"}}}]}})


def attached(client: Client, name: str) -> Pod | None:
    """The pod once Ready with its network-status written."""
    pod = client.get(Pod, name, namespace="default")
    return pod if ready(pod) and NETWORK_STATUS in (pod.metadata.annotations or {}) else None


# Inside a workload's container: its links (/proc/net/dev: a container of this node sees the
# node's simulated /sys, not its own network namespace's), its devices, its addresses and
# net1's MAC (the image has python3, no iproute2).
LOOK_INSIDE = ("tail -n +3 /proc/net/dev | cut -d: -f1; echo --; ls /dev/infiniband; echo --; "
               "cat /proc/net/fib_trie; echo --; python3 -c 'import fcntl, socket, struct; "
               "s = socket.socket(); print(fcntl.ioctl(s.fileno(), 0x8927, "
               "struct.pack(\"256s\", b\"net1\"))[18:24].hex(\":\"))'")


def look_inside(cluster: LocalCluster, pod: str) -> tuple[list[str], list[str], str, str]:
    """The links, /dev/infiniband entries, fib_trie and net1 MAC of `pod`'s container."""
    links, devices, fib, mac = kubectl(cluster, "exec", "-n", "default", pod, "--", "sh", "-c",
                                       LOOK_INSIDE).split("--\n")
    return links.split(), devices.split(), fib, mac.strip()


def fib_addresses(text: str) -> set[str]:
    """The local IPv4 addresses of a /proc/net/fib_trie (the image has no iproute2)."""
    lines = text.splitlines()
    return {lines[i - 1].split()[-1] for i, line in enumerate(lines)
            if "/32 host LOCAL" in line}


def test_a_pod_with_a_dra_claim_holds_the_devices_of_its_cdi_spec(
        deployed: LocalCluster, real_client: Client) -> None:
    """A ResourceClaim for one NIC of nicop's DRA class and a pod using it on the real node
    (before the SR-IOV tests: a NIC whose VFs a policy gives the device plugin is not the DRA
    driver's, docs/dra.md):
    containerd applies the CDI spec the DRA driver wrote when the kubelet prepared the claim,
    so the container sees that NIC's uverbs device and not the other port's."""
    real_client.create(ResourceClaim(
        metadata=ObjectMeta(name="one-nic", namespace="default"),
        spec={"devices": {"requests": [{"name": "nic", "exactly": {
            "deviceClassName": dra.PF_CLASS}}]}}))
    real_client.create(Pod.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "dra-workload", "namespace": "default"},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE},
                 "resourceClaims": [{"name": "nic", "resourceClaimName": "one-nic"}],
                 "containers": [{"name": "app", "image": "nicop:0.1.0",
                                 "command": ["sleep", "3600"],
                                 "resources": {"claims": [{"name": "nic"}]}}]}}))
    try:
        eventually(lambda: ready(real_client.get(Pod, "dra-workload", namespace="default")),
                   timeout=90, what="the DRA workload running")
        claim = real_client.get(ResourceClaim, "one-nic", namespace="default")
        [result] = claim["status"]["allocation"]["devices"]["results"]
        ibdev = next(d["attributes"][dra.RDMA_DEVICE]["string"]
                     for s in real_client.list(ResourceSlice)
                     if s["spec"]["driver"] == dra.DRIVER and s["spec"].get("nodeName") == NODE
                     for d in s["spec"].get("devices", []) if d["name"] == result["device"])
        verbs = deployed.real_node(NODE).tree / "sys/class/infiniband_verbs"
        mine = {v.name for v in verbs.glob("uverbs*")
                if (v / "ibdev").read_text().strip() == ibdev}
        others = {v.name for v in verbs.glob("uverbs*")} - mine
        devices = set(kubectl(deployed, "exec", "-n", "default", "dra-workload", "--",
                              "ls", "/dev/infiniband").split())
        assert mine and mine <= devices and not others & devices, (ibdev, devices)
    finally:
        real_client.delete(Pod, "dra-workload", namespace="default", grace_period=0)
        eventually(lambda: not pods_named(real_client, "dra-workload"), timeout=60,
                   what="the DRA workload gone")
        real_client.delete(ResourceClaim, "one-nic", namespace="default")


# NetworkAttachmentDefinition and claim template, without the pod (the test's is pinned to the
# real node): upstream's single-VF demo of the SR-IOV DRA driver on nicop.
DRA_VF_NETWORK = ROOT / "examples/dra/vf-on-a-network.yaml"


def without_pods(path: Path) -> str:
    return yaml.safe_dump_all(d for d in yaml.safe_load_all(path.read_text())
                              if d["kind"] != "Pod")


def published(client: Client, kind: str, node: str = NODE) -> dict[str, dict[str, Any]]:
    """The devices of `kind` nicop's DRA driver publishes for `node`, by name."""
    return {d["name"]: d for s in client.list(ResourceSlice)
            if s["spec"]["driver"] == dra.DRIVER and s["spec"].get("nodeName") == node
            for d in s["spec"].get("devices", [])
            if d.get("attributes", {}).get(dra.KIND, {}).get("string") == kind}


def test_a_pod_on_a_dra_vf_claim_gets_its_network_and_the_claim_shows_what_it_got(
        deployed: LocalCluster, real_client: Client) -> None:
    """Two VFs an administrator made (no SR-IOV policy: the DRA driver publishes them) and
    examples/dra/vf-on-a-network.yaml, upstream's single-VF demo (k8snetworkplumbingwg/
    dra-driver-sriov, demo/single-vf-claim/single-vf.yaml) on nicop: the kubelet prepares the
    claim, and at the sandbox nicop's multus attaches the VF as the claim's VfConfig says (the
    sriov delegate, host-local IPAM). Inside the container `net1` has the MAC and the address
    that the claim's status.devices[].networkData shows, beside the plugin's Ready
    condition."""
    host = SimulatedHost(deployed.real_node(NODE).tree)
    pf = min(d["attributes"][dra.PCI_ADDRESS]["string"]
             for d in published(real_client, dra.KIND_PF).values())
    host.set_numvfs(pf, 2)
    try:
        eventually(lambda: len(published(real_client, dra.KIND_VF)) == 2, timeout=60,
                   what="the administrator's 2 VFs published")
        kubectl(deployed, "apply", "-f", "-", stdin=without_pods(DRA_VF_NETWORK))
        eventually(lambda: any(p.metadata.name.startswith("nicop-cni-daemon") and ready(p)
                             for p in pods_on(real_client, NODE)), timeout=120,
                   what="nicop's CNI daemon ready on the real node for the sriov network")
        real_client.create(Pod.from_dict({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "dra-vf-workload", "namespace": "default"},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE},
                     "resourceClaims": [{"name": "vf", "resourceClaimTemplateName": "single-vf"}],
                     "containers": [{"name": "app", "image": "nicop:0.1.0", "command": SLEEP,
                                     "resources": {"claims": [{"name": "vf"}]}}]}}))
        pod = eventually(lambda: attached(real_client, "dra-vf-workload"), timeout=120,
                         what="the DRA VF workload running")
        [generated] = pod.status.resourceClaimStatuses
        claim = real_client.get(ResourceClaim, generated.resourceClaimName, namespace="default")
        [result] = claim["status"]["allocation"]["devices"]["results"]
        [entry] = [d for d in claim["status"].get("devices") or []
                   if d["device"] == result["device"]]
        assert {c["type"] for c in entry["conditions"]} >= {"Ready"}, entry
        data = entry["networkData"]
        assert data["interfaceName"] == "net1", data
        [cidr] = data["ips"]
        assert cidr.startswith("10.0.1.") and cidr.endswith("/24"), data
        links, _, fib, mac = look_inside(deployed, "dra-vf-workload")
        assert "net1" in links and mac == data["hardwareAddress"], (links, mac, data)
        assert cidr.split("/")[0] in fib_addresses(fib), fib
        status = json.loads(pod.metadata.annotations[NETWORK_STATUS])
        assert [s["name"] for s in status if s.get("interface") == "net1"] == ["default/vf-test1"]
    finally:
        with contextlib.suppress(ApiError):
            real_client.delete(Pod, "dra-vf-workload", namespace="default")
        eventually(lambda: not pods_named(real_client, "dra-vf-workload"), timeout=90,
                   what="the DRA VF workload gone, its VF back on the node")
        kubectl(deployed, "delete", "--ignore-not-found", "-f", "-",
                stdin=without_pods(DRA_VF_NETWORK))
        host.set_numvfs(pf, 0)
        eventually(lambda: not published(real_client, dra.KIND_VF), timeout=60,
                   what="the VFs gone from the slice")


def test_a_pod_on_the_sriov_network_has_its_vf_with_its_address_vlan_and_rdma_devices(
        deployed: LocalCluster, real_client: Client, sriov: None) -> None:
    """examples/demo/sriov.yaml on the real node: the config daemon creates the VFs and the
    kubelet puts them in allocatable; a pod on roce-vlan100 asking for a VF is attached by the
    runtime's CNI chain (containerd, nicop's multus, the sriov delegate, nv-ipam): inside its
    container `net1` has the MAC and pool address its network-status names, the VF carries
    VLAN 100 on its PF, and its RDMA devices are there. The SR-IOV agents answer as the
    others do."""
    agents = every_agent_answers(deployed, real_client)
    assert {"sriov-network-config-daemon", "sriov-device-plugin", "nicop-cni-daemon"} <= agents
    real_client.create(vf_workload("vf-workload", NODE))
    try:
        pod = eventually(lambda: attached(real_client, "vf-workload"), timeout=90,
                         what="the VF workload running")
        status = json.loads(pod.metadata.annotations[NETWORK_STATUS])
        [vf] = [s for s in status if s.get("interface") == "net1"]
        assert vf["name"] == "default/roce-vlan100"
        [address] = vf["ips"]
        assert address.startswith("192.168."), vf
        links, devices, fib, mac = look_inside(deployed, "vf-workload")
        assert "net1" in links and mac == vf["mac"], (links, mac)
        assert address in fib_addresses(fib), fib
        assert "rdma_cm" in devices and any(d.startswith("uverbs") for d in devices), devices
        pci = vf["device-info"]["pci"]["pci-address"]
        vlans = [state.get("vlan") for f in (deployed.real_node(NODE).tree / ".sim/pf")
                 .glob("*.json") for state in json.loads(f.read_text()).values()]
        assert 100 in vlans, (pci, vlans)
    finally:
        real_client.delete(Pod, "vf-workload", namespace="default")  # its VF released first


def pods_named(client: Client, name: str) -> list[Pod]:
    return [p for p in client.list(Pod, namespace="default") if p.metadata.name == name]


def what_a_user_sees(cluster: LocalCluster, client: Client, node: str) -> dict[str, Any]:
    """A VF workload on `node`, as a user looks at it: the node's allocatable, the pod's
    conditions, its links, device node kinds and addresses inside, and its network-status (its
    shape: which networks on which interfaces, with which fields). On the real node from inside
    the container; on a stand-in from the pod's network namespace and the devices its kubelet
    allocated (kwok plays the container)."""
    name = f"look-{node}"
    client.create(vf_workload(name, node))
    try:
        pod = eventually(lambda: attached(client, name), timeout=90, what=f"{name} attached")
        if node == NODE:
            names, found, fib, _ = look_inside(cluster, name)
            addresses = fib_addresses(fib)
        else:
            netns = f"cni-{pod.metadata.uid[:13]}"
            shown = json.loads(subprocess.run(["ip", "-n", netns, "-j", "addr"], check=True,
                                              capture_output=True, text=True).stdout)
            names = [link["ifname"] for link in shown]
            addresses = {a["local"] for link in shown for a in link.get("addr_info", [])
                         if a.get("family") == "inet"}
            record = json.loads(pod.metadata.annotations[DEVICES_ANNOTATION])
            found = [Path(d).name for container in record.values()
                     for got in container.values() for d in got["devices"]]
        status = json.loads(pod.metadata.annotations[NETWORK_STATUS])
        return {
            "allocatable": {r: allocatable(client, r, node) for r in (RESOURCE, VF_RESOURCE)},
            "conditions": sorted(c.type for c in pod.status.conditions if c.status == "True"),
            "links": sorted(names),
            "device kinds": sorted({re.sub(r"\d+$", "", d) for d in found}),
            "uverbs devices": len({d for d in found if d.startswith("uverbs")}),
            "network-status": [{
                "network": "<default>" if s.get("default") else s["name"],
                "interface": s["interface"], "fields": sorted(s), "ips": len(s.get("ips", [])),
                "device-info": sorted(s.get("device-info", {}).get("pci", {}))} for s in status],
            "addresses inside": all(a in addresses for s in status for a in s.get("ips", [])),
            "VF address from the pool": [s["ips"][0].startswith("192.168.")
                                         for s in status if not s.get("default")],
        }
    finally:
        client.delete(Pod, name, namespace="default")


def test_a_stand_in_shows_a_user_what_the_real_node_shows(
        deployed: LocalCluster, real_client: Client, sriov: None) -> None:
    """The same VF workload on the real node and on a node stand-in of the same hardware: what
    a user sees of it is the same (the real kubelet, containerd and nicop's multus are the
    reference the stand-in is held to)."""
    real = what_a_user_sees(deployed, real_client, NODE)
    stand_in = what_a_user_sees(deployed, real_client, STAND_IN)
    assert real["addresses inside"] and real["VF address from the pool"] == [True]
    assert stand_in == real, {k: (real[k], stand_in[k]) for k in real if real[k] != stand_in[k]}


def test_a_killed_agent_is_restarted_and_its_resource_comes_back_as_on_a_stand_in(
        deployed: LocalCluster, real_client: Client) -> None:
    """The RDMA plugin killed on the real node (its container's process) and on a stand-in
    (its process): on both the pod's restartCount goes up by one, it is Ready again and the
    node's pool is back."""
    eventually(lambda: rolled_out(real_client), timeout=120, what="every DaemonSet rolled out")
    before = {}
    for node in (NODE, STAND_IN):
        plugin = rdma_plugin(real_client, node)
        before[node] = (plugin.metadata.name, plugin.status.containerStatuses[0].restartCount)
        if node == NODE:
            pid = container_process(deployed, plugin.status.containerStatuses[0].containerID)
        else:
            (agent,) = [a for a in agents(deployed, node) if a.pod == plugin.metadata.name]
            pid = agent.pid
        subprocess.run(["kill", "-9", str(pid)], check=True)

    def back(node: str) -> bool:
        name, restarts = before[node]
        pod = real_client.get(Pod, name, namespace=NAMESPACE)
        status = pod.status.containerStatuses[0]
        return status.restartCount == restarts + 1 and ready(pod) and \
            allocatable(real_client, RESOURCE, node) == "63"

    for node in (NODE, STAND_IN):
        eventually(lambda n=node: back(n), timeout=120,
                   what=f"the plugin on {node} restarted, its pool back")


def test_a_restarted_kubelet_gets_the_device_plugins_registered_again_as_on_a_stand_in(
        deployed: LocalCluster, real_client: Client) -> None:
    """The real node's kubelet killed (the node starts it again) and a stand-in's device manager
    restarted (SIGHUP): on both the RDMA plugin registers again and the pool comes back, while
    the plugin's pod runs on (no container restart)."""
    eventually(lambda: rolled_out(real_client), timeout=120, what="every DaemonSet rolled out")
    before = {}
    for node in (NODE, STAND_IN):
        plugin = rdma_plugin(real_client, node)
        before[node] = (plugin.metadata.name, registrations(plugin),
                        plugin.status.containerStatuses[0].restartCount)
    kubelet = node_process(deployed, "kubelet")
    subprocess.run(["kill", str(kubelet)], check=True)
    eventually(lambda: node_process(deployed, "kubelet") not in (None, kubelet), timeout=30,
               what="a new kubelet")
    [stand_in] = [pid for pid, node in stand_ins(deployed).items() if node == STAND_IN]
    os.kill(stand_in, signal.SIGHUP)

    def registered_again(node: str) -> bool:
        name, registered, _ = before[node]
        plugin = real_client.get(Pod, name, namespace=NAMESPACE)
        return registrations(plugin) > registered and allocatable(real_client, node=node) == "63"

    for node in (NODE, STAND_IN):
        eventually(lambda n=node: registered_again(n), timeout=60,
                   what=f"the RDMA plugin on {node} registered again, its pool back")
        name, _, restarts = before[node]
        pod = real_client.get(Pod, name, namespace=NAMESPACE)
        assert pod.status.containerStatuses[0].restartCount == restarts, node


def rolled_out(client: Client) -> bool:
    """Every nicop DaemonSet has its current template on every node it selects, all Ready: a
    pod the DaemonSet controller is about to replace is no pod to kill and watch come back."""
    return all(
        ds.status is not None and ds.status.observedGeneration == ds.metadata.generation
        and ds.status.desiredNumberScheduled == (ds.status.updatedNumberScheduled or 0)
        == ds.status.numberReady for ds in client.list(DaemonSet, namespace=NAMESPACE))


def rdma_plugin(client: Client, node: str) -> Pod:
    (plugin,) = [p for p in pods_on(client, node)
                 if p.metadata.labels.get("app") == "rdma-shared-dp"]
    return plugin


def registrations(plugin: Pod) -> float:
    """What nicop's RDMA plugin counts of its kubelet registrations (its /metrics, where a
    PodMonitor scrapes it)."""
    return sample(scrape(plugin), "nicop_device_plugin_registrations_total",
                  resource=RESOURCE) or 0.0


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
    """A cluster with a real node running a pod (a second `up` adds nothing to it), then
    `down`: no process, mount, cgroup, link, network namespace or kernel setting of it stays."""
    state = tmp_path / "c"
    mark = f"nicop-{LocalCluster(state)._digest}"
    before = machine(mark)
    with running_cluster(state, controlplane_bin, nodes=0, real_nodes=1) as cluster:
        client = cluster.client()
        client.create(Pod.from_dict({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "nicop:0.1.0",
                                     "command": ["sleep", "3600"]}]}}))
        eventually(lambda: ready(client.get(Pod, "p", namespace="default")), timeout=60,
                   what="a pod running on the real node")
        during = machine(mark)
        assert {n.split()[1] for n in during["processes"]} >= {"kubelet", "containerd", "pause"}
        started = set(cluster.state().processes)
        assert cluster.up(nodes=0, real_nodes=1).already_running  # as a second `make demo`
        assert set(cluster.state().processes) == started  # no stand-in for the real node
        assert during["cgroups"] and during["links"] and during["netns"]
    # killed processes can take a moment to be reaped by init after `down` returns
    with contextlib.suppress(AssertionError):
        eventually(lambda: machine(mark) == before, timeout=15, what="the machine as it was")
    after = machine(mark)
    assert after == before, {k: (before[k], after[k]) for k in before if before[k] != after[k]}
