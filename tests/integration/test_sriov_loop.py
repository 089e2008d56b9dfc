"""SR-IOV the way a cluster runs it: a node policy makes the operator deploy the config daemon
and the SR-IOV device plugin; the daemon (a process the node stand-in started from that
DaemonSet) creates the VFs, the plugin advertises them, and a pod on a SriovNetwork gets one in
its network namespace with an address from an nv-ipam pool."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Pod
from tests.eventually import eventually
from tests.integration.agent_loop import (
    Metrics,
    agents,
    allocatable,
    delete,
    pods,
    ready,
    sample,
    scrape,
    stand_ins,
)
from tests.integration.operator_process import NAMESPACE, OperatorProcess

from nicop_sim.cluster import LocalCluster
from nicop_sim.hardware import STOP_AFTER_NUMVFS, SimulatedHost

NODE = "node-2"  # a ConnectX-6 Dx node of the shared cluster
PF = "0000:3b:00.0"  # its first port, enp59s0f0np0
VFS = 4
GROUP = "sriovnetwork.openshift.io"
NodePolicy = create_namespaced_resource(GROUP, "v1", "SriovNetworkNodePolicy",
                                        "sriovnetworknodepolicies")
NodeState = create_namespaced_resource(GROUP, "v1", "SriovNetworkNodeState",
                                       "sriovnetworknodestates")
OperatorConfig = create_namespaced_resource(GROUP, "v1", "SriovOperatorConfig",
                                            "sriovoperatorconfigs")
SriovNetwork = create_namespaced_resource(GROUP, "v1", "SriovNetwork", "sriovnetworks")
IPPool = create_namespaced_resource("nv-ipam.nvidia.com", "v1alpha1", "IPPool", "ippools")
DAEMONSETS = ("sriov-network-config-daemon", "sriov-device-plugin", "nicop-cni-daemon")


def node_metrics(client: Client, app: str) -> Metrics:
    """A scrape of the `app` agent of NODE at its pod's IP and declared port `metrics`."""
    def once() -> Metrics | None:
        for pod in pods(client, NAMESPACE, {"app": app}):
            if pod.spec.nodeName == NODE and ready(pod):
                try:
                    return scrape(pod)
                except OSError:
                    return None
        return None

    metrics: Metrics = eventually(once, timeout=60, what=f"/metrics of {app} on {NODE}")
    return metrics


def daemonsets(client: Client) -> set[str]:
    return {d.metadata.name for d in client.list(DaemonSet, namespace=NAMESPACE)} & set(
        DAEMONSETS)


def numvfs(cluster: LocalCluster) -> int:
    path = cluster.node_root(NODE) / f"sys/bus/pci/devices/{PF}/sriov_numvfs"
    return int(path.read_text())


@pytest.fixture(scope="module")
def policy(client: Client, operator: OperatorProcess, cluster: LocalCluster) -> Iterator[None]:
    client.apply(NodePolicy(metadata=ObjectMeta(name="loop-vfs", namespace=NAMESPACE), spec={
        "resourceName": "cx6dx_vf", "nodeSelector": {"kubernetes.io/hostname": NODE},
        "numVfs": VFS, "nicSelector": {"pfNames": ["enp59s0f0np0"]}, "isRdma": True,
        "linkType": "eth"}), field_manager="test", force=True)
    yield
    delete(client, NodePolicy, "loop-vfs", NAMESPACE)
    # The config daemon resets the VFs it made, then goes with the rest.
    eventually(lambda: numvfs(cluster) == 0, timeout=120, what="the VFs to be removed")
    eventually(lambda: not daemonsets(client), timeout=120, what="the SR-IOV DaemonSets to go")
    eventually(lambda: not agents(cluster, NODE), timeout=60, what="the agents to end")
    delete(client, OperatorConfig, "default", NAMESPACE)


def test_the_config_daemon_pod_creates_the_vfs_and_the_plugin_advertises_them(
        client: Client, cluster: LocalCluster, policy: None) -> None:
    def state() -> dict[str, Any] | None:
        try:
            obj = client.get(NodeState, NODE, namespace=NAMESPACE)
        except Exception:
            return None
        return obj if (obj.get("status") or {}).get("syncStatus") == "Succeeded" and \
            numvfs(cluster) == VFS else None

    eventually(state, timeout=180, what=f"{VFS} VFs on {NODE} and its node state Succeeded")
    eventually(lambda: allocatable(client, NODE, "nvidia.com/cx6dx_vf") == VFS, timeout=60,
               what=f"{VFS} nvidia.com/cx6dx_vf on {NODE}")
    eventually(lambda: [p for p in pods(client, NAMESPACE, {"app": "sriov-network-config-daemon"})
                      if p.spec.nodeName == NODE and ready(p)], timeout=60,
               what=f"the config daemon pod on {NODE} to be Ready")
    config = client.get(OperatorConfig, "default", namespace=NAMESPACE)
    assert config["spec"]["configDaemonNodeSelector"] == {}  # upstream's default object
    parent = {pid for pid, node in stand_ins(cluster).items() if node == NODE}
    commands = {p.command for p in agents(cluster, NODE) if p.ppid in parent}
    assert {"sriov-config-daemon", "sriov-device-plugin"} <= commands, commands

    daemon = node_metrics(client, "sriov-network-config-daemon")
    assert sample(daemon, "nicop_sriov_sync_status", status="Succeeded") == 1
    assert sample(daemon, "nicop_sriov_sync_status", status="Failed") == 0
    assert sample(daemon, "nicop_sriov_vfs", pf="enp59s0f0np0") == VFS
    assert (sample(daemon, "nicop_sriov_last_apply_seconds") or 0) > 0
    plugin = node_metrics(client, "sriov-device-plugin")
    resource = "nvidia.com/cx6dx_vf"
    assert sample(plugin, "nicop_device_plugin_devices", resource=resource) == VFS
    assert sample(plugin, "nicop_device_plugin_registered", resource=resource) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="pods' network namespaces need root; without "
                    "it the node stand-ins run no CNI (the rest of this module still runs)")
def test_a_pod_on_the_sriov_network_gets_a_vf_and_an_address(
        client: Client, cluster: LocalCluster, namespace: str, policy: None) -> None:
    eventually(lambda: allocatable(client, NODE, "nvidia.com/cx6dx_vf") == VFS, timeout=180,
               what="the VFs to be advertised")
    client.create(IPPool(metadata=ObjectMeta(name="loop-pool", namespace=NAMESPACE), spec={
        "subnet": "10.77.0.0/16", "perNodeBlockSize": 64, "gateway": "10.77.0.1"}))
    client.create(SriovNetwork(metadata=ObjectMeta(name="loop-net", namespace=NAMESPACE), spec={
        "resourceName": "cx6dx_vf", "networkNamespace": namespace, "vlan": 100,
        "ipam": json.dumps({"type": "nv-ipam", "poolName": "loop-pool"})}))
    try:
        eventually(lambda: [p for p in pods(client, NAMESPACE, {"app": "nicop-cni-daemon"})
                          if p.spec.nodeName == NODE and ready(p)], timeout=120,
                   what=f"the CNI daemon on {NODE}")
        limits = {"nvidia.com/cx6dx_vf": "1"}
        client.create(Pod(
            metadata=ObjectMeta(name="vf-workload", namespace=namespace,
                                annotations={"k8s.v1.cni.cncf.io/networks": "loop-net"}),
            spec=PodSpec(nodeSelector={"kubernetes.io/hostname": NODE}, containers=[Container(
                name="app", image="mellanox/rping-test",
                resources=ResourceRequirements(requests=limits, limits=limits))])))

        def attached() -> list[dict[str, Any]] | None:
            pod = client.get(Pod, "vf-workload", namespace=namespace)
            raw = (pod.metadata.annotations or {}).get("k8s.v1.cni.cncf.io/network-status")
            return json.loads(raw) if raw and pod.status.phase == "Running" else None

        (default, status) = eventually(attached, timeout=120, what="the pod's network status")
        assert default["default"] and default["interface"] == "eth0", default
        assert status["name"] == f"{namespace}/loop-net" and status["interface"] == "net1"
        address = status["ips"][0]
        assert address.startswith("10.77."), status
        uid = client.get(Pod, "vf-workload", namespace=namespace).metadata.uid
        netns = f"cni-{uid[:13]}"
        shown = subprocess.run(["ip", "-n", netns, "-j", "addr", "show", "net1"],
                               capture_output=True, text=True, check=True).stdout
        assert address in [a["local"] for link in json.loads(shown)
                           for a in link.get("addr_info", [])]
        vf = status["device-info"]["pci"]["pci-address"]
        netdev = os.listdir(cluster.node_root(NODE) / f"sys/bus/pci/devices/{vf}/net")[0]
        node_links = subprocess.run(["ip", "-n", cluster.netns_of(NODE), "-j", "link", "show"],
                                    capture_output=True, text=True, check=True).stdout
        assert netdev not in [link["ifname"] for link in json.loads(node_links)]

        cni = node_metrics(client, "nicop-cni-daemon")
        assert (sample(cni, "nicop_cni_requests_total", plugin="sriov", command="ADD",
                       result="ok") or 0) >= 1
        assert (sample(cni, "nicop_cni_request_seconds_count", plugin="sriov", command="ADD",
                       result="ok") or 0) >= 1
        assert (sample(cni, "nicop_ipam_allocated", pool="loop-pool") or 0) >= 1
        assert (sample(cni, "nicop_ipam_pool_size", pool="loop-pool") or 0) >= 1
        plugin = node_metrics(client, "sriov-device-plugin")
        assert (sample(plugin, "nicop_device_plugin_devices_allocated",
                       resource="nvidia.com/cx6dx_vf") or 0) >= 1

        delete(client, Pod, "vf-workload", namespace)
        eventually(lambda: not os.path.exists(f"/run/netns/{netns}"), timeout=60,
                   what="the pod's network namespace to go")
        node_links = subprocess.run(["ip", "-n", cluster.netns_of(NODE), "-j", "link", "show"],
                                    capture_output=True, text=True, check=True).stdout
        assert netdev in [link["ifname"] for link in json.loads(node_links)]
        store = json.loads((cluster.node_root(NODE) / "var/lib/cni/nv-ipam/store").read_text())
        assert not [e for p in store["pools"].values() for e in p["entries"].values()
                    if e["ip_address"] == address], "the address was not given back"
    finally:
        delete(client, SriovNetwork, "loop-net", NAMESPACE)
        delete(client, IPPool, "loop-pool", NAMESPACE)
        eventually(lambda: "nicop-cni-daemon" not in daemonsets(client), timeout=120,
                   what="the CNI daemon to go with the last network")


def test_a_config_daemon_killed_between_creating_vfs_and_binding_them_converges(
        client: Client, cluster: LocalCluster, policy: None) -> None:
    """The daemon on node-3 stopped right after its write to sriov_numvfs (the simulated kernel
    stops it there), then SIGKILLed: its DaemonSet's pod restarts it, and the restarted daemon
    finds the VFs made and binds them to vfio-pci as the policy asks; the node state ends
    Succeeded and the plugin advertises both VFs."""
    node, pf = "node-3", "0000:3b:00.1"  # the second port of its ConnectX-6 Dx
    host = SimulatedHost(cluster.node_root(node))
    vf_driver = f"sys/bus/pci/devices/{pf}/virtfn{{}}/driver"

    def bound(index: int) -> str:
        return os.path.basename(os.readlink(cluster.node_root(node) / vf_driver.format(index)))

    (daemon_pod,) = eventually(lambda: [
        p for p in pods(client, NAMESPACE, {"app": "sriov-network-config-daemon"})
        if p.spec.nodeName == node and ready(p)], timeout=120, what=f"the config daemon on {node}")
    restarts = daemon_pod.status.containerStatuses[0].restartCount
    host.plant_fault(STOP_AFTER_NUMVFS)
    client.apply(NodePolicy(metadata=ObjectMeta(name="kill-dpdk", namespace=NAMESPACE), spec={
        "resourceName": "cx6dx_dpdk", "nodeSelector": {"kubernetes.io/hostname": node},
        "numVfs": 2, "nicSelector": {"pfNames": ["enp59s0f1np1"]}, "deviceType": "vfio-pci"}),
        field_manager="test", force=True)
    try:
        def stopped() -> int | None:
            for agent in agents(cluster, node):
                if agent.command == "sriov-config-daemon" and \
                        Path(f"/proc/{agent.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] \
                        == "T":
                    return agent.pid
            return None

        pid = eventually(stopped, timeout=180, what=f"the config daemon on {node} to reach the "
                         "fault")
        assert host.read_int(f"/sys/bus/pci/devices/{pf}/sriov_numvfs") == 2
        assert bound(0) != "vfio-pci", "stopped before binding"
        os.kill(pid, signal.SIGKILL)

        def converged() -> bool:
            state = client.get(NodeState, node, namespace=NAMESPACE)
            return bool((state.get("status") or {}).get("syncStatus") == "Succeeded"
                        and state["status"].get("lastSyncError", "") == ""
                        and all(bound(i) == "vfio-pci" for i in (0, 1))
                        and allocatable(client, node, "nvidia.com/cx6dx_dpdk") == 2)

        eventually(converged, timeout=180, what="both VFs bound to vfio-pci and advertised")
        (daemon_pod,) = [p for p in pods(client, NAMESPACE, {"app": "sriov-network-config-daemon"})
                         if p.spec.nodeName == node]
        status = daemon_pod.status.containerStatuses[0]
        assert status.restartCount == restarts + 1 and status.lastState.terminated.exitCode == 137
        assert host.read_int(f"/sys/bus/pci/devices/{pf}/sriov_numvfs") == 2
    finally:
        delete(client, NodePolicy, "kill-dpdk", NAMESPACE)
        eventually(lambda: host.read_int(f"/sys/bus/pci/devices/{pf}/sriov_numvfs") == 0,
                   timeout=120, what=f"the VFs of {pf} to be removed")
