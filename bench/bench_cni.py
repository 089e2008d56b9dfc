"""host-device ADD+DEL latency: nicop's plugin against the reference plugin, same veth, same run.

The reference is `host-device` of containernetworking/plugins, built from its Go module
(bench/hostdevice-ref/go.mod) into a cache directory outside git. Both plugins are executed the
way a runtime executes them (fork+exec, CNI_* environment, config on stdin) from a harness that
runs in the node's network namespace, on the same veth pair, in alternating rounds. nicop's
plugin is the installed shim forwarding to a running `nicop cni-daemon` process. Needs root.

Run: sudo .venv/bin/python bench/bench_cni.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from nicop.cni.install import install

HERE = Path(__file__).resolve().parent
REF_MODULE = HERE / "hostdevice-ref"
REF_PACKAGE = "github.com/containernetworking/plugins/plugins/main/host-device"
CLONE_NEWNET = 0x40000000
SOCKET = "/run/nicop/cni.sock"


def build_reference() -> Path:
    """The reference plugin, built once per pinned version into ~/.cache/nicop/bench."""
    key = hashlib.sha256((REF_MODULE / "go.mod").read_bytes()
                         + (REF_MODULE / "go.sum").read_bytes()).hexdigest()[:12]
    out = Path(os.environ.get("NICOP_CACHE", Path.home() / ".cache/nicop")) / "bench" / key
    binary = out / "host-device"
    if not binary.exists():
        out.mkdir(parents=True, exist_ok=True)
        print(f"building the reference host-device ({REF_PACKAGE}) ...", flush=True)
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly -buildvcs=false"}
        subprocess.run(["go", "build", "-o", str(binary), REF_PACKAGE], cwd=REF_MODULE,
                       env=env, check=True)
    return binary


def enter(netns: str) -> None:
    """Move this thread (the harness, and every process it starts) into `netns`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(netns, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {netns}")
    finally:
        os.close(fd)


def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def call(binary: Path, command: str, config: bytes, pod: str) -> float:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "bench", "CNI_NETNS": pod,
           "CNI_IFNAME": "net1", "CNI_PATH": str(binary.parent),
           "CNI_ARGS": "IgnoreUnknown=true;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=bench"}
    start = time.perf_counter()
    proc = subprocess.run([str(binary)], input=config, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{binary} {command} failed: {proc.stdout.decode()}"
                         f"{proc.stderr.decode()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter of nicop's plugin executable (the node's python3)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces)")
    reference = build_reference()

    tag = uuid.uuid4().hex[:6]
    node_ns, pod_ns = f"bench-{tag}-node", f"bench-{tag}-pod"
    root = Path(tempfile.mkdtemp(prefix="bench-cni-", dir="/tmp"))
    daemon = None
    try:
        for ns in (node_ns, pod_ns):
            subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "-n", node_ns, "link", "add", "bvf0", "type", "veth", "peer",
                        "name", "bpeer0"], check=True)
        install(root / "bin", str(root / SOCKET.lstrip("/")), args.python, ("host-device",))
        daemon = subprocess.Popen(
            [sys.executable, "-m", "nicop", "cni-daemon", "--host-root", str(root),
             "--socket", SOCKET, "--host-netns", f"/run/netns/{node_ns}", "--no-api"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not (root / SOCKET.lstrip("/")).exists():
            if daemon.poll() is not None:
                raise SystemExit("nicop cni-daemon did not start")
            time.sleep(0.05)
        enter(f"/run/netns/{node_ns}")
        config = json.dumps({"cniVersion": "1.0.0", "name": "bench", "type": "host-device",
                             "device": "bvf0"}).encode()
        pod = f"/run/netns/{pod_ns}"
        plugins = {"reference": reference, "nicop": root / "bin" / "host-device"}
        samples: dict[str, dict[str, list[float]]] = {
            name: {"ADD": [], "DEL": [], "ADD+DEL": []} for name in plugins}
        for binary in plugins.values():  # warm up: page cache, first-run costs
            for _ in range(5):
                call(binary, "ADD", config, pod)
                call(binary, "DEL", config, pod)
        for _ in range(args.rounds):
            for name, binary in plugins.items():
                add = call(binary, "ADD", config, pod)
                delete = call(binary, "DEL", config, pod)
                for key, value in (("ADD", add), ("DEL", delete), ("ADD+DEL", add + delete)):
                    samples[name][key].append(value)

        print(f"host-device on a veth pair, {args.rounds} rounds each, alternating "
              f"(nicop plugin interpreter: {args.python})")
        print(f"{'':10} {'':8} {'p50':>10} {'p99':>10} {'mean':>10}")
        for name in plugins:
            for key, values in samples[name].items():
                print(f"{name:10} {key:8} {pct(values, 50) * 1000:8.2f}ms "
                      f"{pct(values, 99) * 1000:8.2f}ms {statistics.mean(values) * 1000:8.2f}ms")
        for p in (50, 99):
            ratio = pct(samples["nicop"]["ADD+DEL"], p) / pct(samples["reference"]["ADD+DEL"], p)
            print(f"ratio nicop/reference ADD+DEL p{p}: {ratio:.2f}x (goal: at most 1.50x)")
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(10)
        for ns in (node_ns, pod_ns):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
