"""The loop a real cluster runs, on the local one, with nothing started beside the cluster but
the operator and the node stand-ins: policy -> DaemonSet -> pod -> agent process -> kubelet ->
a workload pod with its devices (and, on SR-IOV networks, a VF in its namespace with an IP)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.generic_resource import create_global_resource
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Event, Node, Pod
from tests.eventually import eventually
from tests.integration.agent_loop import (
    agents,
    allocatable,
    delete,
    metrics_address,
    pods,
    ready,
    sample,
    scrape,
    stand_ins,
    volume_dir,
)
from tests.integration.operator_process import NAMESPACE, OperatorProcess

from nicop.node.kernel import version_matches
from nicop_sim.cluster import LocalCluster

NicClusterPolicy = create_global_resource("mellanox.com", "v1alpha1", "NicClusterPolicy",
                                          "nicclusterpolicies")
IB_NODE = "node-1"  # the DGX-like node: eight ConnectX-7 InfiniBand NICs
DRIVER = "25.10-1.2.8.0"
RDMA_CONFIG = {"configList": [
    {"resourceName": "rdma", "resourcePrefix": "nvidia.com", "rdmaHcaMax": 63,
     "selectors": {"vendors": ["15b3"], "deviceIDs": ["1021"]}}]}
SRIOV_CONFIG = {"resourceList": [
    {"resourcePrefix": "nvidia.com", "resourceName": "ib_vf",
     "selectors": {"vendors": ["15b3"], "devices": ["101e"], "linkTypes": ["infiniband"]}}]}
# Upstream's probe fields, shortened so the driver is judged in seconds, not minutes. Upstream's
# default of one failure would let a single probe process that a loaded machine starts too late
# take the driver (and with mofed.wait every plugin of the node) away mid-test: three, as a
# cluster on busy nodes sets them.
FAST_PROBES = {"startupProbe": {"initialDelaySeconds": 1, "periodSeconds": 2},
               "livenessProbe": {"initialDelaySeconds": 5, "periodSeconds": 10,
                                 "failureThreshold": 3},
               "readinessProbe": {"initialDelaySeconds": 1, "periodSeconds": 3,
                                  "failureThreshold": 3}}
POLICY: dict[str, Any] = {
    "apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
    "metadata": {"name": "nic-cluster-policy"},
    "spec": {
        "ofedDriver": {"image": "nicop", "version": DRIVER, **FAST_PROBES},
        "rdmaSharedDevicePlugin": {"image": "nicop", "config": json.dumps(RDMA_CONFIG)},
        "sriovDevicePlugin": {"image": "nicop", "config": json.dumps(SRIOV_CONFIG)},
    },
}
# Besides the driver's, one per OS/kernel pool.
AGENT_DAEMONSETS = {"rdma-shared-dp-ds": "rdma-device-plugin",
                    "network-operator-sriov-device-plugin": "sriov-device-plugin"}


def apply_policy(client: Client, body: dict[str, Any]) -> None:
    client.apply(NicClusterPolicy(**body), field_manager="test", force=True)


def policy_state(client: Client) -> str:
    return str((client.get(NicClusterPolicy, "nic-cluster-policy").get("status") or {}).get(
        "state", ""))


def policy_daemonsets(client: Client) -> list[DaemonSet]:
    return list(client.list(DaemonSet, namespace=NAMESPACE,
                            labels={"nvidia.network-operator.state": None}))


@pytest.fixture(scope="module")
def running(client: Client, operator: OperatorProcess, cluster: LocalCluster) -> Iterator[None]:
    """The policy applied with nicop's image for every component, and ready."""
    apply_policy(client, POLICY)
    eventually(lambda: policy_state(client) == "ready", timeout=240,
               what="the policy with nicop's agents to be ready")
    yield
    delete(client, NicClusterPolicy, "nic-cluster-policy")
    eventually(lambda: not policy_daemonsets(client) and not agents(cluster), timeout=120,
               what="the policy's agents to go")


def test_every_component_runs_as_an_agent_process_started_by_its_daemonset(
        client: Client, cluster: LocalCluster, running: None) -> None:
    """Each DaemonSet's pods are Ready from their probes, and each is a process the node's
    stand-in started: the driver loaded the policy's version into the simulated kernel, and
    the RDMA plugin advertises the node's HCAs to its kubelet."""
    daemonsets = policy_daemonsets(client)
    names = {ds.metadata.name for ds in daemonsets}
    assert names.issuperset(AGENT_DAEMONSETS), names
    assert any(n.startswith("mofed-") for n in names), names
    parents = stand_ins(cluster)
    for ds in daemonsets:
        selected = pods(client, NAMESPACE, ds.spec.selector.matchLabels)
        assert selected, f"no pod of {ds.metadata.name}"
        for pod in selected:
            assert ready(pod), f"{pod.metadata.name} is not Ready"
            assert pod.spec.containers[0].image == "nicop:0.1.0"
            node = pod.spec.nodeName
            mine = [p for p in agents(cluster, node) if parents.get(p.ppid) == node]
            wanted = AGENT_DAEMONSETS.get(ds.metadata.name, "driver run")
            assert any(p.command == wanted for p in mine), (node, [p.command for p in mine])
    loaded = (cluster.node_root(IB_NODE) / "sys/module/mlx5_core/version").read_text()
    assert version_matches(loaded.strip(), DRIVER)
    assert allocatable(client, IB_NODE, "nvidia.com/rdma") == 63


def run_rdma_workload(client: Client, namespace: str) -> dict[str, Any]:
    """A pod asking for one nvidia.com/rdma, once running: what the kubelet gave it."""
    limits = {"nvidia.com/rdma": "1"}
    client.create(Pod(metadata=ObjectMeta(name="rdma-workload", namespace=namespace),
                      spec=PodSpec(containers=[Container(
                          name="app", image="mellanox/rping-test",
                          resources=ResourceRequirements(requests=limits, limits=limits))])))

    def devices() -> dict[str, Any] | None:
        pod = client.get(Pod, "rdma-workload", namespace=namespace)
        record = (pod.metadata.annotations or {}).get("nicop.io/devices")
        return json.loads(record) if record and pod.status.phase == "Running" else None

    got: dict[str, Any] = eventually(devices, timeout=60, what="the workload pod's devices")
    return got


def test_a_pod_requesting_the_resource_gets_its_devices(
        client: Client, namespace: str, running: None) -> None:
    got = run_rdma_workload(client, namespace)["app"]
    assert got["nvidia.com/rdma"]["devices"]
    assert all(d.startswith("/dev/infiniband/") for d in got["nvidia.com/rdma"]["devices"])


def test_every_agent_serves_metrics_where_its_pod_says(
        client: Client, namespace: str, running: None) -> None:
    """After the workload got its device: a scrape of each agent pod's IP and declared port
    `metrics` (what a PodMonitor does) reaches that node's agent, which shows its devices,
    the device it handed out and the driver version it loaded."""
    assert run_rdma_workload(client, namespace)["app"]["nvidia.com/rdma"]["devices"]
    node_of_workload = client.get(Pod, "rdma-workload", namespace=namespace).spec.nodeName
    addresses: dict[str, str] = {}
    for ds in policy_daemonsets(client):
        for pod in pods(client, NAMESPACE, ds.spec.selector.matchLabels):
            address = metrics_address(pod)
            assert addresses.setdefault(address, pod.metadata.name) == pod.metadata.name, \
                f"{pod.metadata.name} and {addresses[address]} share {address}"
            metrics = eventually(lambda pod=pod: _scrape_or_none(pod), timeout=30,
                                 what=f"/metrics of {pod.metadata.name} at {address}")
            node = pod.spec.nodeName
            if ds.metadata.name.startswith("mofed-"):
                assert sample(metrics, "nicop_driver_info", version=DRIVER) == 1, node
                assert (sample(metrics, "nicop_driver_load_seconds_count") or 0) >= 1, node
            elif ds.metadata.name == "rdma-shared-dp-ds":
                resource = "nvidia.com/rdma"
                if node == IB_NODE:  # the node whose HCAs the config selects
                    for name in ("nicop_device_plugin_devices",
                                 "nicop_device_plugin_devices_healthy"):
                        assert sample(metrics, name, resource=resource) == 63, name
                    assert sample(metrics, "nicop_device_plugin_registered",
                                  resource=resource) == 1
                    assert (sample(metrics, "nicop_device_plugin_registrations_total",
                                   resource=resource) or 0) >= 1
                if node == node_of_workload:
                    assert (sample(metrics, "nicop_device_plugin_devices_allocated",
                                   resource=resource) or 0) >= 1
                    assert (sample(metrics, "nicop_device_plugin_allocate_seconds_count",
                                   resource=resource) or 0) >= 1
    assert len({a.split(":")[0] for a in addresses}) > 1  # each node its own address


def _scrape_or_none(pod: Pod) -> dict[Any, float] | None:
    try:
        return scrape(pod)
    except OSError:
        return None


def test_a_killed_agent_is_restarted_and_its_resource_is_back_within_5s(
        client: Client, cluster: LocalCluster, running: None) -> None:
    (pod,) = [p for p in pods(client, NAMESPACE, {"app": "rdma-shared-dp"})
              if p.spec.nodeName == IB_NODE]
    restarts = pod.status.containerStatuses[0].restartCount
    (plugin,) = [p for p in agents(cluster, IB_NODE) if p.command == "rdma-device-plugin"]
    killed = time.monotonic()
    os.kill(plugin.pid, signal.SIGKILL)

    def back() -> bool:
        now = client.get(Pod, pod.metadata.name, namespace=NAMESPACE)
        status = now.status.containerStatuses[0]
        again = [p for p in agents(cluster, IB_NODE) if p.command == "rdma-device-plugin"
                 and p.pid != plugin.pid]
        log = cluster.state_dir / "p" / IB_NODE
        registered = any("nvidia.com/rdma: registered with the kubelet" in f.read_text()
                         for f in log.glob(f"*{pod.metadata.name}*/containers/*/"
                                           f"{status.restartCount}.log"))
        return bool(status.restartCount == restarts + 1 and again and registered
                    and allocatable(client, IB_NODE, "nvidia.com/rdma") == 63)

    eventually(back, timeout=30, what="the plugin to be restarted and registered again")
    assert time.monotonic() - killed <= 5.0 + 0.5, "advertised again later than 5 s after the kill"
    last = client.get(Pod, pod.metadata.name, namespace=NAMESPACE).status.containerStatuses[0]
    assert last.lastState.terminated.exitCode == 137


def test_an_agent_that_cannot_start_crash_loops_and_diagnose_names_it(
        client: Client, cluster: LocalCluster, kubeconfig: Any, running: None) -> None:
    """A config the agent refuses: its pod crash-loops with the agent's error in the last
    state, and `nicop diagnose node` fails naming the pod and the error."""
    bad = {"configList": [{"resourceName": "rdma-hca", "rdmaHcaMax": 1,
                           "selectors": {"vendors": ["15b3"]}}]}
    broken = json.loads(json.dumps(POLICY))
    broken["spec"]["rdmaSharedDevicePlugin"]["config"] = json.dumps(bad)
    apply_policy(client, broken)
    try:
        def crash_looping() -> Pod | None:
            for pod in pods(client, NAMESPACE, {"app": "rdma-shared-dp"}):
                status = (pod.status.containerStatuses or [None])[0]
                if status and status.state.waiting and status.state.waiting.reason == \
                        "CrashLoopBackOff" and status.lastState.terminated:
                    return pod
            return None

        pod = eventually(crash_looping, timeout=90, what="a crash-looping plugin pod")
        message = pod.status.containerStatuses[0].lastState.terminated.message
        assert "rdma-hca" in message and "resourceName" in message, message
        assert pod.status.containerStatuses[0].lastState.terminated.exitCode == 1
        done = subprocess.run(
            [sys.executable, "-m", "nicop", "diagnose", "node", pod.spec.nodeName,
             "--kubeconfig", str(kubeconfig)], capture_output=True, text=True, timeout=60,
            check=False)
        assert done.returncode == 1, done.stdout + done.stderr
        output = " ".join(done.stdout.split())
        assert pod.metadata.name in output and "CrashLoopBackOff" in output, output
        assert "rdma-hca" in output, output
    finally:
        apply_policy(client, POLICY)
    eventually(lambda: policy_state(client) == "ready", timeout=120,
               what="the policy to recover with the good config")


@pytest.mark.parametrize(("app", "command", "wrong_type"), [
    ("rdma-shared-dp", "rdma-device-plugin", '{"configList": "rdma"}'),
    ("sriovdp", "sriov-device-plugin", '{"resourceList": {"resourceName": "ib_vf"}}'),
])
def test_a_config_file_the_agent_cannot_use_is_reported_on_its_pod_and_the_last_good_serves(
        client: Client, cluster: LocalCluster, running: None, app: str, command: str,
        wrong_type: str) -> None:
    """The plugin's config file, as its pod sees it, truncated, of the wrong type and unreadable
    (a directory in its place), then fixed: the same process keeps serving what it served, each
    problem is a Warning Event on its pod, and the fixed file a Normal one."""
    (pod,) = [p for p in pods(client, NAMESPACE, {"app": app}) if p.spec.nodeName == IB_NODE]
    name = pod.metadata.name
    restarts = pod.status.containerStatuses[0].restartCount
    (agent,) = [a for a in agents(cluster, IB_NODE) if a.command == command]
    node = client.get(Node, IB_NODE)
    served = {k: v for k, v in (node.status.allocatable or {}).items() if k.startswith("nvidia")}
    # The volume of the plugin's ConfigMap (upstream names it per plugin).
    (volume,) = [v.name for v in pod.spec.volumes if v.configMap]
    config = volume_dir(cluster, pod, volume) / "config.json"
    good = config.read_text()

    def replace(content: str | None) -> None:
        """A new file renamed over the old, as a ConfigMap volume changes; None: a directory."""
        tmp = config.with_name(".new")
        if config.is_dir():
            shutil.rmtree(config)
        if content is None:
            config.unlink()
            tmp.mkdir()
        else:
            tmp.write_text(content)
        os.replace(tmp, config)

    def reported(reason: str, says: str) -> bool:
        return any(e.reason == reason and says in (e.message or "")
                   for e in client.list(Event, namespace=NAMESPACE,
                                        fields={"involvedObject.name": name}))

    try:
        for content, says in ((good[:len(good) // 2], "not valid JSON"),
                              (wrong_type, "input should be a valid list"),
                              (None, "Is a directory")):
            replace(content)
            eventually(lambda says=says: reported("ConfigInvalid", says), timeout=30,
                       what=f"a ConfigInvalid Event on {name} saying {says!r}")
            assert [a.pid for a in agents(cluster, IB_NODE) if a.command == command] == \
                [agent.pid]
            now = client.get(Node, IB_NODE).status.allocatable or {}
            assert {k: now.get(k) for k in served} == served
    finally:
        replace(good)
    eventually(lambda: reported("ConfigLoaded", "is valid again"), timeout=30,
               what=f"a ConfigLoaded Event on {name}")
    now = client.get(Pod, name, namespace=NAMESPACE)
    assert now.status.containerStatuses[0].restartCount == restarts
    assert ready(now)


def test_deleting_the_policy_removes_its_daemonsets_pods_and_processes(
        client: Client, cluster: LocalCluster, operator: OperatorProcess) -> None:
    """Runs last in this module: the module's policy goes, and everything it started."""
    apply_policy(client, POLICY)
    eventually(lambda: agents(cluster), timeout=60, what="agents to run")
    delete(client, NicClusterPolicy, "nic-cluster-policy")
    eventually(lambda: not policy_daemonsets(client), timeout=60, what="the DaemonSets to go")
    eventually(lambda: not [p for p in client.list(Pod, namespace=NAMESPACE)
                          if (p.metadata.labels or {}).get("app") in ("rdma-shared-dp", "sriovdp")
                          or "nvidia.com/ofed-driver" in (p.metadata.labels or {})],
               timeout=120, what="their pods to go")
    eventually(lambda: not agents(cluster), timeout=60, what="every agent process to end")
