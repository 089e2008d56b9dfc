"""The loop on the local cluster with nicop's own agents: how long from applying a policy to a
workload pod running with its devices, and what the nodes run for it.

Four nodes (dgx, cx6dx, cx6dx, cpu), each with its node stand-in; the policy runs nicop's driver
agent and RDMA shared device plugin (upstream's probe fields shortened, as in the demo policy).
A workload asking for nvidia.com/rdma is created right after the policy. Prints the time to the
policy's `ready` and to the workload Running with its devices, the processes per node, and the
CPU seconds and peak RSS of the stand-ins and of the agents.
Run from the repository root: .venv/bin/python -m bench.bench_agent_loop
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from bench.common import NCP, cluster_with_operator

ROOT = Path(__file__).resolve().parents[1]
TICKS = 100  # clock ticks per second of /proc/<pid>/stat


def usage(pid: int) -> tuple[float, float] | None:
    """CPU seconds (utime + stime) and peak RSS in MiB of a process; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    cpu = (int(fields[11]) + int(fields[12])) / TICKS
    peak = next(int(line.split()[1]) for line in status.splitlines()
                if line.startswith("VmHWM"))
    return cpu, peak / 1024


def main() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp, cluster_with_operator(
        Path(tmp), 4, ["dgx", "cx6dx", "cx6dx", "cpu"], node_agents=True
    ) as op:
        body = yaml.safe_load((ROOT / "examples" / "nicclusterpolicy-demo.yaml").read_text())
        start = time.monotonic()
        op.client.apply(NCP(**body), field_manager="bench", force=True)
        limits = {"nvidia.com/rdma": "1"}
        op.client.create(Pod(metadata=ObjectMeta(name="workload", namespace="default"),
                             spec=PodSpec(containers=[Container(
                                 name="app", image="mellanox/rping-test",
                                 resources=ResourceRequirements(requests=limits,
                                                                limits=limits))])))
        ready = None
        while True:
            now = time.monotonic() - start
            state = (op.client.get(NCP, "nic-cluster-policy").get("status") or {}).get("state")
            if ready is None and state == "ready":
                ready = now
            pod = op.client.get(Pod, "workload", namespace="default")
            devices = (pod.metadata.annotations or {}).get("nicop.io/devices")
            if devices and pod.status.phase == "Running":
                break
            if now > 600:
                raise SystemExit("the workload did not run in 600s")
            time.sleep(0.2)
        print(f"policy ready {ready or now:.1f}s after apply; workload Running with "
              f"{len(json.loads(devices)['app']['nvidia.com/rdma']['devices'])} RDMA device "
              f"files {now:.1f}s after apply")
        cluster = op.cluster
        stand_ins = {p.pid: name.split("/")[0] for name, p in cluster.state().processes.items()
                     if name.endswith("/sim-node")}
        agents = cluster.agents()
        per_node = Counter(a.node for a in agents)
        for node in sorted(stand_ins.values()):
            commands = ", ".join(sorted(a.command for a in agents if a.node == node))
            print(f"  {node}: 1 stand-in + {per_node[node]} agents ({commands or 'none'})")
        restarts = sum(c.restartCount for p in op.client.list(Pod, namespace="nvidia-network-"
                                                              "operator")
                       for c in p.status.containerStatuses or [])
        print(f"agent container restarts so far: {restarts}")
        for what, pids in (("stand-ins", list(stand_ins)), ("agents", [a.pid for a in agents])):
            figures = [f for pid in pids if (f := usage(pid)) is not None]
            print(f"{what}: {len(pids)} processes, {sum(c for c, _ in figures):.1f} CPU s in all, "
                  f"peak RSS {max(r for _, r in figures):.0f} MiB each at most, "
                  f"{sum(r for _, r in figures):.0f} MiB together")


if __name__ == "__main__":
    main()
