"""How the operator copes with a large cluster: 1000 kwok nodes, one NicClusterPolicy.

Prints the time from applying the InfiniBand example policy to `state: ready`, the API
requests the operator made by verb, and its peak RSS.
Run from the repository root: .venv/bin/python -m bench.bench_policy_scale [--nodes 1000]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import yaml

from bench.common import NCP, cluster_with_operator

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, cluster_with_operator(
        Path(tmp), args.nodes, ["cx6dx", "dgx", "cx6dx"]
    ) as op:
        body = yaml.safe_load((ROOT / "examples" / "nicclusterpolicy-infiniband.yaml").read_text())
        op.client.apply(NCP(**body), field_manager="bench", force=True)
        took = op.wait_policy()
        print(f"policy ready {took:.1f}s after apply")
        print("API requests by verb: "
              + ", ".join(f"{v}={n}" for v, n in op.requests_by_verb().items()))
        print(f"operator peak RSS: {op.peak_rss_mib():.0f} MiB")


if __name__ == "__main__":
    main()
