"""`nicop demo`: the whole system on one machine, step by step, with simulated GPU nodes.

The demo starts the local cluster (whose node stand-ins run the pods of nicop's image on each
node's simulated hardware; with root and the runtime and image built, also a real node whose
kubelet runs them as containers through containerd and runc) and the operator, and nothing
else: every agent runs because the operator rendered a DaemonSet for it. It then applies what a
user would, and shows the result.
"""

from __future__ import annotations

import contextlib
import json
import os
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

from nicop_sim import hardware
from nicop_sim.cluster import ClusterError, LocalCluster, free_port

NAMESPACE = "nvidia-network-operator"
EXAMPLES = Path(__file__).resolve().parent / "examples"  # package data: the demo runs installed
POLICY_FILE = EXAMPLES / "nicclusterpolicy-demo.yaml"
SRIOV_FILE = EXAMPLES / "demo" / "sriov.yaml"
DEVICES_ANNOTATION = "nicop.io/devices"
NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"
OLD_DRIVER = "26.07-0.7.0.0"  # the version in the demo policy
NEW_DRIVER = "26.07-1.0.0.0"
EXPECTED_RESOURCES = {"ib": {"nvidia.com/rdma"}, "eth": {"nvidia.com/rdma_roce"}}
VF_RESOURCE = "nvidia.com/cx6dx_vf"
BROKEN_POD = "rdma-wrong-name"
WORKLOADS: dict[str, tuple[dict[str, str], str | None]] = {
    "rdma-test": ({"nvidia.com/rdma": "1"}, None),
    "sriov-test": ({VF_RESOURCE: "1", "nvidia.com/rdma_roce": "1"}, "roce-vlan100"),
}
REAL_NODE = "real-1"  # a ConnectX-6 Dx; sriov-test runs there when the demo has it
REAL_NODE_IMAGE = "nicop:0.1.0"  # the one image a real node has (no registry is reached)
WORKLOAD_IMAGE = "mellanox/rping-test"


class Demo:
    def __init__(self, console: Console, cluster: LocalCluster) -> None:
        self.console = console
        self.cluster = cluster
        self.client: Any = None
        self.applied_at = 0.0
        self.real_node = False
        self.steps: list[tuple[str, float]] = []  # each step's title and when it began

    def step(self, title: str) -> None:
        self.steps.append((title, time.monotonic()))
        self.console.rule(f"[bold]{title}")

    def took(self) -> str:
        """How long each step took, the slowest first (what a slow machine spends its time on)."""
        ends = [began for _, began in self.steps[1:]] + [time.monotonic()]
        spent = sorted(((end - began, title.split(".", 1)[0]) for (title, began), end
                        in zip(self.steps, ends, strict=True)), reverse=True)
        return ", ".join(f"step {number} {seconds:.0f}s" for seconds, number in spent)

    def wait(self, what: str, check: Callable[[], Any], timeout: float = 180) -> Any:
        deadline = time.monotonic() + timeout
        with self.console.status(what):
            while time.monotonic() < deadline:
                result = check()
                if result:
                    return result
                time.sleep(0.5)
        raise ClusterError(f"timed out after {timeout:.0f}s: {what}; logs are in "
                           f"{self.cluster.log_dir}; try `nicop diagnose`")

    def apply(self, body: dict[str, Any]) -> None:
        """kubectl apply --server-side of one object of a nicop kind."""
        from lightkube.generic_resource import create_global_resource, create_namespaced_resource

        from nicop.api.kinds import kind_for

        crd = kind_for(body["apiVersion"], body["kind"]).crd
        make = create_namespaced_resource if crd.namespaced else create_global_resource
        kind = make(crd.group, crd.version, crd.kind, crd.plural)
        self.client.apply(kind(**body), field_manager="nicop-demo", force=True)

    # ------------------------------------------------------------------ steps
    def start_cluster(self, nodes: int, profiles: list[str] | None,
                      real_node: bool | None) -> None:
        from lightkube.resources.core_v1 import Node

        self.step("1. A local cluster with simulated GPU nodes")
        blocker = self.cluster.real_node_blocker()
        if real_node and blocker:
            raise ClusterError(blocker)
        wanted = real_node is not False and blocker is None
        if real_node is None and blocker:
            self.console.print(f"  without a real node: {blocker}")
        result = self.cluster.up(nodes=nodes, profiles=profiles, real_nodes=int(wanted),
                                 progress=lambda line: self.console.print(f"  {line}"))
        if result.already_running:
            self.console.print(f"  already up at {self.cluster.server}")
        else:
            self.console.print(f"  up in {result.seconds:.1f}s at {self.cluster.server}")
        self.client = self.cluster.client()
        self.real_node = any(n.metadata.name == REAL_NODE for n in self.client.list(Node))
        show_nodes(self.console, self.client)
        self.console.print("  Each node has a node stand-in (`nicop sim-node`): its kubelet for "
                           "nicop, running the pods of nicop's image there as processes.")
        if self.real_node:
            self.console.print(f"  {REAL_NODE} is a real node: a real kubelet, containerd and "
                               "runc run its pods as containers of nicop's image, in a network "
                               "and mount namespace of its own; only its NICs are simulated.")

    def start_operator(self) -> None:
        from lightkube.core.exceptions import ApiError
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Namespace

        from nicop.operator.crds import install_crds

        self.step("2. CRDs and the operator")
        install_crds(self.cluster.kubeconfig)
        self.console.print("  CRDs installed and Established")
        try:
            self.client.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
        except ApiError as e:
            if e.status.code != 409:
                raise
        proc = self.cluster.start_process("operator", [
            sys.executable, "-m", "nicop", "operator", "--kubeconfig",
            str(self.cluster.kubeconfig), "--namespace", NAMESPACE,
            "--health-port", str(free_port()), "--log-format", "json"])
        self.console.print(f"  nicop operator running (pid {proc.pid}, log {proc.log}); the "
                           "rest comes from what it deploys")

    def apply_policy(self) -> None:
        from lightkube.core.exceptions import ApiError
        from lightkube.generic_resource import create_global_resource

        self.step("3. Apply the NicClusterPolicy and watch it become ready")
        self.console.print(f"  kubectl apply -f {POLICY_FILE}")
        ncp = create_global_resource("mellanox.com", "v1alpha1", "NicClusterPolicy",
                                     "nicclusterpolicies")
        body = yaml.safe_load(POLICY_FILE.read_text())
        with contextlib.suppress(ApiError):  # a second run keeps the driver version it left
            current = self.client.get(ncp, "nic-cluster-policy")["spec"]["ofedDriver"]
            body["spec"]["ofedDriver"]["version"] = current["version"]
        self.applied_at = time.monotonic()
        self.apply(body)
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
        self.console.print(escape(f"\n  policy ready {time.monotonic() - self.applied_at:.0f}s "
                                  f"after the apply: {ready['message']}"))

    def show_agents(self) -> None:
        """What runs where: the agents' pods, the processes the node stand-ins started for
        them, and the resources their device plugins advertise."""
        from lightkube.resources.core_v1 import Node, Pod

        self.step("4. nicop's agents run from the operator's DaemonSets")
        table = Table("node", "pod", "ready", "process (started by the node's stand-in), or "
                      "container (a real node's)")
        agents = self.cluster.agents()
        for pod in sorted(self.client.list(Pod, namespace=NAMESPACE),
                          key=lambda p: (p.spec.nodeName or "", p.metadata.name)):
            if not pod.spec.containers[0].image.rsplit("/", 1)[-1].startswith("nicop"):
                continue
            node = pod.spec.nodeName or "-"
            procs = [f"pid {a.pid}: nicop {a.command}" for a in agents
                     if a.node == node and a.pod == pod.metadata.name]
            procs += [f"{s.containerID[:25]}: {' '.join(c.args or c.command or [])[:40]}"
                      for c, s in zip(pod.spec.containers,
                                      pod.status.containerStatuses or [], strict=False)
                      if (s.containerID or "").startswith("containerd://")]
            ready = any(c.type == "Ready" and c.status == "True"
                        for c in pod.status.conditions or [])
            table.add_row(node, pod.metadata.name, "yes" if ready else "no",
                          escape(", ".join(procs) or "-"))
        self.console.print(table)

        def advertised() -> dict[str, dict[str, str]]:
            found = {}
            for node in self.client.list(Node):
                if (node.metadata.labels or {}).get(
                        "network.nvidia.com/operator.mofed.wait") != "false":
                    continue
                extended = {k: v for k, v in (node.status.allocatable or {}).items()
                            if k.startswith("nvidia.com/") and v != "0"}
                if not set(extended) >= self.expected_resources(node):
                    return {}
                found[node.metadata.name] = extended
            return found

        for node_name, resources in sorted(self.wait("waiting for node allocatable",
                                                     advertised).items()):
            listed = ", ".join(f"{k}={v}" for k, v in sorted(resources.items()))
            self.console.print(f"  {node_name}: {listed}")

    def sriov(self) -> None:
        from lightkube.resources.core_v1 import Node

        self.step("5. An SR-IOV node policy: the config daemon creates the VFs")
        self.console.print(f"  kubectl apply -f {SRIOV_FILE}")
        for body in yaml.safe_load_all(SRIOV_FILE.read_text()):
            self.apply(body)

        def vfs() -> dict[str, str]:
            """Every labelled ConnectX-6 Dx node with 4 VFs per port advertised."""
            found, complete = {}, True
            for n in self.client.list(Node):
                profile = hardware.PROFILES.get((n.metadata.annotations or {}).get(
                    hardware.PROFILE_ANNOTATION, ""))
                labelled = (n.metadata.labels or {}).get(hardware.MELLANOX_PRESENT_LABEL)
                if profile is None or labelled != "true" or not any(
                        nic.device_id == "101d" for nic in profile.nics):
                    continue
                want = 4 * sum(nic.ports for nic in profile.nics if nic.device_id == "101d")
                found[n.metadata.name] = (n.status.allocatable or {}).get(VF_RESOURCE, "0")
                complete &= found[n.metadata.name] == str(want)
            return found if found and complete else {}

        for node, count in sorted(self.wait(f"waiting for {VF_RESOURCE}", vfs).items()):
            root = self.cluster.hardware_root(node)
            made = sorted((root / "sys/class/net").glob("*v[0-9]*"))
            self.console.print(f"  {node}: {VF_RESOURCE}={count}; VF netdevs "
                               f"{', '.join(p.name for p in made)}")

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

        self.step("6. Pods get their devices, and a VF with an address on the SR-IOV network")
        for name, (resources, network) in WORKLOADS.items():
            on_real_node = bool(network) and self.real_node
            extra = (f" on network {network}" if network else "") + (
                f", on {REAL_NODE} (the real node)" if on_real_node else "")
            self.console.print(f"  deployment default/{name}: one pod requesting "
                               f"{resources}{extra}")
            labels = {"app": name}
            annotations = {"k8s.v1.cni.cncf.io/networks": network} if network else None
            container = Container(
                name="app", image=REAL_NODE_IMAGE if on_real_node else WORKLOAD_IMAGE,
                command=["sh", "-c", "trap 'exit 0' TERM; sleep infinity & wait"]
                if on_real_node else None,  # ends on SIGTERM, so a drain need not wait
                resources=ResourceRequirements(requests=resources, limits=resources))
            self.client.apply(Deployment(
                metadata=ObjectMeta(name=name, namespace="default"),
                spec=DeploymentSpec(
                    replicas=1, selector=LabelSelector(matchLabels=labels),
                    template=PodTemplateSpec(
                        metadata=ObjectMeta(labels=labels, annotations=annotations),
                        spec=PodSpec(containers=[container], nodeSelector={
                            "kubernetes.io/hostname": REAL_NODE} if on_real_node else None))),
            ), field_manager="nicop-demo", force=True)
        self.show_pods(first=True)

    def show_pods(self, first: bool = False) -> None:
        networks = os.geteuid() == 0
        for name, (_, network) in WORKLOADS.items():
            pod = self.wait(f"waiting for the pod of {name}",
                            partial(_allocated, self.client, name,
                                    bool(network) and networks))
            if first and name == "rdma-test" and self.applied_at:
                self.console.print(f"  (the first workload pod ran with its devices "
                                   f"{time.monotonic() - self.applied_at:.0f}s after the "
                                   "policy was applied)")
            self.console.print(f"  {pod.metadata.name}: {pod.status.phase} on {pod.spec.nodeName}")
            if pod.spec.nodeName == REAL_NODE:
                self.console.print(escape(
                    f"    $ kubectl exec {pod.metadata.name} -- ls /dev/infiniband\n"
                    f"    {self.devices_inside(pod.metadata.name)}"))
            devices = json.loads((pod.metadata.annotations or {}).get(DEVICES_ANNOTATION)
                                 or '{"app": {}}')["app"]
            for resource, got in sorted(devices.items()):
                env = ", ".join(f"{k}={v}" for k, v in sorted(got["env"].items())
                                if not k.endswith("_INFO"))
                shown = ", ".join(got["devices"][:4]) + (
                    f" and {len(got['devices']) - 4} more" if len(got["devices"]) > 4 else "")
                self.console.print(escape(f"    {resource}: {shown}"
                                          + (f"; env {env}" if env else "")))
            if network and networks:
                for attached in json.loads(pod.metadata.annotations[NETWORK_STATUS]):
                    if attached.get("default"):
                        continue
                    self.console.print(escape(
                        f"    {attached['name']}: {attached['interface']} "
                        f"{', '.join(attached['ips'])} mac {attached['mac']} (VF "
                        f"{attached['device-info']['pci']['pci-address']})"))
            elif network:
                self.console.print(f"    {network}: skipped, not root: the node stand-ins "
                                   "need root for network namespaces, so pods get their VF "
                                   "but no interface")

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
                table, done, total = upgrade_table(self.client, self.cluster, target)
                live.update(table)
                seen_progress |= done < total
                if seen_progress and done == total:
                    break
                time.sleep(0.5)
            else:
                raise ClusterError("the upgrade did not finish in 300s; see `nicop status`")
        self.console.print(f"\n  every node's driver agent loaded {target}; all uncordoned. The "
                           "workload pods were evicted from each node before its driver "
                           "restarted:")
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
                     f"ls {self.cluster.state_dir}/p/<node>/      # each pod's volumes and logs",
                     *([f"ls {self.cluster.real_node(REAL_NODE).state}/logs/      # {REAL_NODE}'s "
                        "kubelet and containerd",
                        "kubectl exec deploy/sriov-test -- ls /dev/infiniband"]
                       if self.real_node else []),
                     "nicop cluster down      # stops every process; data stays for the next run"):
            self.console.print(f"  {line}")

    # ------------------------------------------------------------------ helpers
    def devices_inside(self, pod: str) -> str:
        """The RDMA device nodes a container of the real node sees (what its kubelet gave it
        from the device plugins' Allocate)."""
        import subprocess

        done = subprocess.run(
            [str(self.cluster.bin_dir / "kubectl"), "--kubeconfig", str(self.cluster.kubeconfig),
             "exec", "-n", "default", pod, "--", "ls", "/dev/infiniband"],
            capture_output=True, text=True, timeout=60, check=False)
        return " ".join(done.stdout.split()) if done.returncode == 0 else done.stderr.strip()

    def expected_resources(self, node: Any) -> set[str]:
        """What the demo policy's RDMA plugin advertises on this node's hardware."""
        profile = hardware.PROFILES[(node.metadata.annotations or {})[
            hardware.PROFILE_ANNOTATION]]
        links = {n.link_type for n in profile.nics}
        return set().union(*(EXPECTED_RESOURCES[link] for link in links))


def run(console: Console, nodes: int, profiles: list[str] | None, state_dir: Path | None,
        bin_dir: Path | None, real_node: bool | None = None) -> None:
    """`real_node`: True needs one, False runs without, None adds one when the machine can."""
    demo = Demo(console, LocalCluster(state_dir, bin_dir))
    started = time.monotonic()
    demo.start_cluster(nodes, profiles, real_node)
    demo.start_operator()
    demo.apply_policy()
    demo.show_agents()
    demo.sriov()
    demo.run_pods()
    demo.upgrade_driver()
    demo.diagnose()
    console.print(f"\nThe demo took {time.monotonic() - started:.0f}s ({demo.took()}).")
    demo.explore()


def _allocated(client: Any, app: str, networked: bool) -> Any:
    """The Running pod of deployment `app` once the node gave it its devices (and networks);
    a real node's kubelet starts a container only after that."""
    from lightkube.resources.core_v1 import Pod

    for pod in client.list(Pod, namespace="default", labels={"app": app}):
        annotations = pod.metadata.annotations or {}
        running = pod.status.phase == "Running" and not pod.metadata.deletionTimestamp
        attached = not networked or NETWORK_STATUS in annotations
        allocated = DEVICES_ANNOTATION in annotations or pod.spec.nodeName == REAL_NODE
        if running and allocated and attached:
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
            (node.metadata.annotations or {}).get(hardware.PROFILE_ANNOTATION, ""))
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
                      escape((entry.get("message") or "")[:110]))
    return table


def upgrade_table(client: Any, cluster: LocalCluster, target: str) -> tuple[Table, int, int]:
    """Each node's upgrade state and the driver version its simulated kernel has loaded."""
    from lightkube.resources.core_v1 import Node

    from nicop.node.kernel import version_matches

    table = Table("node", "upgrade state", "cordoned", "driver loaded")
    done = total = 0
    for node in sorted(client.list(Node), key=lambda n: n.metadata.name):
        state = (node.metadata.labels or {}).get("nvidia.com/ofed-driver-upgrade-state")
        if state is None:
            continue
        total += 1
        path = cluster.hardware_root(node.metadata.name) / "sys/module/mlx5_core/version"
        loaded = path.read_text().strip() if path.exists() else "(none)"
        done += state == "upgrade-done" and version_matches(loaded, target)
        table.add_row(node.metadata.name, state, "yes" if node.spec.unschedulable else "",
                      loaded)
    table.title = f"driver upgrade: {done} of {total} nodes done"
    return table, done, total
