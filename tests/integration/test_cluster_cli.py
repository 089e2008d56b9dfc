"""`nicop cluster`: what a user sees when starting, checking and stopping the local cluster."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nicop_sim.cluster import COMPONENTS, LocalCluster


def nicop(*args: str, state_dir: Path, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "NICOP_CLUSTER_DIR": str(state_dir),
        "NICOP_CONTROLPLANE_BIN": str(bin_dir),
    }
    return subprocess.run(
        [sys.executable, "-m", "nicop", *args], env=env, capture_output=True, text=True, timeout=180
    )


@pytest.fixture
def state_dir(tmp_path: Path, controlplane_bin: Path) -> Iterator[Path]:
    path = tmp_path / "cluster"
    yield path
    LocalCluster(path, controlplane_bin).down()  # whatever a failed test left running


def pids(state_dir: Path) -> dict[str, int]:
    raw = json.loads((state_dir / "state.json").read_text())
    return {name: p["pid"] for name, p in raw["processes"].items()}


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def test_up_status_down_and_crash(state_dir: Path, controlplane_bin: Path) -> None:
    up = nicop("cluster", "up", "--nodes", "2", state_dir=state_dir, bin_dir=controlplane_bin)
    assert up.returncode == 0, up.stderr
    assert "2 nodes Ready" in up.stdout
    assert f"export KUBECONFIG={state_dir.resolve()}/kubeconfig" in up.stdout

    again = nicop("cluster", "up", state_dir=state_dir, bin_dir=controlplane_bin)
    assert again.returncode == 0
    assert "already up" in again.stdout

    status = nicop("cluster", "status", state_dir=state_dir, bin_dir=controlplane_bin)
    assert status.returncode == 0
    stand_ins = ("node-1/sim-node", "node-2/sim-node")  # each node's kubelet for nicop
    for name in (*COMPONENTS, *stand_ins):
        assert name in status.stdout
    assert status.stdout.count("running") == len(COMPONENTS) + len(stand_ins)

    kubeconfig = nicop("cluster", "kubeconfig", state_dir=state_dir, bin_dir=controlplane_bin)
    assert Path(kubeconfig.stdout.strip()) == state_dir.resolve() / "kubeconfig"

    started = pids(state_dir)
    os.kill(started["kube-apiserver"], signal.SIGKILL)

    status = nicop("cluster", "status", state_dir=state_dir, bin_dir=controlplane_bin)
    assert status.returncode == 1
    assert "exited" in status.stdout

    down = nicop("cluster", "down", state_dir=state_dir, bin_dir=controlplane_bin)
    assert down.returncode == 0, down.stderr
    assert "kube-apiserver: was not running" in down.stdout
    for name in ("etcd", "kube-controller-manager", "kube-scheduler", "kwok", *stand_ins):
        assert f"{name}: stopped" in down.stdout, down.stdout
    assert not any(alive(pid) for pid in started.values())
    # The data stays: certificates, etcd data and the kubeconfig are still there.
    assert (state_dir / "kubeconfig").exists()
    assert (state_dir / "etcd").is_dir()


def test_up_on_a_taken_port_names_the_port(state_dir: Path, controlplane_bin: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = nicop(
            "cluster",
            "up",
            "--apiserver-port",
            str(port),
            state_dir=state_dir,
            bin_dir=controlplane_bin,
        )
    assert result.returncode == 1
    assert f"port {port}" in result.stderr
    assert "already in use" in result.stderr
    assert not (state_dir / "state.json").exists() or not pids(state_dir)


def test_up_with_a_binary_missing_names_it(
    state_dir: Path, controlplane_bin: Path, tmp_path: Path
) -> None:
    partial = tmp_path / "bin"
    partial.mkdir()
    for name in COMPONENTS:
        if name != "kube-scheduler":
            (partial / name).symlink_to(controlplane_bin / name)
    result = nicop("cluster", "up", state_dir=state_dir, bin_dir=partial)
    assert result.returncode == 1
    message = " ".join(result.stderr.split())
    assert "kube-scheduler not found" in message
    assert str(partial) in message
    assert "make controlplane" in message
