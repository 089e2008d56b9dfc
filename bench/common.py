"""What the operator benchmarks share: a big local cluster, the operator process, its metrics."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightkube.generic_resource import create_global_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace

from nicop.operator.crds import install_crds
from nicop_sim.cluster import LocalCluster, free_port

NCP = create_global_resource("mellanox.com", "v1alpha1", "NicClusterPolicy",
                             "nicclusterpolicies")
SAMPLE = re.compile(r'^(\w+)\{([^}]*)\} ([0-9.e+-]+)$')
LABEL = re.compile(r'(\w+)="([^"]*)"')


@contextmanager
def cluster_with_operator(tmp: Path, nodes: int, profiles: list[str],
                          node_agents: bool = False, trace_memory: bool = False,
                          real_nodes: int = 0) -> Iterator[Operator]:
    """A local cluster and the operator; kwok plays every pod unless `node_agents` (a node
    stand-in per node runs nicop's pods: too many processes for a big cluster). With
    `trace_memory` the operator traces its allocations (slower) for `memory_by_module`.
    `real_nodes` more nodes run a real kubelet and containerd (root, `make runtime image`)."""
    cluster = LocalCluster(tmp / "cluster")
    t = time.monotonic()
    cluster.up(nodes=nodes, profiles=profiles, die_with_parent=True, node_agents=node_agents,
               real_nodes=real_nodes)
    print(f"cluster with {nodes} nodes up in {time.monotonic() - t:.1f}s")
    try:
        client = cluster.client()
        install_crds(cluster.kubeconfig)
        client.create(Namespace(metadata=ObjectMeta(name="nvidia-network-operator")))
        op = Operator(cluster, tmp / "operator.log", trace_memory=trace_memory)
        try:
            yield op
        finally:
            op.stop()
    finally:
        cluster.down()


class Operator:
    def __init__(self, cluster: LocalCluster, log: Path, trace_memory: bool = False) -> None:
        self.cluster = cluster
        self.client: Any = cluster.client()
        self.port = free_port()
        self._log = open(log, "wb")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nicop", "operator", "--kubeconfig", str(cluster.kubeconfig),
             "--health-port", str(self.port), "--no-leader-elect"],
            stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, **({"PYTHONTRACEMALLOC": "25"} if trace_memory else {})},
        )
        while self.get("/readyz")[0] != 200:
            time.sleep(0.1)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except OSError:
            return 0, ""

    def metrics(self) -> dict[tuple[str, str], float]:
        """(metric name, its labels as written) -> value."""
        found = {}
        for line in self.get("/metrics")[1].splitlines():
            if m := SAMPLE.match(line):
                found[m.group(1), m.group(2)] = float(m.group(3))
        return found

    def requests(self) -> dict[tuple[str, str], int]:
        """(verb, resource) -> requests sent so far."""
        found = {}
        for (name, labels), value in self.metrics().items():
            if name == "nicop_api_requests_total":
                tags = dict(LABEL.findall(labels))
                found[tags["verb"], tags["resource"]] = int(value)
        return found

    def watch_bytes(self) -> dict[str, float]:
        """resource -> bytes of watch events received so far."""
        return {dict(LABEL.findall(labels))["resource"]: value
                for (name, labels), value in self.metrics().items()
                if name == "nicop_api_watch_bytes_total"}

    def reconciles(self) -> dict[str, tuple[int, float]]:
        """controller -> (reconciles so far, seconds spent in them)."""
        count: dict[str, int] = {}
        seconds: dict[str, float] = {}
        for (name, labels), value in self.metrics().items():
            controller = dict(LABEL.findall(labels)).get("controller", "")
            if name == "nicop_reconcile_seconds_count":
                count[controller] = int(value)
            elif name == "nicop_reconcile_seconds_sum":
                seconds[controller] = value
        return {c: (n, seconds.get(c, 0.0)) for c, n in count.items()}

    def cpu_seconds(self) -> float:
        """utime + stime of the operator process so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self, field: str = "VmHWM") -> float:
        """Peak (VmHWM) or current (VmRSS) resident memory of the operator process."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) / 1024
        return 0.0

    def memory_by_module(self) -> str:
        """The operator's live memory by the line of nicop's code that allocated it (needs
        `trace_memory`)."""
        return self.get("/debug/memory")[1]

    def wait_policy(self, state: str = "ready", timeout: float = 1800) -> float:
        start = time.monotonic()
        while (self.client.get(NCP, "nic-cluster-policy").get("status") or {}).get(
                "state") != state:
            if time.monotonic() - start > timeout:
                raise SystemExit(f"policy not {state} after {timeout}s")
            time.sleep(0.5)
        return time.monotonic() - start

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        self._log.close()
