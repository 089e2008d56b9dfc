"""`nicop sriov-config-daemon` as a process on a simulated node: configures VFs, and when it is
killed in the middle of a drain handshake, the restarted daemon finishes the job."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.models.policy_v1 import PodDisruptionBudgetSpec
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget
from tests.integration.test_sriov_e2e import (
    PF0,
    PREFIX,
    TEST_LABEL,
    Rig,
    clean_node,
    operator_config,
    policy,
    until,
)

from nicop.api.labels import BLOCKED_ANNOTATION, CURRENT_STATE, DESIRED_STATE
from nicop.kube.resources import NODE, Obj
from nicop_sim.hardware import SimulatedHost

NODE_NAME = "node-3"  # the shared cluster's other ConnectX-6 Dx node


class DaemonProcess:
    def __init__(self, kubeconfig: Path, namespace: str, root: Path, log: Path) -> None:
        self._log = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nicop", "sriov-config-daemon", "--node-name", NODE_NAME,
             "--namespace", namespace, "--kubeconfig", str(kubeconfig), "--host-root", str(root),
             "--resync-interval", "1", "--log-format", "json"],
            stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, "NICOP_PLATFORM": "sim", "NICOP_SIM_ROOT": str(root)},
        )

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def node_root(client: Client, namespace: str, crds: list[str]) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="srd-", dir="/tmp"))
    SimulatedHost.build(root, "cx6dx", seed=3)
    client.patch(Node, NODE_NAME, {"metadata": {"labels": {TEST_LABEL: namespace}}})
    yield root
    clean_node(client, NODE_NAME)
    shutil.rmtree(root, ignore_errors=True)


def test_a_daemon_killed_mid_handshake_finishes_after_a_restart(
    client: Client, kubeconfig: Path, namespace: str, node_root: Path, tmp_path: Path
) -> None:
    selector = {TEST_LABEL: namespace}
    resource = "proc_vf"
    log = tmp_path / "daemon.log"
    host = SimulatedHost(node_root)

    async def state_of(rig: Rig) -> Obj:
        state = await rig.state(NODE_NAME)
        assert state is not None
        return state

    async def main() -> None:
        async with Rig(kubeconfig, namespace, []) as rig:  # the operator's controllers only
            await rig.apply(operator_config(selector))
            daemon = DaemonProcess(kubeconfig, namespace, node_root, log)
            try:
                await rig.apply(policy("proc", 8, [PF0], resource, selector))
                await until(lambda: rig.synced(NODE_NAME, 8), 60, "8 VFs from the process")
                assert len(host.vfs(PF0)) == 8

                # A pod using a VF, which a PodDisruptionBudget keeps from being evicted.
                requests = {f"{PREFIX}/{resource}": "1"}
                await asyncio.to_thread(client.create, Pod(
                    metadata=ObjectMeta(name="pinned", namespace=namespace,
                                        labels={"app": "pinned"}),
                    spec=PodSpec(nodeName=NODE_NAME, containers=[Container(
                        name="c", image="busybox", resources=ResourceRequirements(
                            requests=requests, limits=requests))])))
                await asyncio.to_thread(client.create, PodDisruptionBudget(
                    metadata=ObjectMeta(name="pinned", namespace=namespace),
                    spec=PodDisruptionBudgetSpec(minAvailable=1, selector=LabelSelector(
                        matchLabels={"app": "pinned"}))))
                await until(lambda: asyncio.to_thread(_running, client, namespace), 30,
                            "the pod running")

                await rig.apply(policy("proc", 4, [PF0], resource, selector))

                async def blocked() -> str | None:
                    ann = (await state_of(rig))["metadata"].get("annotations") or {}
                    if ann.get(DESIRED_STATE) == "Drain_Required" and \
                            ann.get(CURRENT_STATE) == "Draining":
                        return ann.get(BLOCKED_ANNOTATION)
                    return None

                reason = await until(blocked, 60, "the drain blocked by the PDB")
                assert f"pod {namespace}/pinned" in reason and "PodDisruptionBudget" in reason
                assert (await state_of(rig))["status"]["syncStatus"] == "InProgress"
                daemon.stop(signal.SIGKILL)  # killed while it waits for the drain

                await asyncio.to_thread(client.delete, PodDisruptionBudget, "pinned",
                                        namespace=namespace)

                async def drained() -> bool:
                    ann = (await state_of(rig))["metadata"].get("annotations") or {}
                    return ann.get(CURRENT_STATE) == "DrainComplete"

                await until(drained, 60, "the drain to complete")
                assert len(host.vfs(PF0)) == 8  # nobody applied anything meanwhile

                daemon = DaemonProcess(kubeconfig, namespace, node_root, log)
                await until(lambda: rig.synced(NODE_NAME, 4), 60, "4 VFs after the restart")

                async def uncordoned() -> bool:
                    node = await rig.api.get(NODE, NODE_NAME)
                    ann = (await state_of(rig))["metadata"].get("annotations") or {}
                    return not (node.get("spec") or {}).get("unschedulable") and \
                        ann.get(CURRENT_STATE) == "Idle"

                await until(uncordoned, 30, "the node uncordoned")
                assert len(host.vfs(PF0)) == 4
            finally:
                code = daemon.stop()
            assert code == 0, f"the daemon stops cleanly on SIGTERM; see {log}"

    try:
        asyncio.run(main())
    finally:
        with contextlib.suppress(Exception):
            client.delete(PodDisruptionBudget, "pinned", namespace=namespace)


def _running(client: Client, namespace: str) -> bool:
    pod = client.get(Pod, "pinned", namespace=namespace)
    return pod.status is not None and pod.status.phase == "Running"
