"""`nicop driver run` and `nicop driver probe` as the driver DaemonSet runs them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.eventually import eventually
from typer.testing import CliRunner

from nicop.cli import app
from nicop_sim.hardware import PROFILES, SimulatedHost
from nicop_sim.kernel import SimulatedKernel

NICOP = [sys.executable, "-m", "nicop"]
READY = "run/mellanox/drivers/.driver-ready"
VERSION = "24.10-1.1.4.0"


@pytest.fixture
def node() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="drv-", dir="/tmp"))
    profile = PROFILES["cx7-ib"]
    SimulatedHost.build(root, profile)
    SimulatedKernel.boot(root, profile.kernel)
    yield root
    shutil.rmtree(root)


def test_probes_exit_with_a_one_line_reason(node: Path) -> None:
    runner = CliRunner()
    startup = runner.invoke(app, ["driver", "probe", "startup", "--host-root", str(node)])
    assert startup.exit_code == 1
    assert startup.output.count("\n") == 1 and "does not exist" in startup.output
    live = runner.invoke(app, ["driver", "probe", "liveness", "--host-root", str(node)])
    assert (live.exit_code, live.output) == (0, "mlx5_core inbox loaded\n")
    (node / READY).parent.mkdir(parents=True)
    (node / READY).write_text(VERSION + "\n")
    ready = runner.invoke(app, ["driver", "probe", "readiness", "--host-root", str(node)],
                          env={"NVIDIA_NIC_DRIVER_VER": VERSION})
    assert (ready.exit_code, ready.output) == (1, f"mlx5_core inbox loaded, want {VERSION}\n")
    bad = runner.invoke(app, ["driver", "probe", "health", "--host-root", str(node)])
    assert bad.exit_code == 1 and "unknown probe 'health'" in bad.output



def test_the_probe_as_the_daemonset_runs_it_answers_the_same_without_loading_the_cli(
        node: Path) -> None:
    """The DaemonSet's probe is `nicop driver probe KIND` (the installed command, as in the
    image, and `python -m nicop`) with options from the container's environment, run every few
    seconds: it says what the full command says, without importing the CLI (a probe slower than
    its timeout on a busy node marks the driver not ready). The agents' `nicop probe-ready`
    too."""
    (node / READY).parent.mkdir(parents=True)
    (node / READY).write_text(VERSION + "\n")
    env = {**os.environ, "NICOP_HOST_ROOT": str(node), "NVIDIA_NIC_DRIVER_VER": VERSION,
           "PYTHONPROFILEIMPORTTIME": "1"}
    installed = str(Path(sys.executable).parent / "nicop")
    for command in ([installed], NICOP):
        for kind in ("startup", "liveness", "readiness"):
            run = subprocess.run([*command, "driver", "probe", kind], env=env,
                                 capture_output=True, text=True, timeout=60)
            full = CliRunner().invoke(app, ["driver", "probe", kind], env=env)
            assert (run.returncode, run.stdout) == (full.exit_code, full.output)
            imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines()}
            assert "typer" not in imported and "nicop.cli" not in imported, command
        assert run.returncode == 1 and "want " + VERSION in run.stdout
        ready = subprocess.run([*command, "probe-ready"], env=env, capture_output=True,
                               text=True, timeout=60)
        assert ready.returncode == 1 and "NICOP_READY_FILE" in ready.stdout
        imported = {line.split("|")[-1].strip() for line in ready.stderr.splitlines()}
        assert "typer" not in imported and "nicop.cli" not in imported, command

def _driver(node: Path, log: Path, *args: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*NICOP, "driver", "run", "--host-root", str(node),
         "--log-format", "json", "--validation-timeout", "2", *args],
        env={**os.environ, "NVIDIA_NIC_DRIVER_VER": VERSION, "NICOP_PLATFORM": "sim", **env},
        stderr=log.open("w"),
    )


def test_run_marks_ready_and_sigterm_restores_the_inbox_driver(node: Path) -> None:
    log = node / "driver.log"
    proc = _driver(node, log, RESTORE_DRIVER_ON_POD_TERMINATION="true", NODE_NAME="worker-1")
    try:
        deadline = time.monotonic() + 30
        while not (node / READY).exists():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert (node / "sys/module/mlx5_core/version").read_text().strip() == VERSION
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (node / READY).exists()
    assert not (node / "sys/module/mlx5_core/version").exists()  # inbox again
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert all(line.get("node") == "worker-1" for line in lines if "node" in line)
    messages = [line["msg"] for line in lines]
    assert any(m.startswith("unsetting driver ready state (stopping)") for m in messages)
    assert "inbox driver restored" in messages


def test_run_holds_naming_the_module_that_blocks_and_goes_on_once_it_is_gone(node: Path) -> None:
    """The container keeps running (no crash loop, no restart) and not ready while a storage
    module holds the driver; once somebody unloads the module it reloads the driver."""
    kernel = SimulatedKernel(node)
    kernel.modprobe("ib_srp")
    log = node / "driver.log"
    proc = _driver(node, log, "--preflight-interval", "0.2")
    try:
        eventually(lambda: "ib_srp (storage over RDMA) holds" in log.read_text(), 30,
                   "the agent to report ib_srp's hold", alive=running(proc, log))
        assert "UNLOAD_STORAGE_MODULES=true" in log.read_text()
        assert not (node / READY).exists()
        kernel.rmmod("ib_srp")
        eventually(lambda: (node / READY).exists(), 30, "the agent ready",
                   alive=running(proc, log))
        assert "preflight checks pass" in log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()


def running(proc: subprocess.Popen[bytes], log: Path) -> Callable[[], None]:
    """For eventually(): the agent has not exited (its log says why if it has)."""

    def check() -> None:
        assert proc.poll() is None, log.read_text()

    return check
