"""`nicop demo`: the whole system on one machine, step by step, with simulated GPU nodes.

Everything that would run in the cluster runs here as a local process recorded with the
cluster (so `nicop cluster down` stops it): the operator, and on each managed node the kubelet
stand-in and the two device plugins, on that node's simulated hardware tree. kwok plays the
pods' containers; the kubelet stand-in hands them their devices.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from nicop.sim import hardware
from nicop.sim.cluster import ClusterError, LocalCluster, free_port
from nicop.sim.hardware import PROFILE_ANNOTATION

NAMESPACE = "nvidia-network-operator"
POLICY_FILE = Path(__file__).resolve().parents[2] / "examples" / "nicclusterpolicy-demo.yaml"
DEVICES_ANNOTATION = "nicop.io/devices"
OLD_DRIVER = "doca3.5.0-26.07-0.7.0.0-0"  # the version in the demo policy
NEW_DRIVER = "doca3.5.0-26.07-1.0.0.0-0"
VFS_PER_PF = 4
EXPECTED_RESOURCES = {"ib": {"nvidia.com/rdma"},
                      "eth": {"nvidia.com/rdma_roce", "nvidia.com/cx6dx_vf"}}
BROKEN_POD = "rdma-wrong-name"
WORKLOADS = {
    "rdma-test": {"nvidia.com/rdma": "1"},
    "sriov-test": {"nvidia.com/cx6dx_vf": "1", "nvidia.com/rdma_roce": "1"},
}


class Demo:
    def __init__(self, console: Console, cluster: LocalCluster) -> None:
        self.console = console
        self.cluster = cluster
        self.client: Any = None

    def step(self, title: str) -> None:
        self.console.rule(f"[bold]{title}")

    def wait(self, what: str, check: Callable[[], Any], timeout: float = 180) -> Any:
        deadline = time.monotonic() + timeout
        with self.console.status(what):
            while time.monotonic() < deadline:
                result = check()
                if result:
                    return result
                time.sleep(0.5)
        raise ClusterError(f"timed out after {timeout:.0f}s: {what}; logs are in "
                           f"{self.cluster.log_dir}")

    # ------------------------------------------------------------------ steps
    def start_cluster(self, nodes: int, profiles: list[str] | None) -> None:
        self.step("1. A local cluster with simulated GPU nodes")
        result = self.cluster.up(nodes=nodes, profiles=profiles,
                                 progress=lambda line: self.console.print(f"  {line}"))
        if result.already_running:
            self.console.print(f"  already up at {self.cluster.server}")
        else:
            self.console.print(f"  up in {result.seconds:.1f}s at {self.cluster.server}")
        self.client = self.cluster.client()
        show_nodes(self.console, self.client)

    def start_operator(self) -> None:
        from lightkube.core.exceptions import ApiError
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Namespace

        from nicop.api.install import install_crds

        self.step("2. CRDs and the operator")
        install_crds(self.client, progress=lambda line: None)
        self.console.print("  CRDs installed and Established")
        try:
            self.client.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
        except ApiError as e:
            if e.status.code != 409:
                raise
        port = free_port()
        proc = self.cluster.start_process("operator", [
            sys.executable, "-m", "nicop", "operator", "--kubeconfig",
            str(self.cluster.kubeconfig), "--namespace", NAMESPACE,
            "--health-port", str(port), "--log-format", "json"])
        self.console.print(f"  nicop operator running (pid {proc.pid}, log {proc.log})")

    def start_node_agents(self) -> list[str]:
        """The kubelet stand-in on every node with a Mellanox NIC, on its simulated hardware."""
        from lightkube.resources.core_v1 import Node

        self.step("3. Node agents on simulated hardware")
        managed = []
        for i, node in enumerate(sorted(self.client.list(Node), key=lambda n: n.metadata.name)):
            profile = hardware.PROFILES.get(
                (node.metadata.annotations or {}).get(PROFILE_ANNOTATION, ""))
            if profile is None or not profile.has_mellanox_nic:
                continue
            name = node.metadata.name
            root = self.node_root(name)
            if not (root / "sys").exists():
                sim = hardware.SimulatedHost.build(root, profile, seed=i + 1)
                if any(n.link_type == "eth" for n in profile.nics):
                    for pf in sim.pfs():  # what the SR-IOV config daemon would do
                        sim.set_numvfs(pf, VFS_PER_PF)
            self.agent(f"{name}/kubelet", ["sim-kubelet", "--host-root", str(root),
                                           "--node-name", name,
                                           "--kubeconfig", str(self.cluster.kubeconfig)])
            managed.append(name)
            self.console.print(f"  {name}: {profile.description}; tree {root}")
        return managed

    def apply_policy(self) -> None:
        self.step("4. Apply the NicClusterPolicy and watch it become ready")
        from lightkube.core.exceptions import ApiError
        from lightkube.generic_resource import create_global_resource

        self.console.print(f"  kubectl apply -f {POLICY_FILE}")
        ncp = create_global_resource("mellanox.com", "v1alpha1", "NicClusterPolicy",
                                     "nicclusterpolicies")
        body = yaml.safe_load(POLICY_FILE.read_text())
        with contextlib.suppress(ApiError):  # a second run keeps the driver version it left
            current = self.client.get(ncp, "nic-cluster-policy")["spec"]["ofedDriver"]
            body["spec"]["ofedDriver"]["version"] = current["version"]
        self.client.apply(ncp(**body), field_manager="nicop-demo", force=True)
        deadline = time.monotonic() + 240
        with Live(policy_table({}), console=self.console, refresh_per_second=2) as live:
            while time.monotonic() < deadline:
                status = self.client.get(ncp, "nic-cluster-policy").get("status") or {}
                live.update(policy_table(status))
                if status.get("state") == "ready":
                    break
                time.sleep(0.5)
            else:
                raise ClusterError("the policy did not become ready in 240s; run "
                                   "`nicop diagnose` and see logs/operator.log")
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        self.console.print(escape(f"  policy ready: {ready['message']}"))

    def start_device_plugins(self, managed: list[str]) -> None:
        """Run both plugins on each node where the operator scheduled them, with its config."""
        from lightkube.resources.core_v1 import ConfigMap, Node, Pod

        self.step("5. Device plugins advertise RDMA devices and VFs")
        rdma = self.client.get(ConfigMap, "rdma-devices", namespace=NAMESPACE).data["config.json"]
        sriov = self.client.get(ConfigMap, "network-operator-sriovdp-config",
                                namespace=NAMESPACE).data["config.json"]
        scheduled = {p.spec.nodeName for p in self.client.list(Pod, namespace=NAMESPACE)
                     if (p.metadata.labels or {}).get("app") in ("rdma-shared-dp", "sriovdp")}
        for name in managed:
            if name not in scheduled:
                continue
            root = self.node_root(name)
            for file, text in (("rdma.json", rdma), ("sriov.json", sriov)):
                (root / "etc" / "nicop").mkdir(parents=True, exist_ok=True)
                (root / "etc" / "nicop" / file).write_text(text)
            self.agent(f"{name}/rdma-device-plugin", [
                "rdma-device-plugin", "--host-root", str(root),
                "--config-file", str(root / "etc" / "nicop" / "rdma.json")])
            self.agent(f"{name}/sriov-device-plugin", [
                "sriov-device-plugin", "--host-root", str(root),
                "--config-file", str(root / "etc" / "nicop" / "sriov.json")])

        def advertised() -> dict[str, dict[str, str]]:
            found = {}
            for node in self.client.list(Node):
                name = node.metadata.name
                if name not in scheduled:
                    continue
                extended = {k: v for k, v in (node.status.allocatable or {}).items()
                            if k.startswith("nvidia.com/") and v != "0"}
                if not set(extended) >= self.expected_resources(node):
                    return {}
                found[name] = extended
            return found

        for node_name, resources in sorted(self.wait("waiting for node allocatable",
                                                     advertised).items()):
            listed = ", ".join(f"{k}={v}" for k, v in sorted(resources.items()))
            self.console.print(f"  {node_name}: {listed}")

    def run_pods(self) -> None:
        from lightkube.models.apps_v1 import DeploymentSpec
        from lightkube.models.core_v1 import (
            Container,
            PodSpec,
            PodTemplateSpec,
            ResourceRequirements,
        )
        from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
        from lightkube.resources.apps_v1 import Deployment

        self.step("6. Pods get their devices")
        for name, resources in WORKLOADS.items():
            self.console.print(f"  deployment default/{name}: one pod requesting {resources}")
            labels = {"app": name}
            self.client.apply(Deployment(
                metadata=ObjectMeta(name=name, namespace="default"),
                spec=DeploymentSpec(
                    replicas=1, selector=LabelSelector(matchLabels=labels),
                    template=PodTemplateSpec(metadata=ObjectMeta(labels=labels), spec=PodSpec(
                        containers=[Container(
                            name="app", image="mellanox/rping-test",
                            resources=ResourceRequirements(requests=resources,
                                                           limits=resources))]))),
            ), field_manager="nicop-demo", force=True)
        self.show_pods()

    def show_pods(self) -> None:
        for name in WORKLOADS:
            pod = self.wait(f"waiting for the pod of {name}",
                            partial(_allocated, self.client, name))
            devices = json.loads(pod.metadata.annotations[DEVICES_ANNOTATION])["app"]
            self.console.print(f"  {pod.metadata.name}: {pod.status.phase} on {pod.spec.nodeName}")
            for resource, got in sorted(devices.items()):
                env = ", ".join(f"{k}={v}" for k, v in sorted(got["env"].items())
                                if not k.endswith("_INFO"))
                devices = got["devices"]
                shown = ", ".join(devices[:4]) + (f" and {len(devices) - 4} more"
                                                  if len(devices) > 4 else "")
                self.console.print(escape(f"    {resource}: {shown}"
                                          + (f"; env {env}" if env else "")))

    def upgrade_driver(self) -> None:
        from lightkube.generic_resource import create_global_resource
        from lightkube.types import PatchType

        ncp = create_global_resource("mellanox.com", "v1alpha1", "NicClusterPolicy",
                                     "nicclusterpolicies")
        current = self.client.get(ncp, "nic-cluster-policy")["spec"]["ofedDriver"]["version"]
        target = OLD_DRIVER if current == NEW_DRIVER else NEW_DRIVER  # a second run goes back
        self.step(f"7. Rolling driver upgrade from {current} to {target}")
        self.client.patch(ncp, "nic-cluster-policy",
                          {"spec": {"ofedDriver": {"version": target}}},
                          patch_type=PatchType.MERGE, field_manager="nicop-demo")
        deadline = time.monotonic() + 300
        seen_progress = False
        with Live(console=self.console, refresh_per_second=2) as live:
            while time.monotonic() < deadline:
                table, done, total = upgrade_table(self.client, target)
                live.update(table)
                seen_progress |= done < total
                if seen_progress and done == total:
                    break
                time.sleep(0.5)
            else:
                raise ClusterError("the upgrade did not finish in 300s; see `nicop status`")
        self.console.print(f"  every node runs {target}; all uncordoned. The workload pods "
                           "were evicted from each node before its driver restarted:")
        self.show_pods()

    def diagnose(self) -> None:
        """A pod written for upstream's default resource name, which this policy does not use."""
        import subprocess

        from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Pod

        self.step("8. nicop diagnose explains a pod that cannot get RDMA")
        wrong = {"rdma/hca_shared_devices_a": "1"}
        self.console.print(f"  pod default/{BROKEN_POD} requests {wrong}")
        self.client.apply(Pod(
            metadata=ObjectMeta(name=BROKEN_POD, namespace="default"),
            spec=PodSpec(containers=[Container(
                name="app", image="mellanox/rping-test",
                resources=ResourceRequirements(requests=wrong, limits=wrong))])),
            field_manager="nicop-demo", force=True)
        self.wait("waiting for the scheduler's verdict",
                  partial(_failed_scheduling, self.client, BROKEN_POD), timeout=60)
        self.console.print(f"  $ nicop diagnose pod default/{BROKEN_POD}")
        result = subprocess.run(
            [sys.executable, "-m", "nicop", "diagnose", "pod", f"default/{BROKEN_POD}",
             "--kubeconfig", str(self.cluster.kubeconfig)],
            capture_output=True, text=True, check=False)
        for line in (result.stdout + result.stderr).rstrip().splitlines():
            self.console.print(escape(f"  {line}"))

    def explore(self) -> None:
        self.step("Explore")
        bin_dir = self.cluster.bin_dir
        for line in (f"export KUBECONFIG={self.cluster.kubeconfig}",
                     f"export PATH={bin_dir}:$PATH      # kubectl",
                     "kubectl get nicclusterpolicy,nodes",
                     "kubectl get pods -A -o wide",
                     "nicop status",
                     "nicop diagnose node node-4",
                     "nicop cluster down      # stops every process; data stays for the next run"):
            self.console.print(f"  {line}")

    # ------------------------------------------------------------------ helpers
    def expected_resources(self, node: Any) -> set[str]:
        """What the demo policy's plugins advertise on this node's hardware."""
        profile = hardware.PROFILES[(node.metadata.annotations or {})[PROFILE_ANNOTATION]]
        links = {n.link_type for n in profile.nics}
        return set().union(*(EXPECTED_RESOURCES[link] for link in links))

    def node_root(self, node: str) -> Path:
        # Short: unix socket paths under it must stay below 108 bytes.
        return self.cluster.state_dir / "n" / node

    def agent(self, name: str, args: list[str]) -> None:
        self.cluster.start_process(name, [sys.executable, "-m", "nicop", *args])


def run(console: Console, nodes: int, profiles: list[str] | None, state_dir: Path | None,
        bin_dir: Path | None) -> None:
    demo = Demo(console, LocalCluster(state_dir, bin_dir))
    started = time.monotonic()
    demo.start_cluster(nodes, profiles)
    demo.start_operator()
    managed = demo.start_node_agents()
    demo.apply_policy()
    demo.start_device_plugins(managed)
    demo.run_pods()
    demo.upgrade_driver()
    demo.diagnose()
    console.print(f"\nThe demo took {time.monotonic() - started:.0f}s.")
    demo.explore()


def _allocated(client: Any, app: str) -> Any:
    """The Running pod of deployment `app` once the kubelet stand-in gave it its devices."""
    from lightkube.resources.core_v1 import Pod

    for pod in client.list(Pod, namespace="default", labels={"app": app}):
        annotated = DEVICES_ANNOTATION in (pod.metadata.annotations or {})
        if annotated and pod.status.phase == "Running" and not pod.metadata.deletionTimestamp:
            return pod
    return None


def _failed_scheduling(client: Any, name: str) -> bool:
    from lightkube.resources.core_v1 import Event

    return any(e.reason == "FailedScheduling" and e.involvedObject.name == name
               for e in client.list(Event, namespace="default"))


def show_nodes(console: Console, client: Any) -> None:
    from lightkube.resources.core_v1 import Node

    table = Table("node", "profile", "NICs", f"label {hardware.MELLANOX_PRESENT_LABEL}", "Ready")
    for node in client.list(Node):
        labels = node.metadata.labels or {}
        profile = hardware.PROFILES.get(
            (node.metadata.annotations or {}).get(PROFILE_ANNOTATION, ""))
        nics = ", ".join(f"{n.model} ({n.link_type})" for n in profile.nics) if profile else "?"
        labelled = labels.get(hardware.MELLANOX_PRESENT_LABEL) == "true"
        note = "true" if labelled else (
            "[yellow]missing: nicop will say so[/yellow]"
            if profile and profile.has_mellanox_nic else "-")
        ready = any(c.type == "Ready" and c.status == "True"
                    for c in (node.status.conditions or []))
        table.add_row(node.metadata.name, profile.name if profile else "?", nics or "none",
                      note, "yes" if ready else "no")
    console.print(table)


def policy_table(status: dict[str, Any]) -> Table:
    table = Table("component", "state", "message", title=f"nic-cluster-policy: "
                  f"{status.get('state', 'pending')}")
    colors = {"ready": "green", "notReady": "yellow", "error": "red", "ignore": "dim"}
    for entry in status.get("appliedStates") or []:
        color = colors.get(entry["state"], "white")
        table.add_row(entry["name"], f"[{color}]{entry['state']}[/{color}]",
                      (entry.get("message") or "")[:110])
    return table


def upgrade_table(client: Any, target: str) -> tuple[Table, int, int]:
    from lightkube.resources.core_v1 import Node, Pod

    images = {p.spec.nodeName: p.spec.containers[0].image.rsplit(":", 1)[-1]
              for p in client.list(Pod, namespace=NAMESPACE,
                                   labels={"nvidia.com/ofed-driver": None})}
    table = Table("node", "upgrade state", "cordoned", "driver image tag")
    done = total = 0
    for node in sorted(client.list(Node), key=lambda n: n.metadata.name):
        state = (node.metadata.labels or {}).get("nvidia.com/ofed-driver-upgrade-state")
        if state is None:
            continue
        total += 1
        tag = images.get(node.metadata.name, "(restarting)")
        done += state == "upgrade-done" and tag.startswith(target)
        table.add_row(node.metadata.name, state, "yes" if node.spec.unschedulable else "",
                      tag)
    table.title = f"driver upgrade: {done} of {total} nodes done"
    return table, done, total

