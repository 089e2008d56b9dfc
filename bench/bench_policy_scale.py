"""How the operator copes with a large cluster: 1000 kwok nodes, one NicClusterPolicy.

Prints the time from applying the InfiniBand example policy to `state: ready`, the API
requests the operator made by verb, and its peak RSS.
Run: .venv/bin/python bench/bench_policy_scale.py [--nodes 1000]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import yaml
from lightkube.generic_resource import create_global_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace

from nicop.api.install import install_crds
from nicop.sim.cluster import LocalCluster, free_port

ROOT = Path(__file__).resolve().parents[1]
METRIC = re.compile(r'^nicop_api_requests_total\{resource="([^"]+)",verb="([^"]+)"\} ([0-9.e+]+)$')


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster")
        t = time.monotonic()
        cluster.up(nodes=args.nodes, profiles=["cx6dx", "dgx", "cx6dx"], die_with_parent=True)
        print(f"cluster with {args.nodes} nodes up in {time.monotonic() - t:.1f}s")
        try:
            run(cluster, Path(tmp))
        finally:
            cluster.down()


def run(cluster: LocalCluster, tmp: Path) -> None:
    client = cluster.client()
    install_crds(client)
    client.create(Namespace(metadata=ObjectMeta(name="nvidia-network-operator")))
    port = free_port()
    log = open(tmp / "operator.log", "wb")  # noqa: SIM115
    op = subprocess.Popen(
        [sys.executable, "-m", "nicop", "operator", "--kubeconfig", str(cluster.kubeconfig),
         "--health-port", str(port), "--no-leader-elect"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        ncp = create_global_resource("mellanox.com", "v1alpha1", "NicClusterPolicy",
                                     "nicclusterpolicies")
        body = yaml.safe_load((ROOT / "examples" / "nicclusterpolicy-infiniband.yaml").read_text())
        while _get(port, "/readyz")[0] != 200:
            time.sleep(0.1)
        start = time.monotonic()
        client.apply(ncp(**body), field_manager="bench", force=True)
        while (client.get(ncp, "nic-cluster-policy").get("status") or {}).get("state") != "ready":
            if time.monotonic() - start > 900:
                raise SystemExit("policy not ready after 900s")
            time.sleep(0.5)
        took = time.monotonic() - start
        requests: Counter[str] = Counter()
        for line in _get(port, "/metrics")[1].splitlines():
            if m := METRIC.match(line):
                requests[m.group(2)] += int(float(m.group(3)))
        hwm = next(line.split()[1] for line in Path(f"/proc/{op.pid}/status").read_text()
                   .splitlines() if line.startswith("VmHWM"))
        print(f"policy ready {took:.1f}s after apply")
        print("API requests by verb: " + ", ".join(f"{v}={n}" for v, n in sorted(requests.items())))
        print(f"operator peak RSS: {int(hwm) / 1024:.0f} MiB")
    finally:
        op.terminate()
        op.wait()
        log.close()


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except OSError:
        return 0, ""


if __name__ == "__main__":
    main()
