"""`nicop rdma-device-plugin` on simulated nodes, driven by the kubelet stand-in."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from nicop.cli import app
from nicop.node.deviceplugin.config import ConfigError
from nicop.node.deviceplugin.rdma import RdmaAgent, load_config
from nicop.node.deviceplugin.server import DEVICE_PLUGIN_PATH
from nicop.node.report import Reporter
from nicop_sim.hardware import SimulatedHost
from nicop_sim.kubelet import Kubelet


@pytest.fixture
def root() -> Iterator[Path]:
    """A short node root: gRPC binds unix socket paths of at most 105 bytes."""
    path = Path(tempfile.mkdtemp(prefix="rdma-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def write_config(root: Path, config: dict[str, Any]) -> Path:
    path = root / "config.json"
    path.write_text(json.dumps(config))
    return path


@contextlib.asynccontextmanager
async def running(host: SimulatedHost, config: dict[str, Any]) -> AsyncIterator[Kubelet]:
    sockdir = host.path(DEVICE_PLUGIN_PATH)
    kubelet = Kubelet(sockdir)
    await kubelet.start()
    stop = asyncio.Event()
    agent = RdmaAgent(load_config(write_config(host.root, config)), host, sockdir, 0.1)
    task = asyncio.create_task(agent.run(stop))
    try:
        yield kubelet
    finally:
        stop.set()
        await task
        await kubelet.close()


def specs(response: Any) -> list[str]:
    assert {d.permissions for d in response.devices} == {"rwm"}
    assert all(d.container_path == d.host_path for d in response.devices)
    return [d.host_path for d in response.devices]


@pytest.mark.parametrize(("profile", "nics"), [("cx6dx", 2), ("cx7-ib", 1), ("bf3", 2),
                                               ("dgx", 8)])
def test_every_profile_shares_all_its_hcas(root: Path, profile: str, nics: int) -> None:
    host = SimulatedHost.build(root, profile)
    config = {"configList": [
        {"resourceName": "hca_shared_devices_a", "rdmaHcaMax": 100,
         "selectors": {"vendors": ["15b3"]}},
        {"resourcePrefix": "nvidia.com", "resourceName": "rdma", "rdmaHcaMax": 10,
         "selectors": {"drivers": ["mlx5_core"]}},
    ]}

    async def main() -> None:
        async with running(host, config) as kubelet:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {
                "rdma/hca_shared_devices_a": 100, "nvidia.com/rdma": 10})
            assert sorted(kubelet.health("nvidia.com/rdma")) == sorted(str(i) for i in range(10))
            response = await kubelet.allocate("rdma/hca_shared_devices_a")
            assert not response.envs and not response.mounts
            got = specs(response)
            assert got.count("/dev/infiniband/rdma_cm") == 1
            assert sorted(got) == sorted(
                [f"/dev/infiniband/{kind}{i}" for i in range(nics)
                 for kind in ("uverbs", "umad", "issm")] + ["/dev/infiniband/rdma_cm"])

    asyncio.run(main())


def test_a_pool_of_one_nic_gives_only_that_nic(root: Path) -> None:
    host = SimulatedHost.build(root, "dgx")
    config = {"configList": [{"resourceName": "rail_5", "rdmaHcaMax": 4,
                              "selectors": {"ifNames": ["ibp192s0"],
                                            "linkTypes": ["infiniband"]}}]}

    async def main() -> None:
        async with running(host, config) as kubelet:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {"rdma/rail_5": 4})
            got = specs(await kubelet.allocate("rdma/rail_5", count=2))
            assert got == ["/dev/infiniband/uverbs5", "/dev/infiniband/issm5",
                           "/dev/infiniband/umad5", "/dev/infiniband/rdma_cm"]

    asyncio.run(main())


def test_link_down_makes_the_nics_devices_unhealthy_within_2s(root: Path) -> None:
    host = SimulatedHost.build(root, "cx6dx")
    config = {"configList": [
        {"resourceName": "port_0", "rdmaHcaMax": 3, "selectors": {"ifNames": ["enp59s0f0np0"]}},
        {"resourceName": "port_1", "rdmaHcaMax": 3, "selectors": {"ifNames": ["enp59s0f1np1"]}},
    ]}

    async def main() -> None:
        async with running(host, config) as kubelet:
            await kubelet.wait_for(
                lambda: kubelet.allocatable() == {"rdma/port_0": 3, "rdma/port_1": 3})
            started = time.monotonic()
            host.set_link("enp59s0f0np0", False)
            await kubelet.wait_for(lambda: set(kubelet.health("rdma/port_0").values())
                                   == {"Unhealthy"}, timeout=2)
            assert time.monotonic() - started < 2
            assert kubelet.allocatable() == {"rdma/port_0": 0, "rdma/port_1": 3}
            assert kubelet.capacity() == {"rdma/port_0": 3, "rdma/port_1": 3}
            host.set_link("enp59s0f0np0", True)
            await kubelet.wait_for(
                lambda: kubelet.allocatable() == {"rdma/port_0": 3, "rdma/port_1": 3}, timeout=2)

    asyncio.run(main())


def test_a_nic_that_loses_its_rdma_device_is_unhealthy_until_it_returns(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    host = SimulatedHost.build(root, "cx7-ib")
    config = {"configList": [{"resourceName": "ib", "rdmaHcaMax": 2,
                              "selectors": {"linkTypes": ["infiniband"]}}]}

    async def main() -> None:
        async with running(host, config) as kubelet:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {"rdma/ib": 2})
            host.remove_rdma("ibp75s0")
            await kubelet.wait_for(lambda: kubelet.allocatable() == {"rdma/ib": 0}, timeout=2)
            assert kubelet.capacity() == {"rdma/ib": 2}
            host.add_rdma("ibp75s0")
            await kubelet.wait_for(lambda: kubelet.allocatable() == {"rdma/ib": 2}, timeout=2)

    with caplog.at_level(logging.INFO):
        asyncio.run(main())
    assert "rdma/ib: 0000:4b:00.0: no RDMA device" in caplog.text
    assert "rdma/ib: 0000:4b:00.0 recovered" in caplog.text


def test_nics_whose_rdma_device_appears_late_join_at_the_periodic_update(root: Path) -> None:
    host = SimulatedHost.build(root, "cx6dx")
    host.remove_rdma("enp59s0f1np1")  # mlx5_ib not loaded yet for this port
    config = {"periodicUpdateInterval": 1, "configList": [
        {"resourceName": "port_1", "rdmaHcaMax": 5, "selectors": {"ifNames": ["enp59s0f1np1"]}},
    ]}

    async def main() -> None:
        async with running(host, config) as kubelet:
            await kubelet.wait_for(lambda: kubelet.capacity() == {"rdma/port_1": 0})
            host.add_rdma("enp59s0f1np1")
            await kubelet.wait_for(lambda: kubelet.allocatable() == {"rdma/port_1": 5},
                                   timeout=3)

    asyncio.run(main())


def test_config_defaults_match_upstream(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = load_config(write_config(root, {"configList": [
        {"resourceName": "hca_shared_devices_a", "rdmaHcaMax": 1000, "devices": ["ib0", "ib1"]},
    ]}))
    assert config.update_interval == 60
    (res,) = config.config_list
    assert res.full_name == "rdma/hca_shared_devices_a"
    assert res.selectors is not None and res.selectors.if_names == ["ib0", "ib1"]
    assert "devices: deprecated, use selectors.ifNames" in caplog.text


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('{"configList": [', "not valid JSON at line 1 column 17"),
        ({"configList": []}, "configList: no resources configured"),
        ({"configList": [{"resourceName": "hca-a", "selectors": {"vendors": ["15b3"]}}]},
         'configList[0] ("hca-a"): resourceName: \'hca-a\' may contain only letters, digits '
         "and '_'"),
        ({"configList": [{"resourceName": "a", "selectors": {"vendors": ["15b3"]}},
                         {"resourceName": "b", "selectors": {}}]},
         'configList[1] ("b"): selectors: required'),
        ({"configList": [{"resourceName": "a"}]}, 'configList[0] ("a"): selectors: required'),
        ({"configList": [{"resourceName": "a", "devices": ["ib0"],
                          "selectors": {"ifNames": ["ib0"]}}]},
         'configList[0] ("a"): devices: cannot specify both devices and selectors'),
        ({"configList": [{"resourceName": "a", "rdmaHcaMax": -1,
                          "selectors": {"vendors": ["15b3"]}}]},
         'configList[0] ("a"): rdmaHcaMax: must be 0 or more, got -1'),
        ({"configList": [{"resourceName": "a", "rdmaHcaMax": "10",
                          "selectors": {"vendors": ["15b3"]}}]},
         'configList[0] ("a"): rdmaHcaMax: input should be a valid integer, got "10"'),
        ({"configList": [{"resourceName": "a", "selectors": {"vendors": "15b3"}}]},
         'configList[0] ("a"): selectors.vendors: input should be a valid list'),
        ({"configList": [{"resourceName": "a", "selectors": {"vendors": ["15b3"]}},
                         {"resourceName": "a", "selectors": {"vendors": ["15b3"]}}]},
         'configList[1] ("a"): resourceName: \'a\' is already used by rdma/a; both would serve '
         "the socket a.sock"),
        ({"periodicUpdateInterval": -5, "configList": []},
         "periodicUpdateInterval: must be 0 (off) or more seconds"),
        ({"resources": []}, "configList: is required"),
    ],
)
def test_invalid_configs_name_the_entry_and_field(
    root: Path, config: dict[str, Any] | str, message: str
) -> None:
    path = root / "config.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).startswith(f"{path}: ")
    assert message in str(e.value)


def test_unknown_keys_are_reported_as_likely_typos(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    load_config(write_config(root, {"configList": [
        {"resourceName": "a", "selectors": {"vendors": ["15b3"], "ifname": ["ib0"]}}]}))
    assert 'configList[0] ("a"): selectors.ifname: unknown key, ignored (a typo?)' in caplog.text


def test_the_command_exits_with_the_problem(root: Path) -> None:
    path = write_config(root, {"configList": [{"resourceName": "hca-a",
                                               "selectors": {"vendors": ["15b3"]}}]})
    result = CliRunner().invoke(app, ["rdma-device-plugin", "--config-file", str(path),
                                      "--host-root", str(root)])
    assert result.exit_code == 1
    assert "resourceName: 'hca-a' may contain only letters, digits and '_' (^[a-zA-Z0-9_]+$)" \
        in result.output.replace("\n", "")


def test_a_node_without_nics_registers_an_empty_resource(root: Path) -> None:
    host = SimulatedHost.build(root, "cpu")
    config = {"configList": [{"resourceName": "hca_shared_devices_a", "rdmaHcaMax": 100,
                              "selectors": {"vendors": ["15b3"]}}]}

    async def main() -> None:
        async with running(host, config) as kubelet:
            # registered with 0 devices, as upstream: the node shows the resource at 0
            await kubelet.wait_for(lambda: kubelet.resources.get("rdma/hca_shared_devices_a")
                                   is not None and kubelet.resources[
                                       "rdma/hca_shared_devices_a"].connected)
            assert kubelet.capacity() == {"rdma/hca_shared_devices_a": 0}

    asyncio.run(main())


class Recorded(Reporter):
    """What the agent reports, kept in order (a pod's Events, without an API server)."""

    def __init__(self) -> None:
        super().__init__()
        self.reports: list[tuple[str, str]] = []

    async def warn(self, reason: str, message: str) -> None:
        self.reports.append((reason, message))

    async def info(self, reason: str, message: str) -> None:
        self.reports.append((reason, message))

    async def wait_for(self, reason: str, says: str) -> None:
        async with asyncio.timeout(10):
            while not any(r == reason and says in m for r, m in self.reports):
                await asyncio.sleep(0.05)


def replace(path: Path, text: str) -> None:
    """As a ConfigMap volume changes: a new file renamed over the old."""
    tmp = path.with_name(".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_a_changed_config_is_taken_and_a_broken_one_reported_while_the_last_good_serves(
        root: Path) -> None:
    host = SimulatedHost.build(root, "cx6dx")
    sockdir = host.path(DEVICE_PLUGIN_PATH)
    first = {"configList": [{"resourceName": "a", "rdmaHcaMax": 10,
                             "selectors": {"vendors": ["15b3"]}}]}
    path = write_config(root, first)
    reporter = Recorded()

    async def main() -> None:
        kubelet = Kubelet(sockdir)
        await kubelet.start()
        stop = asyncio.Event()
        agent = RdmaAgent(load_config(path), host, sockdir, 0.1, config_path=path,
                          reporter=reporter)
        task = asyncio.create_task(agent.run(stop))
        try:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {"rdma/a": 10})
            for broken, says in (('{"configList": [', "not valid JSON"),
                                 ('{"configList": "a"}', "configList: input should be a valid "
                                                         "list"),
                                 (None, "cannot read config file")):
                if broken is None:
                    path.unlink()
                else:
                    replace(path, broken)
                await reporter.wait_for("ConfigInvalid", says)
                assert kubelet.allocatable() == {"rdma/a": 10}
            second = {"configList": [
                *first["configList"],
                {"resourceName": "b", "rdmaHcaMax": 3, "selectors": {"vendors": ["15b3"]}}]}
            replace(path, json.dumps(second))
            await kubelet.wait_for(lambda: kubelet.allocatable() == {"rdma/a": 10, "rdma/b": 3})
            assert reporter.reports[-1][0] == "ConfigLoaded"
            assert [r for r, _ in reporter.reports] == ["ConfigInvalid"] * 3 + ["ConfigLoaded"]
            assert not task.done()
        finally:
            stop.set()
            await task
            await kubelet.close()

    asyncio.run(main())
