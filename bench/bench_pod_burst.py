"""Pods that start at once: 100 pods over 10 ConnectX-6 Dx nodes, each with a shared RDMA device
and one VF on an SR-IOV network with an nv-ipam address.

Ten node stand-ins run nicop's agents from the operator's DaemonSets (the demo policy; SR-IOV
with 8 VFs a port, an nv-ipam pool, the roce-vlan100 network of examples/demo/sriov.yaml). Once
every node offers its VFs, `--pods` pods are created together, spread evenly by node selector.
Prints p50/p99/max from creation to Running and to network-status naming the VF and its
address; the agents' own figures (CNI ADD from the CNI daemons' and Multus' histograms, Allocate
from the device plugins'), as p50/p99 read from their buckets; whether any address was given
twice; and, after every pod is deleted, how many addresses the nodes still hold. Also the CPU
seconds and peak RSS of the agents and the stand-ins over the burst.
Run as root from the repository root: .venv/bin/python -m bench.bench_pod_burst [--pods 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Node, Pod
from prometheus_client.parser import text_string_to_metric_families

from bench.bench_agent_loop import usage
from bench.bench_pod_start import VF, percentile, wait, workload
from bench.common import NCP, cluster_with_operator
from nicop.api.nodes import ipam_usage

ROOT = Path(__file__).resolve().parents[1]
NODES = 10
NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"
NAMESPACE = "nvidia-network-operator"


def bucket_percentile(buckets: dict[float, float], q: float) -> float:
    """A quantile from cumulative histogram buckets (upper bound -> count), interpolated within
    its bucket as Prometheus' histogram_quantile does."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if not total:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        if buckets[bound] >= rank:
            if bound == float("inf"):
                return lower
            inside = buckets[bound] - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1)
        lower, below = bound, buckets[bound]
    return lower


def histograms(address: str, name: str) -> dict[float, float]:
    """`name`'s buckets of one agent, summed over its labels (ok results only for CNI)."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    buckets: dict[float, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == f"{name}_bucket" and s.labels.get("result", "ok") == "ok" \
                    and s.labels.get("command", "ADD") == "ADD":
                buckets[float(s.labels["le"])] += s.value
    return buckets


def agent_pods(client: Any) -> list[Pod]:
    return [p for p in client.list(Pod, namespace=NAMESPACE) if p.status.phase == "Running"]


def metrics_address(pod: Pod) -> str | None:
    ports = [p.containerPort for c in pod.spec.containers for p in c.ports or []
             if p.name == "metrics"]
    ip = pod.status.podIP or pod.status.hostIP
    return f"{ip}:{ports[0]}" if ports and ip else None


def agent_figures(client: Any, name: str, containers: tuple[str, ...]) -> dict[float, float]:
    """`name`'s buckets summed over every agent pod whose container is one of `containers`."""
    total: dict[float, float] = defaultdict(float)
    for pod in agent_pods(client):
        if pod.spec.containers[0].name not in containers:
            continue
        if (address := metrics_address(pod)) is None:
            continue
        for bound, count in histograms(address, name).items():
            total[bound] += count
    return total


def started(pod: Pod) -> tuple[bool, bool]:
    """(Running, network-status names a VF with an address)."""
    running = pod.status is not None and pod.status.phase == "Running"
    status = json.loads((pod.metadata.annotations or {}).get(NETWORK_STATUS) or "[]")
    attached = any(s.get("device-info") and s.get("ips") for s in status)
    return running, attached


def held_addresses(client: Any) -> int:
    """Addresses the nodes' CNI daemons say they hold (their usage annotation)."""
    return sum(int(pool.get("allocated", 0)) for node in client.list(Node)
               for pool in ipam_usage(node.to_dict()).values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp, cluster_with_operator(
            Path(tmp), NODES, ["cx6dx"], node_agents=True) as op:
        client = op.client
        policy = yaml.safe_load((ROOT / "examples/nicclusterpolicy-demo.yaml").read_text())
        client.apply(NCP(**policy), field_manager="bench", force=True)
        print(f"policy ready in {op.wait_policy(timeout=600):.1f}s")
        sriov = list(yaml.safe_load_all((ROOT / "examples/demo/sriov.yaml").read_text()))
        sriov[0]["spec"]["numVfs"] = 8  # 16 VFs a node: room for 10 pods on each
        path = Path(tmp) / "sriov.yaml"
        path.write_text(yaml.safe_dump_all(sriov))
        subprocess.run([str(op.cluster.bin_dir / "kubectl"), "--kubeconfig",
                        str(op.cluster.kubeconfig), "apply", "-f", str(path)], check=True,
                       capture_output=True)
        nodes = [f"node-{i}" for i in range(1, NODES + 1)]
        for node in nodes:
            wait(f"16 VFs on {node}", lambda n=node: (client.get(Node, n).status.allocatable
                                                      or {}).get(VF) == "16")
        pids = {f"{a.node}/{a.command.split()[0]}": a.pid for a in op.cluster.agents()}
        pids.update({name: p.pid for name, p in op.cluster.state().processes.items()
                     if name.endswith("/sim-node")})
        before = {name: usage(pid) for name, pid in pids.items()}
        names = [f"burst-{i}" for i in range(args.pods)]
        created: dict[str, float] = {}
        running: dict[str, float] = {}
        attached: dict[str, float] = {}
        start = time.monotonic()
        with ThreadPoolExecutor(10) as pool:
            for name, at in zip(names, pool.map(
                    lambda i: (client.create(workload(names[i], nodes[i % NODES])),
                               time.monotonic())[1], range(args.pods)), strict=True):
                created[name] = at
        print(f"{args.pods} pods created in {time.monotonic() - start:.1f}s")
        while len(attached) < args.pods:
            if time.monotonic() - start > 600:
                raise SystemExit(f"only {len(attached)} of {args.pods} pods attached in 600s")
            now = time.monotonic()
            for pod in client.list(Pod, namespace="default"):
                name = pod.metadata.name
                if name not in created:
                    continue
                is_running, is_attached = started(pod)
                if is_running and name not in running:
                    running[name] = now - created[name]
                if is_attached and name not in attached:
                    attached[name] = now - created[name]
            time.sleep(0.1)
        after = {name: usage(pid) for name, pid in pids.items()}
        addresses = [s["ips"][0] for p in client.list(Pod, namespace="default")
                     if p.metadata.name in created
                     for s in json.loads(p.metadata.annotations[NETWORK_STATUS])
                     if s.get("device-info")]
        print(f"\n{args.pods} pods over {NODES} nodes, from creation (polled every 0.1 s):")
        for what, values in (("to Running", list(running.values())),
                             ("to its VF with an address", list(attached.values()))):
            print(f"  {what:28s} p50 {percentile(values, 0.5):5.2f}s  p99 "
                  f"{percentile(values, 0.99):5.2f}s  max {max(values):5.2f}s  mean "
                  f"{statistics.mean(values):5.2f}s")
        print(f"  addresses: {len(addresses)}, distinct {len(set(addresses))}")
        for label, name, containers in (
                ("CNI ADD in the CNI daemons", "nicop_cni_request_seconds", ("cni-daemon",)),
                ("CNI ADD in Multus (whole pod)", "nicop_cni_request_seconds", ("kube-multus",)),
                ("Allocate in the device plugins", "nicop_device_plugin_allocate_seconds",
                 ("rdma-shared-dp", "sriov-device-plugin"))):
            buckets = agent_figures(client, name, containers)
            if buckets:
                print(f"  {label:32s} p50 {1000 * bucket_percentile(buckets, 0.5):7.1f}ms  p99 "
                      f"{1000 * bucket_percentile(buckets, 0.99):7.1f}ms  "
                      f"({buckets[max(buckets)]:.0f} calls)")
        print("\nCPU seconds over the burst, and peak RSS:")
        by_kind: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for name in pids:
            if before[name] is None or after[name] is None:
                continue
            by_kind[name.split("/", 1)[1]].append((after[name][0] - before[name][0],
                                                    after[name][1]))
        for kind, figures in sorted(by_kind.items()):
            print(f"  {kind:22s} {len(figures):2d} processes, {sum(c for c, _ in figures):6.1f} "
                  f"CPU s, peak RSS {max(r for _, r in figures):5.0f} MiB at most")
        for name in names:
            client.delete(Pod, name, namespace="default")

        def gone() -> bool:
            try:
                return not [p for p in client.list(Pod, namespace="default")
                            if p.metadata.name in created]
            except ApiError:
                return False

        wait("every pod gone", gone)
        try:  # the daemons publish their usage every 5 s
            wait("every address given back", lambda: held_addresses(client) == 0, timeout=60)
        except SystemExit as e:
            print(e)
        print(f"\nafter deleting them: addresses still held {held_addresses(client)}")


if __name__ == "__main__":
    main()
