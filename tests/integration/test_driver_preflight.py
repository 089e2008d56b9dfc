"""A driver upgrade that would hurt a node is held on that node, by nicop's driver agent the
operator's DaemonSet runs there, until the cause is fixed: the management interface on a
ConnectX port, a storage module holding the driver, forcePrecompiled on a kernel without
packages. The running driver stays loaded, the node and `nicop diagnose node` say why and how
to fix it, and once fixed the upgrade finishes with the same operator process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Event, Node
from tests.eventually import eventually
from tests.integration.agent_loop import agents, delete
from tests.integration.operator_process import OperatorProcess
from tests.integration.test_agents_loop import (
    FAST_PROBES,
    NicClusterPolicy,
    apply_policy,
    policy_daemonsets,
    policy_state,
)

from nicop.api.upgrade import DONE, PREFLIGHT_ANNOTATION, STATE_LABEL
from nicop.node.driver import nic_functions
from nicop.node.kernel import version_matches
from nicop_sim.cluster import LocalCluster
from nicop_sim.hardware import SimulatedHost
from nicop_sim.kernel import SimulatedKernel

NODE = "node-2"  # a ConnectX-6 Dx node
VERSIONS = ("25.10-1.2.8.0", "25.10-1.3.1.0", "25.10-1.4.0.0", "25.10-1.5.2.0")


def policy(version: str, **driver: Any) -> dict[str, Any]:
    return {
        "apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
        "metadata": {"name": "nic-cluster-policy"},
        "spec": {"ofedDriver": {
            "image": "nicop", "version": version, **FAST_PROBES, **driver,
            "upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": 0,
                              "drain": {"enable": False}}}},
    }


@pytest.fixture(scope="module")
def driver(client: Client, operator: OperatorProcess, cluster: LocalCluster) -> Iterator[list[str]]:
    """nicop's driver agent on every node, at the first version; the versions applied so far."""
    applied = [VERSIONS[0]]
    apply_policy(client, policy(applied[0]))
    eventually(lambda: policy_state(client) == "ready", timeout=240,
               what="the driver agents to be ready")
    yield applied
    delete(client, NicClusterPolicy, "nic-cluster-policy")
    eventually(lambda: not policy_daemonsets(client) and not agents(cluster), timeout=120,
               what="the driver agents to go")
    for node in client.list(Node):
        if node.spec.unschedulable or STATE_LABEL in (node.metadata.labels or {}):
            client.patch(Node, node.metadata.name, {"spec": {"unschedulable": None},
                                                    "metadata": {"labels": {STATE_LABEL: None}}})


def loaded(cluster: LocalCluster) -> str:
    return (cluster.node_root(NODE) / "sys/module/mlx5_core/version").read_text().strip()


def management_on_connectx(root: Path) -> Callable[[], None]:
    host = SimulatedHost(root)
    port = sorted(n for f in nic_functions(host).values() for n in f.netdevs)[0]
    host.set_routes({"0.0.0.0/0": port})
    return lambda: host.set_routes({"0.0.0.0/0": "eno1"})


def storage_module_holding_the_driver(root: Path) -> Callable[[], None]:
    kernel = SimulatedKernel(root)
    kernel.modprobe("ib_iser")  # an iSCSI-over-RDMA initiator with volumes mounted
    return lambda: kernel.rmmod("ib_iser")


def kernel_without_precompiled_driver(root: Path) -> Callable[[], None]:
    kernel = SimulatedKernel(root)
    kernel.withhold_precompiled()
    return lambda: kernel.withhold_precompiled(False)


CASES = {
    "management": (management_on_connectx, {},
                   "carries the default route and goes down with mlx5_core",
                   "ALLOW_MANAGEMENT_INTERFACE_RELOAD=true"),
    "modules": (storage_module_holding_the_driver, {},
                "ib_iser (storage over RDMA) holds", "UNLOAD_STORAGE_MODULES=true"),
    "kernel": (kernel_without_precompiled_driver, {"forcePrecompiled": True},
               "no precompiled driver", "unset spec.ofedDriver.forcePrecompiled"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_upgrade_that_would_hurt_the_node_is_held_there_until_fixed(
        case: str, client: Client, kubeconfig: Path, cluster: LocalCluster,
        operator: OperatorProcess, driver: list[str]) -> None:
    cause, extra, said, fix = CASES[case]
    old, new = driver[-1], VERSIONS[len(driver)]
    undo = cause(cluster.node_root(NODE))
    operator_pid = operator.proc.pid
    try:
        apply_policy(client, policy(new, **extra))
        driver.append(new)
        held = eventually(lambda: annotations(client).get(PREFLIGHT_ANNOTATION), timeout=120,
                          what=f"the driver agent on {NODE} to hold the reload")
        assert said in held and fix in held, held
        assert version_matches(loaded(cluster), old)  # the running driver stays
        # the agent records the Event after it annotates the node
        eventually(lambda: any(said in e.message for e in refusals(client)), timeout=30,
                   what=f"a DriverReloadRefused Event on {NODE} saying {said!r}")
        report = diagnose(kubeconfig)
        assert "holds the driver reload" in report and said in report and fix in report, report
    finally:
        undo()
    eventually(lambda: upgraded(client, cluster, new), timeout=120,
               what=f"{NODE} upgraded to {new} once the cause is gone")
    assert PREFLIGHT_ANNOTATION not in annotations(client)
    assert operator.proc.poll() is None and operator.proc.pid == operator_pid


def annotations(client: Client) -> dict[str, str]:
    return dict(client.get(Node, NODE).metadata.annotations or {})


def refusals(client: Client) -> list[Event]:
    return [e for e in client.list(Event, namespace="default",
                                   fields={"involvedObject.name": NODE})
            if e.reason == "DriverReloadRefused"]


def upgraded(client: Client, cluster: LocalCluster, version: str) -> bool:
    state = (client.get(Node, NODE).metadata.labels or {}).get(STATE_LABEL)
    return state == DONE and version_matches(loaded(cluster), version)


def diagnose(kubeconfig: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "nicop", "diagnose", "node", NODE,
                           "--kubeconfig", str(kubeconfig)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    return " ".join(done.stdout.split())
