"""What nicop costs a GPU node: every agent the operator deploys, on one DGX-like node stand-in.

The policy runs each of nicop's agents there from the operator's DaemonSets: the driver agent,
the RDMA shared device plugin, Multus, the DRA kubelet plugin; an SR-IOV policy (2 VFs on each of
the 8 InfiniBand NICs) adds the SR-IOV config daemon and device plugin, and an InfiniBand network
with an nv-ipam pool adds the CNI daemon. Once every agent runs and the policy is ready, the node
is left alone for `--idle` seconds. Prints per agent: RSS, peak RSS and idle CPU in millicores
(its paced rescans included); the node's totals; and the requests and limits the operator
rendered for each DaemonSet beside them.
Run as root from the repository root: .venv/bin/python -m bench.bench_node_footprint [--idle 300]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from lightkube.resources.apps_v1 import DaemonSet

from bench.bench_agent_loop import usage
from bench.common import NCP, cluster_with_operator

ROOT = Path(__file__).resolve().parents[1]
NODE = "node-1"
AGENTS = {"driver", "rdma-device-plugin", "multus-daemon", "dra-plugin", "sriov-config-daemon",
          "sriov-device-plugin", "cni-daemon"}
POLICY = {
    "apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
    "metadata": {"name": "nic-cluster-policy"},
    "spec": {
        "ofedDriver": {"image": "nicop", "version": "26.07-0.7.0.0",
                       "startupProbe": {"initialDelaySeconds": 5, "periodSeconds": 5},
                       "readinessProbe": {"initialDelaySeconds": 5, "periodSeconds": 10}},
        "rdmaSharedDevicePlugin": {"image": "nicop", "config": json.dumps({"configList": [{
            "resourceName": "rdma", "resourcePrefix": "nvidia.com", "rdmaHcaMax": 63,
            "selectors": {"vendors": ["15b3"], "deviceIDs": ["1021"]}}]})},
        "secondaryNetwork": {"multus": {"image": "nicop"}},
        "draDriver": {},
    },
}
SRIOV = """
apiVersion: sriovnetwork.openshift.io/v1
kind: SriovNetworkNodePolicy
metadata: {name: ib-vfs, namespace: nvidia-network-operator}
spec:
  resourceName: ib_vf
  nodeSelector: {feature.node.kubernetes.io/pci-15b3.present: "true"}
  numVfs: 2
  nicSelector: {vendor: "15b3", deviceID: "1021"}
  isRdma: true
  linkType: ib
---
apiVersion: nv-ipam.nvidia.com/v1alpha1
kind: IPPool
metadata: {name: ib-pool, namespace: nvidia-network-operator}
spec: {subnet: 192.168.0.0/16, perNodeBlockSize: 128, gateway: 192.168.0.1}
---
apiVersion: sriovnetwork.openshift.io/v1
kind: SriovIBNetwork
metadata: {name: ib-net, namespace: nvidia-network-operator}
spec:
  resourceName: ib_vf
  networkNamespace: default
  ipam: '{"type": "nv-ipam", "poolName": "ib-pool"}'
"""


def wait(what: str, check: Any, timeout: float = 600) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.5)
    raise SystemExit(f"timed out after {timeout:.0f}s: {what}")


def status_field(pid: int, field: str) -> float:
    """A /proc/<pid>/status figure in MiB (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def budgets(client: Any) -> dict[str, str]:
    """Each agent DaemonSet's main container resources, as the operator rendered them."""
    found = {}
    for ds in client.list(DaemonSet, namespace="nvidia-network-operator"):
        container = ds.spec.template.spec.containers[0]
        res = container.resources
        req = (res.requests or {}) if res else {}
        lim = (res.limits or {}) if res else {}
        found[ds.metadata.name] = (f"requests {req.get('cpu', '-')}/{req.get('memory', '-')}, "
                                   f"limits {lim.get('memory', '-')}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--idle", type=float, default=300, help="seconds left alone")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp, cluster_with_operator(
            Path(tmp), 1, ["dgx"], node_agents=True) as op:
        op.client.apply(NCP(**POLICY), field_manager="bench", force=True)
        sriov = Path(tmp) / "sriov.yaml"
        sriov.write_text(SRIOV)
        subprocess.run([str(op.cluster.bin_dir / "kubectl"), "--kubeconfig",
                        str(op.cluster.kubeconfig), "apply", "-f", str(sriov)], check=True,
                       capture_output=True)
        print(f"policy ready in {op.wait_policy(timeout=600):.1f}s")

        def running() -> dict[str, int] | None:
            found = {a.command.split()[0]: a.pid for a in op.cluster.agents() if a.node == NODE}
            return found if set(found) >= AGENTS else None

        agents = wait("every agent running on " + NODE, running)
        start = {name: usage(pid) for name, pid in agents.items()}
        print(f"{len(agents)} agents running; idle for {args.idle:.0f}s")
        time.sleep(args.idle)
        idle = {name: usage(pid) for name, pid in agents.items()}
        print(f"\n{'agent':22s} {'RSS':>7s} {'peak':>7s} {'idle CPU':>9s}")
        total_rss = total_peak = total_mcpu = 0.0
        for name, pid in sorted(agents.items()):
            before, after = start[name], idle[name]
            if before is None or after is None:
                print(f"{name:22s} exited during the run")
                continue
            rss, peak = status_field(pid, "VmRSS"), status_field(pid, "VmHWM")
            mcpu = 1000 * (after[0] - before[0]) / args.idle
            total_rss, total_peak, total_mcpu = total_rss + rss, total_peak + peak, \
                total_mcpu + mcpu
            print(f"{name:22s} {rss:6.1f}M {peak:6.1f}M {mcpu:7.2f}m")
        print(f"{'node total':22s} {total_rss:6.1f}M {total_peak:6.1f}M {total_mcpu:7.2f}m")
        print("\nDaemonSet budgets as rendered:")
        for name, text in sorted(budgets(op.client).items()):
            print(f"  {name:40s} {text}")


if __name__ == "__main__":
    main()
