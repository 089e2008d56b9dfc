"""The agents as the DaemonSets run them: separate processes, stopped with SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nicop.cli import app

NICOP = [sys.executable, "-m", "nicop"]


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="proc-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def test_sim_host_commands_build_and_change_a_node(root: Path) -> None:
    runner = CliRunner()
    node = root / "node"
    built = runner.invoke(app, ["sim-host", "build", str(node), "--profile", "cx6dx"])
    assert built.exit_code == 0
    assert "0000:3b:00.0  enp59s0f0np0" in built.output
    assert runner.invoke(app, ["sim-host", "numvfs", str(node), "enp59s0f0np0", "2"]).exit_code == 0
    busy = runner.invoke(app, ["sim-host", "numvfs", str(node), "enp59s0f0np0", "3"])
    assert busy.exit_code == 1 and "2 VFs already enabled" in busy.output
    assert runner.invoke(app, ["sim-host", "link", str(node), "enp59s0f0v1", "down"]).exit_code == 0
    assert (node / "sys/class/net/enp59s0f0v1/operstate").read_text().strip() == "down"


def test_plugins_register_with_the_kubelet_and_clean_up_on_sigterm(root: Path) -> None:
    node = root / "node"
    assert CliRunner().invoke(app, ["sim-host", "build", str(node), "--profile",
                                    "cx7-ib"]).exit_code == 0
    (root / "rdma.json").write_text(json.dumps({"configList": [
        {"resourceName": "hca", "rdmaHcaMax": 5, "selectors": {"linkTypes": ["infiniband"]}}]}))
    (root / "sriov.json").write_text(json.dumps({"resourceList": [
        {"resourceName": "ib_pf", "selectors": {"devices": ["1021"]}}]}))
    common = ["--host-root", str(node), "--log-format", "json"]
    kubelet_log = root / "kubelet.log"
    with open(kubelet_log, "w") as log:
        kubelet = subprocess.Popen([*NICOP, "sim-kubelet", *common], stderr=log)
        plugins = [
            subprocess.Popen([*NICOP, "rdma-device-plugin", "--config-file",
                              str(root / "rdma.json"), *common], stderr=subprocess.PIPE),
            subprocess.Popen([*NICOP, "sriov-device-plugin", "--config-file",
                              str(root / "sriov.json"), *common], stderr=subprocess.PIPE),
        ]
        try:
            deadline = time.monotonic() + 30
            wanted = {"kubelet: registered rdma/hca at hca.sock",
                      "kubelet: registered intel.com/ib_pf at intel.com_ib_pf.sock"}
            while not wanted <= {json.loads(line)["msg"]
                                 for line in kubelet_log.read_text().splitlines()}:
                assert time.monotonic() < deadline, kubelet_log.read_text()
                time.sleep(0.1)
            for plugin in plugins:
                plugin.send_signal(signal.SIGTERM)
                _, stderr = plugin.communicate(timeout=10)
                assert plugin.returncode == 0, stderr
                assert all(json.loads(line)["level"] for line in stderr.decode().splitlines())
            sockets = os.listdir(node / "var/lib/kubelet/device-plugins")
            assert sockets == ["kubelet.sock"]
            kubelet.send_signal(signal.SIGTERM)
            assert kubelet.wait(timeout=10) == 0
            lines = kubelet_log.read_text().splitlines()
            assert all(json.loads(line)["level"] for line in lines)  # nothing but JSON
            assert "kubelet: ListAndWatch of rdma/hca ended: UNAVAILABLE" in {
                json.loads(line)["msg"] for line in lines}
        finally:
            for proc in [*plugins, kubelet]:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=10)
