"""A rolling driver upgrade of 1000 kwok nodes with maxParallelUpgrades 50.

Prints the total rollout time, the operator's CPU seconds (utime+stime of the process, all its
controllers and watches) per node transition, the upgrade controller's reconcile time per
transition (API calls included), and the operator's peak RSS.
Run from the repository root: .venv/bin/python -m bench.bench_upgrade [--nodes 1000] [--parallel 50]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from lightkube.resources.core_v1 import Node, Pod

from bench.common import NCP, Operator, cluster_with_operator

OLD, NEW = "doca3.5.0-26.07-0.7.0.0-0", "doca3.5.0-26.07-1.0.0.0-0"


def policy(version: str, parallel: int) -> dict[str, Any]:
    return {"apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
            "metadata": {"name": "nic-cluster-policy"},
            "spec": {"ofedDriver": {
                "image": "doca-driver", "repository": "nvcr.io/nvidia/mellanox",
                "version": version,
                "upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": parallel,
                                  "drain": {"enable": True, "timeoutSeconds": 300}}}}}


def upgrade_totals(op: Operator) -> tuple[float, float]:
    metrics = op.metrics()
    seconds = metrics.get(("nicop_reconcile_seconds_sum", 'controller="ofed-upgrade"'), 0.0)
    transitions = sum(v for (name, _), v in metrics.items()
                      if name == "nicop_upgrade_transitions_total")
    return seconds, transitions


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--parallel", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, cluster_with_operator(
        Path(tmp), args.nodes, ["cx6dx"]
    ) as op:
        op.client.apply(NCP(**policy(OLD, args.parallel)), field_manager="bench", force=True)
        print(f"driver on every node in {op.wait_policy():.1f}s")
        while not all((n.metadata.labels or {}).get("nvidia.com/ofed-driver-upgrade-state")
                      == "upgrade-done" for n in op.client.list(Node)):
            time.sleep(1)
        base_seconds, base_transitions = upgrade_totals(op)
        base_cpu = op.cpu_seconds()
        start = time.monotonic()
        op.client.apply(NCP(**policy(NEW, args.parallel)), field_manager="bench", force=True)
        while True:
            pods = list(op.client.list(Pod, namespace="nvidia-network-operator"))
            states = {(n.metadata.labels or {}).get("nvidia.com/ofed-driver-upgrade-state")
                      for n in op.client.list(Node)}
            if (len(pods) == args.nodes and states == {"upgrade-done"}
                    and all(NEW in p.spec.containers[0].image for p in pods)):
                break
            time.sleep(1)
        took = time.monotonic() - start
        cpu = op.cpu_seconds() - base_cpu
        seconds, transitions = upgrade_totals(op)
        seconds -= base_seconds
        transitions -= base_transitions
        print(f"rollout of {args.nodes} nodes (maxParallelUpgrades {args.parallel}): {took:.1f}s")
        print(f"node transitions: {transitions:.0f}; operator CPU {cpu:.1f}s, "
              f"{1000 * cpu / max(transitions, 1):.2f} ms per transition")
        print("upgrade controller reconcile time per transition: "
              f"{1000 * seconds / max(transitions, 1):.2f} ms "
              f"({seconds:.1f}s of reconcile in total, {100 * seconds / took:.0f}% of the rollout)")
        print(f"operator peak RSS: {op.rss_mib():.0f} MiB")


if __name__ == "__main__":
    main()
