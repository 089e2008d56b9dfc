"""Chaos for a given time, with nothing lost: faults on a live local cluster, invariants checked
all along.

Four ConnectX-6 Dx node stand-ins run nicop's agents from the operator's DaemonSets (the demo
policy, with maxParallelUpgrades 2; SR-IOV with 4 VFs a port, an nv-ipam pool and the
roce-vlan100 network of examples/demo/sriov.yaml). A Deployment keeps `--replicas` pods, each
with a VF on that network and a shared RDMA device. Then, until `--minutes` are up, one fault
at a time, picked at random: the operator killed (SIGKILL) and started again, the API server
restarted, an agent killed, a node stand-in (the kubelet's part) restarted, a PF's link flapped,
the driver version changed (a rolling upgrade), workload pods deleted, a fifth node joined (fresh
hardware: its agents, VFs and address block must come) or drained and removed (its address block
must be freed). After each fault the run waits until the policy is ready and every workload pod
is Running with its VF and address again (the recovery time). Meanwhile, every second:

- no address is given to two pods at once;
- no more nodes are cordoned than maxParallelUpgrades;
- the policy never says ready for long while one of its DaemonSets is not;
- the operator's memory: its resident size per life, which must not grow from life to life.

At the end the Deployment is scaled to 0: no node may still hold an address; then back up:
every pod must get a VF and an address again (none leaked). Prints the faults by kind with
their longest recovery and each invariant's result; exits 1 when an invariant broke.
Run as root from the repository root: .venv/bin/python -m bench.soak --minutes 60
(`--faults node-join-leave,link-flap` injects only those kinds; `--each-once` every kind once,
in random order, the short run `make test` does).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apps_v1 import DaemonSet, Deployment
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from bench.bench_pod_burst import NETWORK_STATUS, held_addresses, started
from bench.bench_pod_start import RDMA, VF
from bench.common import NCP, Operator, cluster_with_operator
from nicop_sim.hardware import PROFILES, SimulatedHost

ROOT = Path(__file__).resolve().parents[1]
NODES = 4
EXTRA_NODE = f"node-{NODES + 1}"  # joins and leaves
NAMESPACE = "nvidia-network-operator"
MAX_PARALLEL = 2  # the demo policy's maxParallelUpgrades
VFS_PER_NODE = 8  # 4 on each port of a ConnectX-6 Dx (examples/demo/sriov.yaml)
UPGRADE_STATE = "nvidia.com/ofed-driver-upgrade-state"
RECOVERY_TIMEOUT = 300.0
STATUS_GRACE = 30.0  # how long the policy may say ready while a DaemonSet is not
DRIVERS = ("26.07-0.7.0.0", "26.07-1.0.0.0")
FAULTS = {  # kind -> weight
    "operator-kill": 3, "apiserver-restart": 2, "agent-kill": 4, "standin-restart": 2,
    "link-flap": 3, "driver-upgrade": 1, "pod-churn": 4, "node-join-leave": 2,
}
IPPool = create_namespaced_resource("nv-ipam.nvidia.com", "v1alpha1", "IPPool", "ippools")


@dataclass
class Findings:
    """What the monitor and the fault loop saw; violations by invariant, first few kept."""

    violations: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    checks: Counter[str] = field(default_factory=Counter)
    recoveries: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    memory: dict[int, list[float]] = field(default_factory=dict)  # operator pid -> RSS MiB
    lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, invariant: str, ok: bool, detail: str = "") -> None:
        """Count the check; a violation is kept and printed at once (a run stopped before its
        report still shows it)."""
        with self.lock:
            self.checks[invariant] += 1
            if not ok and len(self.violations[invariant]) < 20:
                self.violations[invariant].append(f"{time.strftime('%H:%M:%S')} {detail}")
                print(f"  VIOLATED {invariant}: {detail}", flush=True)


def workload(replicas: int) -> Deployment:
    labels = {"app": "soak"}
    return Deployment.from_dict({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "soak", "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels,
                         "annotations": {"k8s.v1.cni.cncf.io/networks": "roce-vlan100"}},
            "spec": {"terminationGracePeriodSeconds": 5, "containers": [{
                "name": "app", "image": "nicop:0.1.0",
                "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 36000 & wait"],
                "resources": {"limits": {VF: "1", RDMA: "1"}}}]}}}})


def pods(client: Any) -> list[Pod]:
    return [p for p in client.list(Pod, namespace="default", labels={"app": "soak"})
            if not p.metadata.deletionTimestamp]


def settled(client: Any, replicas: int) -> bool:
    """The policy ready and every workload pod Running with its VF and address."""
    status = client.get(NCP, "nic-cluster-policy").get("status") or {}
    running = [p for p in pods(client) if all(started(p))]
    return status.get("state") == "ready" and len(running) == replicas


def wait(what: str, check: Any, timeout: float) -> float:
    """Seconds until `check` holds (a check that fails, the API server being away, counts as
    not yet); raises TimeoutError naming `what` and the last failure."""
    start = time.monotonic()
    failure = ""
    while True:
        try:
            if check():
                return time.monotonic() - start
        except Exception as e:  # the API server or the operator restarting
            failure = f"; last: {type(e).__name__}: {e}"
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what} not within {timeout:.0f}s{failure}")
        time.sleep(1)


class Soak:
    def __init__(self, op: Operator, tmp: Path, replicas: int, rng: random.Random) -> None:
        self.op = op
        self.cluster = op.cluster
        self.client = op.client
        self.tmp = tmp
        self.replicas = replicas
        self.rng = rng
        self.findings = Findings()
        self.stop = threading.Event()
        self.ready_while_broken: float | None = None
        self.lives = 0
        self.tick = 0  # the policy annotation the operator must reconcile after a fault
        self.tick_seen: float | None = None

    # ------------------------------------------------------------------ invariants
    def monitor(self) -> None:
        """Every second, until stopped; a read that fails (the API server restarting) is
        skipped, not counted."""
        client = self.cluster.client()
        while not self.stop.wait(1.0):
            try:
                self.sample(client)
            except Exception as e:  # an outage the faults caused
                if "Connection refused" not in str(e) and "503" not in str(e):
                    print(f"  monitor: {type(e).__name__}: {e}", flush=True)

    def sample(self, client: Any) -> None:
        owners: dict[str, list[str]] = defaultdict(list)
        for pod in pods(client):
            for net in json.loads((pod.metadata.annotations or {}).get(NETWORK_STATUS) or "[]"):
                if not net.get("default"):
                    for ip in net.get("ips") or []:
                        owners[ip].append(pod.metadata.name)
        twice = {ip: names for ip, names in owners.items() if len(names) > 1}
        self.findings.check("no address given twice", not twice, json.dumps(twice))
        cordoned = sorted(n.metadata.name for n in client.list(Node) if n.spec.unschedulable)
        self.findings.check("cordoned nodes within maxParallelUpgrades",
                            len(cordoned) <= MAX_PARALLEL, ", ".join(cordoned))
        status = client.get(NCP, "nic-cluster-policy").get("status") or {}
        unready = [d.metadata.name for d in client.list(DaemonSet, namespace=NAMESPACE)
                   if (d.status.numberReady or 0) < (d.status.desiredNumberScheduled or 0)]
        if status.get("state") == "ready" and unready:
            self.ready_while_broken = self.ready_while_broken or time.monotonic()
            lasted = time.monotonic() - self.ready_while_broken
            self.findings.check("policy status true", lasted < STATUS_GRACE,
                                f"ready for {lasted:.0f}s while {', '.join(unready)} not ready")
        else:
            self.ready_while_broken = None
            self.findings.check("policy status true", True)
        pid = self.op.proc.pid
        try:
            rss = self.op.rss_mib("VmRSS")
        except OSError:
            return  # between lives
        if rss > 0:  # a killed operator not yet reaped has no resident size to read
            self.findings.memory.setdefault(pid, []).append(rss)

    # ------------------------------------------------------------------ faults
    def inject(self, kind: str) -> tuple[str, Callable[[], bool]]:
        """Do one fault of `kind`: what was done, and what shows the fault is over besides the
        workload (the operator reconciled, the agent runs again, the rollout finished)."""
        rng = self.rng
        if kind == "operator-kill":
            self.op.proc.send_signal(signal.SIGKILL)
            self.op.proc.wait()
            self.lives += 1
            self.op = Operator(self.cluster, self.tmp / f"operator-{self.lives}.log")
            return f"operator killed; pid {self.op.proc.pid} started", lambda: True
        if kind == "apiserver-restart":
            self.cluster.restart("kube-apiserver")
            return "kube-apiserver restarted", lambda: True
        if kind == "agent-kill":
            # An exec probe's process is no agent: killing it is only a failed probe.
            agent = rng.choice([a for a in self.cluster.agents() if "probe" not in a.command])
            os.kill(agent.pid, signal.SIGKILL)
            return (f"agent {agent.command} on {agent.node} killed",
                    lambda: any(a.node == agent.node and a.command == agent.command
                                and a.pid != agent.pid for a in self.cluster.agents()))
        node = f"node-{rng.randint(1, NODES)}"
        if kind == "standin-restart":
            self.cluster.restart(f"{node}/sim-node")
            return (f"node stand-in of {node} restarted",
                    lambda: any(a.node == node for a in self.cluster.agents()))
        if kind == "link-flap":
            root = self.cluster.hardware_root(node)
            pfs = sorted(p.parent.parent.name for p in
                         (root / "sys/class/net").glob("*/device/sriov_totalvfs"))
            pf = rng.choice(pfs)
            host = SimulatedHost(root)
            host.set_link(pf, False)
            time.sleep(rng.uniform(1, 5))
            host.set_link(pf, True)
            return (f"link of {pf} on {node} down and up",
                    lambda: (self.client.get(Node, node).status.allocatable or {}).get(VF)
                    == str(VFS_PER_NODE))
        if kind == "driver-upgrade":
            current = self.driver()
            target = DRIVERS[1] if current == DRIVERS[0] else DRIVERS[0]
            self.client.patch(NCP, "nic-cluster-policy",
                              {"spec": {"ofedDriver": {"version": target}}},
                              patch_type=PatchType.MERGE, field_manager="soak")
            return f"driver {current} -> {target}", lambda: self.rolled_out(target)
        if kind == "pod-churn":
            running = pods(self.client)
            victims = rng.sample(running, k=min(3, len(running)))
            for pod in victims:
                self.client.delete(Pod, pod.metadata.name, namespace="default")
            return f"{len(victims)} workload pods deleted", lambda: True
        if kind == "node-join-leave":
            if any(n.metadata.name == EXTRA_NODE for n in self.client.list(Node)):
                return self.leave(EXTRA_NODE)
            self.cluster.join_node(EXTRA_NODE, PROFILES["cx6dx"], die_with_parent=True)
            return (f"{EXTRA_NODE} joined",
                    lambda: (self.client.get(Node, EXTRA_NODE).status.allocatable or {}).get(VF)
                    == str(VFS_PER_NODE) and EXTRA_NODE in self.blocks()
                    and self.rolled_out(self.driver()))
        raise ValueError(kind)

    def leave(self, node: str) -> tuple[str, Callable[[], bool]]:
        """Drain the node as an administrator would (cordon, delete its workload pods and wait
        until they are gone, so their addresses are given back), then remove it."""
        self.client.patch(Node, node, {"spec": {"unschedulable": True}},
                          patch_type=PatchType.MERGE, field_manager="soak")
        for pod in pods(self.client):
            if pod.spec.nodeName == node:
                self.client.delete(Pod, pod.metadata.name, namespace="default")
        wait(f"{node} drained", lambda: not [p for p in self.client.list(
            Pod, namespace="default", labels={"app": "soak"}) if p.spec.nodeName == node],
            RECOVERY_TIMEOUT)
        self.cluster.remove_node(node)
        return f"{node} drained and removed", lambda: node not in self.blocks()

    def blocks(self) -> set[str]:
        """The nodes that hold a block of the workload's address pool."""
        pool = self.client.get(IPPool, "rdma-pool", namespace=NAMESPACE)
        return {a["nodeName"] for a in (pool.get("status") or {}).get("allocations") or []}

    def driver(self) -> str:
        return str(self.client.get(NCP, "nic-cluster-policy")["spec"]["ofedDriver"]["version"])

    def rolled_out(self, version: str) -> bool:
        drivers = [p for p in self.client.list(Pod, namespace=NAMESPACE)
                   if p.metadata.name.startswith("mofed-")]
        nodes = list(self.client.list(Node))
        states = {(n.metadata.labels or {}).get(UPGRADE_STATE) for n in nodes}
        # The version is in the image's tag, or (nicop's driver agent) NVIDIA_NIC_DRIVER_VER.
        return (len(drivers) == len(nodes) and states == {"upgrade-done"}
                and all(version in json.dumps(p.spec.containers[0].to_dict()) for p in drivers))

    def operator_caught_up(self) -> bool:
        """The operator reconciled the policy after this was first asked: it reads the API."""
        if self.tick_seen is None:
            self.tick += 1
            self.tick_seen = self.op.reconciles().get("nicclusterpolicy", (0, 0.0))[0]
            self.client.patch(NCP, "nic-cluster-policy",
                              {"metadata": {"annotations": {"soak-tick": str(self.tick)}}},
                              patch_type=PatchType.MERGE, field_manager="soak")
        return self.op.reconciles().get("nicclusterpolicy", (0, 0.0))[0] > self.tick_seen

    def run(self, schedule: Iterable[str], pause: float) -> None:
        """Inject the faults of `schedule` one at a time, each followed by its recovery and a
        pause of up to `pause` seconds."""
        monitor = threading.Thread(target=self.monitor, daemon=True)
        monitor.start()
        for n, kind in enumerate(schedule, start=1):
            started_at = time.monotonic()
            done, over = self.inject(kind)
            self.tick_seen = None

            def recovered(over: Callable[[], bool] = over) -> bool:
                return over() and self.operator_caught_up() and settled(self.client,
                                                                         self.replicas)
            try:
                wait(f"recovery after {kind}", recovered, RECOVERY_TIMEOUT)
                took = time.monotonic() - started_at
                self.findings.recoveries[kind].append(took)
                self.findings.check("every workload Running again", True)
                print(f"  {n:3d} {kind:18s} {done}; recovered in {took:.0f}s", flush=True)
            except TimeoutError as e:
                self.findings.recoveries[kind].append(RECOVERY_TIMEOUT)
                self.findings.check("every workload Running again", False, f"{done}: {e}")
                print(f"  {n:3d} {kind:18s} {done}; NOT RECOVERED: {e}", flush=True)
            time.sleep(self.rng.uniform(pause / 4, pause))
        self.final_checks()
        self.stop.set()
        monitor.join()

    def final_checks(self) -> None:
        self.client.apply(workload(0), field_manager="soak", force=True)
        wait("the workload pods gone", lambda: not list(self.client.list(
            Pod, namespace="default", labels={"app": "soak"})), RECOVERY_TIMEOUT)
        try:
            wait("every address given back", lambda: held_addresses(self.client) == 0, 60)
            self.findings.check("no address leaked", True)
        except TimeoutError as e:
            self.findings.check("no address leaked", False,
                                f"{held_addresses(self.client)} still held: {e}")
        self.client.apply(workload(self.replicas), field_manager="soak", force=True)
        try:
            wait("every pod with its VF again", lambda: settled(self.client, self.replicas),
                 RECOVERY_TIMEOUT)
            self.findings.check("no VF leaked", True)
        except TimeoutError as e:
            self.findings.check("no VF leaked", False, str(e))

    # ------------------------------------------------------------------ report
    def report(self) -> bool:
        f = self.findings
        print("\nfaults injected (kind: count, longest and median recovery)")
        for kind, took in sorted(f.recoveries.items()):
            took = sorted(took)
            print(f"  {kind:18s} {len(took):3d}  longest {took[-1]:5.0f}s  "
                  f"median {took[len(took) // 2]:5.0f}s")
        lives = [(pid, samples) for pid, samples in f.memory.items() if len(samples) >= 10]
        if lives:
            settled_rss = lives[0][1][len(lives[0][1]) // 2]
            last = [samples[-1] for _, samples in lives]
            print(f"\noperator memory: {len(lives)} lives; RSS at the end of each: "
                  + ", ".join(f"{x:.0f}" for x in last) + f" MiB (first life settled at "
                  f"{settled_rss:.0f} MiB)")
            f.check("operator memory flat", max(last) <= 1.25 * settled_rss + 10,
                    f"grew to {max(last):.0f} MiB from {settled_rss:.0f} MiB")
        print("\ninvariants")
        ok = True
        for invariant in sorted(f.checks):
            broken = f.violations.get(invariant) or []
            ok &= not broken
            print(f"  {'FAIL' if broken else 'PASS'}  {invariant} ({f.checks[invariant]} "
                  "checks)")
            for line in broken[:5]:
                print(f"          {line}")
        return ok


def timed(minutes: float, faults: dict[str, int], rng: random.Random) -> Iterator[str]:
    """Faults picked at random by weight until `minutes` are up."""
    deadline = time.monotonic() + minutes * 60
    kinds, weights = zip(*faults.items(), strict=True)
    while time.monotonic() < deadline:
        yield rng.choices(kinds, weights)[0]


def each_once(faults: dict[str, int], rng: random.Random) -> list[str]:
    """Every kind once, in random order (node-join-leave twice: the node joins, then leaves):
    the short run that covers every fault."""
    kinds = [*faults, *(["node-join-leave"] if "node-join-leave" in faults else [])]
    rng.shuffle(kinds)
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--replicas", type=int, default=12)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help="the kinds of fault to inject, comma-separated")
    parser.add_argument("--each-once", action="store_true",
                        help="every kind once in random order instead of for --minutes")
    parser.add_argument("--pause", type=float, default=20,
                        help="longest pause between faults, seconds (the shortest is a quarter)")
    args = parser.parse_args()
    chosen = args.faults.split(",")
    if unknown := sorted(set(chosen) - set(FAULTS)):
        parser.error(f"unknown fault {', '.join(unknown)}; known: {', '.join(FAULTS)}")
    faults = {k: FAULTS[k] for k in chosen}
    rng = random.Random(args.seed)
    schedule = each_once(faults, rng) if args.each_once else timed(args.minutes, faults, rng)
    length = "every fault once" if args.each_once else f"{args.minutes:g} minutes"
    print(f"soak for {length}, seed {args.seed}", flush=True)
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp, cluster_with_operator(
            Path(tmp), NODES, ["cx6dx"], node_agents=True) as op:
        client = op.client
        policy = yaml.safe_load((ROOT / "examples/nicclusterpolicy-demo.yaml").read_text())
        client.apply(NCP(**policy), field_manager="soak", force=True)
        print(f"policy ready in {op.wait_policy(timeout=600):.1f}s", flush=True)
        subprocess.run([str(op.cluster.bin_dir / "kubectl"), "--kubeconfig",
                        str(op.cluster.kubeconfig), "apply", "-f",
                        str(ROOT / "examples/demo/sriov.yaml")], check=True,
                       capture_output=True)
        client.apply(workload(args.replicas), field_manager="soak", force=True)
        took = wait("the workload Running", lambda: settled(client, args.replicas), 600)
        print(f"{args.replicas} workload pods Running with a VF and an address in {took:.0f}s",
              flush=True)
        soak = Soak(op, Path(tmp), args.replicas, rng)
        try:
            soak.run(schedule, args.pause)
        finally:
            soak.stop.set()
            soak.op.stop()
        ok = soak.report()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
