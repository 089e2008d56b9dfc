"""`make demo` as a user runs it: it starts the cluster (with its node stand-ins, and as root a
real node) and the operator, nothing else; every agent process was started by a node stand-in
for a pod of a DaemonSet the operator rendered, or by the real node's kubelet as a container."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube.resources.core_v1 import Pod

from nicop_sim.cluster import COMPONENTS, LocalCluster


@pytest.fixture
def state_dir(controlplane_bin: Path) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="demo-", dir="/tmp"))  # short: unix sockets under it
    yield path
    LocalCluster(path, controlplane_bin).down()


def test_the_demo_starts_no_agent_itself(state_dir: Path, controlplane_bin: Path) -> None:
    env = {**os.environ, "NICOP_CLUSTER_DIR": str(state_dir),
           "NICOP_CONTROLPLANE_BIN": str(controlplane_bin), "COLUMNS": "160"}
    demo = subprocess.run([sys.executable, "-m", "nicop", "demo"], env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    assert demo.returncode == 0, demo.stdout[-4000:] + demo.stderr[-2000:]
    assert "The demo took" in demo.stdout
    cluster = LocalCluster(state_dir, controlplane_bin)
    started = set(cluster.state().processes)
    stand_ins = {p.pid: name.split("/")[0] for name, p in cluster.state().processes.items()
                 if name.endswith("/sim-node")}
    real = cluster.real_node_blocker() is None  # root, with the runtime and image make test built
    assert started == {*COMPONENTS, "operator", *(f"{node}/sim-node"
                                                  for node in stand_ins.values()),
                       *(["real-1/real-node"] if real else [])}, started
    agents = cluster.agents()
    assert {a.command for a in agents} >= {
        "driver run", "rdma-device-plugin", "sriov-config-daemon", "sriov-device-plugin",
        "cni-daemon"}, sorted(a.command for a in agents)
    for agent in agents:  # each started by the stand-in of its node, none by the demo
        assert stand_ins.get(agent.ppid) == agent.node, agent
    shown = " ".join(demo.stdout.split())
    if os.geteuid() == 0:  # the VF and its address, from CNI
        assert "default/roce-vlan100: net1 192.168." in shown
    if real:  # the SR-IOV workload ran on the real node, its RDMA devices in its container
        assert "on real-1" in shown and "containerd://" in shown
        inside = shown.partition("-- ls /dev/infiniband ")[2][:120]
        assert "uverbs" in inside and "rdma_cm" in inside, shown[-3000:]
    else:
        assert "without a real node: " in shown
    # Each node is uncordoned once the RDMA device plugin the driver reload took is back and the
    # VFs the SR-IOV plugin reported unhealthy meanwhile are allocatable again, not when its
    # driver alone is: no pod was placed there and refused by the kubelet for a device.
    refused = [f"{p.metadata.name} on {p.spec.nodeName}: {p.status.message}"
               for p in cluster.client().list(Pod, namespace="default")
               if p.status.reason == "UnexpectedAdmissionError"]
    assert not refused, refused
