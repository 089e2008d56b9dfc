"""Safe driver load against the real API server: the driver container annotates its node and
unloads nothing until the upgrade controller (here: the test, as an operator would) removes it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lightkube import Client
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType
from tests.eventually import until

from nicop.kube.client import ApiClient
from nicop.node.driver import (
    READY_FILE,
    SAFE_LOAD_ANNOTATION,
    DriverAgent,
    DriverConfig,
    SafeLoad,
)
from nicop_sim.hardware import PROFILES, SimulatedHost
from nicop_sim.kernel import SimulatedBackend, SimulatedKernel

NODE = "node-3"  # a ConnectX-6 Dx node of the test cluster
OLD, NEW = "24.07-0.6.1.0", "24.10-1.1.4.0"


def annotations(client: Client) -> dict[str, str]:
    return dict(client.get(Node, NODE).metadata.annotations or {})


def test_safe_load_blocks_until_the_annotation_is_removed(
    client: Client, kubeconfig: Path, tmp_path: Path
) -> None:
    profile = PROFILES["cx6dx"]
    host = SimulatedHost.build(tmp_path / "node", profile)
    kernel = SimulatedKernel.boot(tmp_path / "node", profile.kernel, driver_version=OLD)
    backend = SimulatedBackend(kernel, precompiled=[NEW])

    async def scenario() -> None:
        api = ApiClient(kubeconfig)
        try:
            cfg = DriverConfig(version=NEW, node_name=NODE, safe_load=True,
                               validation_timeout=10, poll_interval=0.1)
            safe_load = SafeLoad(api, NODE, poll_interval=0.2)
            agent = DriverAgent(cfg, host, backend, safe_load)
            stop = asyncio.Event()
            task = asyncio.create_task(agent.run(stop))
            await until(lambda: SAFE_LOAD_ANNOTATION in annotations(client), 20,
                        "the safe-load annotation on the node", blocking=True)
            assert annotations(client)[SAFE_LOAD_ANNOTATION] == "true"
            await until(lambda: safe_load.polls >= 5, 30, "five polls of the node")
            assert not task.done()
            assert kernel.installed_version() == NEW  # installed while the node kept working
            assert backend.commands == []
            assert kernel.version("mlx5_core") == OLD
            assert not host.exists(READY_FILE)

            # What the upgrade controller does once the node is drained.
            await asyncio.to_thread(
                client.patch, Node, NODE,
                {"metadata": {"annotations": {SAFE_LOAD_ANNOTATION: None}}},
                patch_type=PatchType.MERGE)
            await until(lambda: host.exists(READY_FILE) or task.done(), 20,
                        "the readiness file", blocking=True)
            assert not task.done(), task.exception()
            assert kernel.version("mlx5_core") == NEW
            assert "rmmod mlx5_core" in backend.commands
            stop.set()
            await task
        finally:
            await api.close()

    try:
        asyncio.run(scenario())
    finally:
        if SAFE_LOAD_ANNOTATION in annotations(client):
            client.patch(Node, NODE, {"metadata": {"annotations": {SAFE_LOAD_ANNOTATION: None}}},
                         patch_type=PatchType.MERGE)
