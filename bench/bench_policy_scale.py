"""How the operator copes with a large cluster: N kwok nodes, the InfiniBand example policy.

For each `--nodes` value, on a fresh local cluster with the operator alone, prints for the
operator process: CPU seconds (utime+stime) from apply to `state: ready` and from process start
to ready, CPU and API writes at rest over `--rest` seconds after ready, peak and final RSS, API
requests by verb and resource, bytes received from watches by resource, and with
`--trace-memory` the lines of nicop's code that hold the most memory (tracing slows the process:
its CPU and RSS figures are then not comparable); with `--profile DIR` a py-spy profile of the
operator from apply to ready (collapsed stacks, DIR/operator-N.txt) and its hottest functions.
A sweep ends with how each figure grows.

The policy is upstream's example without `maxUnavailable`, so the figures compare with the Go
operator's on the same input.
Run from the repository root:
  .venv/bin/python -m bench.bench_policy_scale --nodes 100 1000 3000 [--rest 60] [--trace-memory]
      [--profile DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import yaml

from bench.common import NCP, cluster_with_operator
from nicop.kube.client import WRITE_VERBS

ROOT = Path(__file__).resolve().parents[1]
FIGURES = [  # (key, label, unit)
    ("cpu_apply_ready", "operator CPU, apply -> ready", "s"),
    ("cpu_start_ready", "operator CPU, process start -> ready", "s"),
    ("apply_ready", "wall time, apply -> ready", "s"),
    ("cpu_rest", "operator CPU at rest", "s"),
    ("writes_rest", "API writes at rest", ""),
    ("peak_rss", "operator peak RSS", "MiB"),
    ("final_rss", "operator RSS at the end", "MiB"),
    ("requests", "API requests, start -> end", ""),
    ("watch_mib", "watch events received", "MiB"),
]


def policy() -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(
        (ROOT / "examples" / "nicclusterpolicy-infiniband.yaml").read_text())
    upgrade = (body["spec"].get("ofedDriver") or {}).get("upgradePolicy") or {}
    upgrade.pop("maxUnavailable", None)
    return body


def writes(requests: dict[tuple[str, str], int]) -> int:
    return sum(n for (verb, res), n in requests.items()
               if verb in WRITE_VERBS and res not in ("leases", "events"))


def one_run(nodes: int, rest: float, trace_memory: bool,
            profile: Path | None) -> dict[str, float]:
    print(f"\n=== {nodes} nodes ===", flush=True)
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp, cluster_with_operator(
        Path(tmp), nodes, ["cx6dx", "dgx", "cx6dx"], trace_memory=trace_memory
    ) as op:
        cpu_start = op.cpu_seconds()
        with profiled(op.proc.pid, profile / f"operator-{nodes}.txt" if profile else None):
            op.client.apply(NCP(**policy()), field_manager="bench", force=True)
            took = op.wait_policy()
        cpu_ready = op.cpu_seconds()
        before = op.requests()
        time.sleep(rest)
        after = op.requests()
        figures = {
            "cpu_apply_ready": cpu_ready - cpu_start, "cpu_start_ready": cpu_ready,
            "apply_ready": took, "cpu_rest": op.cpu_seconds() - cpu_ready,
            "writes_rest": writes(after) - writes(before), "peak_rss": op.rss_mib(),
            "final_rss": op.rss_mib("VmRSS"), "requests": sum(after.values()),
            "watch_mib": sum(op.watch_bytes().values()) / 2**20,
        }
        for key, label, unit in FIGURES:
            print(f"{label:40s} {figures[key]:10.1f} {unit}")
        print("API requests by verb and resource (start -> end):")
        for (verb, res), n in sorted(after.items(), key=lambda kv: -kv[1]):
            print(f"  {verb:7s} {res:32s} {n:7d}")
        print("reconciles by controller (start -> end): count, seconds, ms each")
        for name, (n, secs) in sorted(op.reconciles().items(), key=lambda kv: -kv[1][1]):
            print(f"  {name:32s} {n:7d} {secs:8.2f} {1000 * secs / max(n, 1):8.1f}")
        print("watch events received by resource:")
        for res, size in sorted(op.watch_bytes().items(), key=lambda kv: -kv[1]):
            print(f"  {res:40s} {size / 2**20:8.2f} MiB")
        if trace_memory:
            print("live memory by allocating line of nicop's code:")
            print(op.memory_by_module())
        return figures


@contextlib.contextmanager
def profiled(pid: int, out: Path | None) -> Iterator[None]:
    """py-spy samples the process while the block runs (the profile costs the sampler's CPU,
    not the operator's); its hottest functions are printed after."""
    if out is None:
        yield
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(pid),
                            "-r", "50", "--nolineno", "-f", "raw", "-o", str(out)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait()
    print(f"profile: {out}\n{hottest(out)}")


def hottest(collapsed: Path, top: int = 25) -> str:
    """Functions by the share of samples they were on the stack (inclusive) and on top of it."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        total += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
    rows = [f"  {100 * n / total:5.1f}% {100 * own[f] / total:5.1f}%  {f}"
            for f, n in inclusive.most_common(top)]
    return "  incl.  self   function (file)\n" + "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000])
    parser.add_argument("--rest", type=float, default=60, help="seconds at rest after ready")
    parser.add_argument("--trace-memory", action="store_true")
    parser.add_argument("--profile", type=Path, help="directory for py-spy profiles")
    args = parser.parse_args()
    runs = {n: one_run(n, args.rest, args.trace_memory, args.profile) for n in args.nodes}
    if len(runs) < 2:
        return
    sizes = sorted(runs)
    steps = list(pairwise(sizes))
    print(f"\n{'figure':40s}" + "".join(f"{n:>10d}" for n in sizes)
          + "".join(f"  x{b}/{a}" for a, b in steps))
    for key, label, _ in FIGURES:
        row = [runs[n][key] for n in sizes]
        growth = [f"  {b / a:8.2f}" if a else "       n/a" for a, b in pairwise(row)]
        print(f"{label:40s}" + "".join(f"{v:10.1f}" for v in row) + "".join(growth))
    print("(growth of the nodes: " + ", ".join(f"x{b / a:.1f}" for a, b in steps)
          + "; a figure growing by less is sub-linear)")

if __name__ == "__main__":
    main()
