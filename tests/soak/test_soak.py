"""The soak's short run: every kind of fault once, in random order, on a cluster of its own
(bench/soak.py; the hour-long run is `-m bench.soak --minutes 60`). The seed is printed and
can be given again with NICOP_SOAK_SEED to replay the same order."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bench.soak import FAULTS

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the soak's pods get their VFs in network namespaces: root")


@pytest.mark.timeout(900)
def test_every_fault_once_loses_nothing() -> None:
    """Each fault recovers (the policy ready, every workload pod Running with its VF and
    address), and every invariant holds: no address twice, cordons within maxParallelUpgrades,
    a true policy status, no address or VF leaked once the pods are gone."""
    seed = int(os.environ.get("NICOP_SOAK_SEED") or time.time())
    run = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--each-once", "--pause", "4", "--seed", str(seed)],
        cwd=ROOT, capture_output=True, text=True, timeout=840)
    out = run.stdout + run.stderr
    print(out)
    assert run.returncode == 0, f"soak failed (seed {seed}):\n{out[-6000:]}"
    recovered = set(re.findall(r"^\s+\d+ (\S+)\s.*; recovered in \d+s$", out, re.MULTILINE))
    assert recovered == set(FAULTS), f"seed {seed}: not every fault ran and recovered:\n{out}"
    invariants = re.findall(r"^\s+(PASS|FAIL)\s+(.+) \(\d+ checks\)$", out, re.MULTILINE)
    assert {name for _, name in invariants} >= {
        "no address given twice", "cordoned nodes within maxParallelUpgrades",
        "policy status true", "every workload Running again", "no address leaked",
        "no VF leaked"}, out
    assert all(result == "PASS" for result, _ in invariants), out
