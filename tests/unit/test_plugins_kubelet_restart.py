"""Both plugins on one node survive kubelet restarts: registered again, devices intact."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nicop.node.deviceplugin.rdma import RdmaAgent, load_config
from nicop.node.deviceplugin.server import DEVICE_PLUGIN_PATH
from nicop.node.deviceplugin.sriov import SriovAgent
from nicop_sim.hardware import SimulatedHost
from nicop_sim.kubelet import Kubelet


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="restart-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def test_deleting_the_kubelet_socket_dir_brings_both_plugins_back_within_2s(root: Path) -> None:
    host = SimulatedHost.build(root, "dgx")
    for pf in ("ibp24s0", "ibp154s0"):
        host.set_numvfs(pf, 4)
    (root / "rdma.json").write_text(json.dumps({"configList": [
        {"resourceName": "hca_shared_devices_a", "rdmaHcaMax": 63,
         "selectors": {"ifNames": ["ibp24s0", "ibp154s0"]}}]}))
    (root / "sriov.json").write_text(json.dumps({"resourceList": [
        {"resourceName": "sriov_ib", "resourcePrefix": "nvidia.com",
         "selectors": {"devices": ["101e"], "isRdma": True}}]}))
    sockdir = host.path(DEVICE_PLUGIN_PATH)
    expected = {"rdma/hca_shared_devices_a": 63, "nvidia.com/sriov_ib": 8}

    async def main() -> None:
        kubelet = Kubelet(sockdir)
        await kubelet.start()
        stop = asyncio.Event()
        agents = [
            RdmaAgent(load_config(root / "rdma.json"), host, sockdir, poll_interval=0.5),
            SriovAgent(root / "sriov.json", host, sockdir, poll_interval=0.5),
        ]
        tasks = [asyncio.create_task(a.run(stop)) for a in agents]
        await kubelet.wait_for(lambda: kubelet.allocatable() == expected)
        before = {r: kubelet.health(r) for r in expected}
        for _ in range(3):
            await kubelet.stop()
            shutil.rmtree(sockdir)  # the directory wiped, as on a node reinstall
            started = time.monotonic()
            await kubelet.start()
            await kubelet.wait_for(
                lambda: all(r.connected for r in kubelet.resources.values())
                and kubelet.allocatable() == expected, timeout=2)
            assert time.monotonic() - started < 2
            assert {r: kubelet.health(r) for r in expected} == before
            response = await kubelet.allocate("nvidia.com/sriov_ib")
            assert response.envs["PCIDEVICE_NVIDIA_COM_SRIOV_IB"] == "0000:18:00.1"
        stop.set()
        await asyncio.gather(*tasks)
        await kubelet.close()
        assert list(sockdir.iterdir()) == []  # the plugins removed their sockets

    asyncio.run(main())
