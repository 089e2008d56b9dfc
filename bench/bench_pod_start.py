"""Pod start latency on a real node against a node stand-in of the same hardware.

One real node (a real kubelet, containerd and runc: nicop_sim.realnode) and two stand-ins, all
ConnectX-6 Dx; the demo policy (nicop's image for every component, its multus daemon too) and
examples/demo/sriov.yaml (4 VFs a port, an nv-ipam pool, roce-vlan100). On each of real-1
and node-1, 20 pods one after the other, each asking for the RDMA pool and one VF on
roce-vlan100: the time from the pod's create to Ready with its network-status (its VF, with an
address from the pool), then the pod is deleted (gracefully) and gone before the next. Prints
p50, p99 and max per node, their ratio, and the CPU seconds and peak RSS of what plays the
node: the real kubelet and containerd, and the stand-in's one process.
Run as root from the repository root after `make runtime image`:
    .venv/bin/python -m bench.bench_pod_start
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Event, Node, Pod

from bench.bench_agent_loop import usage
from bench.common import NCP, Operator, cluster_with_operator

ROOT = Path(__file__).resolve().parents[1]
REAL, STAND_IN = "real-1", "node-1"
PODS = 20
SLOW = 3.0  # seconds: a slower start prints the pod's warnings
RDMA, VF = "nvidia.com/rdma_roce", "nvidia.com/cx6dx_vf"
NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"


def workload(name: str, node: str) -> Pod:
    return Pod.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default",
                     "annotations": {"k8s.v1.cni.cncf.io/networks": "roce-vlan100"}},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                 "terminationGracePeriodSeconds": 5, "containers": [{
                     "name": "app", "image": "nicop:0.1.0",
                     "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
                     "resources": {"limits": {VF: "1", RDMA: "1"}}}]}})


def wait(what: str, check: Any, timeout: float = 300, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(every)
    raise SystemExit(f"timed out after {timeout:.0f}s: {what}")


def started(client: Any, name: str) -> bool:
    pod = client.get(Pod, name, namespace="default")
    ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
    return ready and NETWORK_STATUS in (pod.metadata.annotations or {})


def gone(client: Any, name: str) -> bool:
    try:
        client.get(Pod, name, namespace="default")
    except ApiError as e:
        return e.status.code == 404
    return False


def node_processes(op: Operator, node: str) -> dict[str, int]:
    """What plays `node`: the real node's kubelet and containerd (found by their state
    directory), or the stand-in's process."""
    if node != REAL:
        return {"sim-node": op.cluster.state().processes[f"{node}/sim-node"].pid}
    state = str(op.cluster.real_node(node).state).encode()
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        name = argv[0].rsplit(b"/", 1)[-1].decode(errors="replace")
        if name in ("kubelet", "containerd") and state in b" ".join(argv):
            found[name] = int(entry.name)
    return found


def latencies(op: Operator, node: str) -> list[float]:
    seconds = []
    for i in range(PODS):
        name = f"start-{node}-{i}"
        begin = time.monotonic()
        op.client.create(workload(name, node))
        wait(f"{name} Ready with its VF", lambda n=name: started(op.client, n), every=0.05)
        seconds.append(time.monotonic() - begin)
        if seconds[-1] > SLOW:
            print(f"  {name}: {seconds[-1]:.1f}s; its Events: " + "; ".join(
                f"{e.reason}: {e.message}" for e in op.client.list(
                    Event, namespace="default", fields={"involvedObject.name": name})
                if e.type == "Warning") or "none")
        # deleted as kubectl delete does: the kubelet tears the pod's networks down before the
        # pod goes (a forced delete lets the next pod get the VF before its DEL, and wait)
        op.client.delete(Pod, name, namespace="default")
        wait(f"{name} gone", lambda n=name: gone(op.client, n))
    return seconds


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp, cluster_with_operator(
            Path(tmp), 2, ["cx6dx"], node_agents=True, real_nodes=1) as op:
        policy = yaml.safe_load((ROOT / "examples/nicclusterpolicy-demo.yaml").read_text())
        op.client.apply(NCP(**policy), field_manager="bench", force=True)
        print(f"policy ready in {op.wait_policy(timeout=300):.1f}s")
        subprocess.run([str(op.cluster.bin_dir / "kubectl"), "--kubeconfig",
                        str(op.cluster.kubeconfig), "apply", "-f",
                        str(ROOT / "examples/demo/sriov.yaml")], check=True, capture_output=True)
        for node in (REAL, STAND_IN):
            wait(f"8 VFs on {node}", lambda n=node: (op.client.get(Node, n).status.allocatable
                                                      or {}).get(VF) == "8")
        results = {}
        for node in (REAL, STAND_IN):
            pids = node_processes(op, node)
            before = {name: usage(pid) for name, pid in pids.items()}
            seconds = latencies(op, node)
            after = {name: usage(pid) for name, pid in pids.items()}
            results[node] = seconds
            print(f"\n{node}: {PODS} pods (RDMA + one VF + an address), start to Ready with "
                  "network-status")
            print(f"  p50 {percentile(seconds, 0.5):.2f}s  p99 {percentile(seconds, 0.99):.2f}s"
                  f"  max {max(seconds):.2f}s  mean {statistics.mean(seconds):.2f}s")
            for name in pids:
                cpu0, _ = before[name] or (0.0, 0.0)
                cpu1, peak = after[name] or (0.0, 0.0)
                print(f"  {name}: {cpu1 - cpu0:.1f} CPU s over the {PODS} pods, "
                      f"peak RSS {peak:.0f} MiB")
        real, stand_in = results[REAL], results[STAND_IN]
        print(f"\nstand-in / real: p50 {percentile(stand_in, 0.5) / percentile(real, 0.5):.2f}"
              f", p99 {percentile(stand_in, 0.99) / percentile(real, 0.99):.2f}")


if __name__ == "__main__":
    main()
