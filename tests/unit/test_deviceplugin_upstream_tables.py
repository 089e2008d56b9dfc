"""The device plugins on every case of upstream's own unit-test tables, on simulated nodes driven
by the kubelet stand-in.

Each test names the upstream file and test (or table entry) it reproduces. Upstream tests its
parts with mocks; here each case runs the whole plugin on a simulated node whose devices have
the attributes the upstream case gives its mocks, and looks at what a user sees: the resources
the kubelet is given, the Allocate answer, the device-info file, the error message.

Where nicop deliberately differs from upstream, the test says so and asserts nicop's behaviour
(docs/troubleshooting.md lists the differences).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio
from tests.unit.test_deviceplugin_upstream_inputs import PF0, PF1, Recorded, vf, write
from typer.testing import CliRunner

from nicop.cli import app
from nicop.node.deviceplugin import api_pb2 as pb
from nicop.node.deviceplugin import api_pb2_grpc as pb_grpc
from nicop.node.deviceplugin.config import ConfigError
from nicop.node.deviceplugin.ddp import ddptool_profile
from nicop.node.deviceplugin.rdma import RdmaAgent, Selectors
from nicop.node.deviceplugin.rdma import load_config as load_rdma
from nicop.node.deviceplugin.server import DEVICE_PLUGIN_PATH, RegistrationRejected
from nicop.node.deviceplugin.sriov import SriovAgent
from nicop.node.deviceplugin.sriov import load_config as load_sriov
from nicop.node.discovery import Netdev, PciFunction
from nicop_sim.hardware import SimulatedHost
from nicop_sim.kubelet import Kubelet

DEVINFO = "/var/run/k8s.cni.cncf.io/devinfo/dp"


@pytest.fixture
def root() -> Iterator[Path]:
    """A short node root: gRPC binds unix socket paths of at most 105 bytes."""
    path = Path(tempfile.mkdtemp(prefix="dpt-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def stub(kubelet: Kubelet, resource: str) -> Any:
    """A client of the plugin serving `resource`, on the kubelet's connection to it."""
    return pb_grpc.DevicePluginStub(kubelet.resources[resource].channel)  # type: ignore[no-untyped-call]


async def unless_failed(agent: asyncio.Task[None], waiting: Awaitable[None]) -> None:
    """Wait for `waiting`, or raise what made the agent stop first."""
    done, _ = await asyncio.wait({agent, asyncio.ensure_future(waiting)},
                                 return_when=asyncio.FIRST_COMPLETED)
    for finished in done:
        finished.result()


def paths(response: pb.ContainerAllocateResponse) -> list[str]:
    return [d.host_path for d in response.devices]


# ============================================================================== RDMA shared

@contextlib.asynccontextmanager
async def rdma_serving(host: SimulatedHost, config: dict[str, Any]) -> AsyncIterator[Kubelet]:
    """The RDMA plugin on `config`, once the kubelet follows every pool of it."""
    sockdir = host.path(DEVICE_PLUGIN_PATH)
    kubelet = Kubelet(sockdir)
    await kubelet.start()
    stop = asyncio.Event()
    loaded = load_rdma(write(host.root, config))
    agent = RdmaAgent(loaded, host, sockdir, 0.1)
    task = asyncio.create_task(agent.run(stop))
    names = {c.full_name for c in loaded.config_list}
    try:
        await unless_failed(task, kubelet.wait_for(lambda: all(
            n in kubelet.resources and kubelet.resources[n].connected for n in names)))
        yield kubelet
    finally:
        stop.set()
        await task
        await kubelet.close()


def rdma_specs(response: pb.ContainerAllocateResponse) -> list[str]:
    """The device nodes an RDMA shared pool gives, as upstream writes them (rwm, same path)."""
    assert {d.permissions for d in response.devices} == {"rwm"}
    assert all(d.container_path == d.host_path for d in response.devices)
    return paths(response)


def nic_nodes(n: int) -> list[str]:
    """The character devices of the simulated node's NIC number `n`."""
    return [f"/dev/infiniband/{kind}{n}" for kind in ("uverbs", "issm", "umad")]


READ_CONFIG_CASES = {
    "Read valid config file with non default periodic update": (
        '{"configList": [{"resourceName": "hca_shared_devices_a", "rdmaHcaMax": 1000, '
        '"devices": ["ib0", "ib1"]}, {"resourceName": "hca_shared_devices_b", "rdmaHcaMax": 500, '
        '"selectors": {"vendors": ["15b3"], "deviceIDs": ["1017"], "ifNames": ["ib2", "ib3"]}}], '
        '"periodicUpdateInterval": 30}', 30),
    "Read valid config file with default periodic update": (
        '{"configList": [{"resourceName": "hca_shared_devices_a", "rdmaHcaMax": 1000, '
        '"devices": ["ib0", "ib1"]}, {"resourceName": "hca_shared_devices_b", "rdmaHcaMax": 500, '
        '"selectors": {"vendors": ["15b3"], "deviceIDs": ["1017"], "ifNames": ["ib2", "ib3"]}}]}',
        60),
    "non existing config file": (None, "cannot read config file"),
    "Read invalid config file": (
        '{"configList": [{"resourceName": "hca_shared_devices_a", "rdmaHcaMax": 1000, '
        '"devices": ["ib0", "ib1"]}}},\n]}', "not valid JSON at line 1 column 104"),
}


@pytest.mark.parametrize("case", list(READ_CONFIG_CASES))
def test_rdma_read_config(root: Path, case: str) -> None:
    """Mellanox/k8s-rdma-shared-dev-plugin pkg/resources/resources_manager_test.go, ReadConfig: the
    case named by `case`. A valid file gives its two resources (the deprecated `devices` list read
    as ifNames) and the update interval (30 s as written, else 60 s); a missing or broken file is an
    error naming the file and the place."""
    text, expected = READ_CONFIG_CASES[case]
    path = root / "config.json"
    if text is not None:
        path.write_text(text)
    if isinstance(expected, int):
        config = load_rdma(path)
        first, second = config.config_list
        assert first.selectors is not None and first.selectors.if_names == ["ib0", "ib1"]
        assert second.selectors is not None
        assert (second.selectors.vendors, second.selectors.device_ids,
                second.selectors.if_names) == (["15b3"], ["1017"], ["ib2", "ib3"])
        assert config.update_interval == expected
        return
    with pytest.raises(ConfigError) as e:
        load_rdma(path)
    assert str(path) in str(e.value)
    assert str(expected) in str(e.value)


VALIDATE_CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    'Valid config list with "devices" field': (
        {"configList": [{"resourceName": "test_config", "rdmaHcaMax": 100, "devices": ["ib0"]}]},
        None),
    'Valid config list  "selectors" field': (
        {"configList": [{"resourceName": "test_config", "rdmaHcaMax": 100, "selectors": {
            "vendors": ["15b3"], "deviceIDs": ["1017"], "ifNames": ["eth1"]}}]}, None),
    "Valid config list with 0 number of resources": (
        {"configList": [{"resourceName": "test_config", "rdmaHcaMax": 0, "devices": ["ib0"]}]},
        None),
    "Validate empty config list": (
        {"configList": []}, "configList: no resources configured; add at least one"),
    "resources with invalid name": (
        {"configList": [{"resourceName": "test_config$$", "rdmaHcaMax": 100,
                         "devices": ["ib0"]}]},
        "resourceName: 'test_config$$' may contain only letters, digits and '_'"),
    "resources with repeated names": (
        {"configList": [{"resourceName": "test_config", "rdmaHcaMax": 100, "devices": ["ib0"]},
                        {"resourceName": "test_config", "rdmaHcaMax": 500, "devices": ["ib1"]}]},
        "configList[1] (\"test_config\"): resourceName: 'test_config' is already used by "
        "rdma/test_config"),
    "resources with invalid number of resources": (
        {"configList": [{"resourceName": "test_config", "rdmaHcaMax": -100,
                         "devices": ["ib0"]}]},
        "rdmaHcaMax: must be 0 or more, got -100"),
    'configuration mismatch between "selectors" and "devices"': (
        {"configList": [{"resourceName": "test_config", "rdmaHcaMax": 100, "devices": ["eth0"],
                         "selectors": {"ifNames": ["eth1"]}}]},
        "devices: cannot specify both devices and selectors; move the names to "
        "selectors.ifNames"),
    'resources configuration with neither "selectors" nor "devices"': (
        {"configList": [{"resourceName": "test_config", "rdmaHcaMax": 100}]},
        "selectors: required, with at least one of vendors, deviceIDs, drivers, ifNames, "
        "linkTypes"),
    'configuration with invalid "periodicUpdateInterval"': (
        {"periodicUpdateInterval": -10, "configList": [
            {"resourceName": "test_config", "rdmaHcaMax": 100, "devices": ["ib0"]}]},
        "periodicUpdateInterval: must be 0 (off) or more seconds, got -10"),
}


@pytest.mark.parametrize("case", list(VALIDATE_CASES))
def test_rdma_validate_configs(root: Path, case: str) -> None:
    """Mellanox/k8s-rdma-shared-dev-plugin pkg/resources/resources_manager_test.go, ValidateConfigs:
    the case named by `case`; where upstream fails, nicop's error names the entry, the field and
    what to do."""
    config, problem = VALIDATE_CASES[case]
    path = write(root, config)
    if problem is None:
        (res,) = load_rdma(path).config_list
        assert res.full_name == "rdma/test_config"
        return
    with pytest.raises(ConfigError) as e:
        load_rdma(path)
    assert problem in str(e.value)


def test_rdma_two_prefixes_sharing_a_resource_name_stop_the_plugin(root: Path) -> None:
    """Mellanox/k8s-rdma-shared-dev-plugin pkg/resources/resources_manager_test.go, ValidateConfigs
    "resources with repeated names": upstream keys uniqueness on resourceName alone (the socket is
    <resourceName>.sock), so two entries differing only in resourcePrefix stop the plugin at start;
    so does nicop's, naming both resources, the socket they would share and the fix."""
    path = write(root, {"configList": [
        {"resourceName": "rdma_shared", "resourcePrefix": "nvidia.com", "rdmaHcaMax": 10,
         "selectors": {"ifNames": [PF0]}},
        {"resourceName": "rdma_shared", "resourcePrefix": "example.com", "rdmaHcaMax": 10,
         "selectors": {"ifNames": [PF1]}}]})
    SimulatedHost.build(root, "cx6dx")
    result = CliRunner().invoke(app, ["rdma-device-plugin", "--config-file", str(path),
                                      "--host-root", str(root)])
    assert result.exit_code == 1
    output = " ".join(result.output.split())
    assert ("configList[1] (\"rdma_shared\"): resourceName: 'rdma_shared' is already used by "
            "nvidia.com/rdma_shared; both would serve the socket rdma_shared.sock") in output
    assert "give each entry its own resourceName" in output
    assert not list(host_sockets(root))


def host_sockets(root: Path) -> Iterator[str]:
    directory = root / DEVICE_PLUGIN_PATH.lstrip("/")
    return (p.name for p in directory.iterdir()) if directory.exists() else iter(())


def nic(vendor: str, device: str, driver: str, ifname: str, link_type: str) -> PciFunction:
    """A NIC as discovery describes it, with upstream's mock attributes."""
    return PciFunction(
        address=ifname, vendor=vendor, device=device, class_code=0x020000, driver=driver,
        numa_node=0, iommu_group=None, netdevs=(Netdev(ifname, link_type, "up"),), rdma=(),
        pf=None, vf_index=None, total_vfs=None, num_vfs=0, acpi_index=None)


def test_rdma_get_filtered_devices() -> None:
    """Mellanox/k8s-rdma-shared-dev-plugin pkg/resources/resources_manager_test.go,
    GetFilteredDevices "Get full list of devices": upstream's five NICs and selectors; every list
    set must contain the NIC's value (vendor, device ID, driver, interface name, link type), so only
    dev1 and dev2 are taken."""
    devs = {
        "dev1": nic("15b3", "1017", "mlx5_core", "enp2s0f0", "ether"),
        "dev2": nic("8080", "2031", "igb", "enp2s0f1", "ether"),
        "dev3": nic("15b3", "1017", "broadcom", "eth0", "ether"),
        "dev4": nic("8080", "1234", "igb", "eth1", "ether"),
        "dev5": nic("15b3", "1017", "mlx5_core", "enp4s0f0", "infiniband"),
    }
    selectors = Selectors.model_validate({
        "vendors": ["15b3", "8080"], "deviceIDs": ["1017", "2031"],
        "drivers": ["mlx5_core", "igb"], "ifNames": ["enp2s0f0", "enp2s0f1", "enp4s0f0"],
        "linkTypes": ["ether"]})
    assert [n for n, fn in devs.items() if selectors.matches(fn)] == ["dev1", "dev2"]


def test_rdma_only_network_nics_with_rdma_join_a_pool(
        root: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Mellanox/k8s-rdma-shared-dev-plugin pkg/resources/resources_manager_test.go, GetDevices "Get
    full list of devices" and DiscoverHostDevices "Discover devices in host": of a ConnectX NIC, an
    Intel igb NIC (without RDMA) and a storage controller (class 01) that the selectors all match,
    only the network controllers are candidates and only those with RDMA devices are shared; the igb
    NIC is logged with the reason."""
    host = SimulatedHost.build(root, "cx6dx")
    host.add_pci_device("0000:03:00.0", "8086", "1533", 0x020000, driver="igb")
    host.add_pci_device("0000:08:00.0", "8086", "1d02", 0x010601, driver="ahci")
    config = {"configList": [{"resourceName": "hca", "rdmaHcaMax": 5,
                              "selectors": {"vendors": ["15b3", "8086"]}}]}

    async def main() -> None:
        async with rdma_serving(host, config) as kubelet:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {"rdma/hca": 5})
            got = rdma_specs(await kubelet.allocate("rdma/hca"))
            assert sorted(got) == sorted([*nic_nodes(0), *nic_nodes(1),
                                          "/dev/infiniband/rdma_cm"])

    with caplog.at_level(logging.INFO):
        asyncio.run(main())
    assert "0000:03:00.0 (no netdev) matches but no RDMA device (is mlx5_ib loaded?)" \
        in caplog.text
    assert "0000:08:00.0" not in caplog.text


def test_rdma_servers_are_named_after_their_resource(root: Path) -> None:
    """Mellanox/k8s-rdma-shared-dev-plugin pkg/resources/server_test.go, newResourceServer "server
    with plugin watcher disabled", "... with 0 resources" and "server with no RDMA resources", and
    resources_manager_test.go InitServers "Init valid server": one server per entry, resource
    <resourcePrefix>/<resourceName> on socket <resourceName>.sock, with rdmaHcaMax slots, none when
    rdmaHcaMax is 0 or when the pool's NICs have no RDMA device."""
    host = SimulatedHost.build(root, "cx6dx")
    host.remove_rdma(PF1)
    config = {"configList": [
        {"resourceName": "test_server", "resourcePrefix": "rdma", "rdmaHcaMax": 100,
         "selectors": {"ifNames": [PF0]}},
        {"resourceName": "zero", "rdmaHcaMax": 0, "selectors": {"ifNames": [PF0]}},
        {"resourceName": "no_rdma", "rdmaHcaMax": 100, "selectors": {"ifNames": [PF1]}},
    ]}

    async def main() -> None:
        async with rdma_serving(host, config) as kubelet:
            await kubelet.wait_for(lambda: kubelet.capacity() == {
                "rdma/test_server": 100, "rdma/zero": 0, "rdma/no_rdma": 0})
            assert sorted(kubelet.health("rdma/test_server")) == sorted(
                str(i) for i in range(100))
            assert {r.endpoint for r in kubelet.resources.values()} == {
                "test_server.sock", "zero.sock", "no_rdma.sock"}
            assert set(host_sockets(root)) >= {"test_server.sock", "zero.sock", "no_rdma.sock"}
        # every plugin socket is removed when the plugin stops
        assert not {"test_server.sock", "zero.sock", "no_rdma.sock"} & set(host_sockets(root))

    asyncio.run(main())


def test_rdma_a_prefix_the_kubelet_refuses_stops_the_plugin_with_the_kubelets_reason(
        root: Path) -> None:
    """Mellanox/k8s-rdma-shared-dev-plugin pkg/resources/server_test.go, "registering with Kubelet"
    entry "when device plugin unable to register with Kubelet should fail", with
    resources_manager_test.go InitServers' prefix "test_prefix": the kubelet refuses
    test_prefix/test_config (a prefix must be a DNS subdomain, without '_'); the plugin stops, and
    says why."""
    host = SimulatedHost.build(root, "cx6dx")
    config = {"configList": [{"resourceName": "test_config", "resourcePrefix": "test_prefix",
                              "rdmaHcaMax": 100, "devices": [PF0]}]}

    async def main() -> None:
        sockdir = host.path(DEVICE_PLUGIN_PATH)
        kubelet = Kubelet(sockdir)
        await kubelet.start()
        agent = RdmaAgent(load_rdma(write(root, config)), host, sockdir, 0.1)
        try:
            with pytest.raises(RegistrationRejected) as e:
                await asyncio.wait_for(agent.run(asyncio.Event()), 10)
        finally:
            await kubelet.close()
        assert "the kubelet rejected resource test_prefix/test_config" in str(e.value)
        assert "'test_prefix' is not a DNS subdomain" in str(e.value)

    asyncio.run(main())


def test_rdma_periodic_update(root: Path) -> None:
    """Mellanox/k8s-rdma-shared-dev-plugin pkg/resources/resources_manager_test.go, PeriodicUpdate
    "Update resources for resource manager" and "No update when periodic interval is 0": a NIC whose
    RDMA device appears after the start joins its pool at the next periodic update; with
    periodicUpdateInterval 0 it never does (here: not even after the plugin has seen the other
    pool's NIC go down, a later event)."""
    config: dict[str, Any] = {"configList": [
        {"resourceName": "late", "rdmaHcaMax": 5, "selectors": {"ifNames": [PF1]}},
        {"resourceName": "clock", "rdmaHcaMax": 5, "selectors": {"ifNames": [PF0]}},
    ]}

    async def run(interval: int) -> None:
        node = root / f"every-{interval}"
        host = SimulatedHost.build(node, "cx6dx")
        host.remove_rdma(PF1)
        async with rdma_serving(host, {**config, "periodicUpdateInterval": interval}) \
                as kubelet:
            await kubelet.wait_for(lambda: kubelet.capacity() == {"rdma/late": 0,
                                                                  "rdma/clock": 5})
            host.add_rdma(PF1)
            if interval:
                await kubelet.wait_for(lambda: kubelet.allocatable()["rdma/late"] == 5)
                return
            host.set_link(PF0, False)
            await kubelet.wait_for(lambda: kubelet.allocatable()["rdma/clock"] == 0)
            assert kubelet.capacity()["rdma/late"] == 0

    asyncio.run(run(1))
    asyncio.run(run(0))


def test_rdma_allocate_gives_every_nic_of_the_pool(root: Path) -> None:
    """Mellanox/k8s-rdma-shared-dev-plugin pkg/resources/server_test.go, "allocating" entries
    "allocating successfully 1 deviceID", "empty AllocateRequest" and (pending upstream) "allocating
    deviceID that does not exist", and "Allocate resource" (two containers in one request): a pool
    whose selectors match several NICs gives every container the RDMA character devices of each of
    them, and rdma_cm; no container, no answer; a slot the plugin never advertised is refused,
    named."""
    host = SimulatedHost.build(root, "dgx")
    config = {"configList": [{"resourceName": "fakename", "rdmaHcaMax": 100,
                              "selectors": {"vendors": ["15b3"], "linkTypes": ["infiniband"]}}]}
    every = sorted([p for n in range(8) for p in nic_nodes(n)] + ["/dev/infiniband/rdma_cm"])

    async def main() -> None:
        async with rdma_serving(host, config) as kubelet:
            name = "rdma/fakename"
            await kubelet.wait_for(lambda: kubelet.allocatable() == {name: 100})
            assert sorted(rdma_specs(await kubelet.allocate(name, ["0"]))) == every
            client = stub(kubelet, name)
            two = await client.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=["1"]),
                pb.ContainerAllocateRequest(devices_ids=["2"])]))
            assert [sorted(rdma_specs(r)) for r in two.container_responses] == [every, every]
            empty = await client.Allocate(pb.AllocateRequest())
            assert list(empty.container_responses) == []
            with pytest.raises(aio.AioRpcError) as e:
                await client.Allocate(pb.AllocateRequest(container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=["00:00.02"])]))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert e.value.details() == "rdma/fakename: unknown device(s) 00:00.02"

    asyncio.run(main())


@pytest.mark.parametrize("missing", ["umad of one NIC", "ib_umad", "rdma_ucm", "issm"])
def test_rdma_a_nic_without_a_required_char_device_is_left_out(
        root: Path, caplog: pytest.LogCaptureFixture, missing: str) -> None:
    """Mellanox/k8s-rdma-shared-dev-plugin pkg/resources/server_test.go, newResourceServer "server
    with no RDMA resources", with the check upstream makes of every NIC (rdma_device_spec.go:
    rdma_cm, umad and uverbs are required, issm is not since k8s-rdma-shared-dev-plugin#44): a NIC
    whose umad node is missing is left out of the pool (the others are shared); without ib_umad or
    rdma_ucm no NIC qualifies and the pool advertises nothing; a missing issm does not matter. The
    log names what is missing and the module that provides it."""
    host = SimulatedHost.build(root, "cx6dx")
    if missing == "umad of one NIC":
        host.path("/dev/infiniband/umad1").unlink()
    elif missing == "issm":
        host.path("/dev/infiniband/issm0").unlink()
        host.path("/dev/infiniband/issm1").unlink()
    else:
        host.unload_module(missing)
    config = {"configList": [{"resourceName": "hca", "rdmaHcaMax": 3,
                              "selectors": {"vendors": ["15b3"]}}]}

    async def main() -> None:
        async with rdma_serving(host, config) as kubelet:
            if missing in ("ib_umad", "rdma_ucm"):
                assert kubelet.capacity() == {"rdma/hca": 0}
                return
            await kubelet.wait_for(lambda: kubelet.allocatable() == {"rdma/hca": 3})
            got = rdma_specs(await kubelet.allocate("rdma/hca"))
            if missing == "issm":
                assert sorted(got) == sorted(["/dev/infiniband/uverbs0", "/dev/infiniband/umad0",
                                              "/dev/infiniband/uverbs1", "/dev/infiniband/umad1",
                                              "/dev/infiniband/rdma_cm"])
            else:
                assert got == [*nic_nodes(0), "/dev/infiniband/rdma_cm"]

    with caplog.at_level(logging.INFO):
        asyncio.run(main())
    expected = {
        "umad of one NIC": f"0000:3b:00.1 ({PF1}, mlx5_1) matches but mlx5_1 has no "
                           "/dev/infiniband/umad* (is ib_umad loaded?); skipped",
        "ib_umad": "mlx5_0 has no /dev/infiniband/umad* (is ib_umad loaded?)",
        "rdma_ucm": "matches but /dev/infiniband/rdma_cm is missing (is rdma_ucm loaded?)",
        "issm": "rdma/hca: NICs 0000:3b:00.0",
    }
    assert expected[missing] in caplog.text


def test_rdma_allocate_follows_changed_char_devices(root: Path) -> None:
    """Mellanox/k8s-rdma-shared-dev-plugin pkg/resources/server_test.go, devicesChanged ("device is
    present and did not change", "num of devices in deviceList", "mounts changed for one of the
    devices") and UpdateDevices ("should receive signal of updating resource", "resources not
    updated"): a NIC that loses its RDMA device drops out of the Allocate answer, and when it comes
    back under other character device numbers the answer names the new ones."""
    host = SimulatedHost.build(root, "cx6dx")
    config = {"periodicUpdateInterval": 1, "configList": [
        {"resourceName": "hca", "rdmaHcaMax": 2, "selectors": {"vendors": ["15b3"]}}]}

    async def answer(kubelet: Kubelet) -> list[str]:
        return sorted(rdma_specs(await kubelet.allocate("rdma/hca")))

    async def main() -> None:
        async with rdma_serving(host, config) as kubelet:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {"rdma/hca": 2})
            both = await answer(kubelet)
            assert both == sorted([*nic_nodes(0), *nic_nodes(1), "/dev/infiniband/rdma_cm"])
            assert await answer(kubelet) == both  # nothing changed, nothing moves
            host.remove_rdma(PF1)
            host.add_sf(PF0, 1)  # takes the freed uverbs1/umad1/issm1
            sf_nodes = nic_nodes(1)
            async with asyncio.timeout(10):
                while await answer(kubelet) != sorted([*nic_nodes(0), "/dev/infiniband/rdma_cm"]):
                    await asyncio.sleep(0.05)
            host.add_rdma(PF1)
            want = sorted([*nic_nodes(0), *nic_nodes(2), "/dev/infiniband/rdma_cm"])
            async with asyncio.timeout(10):
                while await answer(kubelet) != want:
                    await asyncio.sleep(0.05)
            assert not set(sf_nodes) & set(await answer(kubelet))  # the SF's are not the NIC's

    asyncio.run(main())


def test_rdma_registration_follows_the_kubelet(root: Path) -> None:
    """Mellanox/k8s-rdma-shared-dev-plugin pkg/resources/server_test.go, "registering with Kubelet"
    entries "successfully shouldn't fail" and "when can't connect to Kubelet should fail", and Watch
    "Watch socket and send notification to restart successfully": upstream exits when the kubelet
    cannot be reached at start; nicop's plugin waits and registers when it comes (a node rebooting
    starts its pods before or after the kubelet is ready). A plugin socket removed (as a restarting
    kubelet does) is served and registered again."""
    host = SimulatedHost.build(root, "cx6dx")
    sockdir = host.path(DEVICE_PLUGIN_PATH)
    config = {"configList": [{"resourceName": "hca", "rdmaHcaMax": 4, "devices": [PF0]}]}

    async def main() -> None:
        stop = asyncio.Event()
        agent = RdmaAgent(load_rdma(write(root, config)), host, sockdir, 0.1)
        task = asyncio.create_task(agent.run(stop))
        kubelet = Kubelet(sockdir)
        try:
            async with asyncio.timeout(10):
                while not (sockdir / "hca.sock").exists():
                    await asyncio.sleep(0.05)
            await kubelet.start()
            await kubelet.wait_for(lambda: kubelet.allocatable() == {"rdma/hca": 4})
            first = kubelet.resources["rdma/hca"]
            (sockdir / "hca.sock").unlink()
            await kubelet.wait_for(lambda: kubelet.resources["rdma/hca"] is not first
                                   and kubelet.allocatable() == {"rdma/hca": 4})
            assert (sockdir / "hca.sock").exists()
        finally:
            stop.set()
            await task
            await kubelet.close()

    asyncio.run(main())


# ============================================================================== SR-IOV

# A pool that is always served, last in every config: once the kubelet follows it, the plugin's
# first scan is done and every other pool with devices has its server.
SENTINEL_ADDRESS = "0000:81:00.0"
SENTINEL = {"resourceName": "sentinel", "deviceType": "accelerator",
            "selectors": {"vendors": ["10ee"], "devices": ["5000"]}}


@contextlib.asynccontextmanager
async def sriov_serving(host: SimulatedHost, resources: list[dict[str, Any]], *,
                        reporter: Recorded | None = None) -> AsyncIterator[Kubelet]:
    """The SR-IOV plugin on `resources`, once the kubelet follows every pool it serves."""
    if not host.exists(f"/sys/bus/pci/devices/{SENTINEL_ADDRESS}"):
        host.add_pci_device(SENTINEL_ADDRESS, "10ee", "5000", 0x120000, driver="xdma")
    sockdir = host.path(DEVICE_PLUGIN_PATH)
    kubelet = Kubelet(sockdir)
    await kubelet.start()
    stop = asyncio.Event()
    agent = SriovAgent(write(host.root, {"resourceList": [*resources, SENTINEL]}), host,
                       sockdir, poll_interval=0.1, reporter=reporter)
    task = asyncio.create_task(agent.run(stop))

    def followed(name: str) -> bool:
        res = kubelet.resources.get(name)
        return res is not None and res.connected and bool(res.devices)

    try:
        await unless_failed(task, kubelet.wait_for(lambda: followed("intel.com/sentinel")))
        served = set(agent.servers.servers)
        await unless_failed(task, kubelet.wait_for(lambda: all(followed(n) for n in served)))
        yield kubelet
    finally:
        stop.set()
        await task
        await kubelet.close()


def advertised(kubelet: Kubelet) -> dict[str, set[str]]:
    """Each resource's device IDs, but the sentinel's."""
    return {n: set(r.devices) for n, r in kubelet.resources.items()
            if n != "intel.com/sentinel" and r.connected}


def info(response: pb.ContainerAllocateResponse, env: str) -> dict[str, Any]:
    return json.loads(response.envs[f"{env}_INFO"])  # type: ignore[no-any-return]


def served(host: SimulatedHost, resources: list[dict[str, Any]]) -> dict[str, set[str]]:
    """What the plugin advertises for `resources` on `host`."""
    async def main() -> dict[str, set[str]]:
        async with sriov_serving(host, resources) as kubelet:
            return advertised(kubelet)
    return asyncio.run(main())


# ------------------------------------------------------------------------------ config

def test_sriov_read_config(root: Path) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin cmd/sriovdp/manager_test.go, "reading
    config": "when there's an error reading file" and "... unmarshalling config" fail naming the
    file; "when config reading is successful" loads both resources; "when the multi-selector config
    reading is successful" loads one and two selector objects."""
    with pytest.raises(ConfigError, match=r"cannot read config file .*test_config"):
        load_sriov(root / "test_config")
    (root / "test_config").write_text("junk")
    with pytest.raises(ConfigError, match=r"test_config: not valid JSON at line 1 column 1"):
        load_sriov(root / "test_config")
    netdevice = {"resourceName": "intel_sriov_netdevice", "selectors": {
        "isRdma": False, "vendors": ["8086"], "devices": ["154c", "10ed"],
        "drivers": ["i40evf", "ixgbevf"]}}
    single = load_sriov(write(root, {"resourceList": [netdevice, {
        "resourceName": "intel_sriov_dpdk", "selectors": {
            "vendors": ["8086"], "devices": ["154c", "10ed"], "drivers": ["vfio-pci"]}}]}))
    assert [r.name for r in single.resources] == ["intel.com/intel_sriov_netdevice",
                                                  "intel.com/intel_sriov_dpdk"]
    multi = load_sriov(write(root, {"resourceList": [netdevice, {
        "resourceName": "dpdk", "selectors": [
            {"vendors": ["8086"], "devices": ["154c", "10ed"], "drivers": ["vfio-pci"]},
            {"vendors": ["15b3"], "devices": ["1018"], "drivers": ["mlx5_core"],
             "isRdma": True}]}]}))
    assert [len(r.selectors) for r in multi.resources] == [1, 2]


SELECTORS_8086 = {"vendors": ["8086"], "devices": ["154c", "10ed"],
                  "drivers": ["i40evf", "ixgbevf"]}
VALID_CONFIG_CASES: dict[str, tuple[list[dict[str, Any]], list[str], str | None]] = {
    "when resource name is invalid": (
        [{"resourceName": "invalid.name", "selectors": {"isRdma": False, **SELECTORS_8086}}],
        [], "resourceName: 'invalid.name' may contain only letters, digits, '_' and '-'"),
    "when resource name is duplicated": (
        [{"resourceName": "duplicate", "selectors": {"isRdma": True, **SELECTORS_8086}},
         {"resourceName": "duplicate", "selectors": {
             "vendors": ["8086"], "devices": ["154c", "10ed"], "drivers": ["vfio-pci"]}}],
        ["intel.com/duplicate"],
        'resourceList[1] ("duplicate"): resourceName: intel.com/duplicate is defined twice; '
        "the first definition is served"),
    "when both IsRdma and VdpaType are configured": (
        [{"resourceName": "wrong_config", "selectors": {
            "isRdma": True, "vdpaType": "virtio", **SELECTORS_8086}}],
        [], "selectors: isRdma and vdpaType cannot be used together"),
    "when isRdma and vdpaType are configured in separate selectors": (
        [{"resourceName": "correct_config", "selectors": [
            {"vdpaType": "virtio", **SELECTORS_8086}, {"isRdma": True, **SELECTORS_8086}]}],
        ["intel.com/correct_config"], None),
    "when isRdma and vdpaType are configured in a second selector": (
        [{"resourceName": "mixed_config", "selectors": [
            {"vdpaType": "virtio", **SELECTORS_8086},
            {"isRdma": True, "vdpaType": "virtio", **SELECTORS_8086}]}],
        [], 'resourceList[0] ("mixed_config"): selectors[1]: isRdma and vdpaType cannot be '
            "used together"),
}


@pytest.mark.parametrize("case", list(VALID_CONFIG_CASES))
def test_sriov_valid_configs(root: Path, case: str) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin cmd/sriovdp/manager_test.go, "validating
    configuration", the case named by `case`. Where upstream refuses the whole file and exits, nicop
    leaves out the entry at fault, names it, the field and the rule, and serves the others (a file
    with no usable entry left is refused, as upstream's)."""
    resources, names, problem = VALID_CONFIG_CASES[case]
    path = write(root, {"resourceList": resources})
    if not names:
        with pytest.raises(ConfigError) as e:
            load_sriov(path)
        assert problem is not None and problem in str(e.value)
        return
    loaded = load_sriov(path)
    assert [r.name for r in loaded.resources] == names
    skipped = [s.split(f"{path}: ")[1] for s in loaded.skipped]
    assert skipped == ([problem] if problem else [])


def test_sriov_a_duplicate_resource_name_serves_the_first_and_reports_the_second(
        root: Path) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin cmd/sriovdp/manager_test.go, "when
    resource name is duplicated": upstream checks <prefix>/<resourceName> for uniqueness and
    exits on a repeat. nicop serves the first definition, reports the second as a ResourceSkipped
    Event on its pod naming the entry, and serves the same name under another prefix, which is
    another resource."""
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs(PF0, 2)
    host.set_numvfs(PF1, 2)
    reporter = Recorded()
    resources = [{"resourceName": "duplicate", "selectors": {"pfNames": [PF0]}},
                 {"resourceName": "duplicate", "selectors": {"pfNames": [PF1]}},
                 {"resourceName": "duplicate", "resourcePrefix": "example.com",
                  "selectors": {"pfNames": [PF1]}}]

    async def main() -> None:
        async with sriov_serving(host, resources, reporter=reporter) as kubelet:
            assert advertised(kubelet) == {
                "intel.com/duplicate": {vf(host, PF0, 0), vf(host, PF0, 1)},
                "example.com/duplicate": {vf(host, PF1, 0), vf(host, PF1, 1)}}
        assert [r for r, _ in reporter.reports] == ["ResourceSkipped"]
        assert 'resourceList[1] ("duplicate"): resourceName: intel.com/duplicate is defined ' \
            "twice; the first definition is served" in reporter.reports[0][1]

    asyncio.run(main())


DEVICE_FILTER_CASES: dict[str, tuple[str, Any, str | None]] = {
    "successful netdevice": ("netDevice", {"PfNames": ["eth0"]}, None),
    "failed netdevice": ("netDevice", "invalid selectors!",
                         "selectors: required, an object or a list of objects"),
    "successful accelerator": ("accelerator", {"Vendors": ["8086"]}, None),
    "failed accelerator": ("accelerator", "invalid selectors!",
                           "selectors: required, an object or a list of objects"),
    "successful auxnetdevice": ("auxNetDevice", {"auxTypes": ["foo"]},
                                'selectors.auxTypes: must be ["sf"] (scalable functions), got '
                                '["foo"]'),
    "failed auxnetdevice": ("auxNetDevice", "invalid selectors!",
                            "selectors: required, an object or a list of objects"),
    "unsupported type": ("", {}, "deviceType: '' is not one of netDevice, accelerator, "
                                 "auxNetDevice"),
}


@pytest.mark.parametrize("case", list(DEVICE_FILTER_CASES))
def test_sriov_device_filter(root: Path, case: str) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/factory/factory_test.go, "getting device
    filter", the case named by `case`: selectors that are not an object (or a list of them) are
    refused naming the field; keys are read in any case, as Go reads them. Upstream accepts auxTypes
    ["foo"] here and refuses it in its aux provider's ValidConfig (see test_sriov_aux_valid_config),
    which nicop does when it reads the file."""
    device_type, selectors, problem = DEVICE_FILTER_CASES[case]
    path = write(root, {"resourceList": [{"resourceName": "fake", "deviceType": device_type,
                                          "selectors": selectors}]})
    if problem is None:
        (res,) = load_sriov(path).resources
        (sel,) = res.selectors
        assert (getattr(sel, "pf_names", None) or sel.vendors) in (["eth0"], ["8086"])
        return
    with pytest.raises(ConfigError) as e:
        load_sriov(path)
    assert problem in str(e.value)


AUX_VALID_CASES: dict[str, tuple[Any, str | None]] = {
    "invalid selector in config passed": ({"vendors": []}, 'auxTypes: must be ["sf"]'),
    "auxTypes list is empty": ({"auxTypes": []}, 'selectors.auxTypes: must be ["sf"]'),
    "auxTypes list is empty in second selector": (
        [{"auxTypes": ["sf"]}, {"auxTypes": []}], 'selectors[1].auxTypes: must be ["sf"]'),
    "unsupported auxiliary device types specified": (
        {"auxTypes": ["sf", "eth", "rdma"]},
        'selectors.auxTypes: must be ["sf"] (scalable functions), got ["sf", "eth", "rdma"]'),
    "unsupported auxiliary device types specified in second selector": (
        [{"auxTypes": ["sf"]}, {"auxTypes": ["sf", "eth", "rdma"]}],
        'selectors[1].auxTypes: must be ["sf"]'),
    "supported auxiliary device types": ({"auxTypes": ["sf", "sf"]}, None),
}


@pytest.mark.parametrize("case", list(AUX_VALID_CASES))
def test_sriov_aux_valid_config(root: Path, case: str) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin
    pkg/auxnetdevice/auxNetDeviceProvider_test.go, "validating configuration", the case named by
    `case`: every selector object of an auxNetDevice resource must list auxTypes, all "sf"."""
    selectors, problem = AUX_VALID_CASES[case]
    path = write(root, {"resourceList": [{"resourceName": "sfs", "deviceType": "auxNetDevice",
                                          "selectors": selectors}]})
    if problem is None:
        assert [r.name for r in load_sriov(path).resources] == ["intel.com/sfs"]
        return
    with pytest.raises(ConfigError) as e:
        load_sriov(path)
    assert problem in str(e.value)


def test_sriov_unknown_selector_key_is_reported(
        root: Path, caplog: pytest.LogCaptureFixture) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/factory/factory_test.go, "getting
    selector" entry "invalid": there is no selector "fakeAndInvalid". Go's decoder drops an unknown
    key silently; nicop warns, naming it (usually a typo that widens the pool), and serves the
    resource on the fields it knows."""
    path = write(root, {"resourceList": [{"resourceName": "fake", "selectors": {
        "vendors": ["15b3"], "fakeAndInvalid": ["val1", "val2", "val3"]}}]})
    (res,) = load_sriov(path).resources
    assert res.selectors[0].vendors == ["15b3"]
    assert 'resourceList[0] ("fake"): selectors.fakeAndInvalid: unknown key, ignored (a typo?)' \
        in caplog.text


# ------------------------------------------------------------------------------ discovery

def intel_pf(host: SimulatedHost, address: str, driver: str | None = "i40e",
             total_vfs: int | None = 0) -> str:
    """An Intel X710 port (8086:1572), SR-IOV capable when `total_vfs` is set."""
    host.add_pci_device(address, "8086", "1572", 0x020000, driver=driver)
    if total_vfs is not None:
        host.path(f"/sys/bus/pci/devices/{address}/sriov_totalvfs").write_text(f"{total_vfs}\n")
        host.path(f"/sys/bus/pci/devices/{address}/sriov_numvfs").write_text("0\n")
    return address


DISCOVERY_CASES = ["no devices", "unparsable modalias", "PF device with no VFs configured",
                   "PF device with no VFs configured and not bound to any driver",
                   "PF device with VF configured",
                   "VF device without PF and bound to dpdk driver",
                   "should fail if cannot get driver name"]


@pytest.mark.parametrize("case", DISCOVERY_CASES)
def test_sriov_discovering_devices(root: Path, case: str) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin cmd/sriovdp/manager_test.go, "discovering
    devices", the case named by `case`, with pkg/netdevice/netDeviceProvider_test.go and
    pkg/devices/host_test.go ("should fail if cannot get driver name": the device is left out)
    "adding 3 target devices": a netDevice pool without selector filters ({}) takes every network
    function that has a driver, but not a PF whose VFs are configured, nor a device whose class
    cannot be read; VFs without a PF (in a VM) bound to igb_uio come with their /dev/uioN."""
    host = SimulatedHost.build(root, "cx6dx" if case == "PF device with VF configured"
                               else "cpu")
    want: set[str] = set()
    if case == "unparsable modalias":
        intel_pf(host, "0000:00:00.0")
        host.path("/sys/bus/pci/devices/0000:00:00.0/class").write_text("junk\n")
    elif case == "PF device with no VFs configured":
        want = {intel_pf(host, "0000:00:00.0")}
    elif case == "PF device with no VFs configured and not bound to any driver":
        intel_pf(host, "0000:00:00.0", driver=None)
    elif case == "should fail if cannot get driver name":
        intel_pf(host, "0000:00:00.1", driver=None)
        host.path("/sys/bus/pci/devices/0000:00:00.1/driver").write_text("not a symlink")
    elif case == "PF device with VF configured":
        host.set_numvfs(PF0, 1)
        want = {vf(host, PF0, 0), host.address(PF1)}
    elif case == "VF device without PF and bound to dpdk driver":
        for address in ("0000:03:02.0", "0000:03:02.1"):
            host.add_pci_device(address, "8086", "154c", 0x020000)
            host.bind_driver(address, "igb_uio")
        want = {"0000:03:02.0", "0000:03:02.1"}

    async def main() -> None:
        async with sriov_serving(host, [{"resourceName": "fake", "selectors": {}}]) as kubelet:
            assert advertised(kubelet) == ({"intel.com/fake": want} if want else {})
            if case.startswith("VF device without PF"):
                response = await kubelet.allocate("intel.com/fake", ["0000:03:02.1"])
                assert paths(response) == ["/dev/uio1"]

    asyncio.run(main())


@pytest.fixture
def mixed(root: Path, monkeypatch: pytest.MonkeyPatch) -> SimulatedHost:
    """A node with a ConnectX-6 Dx whose PF0 has four VFs (v0 on mlx5_core, v1 on vfio-pci, v2
    with a vhost vDPA device, v3 with a virtio one) and whose PF1 has none, and three Intel X710
    functions: af:00.0 running DDP profile GTP, af:00.1 profile PPPoE, af:00.2 (8086:154c) on
    igb_uio without profile; ddptool on the PATH."""
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs(PF0, 4)
    host.bind_driver(vf(host, PF0, 1), "vfio-pci")
    host.add_vdpa(vf(host, PF0, 2), "vhost_vdpa")
    host.add_vdpa(vf(host, PF0, 3), "virtio_vdpa")
    intel_pf(host, "0000:af:00.0")
    intel_pf(host, "0000:af:00.1")
    host.add_pci_device("0000:af:00.2", "8086", "154c", 0x020000)
    host.bind_driver("0000:af:00.2", "igb_uio")
    host.set_ddp_profile("0000:af:00.0", "GTP")
    host.set_ddp_profile("0000:af:00.1", "PPPoE")
    tool = host.install_ddptool(root / "bin")
    monkeypatch.setenv("PATH", f"{tool.parent}:{os.environ['PATH']}")
    return host


VFS = ("v0", "v1", "v2", "v3")
INTEL = ("af:00.0", "af:00.1", "af:00.2")
FILTER_CASES: dict[str, tuple[Any, tuple[str, ...]]] = {
    "vendors": ({"vendors": ["8086"]}, INTEL),
    "devices": ({"devices": ["101e"]}, VFS),
    "drivers": ({"drivers": ["igb_uio"]}, ("af:00.2",)),
    "pciAddresses": ({"pciAddresses": ["v0", "0000:af:00.1"]}, ("v0", "af:00.1")),
    "pfNames": ({"pfNames": [PF0, "eth1"]}, VFS),
    "rootDevices": ({"rootDevices": ["0000:3b:00.0", "0000:af:00.0"]}, VFS),
    "linkTypes": ({"linkTypes": ["ether"]}, (*VFS, "pf1")),
    "linkTypes multi": ({"linkTypes": ["infiniband", "ether"]}, (*VFS, "pf1")),
    "ddpProfiles": ({"ddpProfiles": ["GTP"]}, ("af:00.0",)),
    "rdma": ({"isRdma": True}, ("v0", "v2", "v3", "pf1")),
    "vdpa-vhost": ({"vdpaType": "vhost"}, ("v2",)),
    "vdpa-virtio": ({"vdpaType": "virtio"}, ("v3",)),
    "GetFilteredDevices uses the specified selector index": (
        [{"vendors": ["None"]}, {"vendors": ["8086"]}], INTEL),
}


def names(host: SimulatedHost, ids: tuple[str, ...]) -> set[str]:
    """The device IDs of the mixed node's short names (v0..v3, pf1, af:00.N)."""
    out = set()
    for n in ids:
        if n.startswith("v"):
            out.add(vf(host, PF0, int(n[1:])))
        elif n == "pf1":
            out.add(host.address(PF1))
        else:
            out.add(f"0000:{n}")
    return out


@pytest.mark.parametrize("case", list(FILTER_CASES))
def test_sriov_get_filtered_devices(mixed: SimulatedHost, case: str) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/netdevice/netDeviceProvider_test.go,
    "getting Filtered devices", the case named by `case`, with pkg/resources/ddpSelector_test.go
    ("should return devices matching DDP profiles": GTP, not PPPoE, not a device without profile),
    pkg/devices/devices_test.go "should use PF linkType if own ifName is not available" (the
    vfio-bound v1 has the link type of its PF) and pkg/netdevice/pciNetDevice_test.go "With
    Vdpa-capable devices": each selector field alone, on a node with the kinds of devices upstream's
    mocks describe."""
    selectors, ids = FILTER_CASES[case]
    if case == "pciAddresses":
        selectors = {"pciAddresses": [vf(mixed, PF0, 0), "0000:af:00.1"]}
    got = served(mixed, [{"resourceName": "fake", "selectors": selectors}])
    assert got == {"intel.com/fake": names(mixed, ids)}


RESOURCE_POOL_CASES = ["with a single selector object should match devices",
                       "with a slice of one selector object it should match devices",
                       "with more than one selector object, it should match devices from all "
                       "selector objects"]


@pytest.mark.parametrize("case", RESOURCE_POOL_CASES)
def test_sriov_getting_resource_pool(mixed: SimulatedHost, case: str) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/factory/factory_test.go, "getting
    resource pool", the case named by `case`: every field of a selector object must match (vendors,
    devices, drivers, pciAddresses, pfNames, rootDevices, linkTypes; ddpProfiles for the Intel
    port), and a list of objects takes what any of them takes. Upstream's mocks give their Ethernet
    devices P_Keys; real Ethernet devices have none (see test_sriov_pkeys), so pKeys is left out
    here."""
    v0 = {"vendors": ["15b3"], "devices": ["101e"], "drivers": ["mlx5_core", "vfio-pci"],
          "pciAddresses": [vf(mixed, PF0, 0)], "pfNames": [PF0], "rootDevices": ["0000:3b:00.0"],
          "linkTypes": ["ether"]}
    gtp = {"vendors": ["8086"], "devices": ["1572"], "drivers": ["i40e"],
           "pciAddresses": ["0000:af:00.0"], "ddpProfiles": ["GTP"]}
    single, one, several = RESOURCE_POOL_CASES
    selectors: Any = {single: v0, one: [v0], several: [v0, gtp]}[case]
    want = names(mixed, ("v0", "af:00.0") if case == several else ("v0",))
    assert served(mixed, [{"resourceName": "fake", "selectors": selectors}]) == {
        "intel.com/fake": want}


def test_sriov_exclusive_resource_pool(mixed: SimulatedHost) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/factory/factory_test.go, "getting
    exclusive resource pool for netdevice": two resources whose selectors (one object, then a list
    of the same object) take the same device: the first gets it, the second gets nothing and has no
    server."""
    selector = {"vendors": ["15b3"], "pciAddresses": [vf(mixed, PF0, 0)]}
    assert served(mixed, [{"resourceName": "fake", "selectors": selector},
                          {"resourceName": "fake2", "selectors": [selector]}]) == {
        "intel.com/fake": {vf(mixed, PF0, 0)}}


def test_sriov_pf_name_and_root_device_selectors(root: Path) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/resources/deviceSelectors_test.go,
    "pfName selector" (["ens0", "ens2f0#1", "ens2f1#0,3-5,7"]) and "rootDevice selector"
    (["0000:86:00.0", "0000:86:00.1#1", "0000:86:00.2#0-2,5,7"]) with this node's PF names and
    addresses: a PF alone takes all its VFs, #<list> the VFs at those indexes (ranges inclusive), a
    PF not listed none; PF names compare without case."""
    host = SimulatedHost.build(root, "dgx")
    ens0, ens2f0, ens2f1, eth0 = "ibp24s0", "ibp64s0", "ibp79s0", "ibp94s0"
    for pf, count in ((ens0, 2), (ens2f0, 2), (ens2f1, 8), (eth0, 1)):
        host.set_numvfs(pf, count)
    got = served(host, [
        {"resourceName": "by_name", "selectors": {
            "pfNames": [ens0.upper(), f"{ens2f0}#1", f"{ens2f1}#0,3-5,7"]}},
        {"resourceName": "by_root", "selectors": {"rootDevices": [
            host.address(ens0), f"{host.address(ens2f0)}#0", f"{host.address(ens2f1)}#1-2,6"]}},
    ])
    assert got == {
        "intel.com/by_name": {vf(host, ens0, 0), vf(host, ens0, 1), vf(host, ens2f0, 1),
                              *(vf(host, ens2f1, i) for i in (0, 3, 4, 5, 7))},
        "intel.com/by_root": {vf(host, ens2f0, 0), *(vf(host, ens2f1, i) for i in (1, 2, 6))},
    }


def test_sriov_repeated_pf_entries_take_every_range(root: Path) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/resources/deviceSelectors_test.go,
    "pfName selector", with a PF listed twice. Upstream uses the first item naming the PF
    (deviceSelectors.go getItem) and ignores the rest, so ["PF#0-1", "PF#3"] takes VFs 0 and 1 only,
    and sriov-network-operator writes such lists when two policies give one resource different VF
    ranges of a PF. nicop takes the VFs of every item (0, 1 and 3); an item without range takes the
    whole PF."""
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs(PF0, 5)
    host.set_numvfs(PF1, 3)
    got = served(host, [{"resourceName": "ranges", "selectors": {
        "pfNames": [f"{PF0}#0-1", f"{PF0}#3", f"{PF1}#2", PF1]}}])
    assert got == {"intel.com/ranges": {*(vf(host, PF0, i) for i in (0, 1, 3)),
                                        *(vf(host, PF1, i) for i in range(3))}}


def test_sriov_acpi_index_selector(root: Path) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/resources/deviceSelectors_test.go,
    "acpiIndex selector": acpiIndexes ["101"] takes the device whose ACPI index is 101, not the one
    with 102."""
    host = SimulatedHost.build(root, "cx6dx")
    host.set_acpi_index(PF0, 101)
    host.set_acpi_index(PF1, 102)
    assert served(host, [{"resourceName": "onboard", "selectors": {"acpiIndexes": ["101"]}}]) \
        == {"intel.com/onboard": {host.address(PF0)}}


def test_sriov_pkeys(root: Path) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/resources/pKeySelector_test.go, "should
    return devices matching given PKeys" (0x1 and 0x2 taken, 0x3 not), with the condition of
    pciNetDevice.go that only InfiniBand devices have a P_Key: the Ethernet VFs of a ConnectX-6 Dx,
    whose RDMA devices list the default P_Key 0xffff, match no pKeys."""
    ib = SimulatedHost.build(root / "ib", "cx7-ib")
    ib.set_numvfs("ibp75s0", 3)
    for i, pkey in enumerate(("0x1", "0x2", "0x3")):
        ib.set_pkey(vf(ib, "ibp75s0", i), pkey)
    assert served(ib, [{"resourceName": "pkeys", "selectors": {"pKeys": ["0x1", "0x2"]}}]) == {
        "intel.com/pkeys": {vf(ib, "ibp75s0", 0), vf(ib, "ibp75s0", 1)}}
    eth = SimulatedHost.build(root / "eth", "cx6dx")
    eth.set_numvfs(PF0, 2)
    assert eth.read(f"/sys/class/infiniband/{eth.rdma_device(vf(eth, PF0, 0))}/ports/1/pkeys/0") \
        == "0xffff"
    assert served(eth, [{"resourceName": "pkeys", "selectors": {"pKeys": ["0xffff"]}}]) == {}


DDPTOOL_CASES: dict[str, tuple[str, int, str]] = {
    # pkg/utils/ddp_test.go "Get DDP Profiles"
    "valid device id and valid output from ddp tool": (
        '{"DDPInventory": {"device": "154C", "address": "0000:03:02.0", "name": "enp3s2", '
        '"display": "Intel(R) Ethernet Virtual Function 700 Series", "DDPpackage": {'
        '"track_id": "80000008", "version": "1.0.3.0", "name": "GTPv1-C/U IPv4/IPv6 payload"'
        "}}}", 0, "GTPv1-C/U IPv4/IPv6 payload"),
    "valid device id and unexpected output from ddp tool": ("What ever output", 0, ""),
    "ddp tool command not found": ("", 127, ""),
    "ddp tool command not found but stdout matches expected string": (
        '{"DDPInventory": {"DDPpackage": {"name": "GTPv1-C/U IPv4/IPv6 payload"}}}', 127, ""),
    "ddp tool output in alien format": (
        "02:00.0    enp1s0f0       abcdece      1.0.3.a  GTPv1-C/U IPv4/IPv6 payload", 0, ""),
    # pkg/utils/ddp_test.go "getDDPNameFromStdout"
    "valid output from ddp tool": (
        '{"DDPInventory": {"device": "154C", "DDPpackage": {"track_id": "80000008", '
        '"version": "1.0.3.0", "name": "GTPv1-C/U IPv4/IPv6 payload"}}}', 0,
        "GTPv1-C/U IPv4/IPv6 payload"),
    "valid output from ddp tool but DDPpackage field is missing": (
        '{"DDPInventory": {"device": "154C", "address": "0000:03:02.0", "name": "enp3s2", '
        '"display": "Intel(R) Ethernet Virtual Function 700 Series"}}', 0, ""),
    "ddp tool returns error object in json": (
        '{"DDPInventory":{"error": "2", "message": "An internal error has occurred"}}', 0, ""),
    "invalid json output from ddp tool": (
        '{"DDPInventory":{"error": "2" "message": "An internal error has occurred"}}', 0, ""),
    "random text from ddp tool output": ("", 0, ""),
    # ddp.go: exit code 8, a device that supports DDP but runs no profile
    "no profile loaded": ("", 8, ""),
}


@pytest.mark.parametrize("case", list(DDPTOOL_CASES))
def test_sriov_ddptool_answers(root: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/utils/ddp_test.go, "Get DDP Profiles"
    and "getDDPNameFromStdout", the case named by `case`: the profile a device runs is the
    DDPpackage name of ddptool's JSON when ddptool succeeds; any other answer means none (and a
    ddpProfiles selector does not take the device)."""
    stdout, code, profile = DDPTOOL_CASES[case]
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "stdout").write_text(stdout)
    tool = bin_dir / "ddptool"
    tool.write_text(f'#!/bin/sh\n[ "$*" = "-l -a -j -s 0000:af:09.0" ] || exit 9\n'
                    f'cat "{bin_dir}/stdout"\nexit {code}\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert ddptool_profile("0000:af:09.0") == profile


def test_sriov_ddp_profiles_without_ddptool(
        root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/utils/ddp_test.go, "ddp tool command not
    found", on a node (or image) without ddptool at all: no device runs a profile, so a ddpProfiles
    pool stays empty, and the log says that ddptool is missing."""
    host = SimulatedHost.build(root, "cpu")
    intel_pf(host, "0000:af:00.0")
    host.set_ddp_profile("0000:af:00.0", "GTP")
    monkeypatch.setenv("PATH", str(root / "nothing-here"))
    assert served(host, [{"resourceName": "gtp", "selectors": {"ddpProfiles": ["GTP"]}}]) == {}
    assert "ddpProfiles selectors need ddptool, which is not on this node's PATH" in caplog.text


VDPA_CASES = {
    "should add the correct deviceSpec if the ResourceConfig type matches the vdpa driver": True,
    "should generate empty deviceSpecs if ResourceConfig type does not match vdpa driver": False,
}


@pytest.mark.parametrize("case", list(VDPA_CASES))
def test_sriov_vdpa(mixed: SimulatedHost, case: str) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/netdevice/pciNetDevice_test.go, "With
    Vdpa-capable devices", the case named by `case`, with pkg/infoprovider/vdpaInfoProvider_test.go,
    pkg/devices/vdpa_test.go and pkg/netdevice/netResourcePool_test.go "for vdpa devices": a vhost
    vDPA VF is given its /dev/vhost-vdpa-N (and the "vdpa" mount in the _INFO variable), a virtio
    one no device node; the device-info file is of type vdpa, naming the vdpa device, its driver and
    (vhost) path. A selector asking for the other type takes neither."""
    v2, v3 = vf(mixed, PF0, 2), vf(mixed, PF0, 3)
    matching = VDPA_CASES[case]
    resources = [{"resourceName": "vhost", "selectors": {"vdpaType": "vhost" if matching
                                                         else "virtio", "pciAddresses": [v2]}},
                 {"resourceName": "virtio", "selectors": {"vdpaType": "virtio" if matching
                                                          else "vhost", "pciAddresses": [v3]}}]

    async def main() -> None:
        async with sriov_serving(mixed, resources) as kubelet:
            if not matching:
                assert advertised(kubelet) == {}
                return
            assert advertised(kubelet) == {"intel.com/vhost": {v2}, "intel.com/virtio": {v3}}
            vhost = await kubelet.allocate("intel.com/vhost")
            assert [(d.host_path, d.container_path, d.permissions) for d in vhost.devices] == [
                ("/dev/vhost-vdpa-0", "/dev/vhost-vdpa-0", "rw")]
            assert info(vhost, "PCIDEVICE_INTEL_COM_VHOST")[v2] == {
                "generic": {"deviceID": v2}, "vdpa": {"mount": "/dev/vhost-vdpa-0"}}
            virtio = await kubelet.allocate("intel.com/virtio")
            assert paths(virtio) == []
            assert info(virtio, "PCIDEVICE_INTEL_COM_VIRTIO")[v3] == {
                "generic": {"deviceID": v3}, "vdpa": {}}
            files = {d: json.loads(mixed.path(
                f"{DEVINFO}/intel.com-{name}-{d}-device.json").read_text())
                for name, d in (("vhost", v2), ("virtio", v3))}
            assert files == {
                v2: {"type": "vdpa", "version": "1.1.0", "vdpa": {
                    "parent-device": "vdpa0", "driver": "vhost", "path": "/dev/vhost-vdpa-0",
                    "pci-address": v2}},
                v3: {"type": "vdpa", "version": "1.1.0", "vdpa": {
                    "parent-device": "vdpa1", "driver": "virtio", "pci-address": v3}}}

    asyncio.run(main())


# ------------------------------------------------------------------------------ Allocate

DRIVER_CASES: dict[str, tuple[list[str], dict[str, dict[str, str]]]] = {
    # driver: (device nodes, _INFO entries besides "generic"); G is the VF's IOMMU group
    "netdevice": ([], {}),
    "vfio-pci": (["/dev/vfio/vfio", "/dev/vfio/G"],
                 {"vfio": {"mount": "/dev/vfio/vfio", "dev-mount": "/dev/vfio/G"}}),
    "igb_uio": (["/dev/uio0"], {"uio": {"mount": "/dev/uio0"}}),
    "uio": ([], {"uio": {}}),
    "uio_pci_generic": (["/dev/uio0"], {"uio": {"mount": "/dev/uio0"}}),
}


@pytest.mark.parametrize("driver", list(DRIVER_CASES))
def test_sriov_allocate_by_driver(root: Path, driver: str) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/factory/factory_test.go, "getting info
    provider" (vfio-pci, uio, igb_uio) and "getting info provider for generic netdevice", with
    pkg/netdevice/pciNetDevice_test.go "should populate fields",
    pkg/infoprovider/vfioInfoProvider_test.go, uioInfoProvider_test.go ("PCI address passed, returns
    DeviceSpec with paths to its UIO devices", "getting env val") and genericInfoProvider_test.go: a
    VF on its kernel driver gets no device node, on vfio-pci /dev/vfio/vfio and its IOMMU group's
    node, on igb_uio its /dev/uioN; the driver named "uio" without a uio device gets an empty uio
    entry. uio_pci_generic: upstream gives its devices no node (its factory knows "uio" and
    "igb_uio" only); nicop gives them their /dev/uioN, without which DPDK cannot use them."""
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs(PF0, 1)
    dev = vf(host, PF0, 0)
    if driver != "netdevice":
        host.bind_driver(dev, driver)
    group = host.link_name(f"/sys/bus/pci/devices/{dev}/iommu_group") or ""
    nodes, extra = DRIVER_CASES[driver]
    resource = {"resourceName": "fake", "selectors": {"pciAddresses": [dev]}}

    async def main() -> None:
        async with sriov_serving(host, [resource]) as kubelet:
            response = await kubelet.allocate("intel.com/fake")
            assert [(d.host_path, d.container_path, d.permissions) for d in response.devices] \
                == [(n.replace("G", group), n.replace("G", group), "rw") for n in nodes]
            assert list(response.mounts) == []
            assert response.envs["PCIDEVICE_INTEL_COM_FAKE"] == dev
            want = {k: {n: v.replace("G", group) for n, v in e.items()}
                    for k, e in extra.items()}
            assert info(response, "PCIDEVICE_INTEL_COM_FAKE") == {
                dev: {"generic": {"deviceID": dev}, **want}}

    asyncio.run(main())


def test_sriov_allocate_vfio_devices(root: Path) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/resources/pool_stub_test.go, "getting
    device specs" and "getting mounts" (two vfio-pci devices in one container: /dev/vfio/vfio once,
    each IOMMU group's node, no mounts), with pkg/infoprovider/vfioInfoProvider_test.go "empty and
    returning default common vfio device file only" and "should return only mount when VFIO device
    file lookup fails" (a device without IOMMU group gets /dev/vfio/vfio only) and
    pkg/utils/utils_test.go "getting VFIO device file" (in a VM without vIOMMU, group vfio-noiommu:
    the host node is /dev/vfio/noiommu-N, the container sees /dev/vfio/N)."""
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs(PF0, 4)
    devs = [vf(host, PF0, i) for i in range(4)]
    for dev in devs:
        host.bind_driver(dev, "vfio-pci")
    groups = [host.link_name(f"/sys/bus/pci/devices/{d}/iommu_group") for d in devs]
    os.unlink(host.path(f"/sys/bus/pci/devices/{devs[2]}/iommu_group"))
    host.path(f"/sys/kernel/iommu_groups/{groups[3]}/name").write_text("vfio-noiommu\n")
    env = "PCIDEVICE_INTEL_COM_DPDK"

    async def main() -> None:
        async with sriov_serving(host, [{"resourceName": "dpdk", "selectors": {
                "drivers": ["vfio-pci"]}}]) as kubelet:
            both = await kubelet.allocate("intel.com/dpdk", devs[:2])
            assert [(d.host_path, d.container_path) for d in both.devices] == [
                ("/dev/vfio/vfio", "/dev/vfio/vfio"),
                (f"/dev/vfio/{groups[0]}", f"/dev/vfio/{groups[0]}"),
                (f"/dev/vfio/{groups[1]}", f"/dev/vfio/{groups[1]}")]
            assert list(both.mounts) == []
            assert both.envs[env] == ",".join(devs[:2])
            lonely = await kubelet.allocate("intel.com/dpdk", [devs[2]])
            assert paths(lonely) == ["/dev/vfio/vfio"]
            assert info(lonely, env)[devs[2]]["vfio"] == {"mount": "/dev/vfio/vfio"}
            vm = await kubelet.allocate("intel.com/dpdk", [devs[3]])
            assert [(d.host_path, d.container_path) for d in vm.devices][1] == (
                f"/dev/vfio/noiommu-{groups[3]}", f"/dev/vfio/{groups[3]}")
            assert info(vm, env)[devs[3]]["vfio"]["dev-mount"] == f"/dev/vfio/{groups[3]}"

    asyncio.run(main())


def test_sriov_rdma_comes_from_the_selector_that_took_the_device(root: Path) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/netdevice/pciNetDevice_test.go, "with
    two devices but only one of them being RDMA" ("should populate Rdma device specs if isRdma",
    "but not otherwise", "should use isRdma from the selector chosen by selector index"), with
    pkg/infoprovider/rdmaInfoProvider_test.go ("should the rdma mounts from deviceSpecs": uverbs,
    umad, issm, rdma_cm and rdma_dev) and pkg/devices/rdma_test.go "with device specs": a VF taken
    by an isRdma selector object gets its RDMA character devices and rdma_cm, and their paths in the
    _INFO variable; one taken by another object of the same resource gets neither; a VF without RDMA
    device is not taken by isRdma."""
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs(PF0, 3)
    rdma_vf, plain_vf, no_rdma_vf = (vf(host, PF0, i) for i in range(3))
    host.remove_rdma(no_rdma_vf)
    rdma_dev = host.rdma_device(rdma_vf)
    resources = [{"resourceName": "fake", "resourcePrefix": "fake", "selectors": [
        {"pciAddresses": [rdma_vf, no_rdma_vf], "isRdma": True},
        {"pciAddresses": [plain_vf], "isRdma": False}]}]
    env = "PCIDEVICE_FAKE_FAKE"

    async def main() -> None:
        async with sriov_serving(host, resources) as kubelet:
            assert advertised(kubelet) == {"fake/fake": {rdma_vf, plain_vf}}
            rdma = await kubelet.allocate("fake/fake", [rdma_vf])
            n = rdma_dev[len("mlx5_"):] if rdma_dev else ""
            nodes = [f"/dev/infiniband/uverbs{n}", f"/dev/infiniband/issm{n}",
                     f"/dev/infiniband/umad{n}", "/dev/infiniband/rdma_cm"]
            assert paths(rdma) == nodes
            assert info(rdma, env)[rdma_vf] == {"generic": {"deviceID": rdma_vf}, "rdma": {
                "uverbs": nodes[0], "issm": nodes[1], "umad": nodes[2], "rdma_cm": nodes[3],
                "rdma_dev": rdma_dev}}
            plain = await kubelet.allocate("fake/fake", [plain_vf])
            assert paths(plain) == []
            assert info(plain, env) == {plain_vf: {"generic": {"deviceID": plain_vf}}}

    asyncio.run(main())


@pytest.mark.parametrize("loaded", [True, False])
def test_sriov_need_vhost_net(root: Path, loaded: bool) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/netdevice/pciNetDevice_test.go, "With
    needsVhostNet" ("should add the vhost-net deviceSpec", "but only if the selector index has the
    selector set"), pkg/auxnetdevice/auxNetDevice_test.go "with needVhostNet" (both cases) and
    pkg/infoprovider/vhostNetInfoProvider_test.go: with vhost_net loaded, a device taken by a
    needVhostNet selector object gets /dev/vhost-net and /dev/net/tun (four nodes for a vfio-pci VF)
    and their paths under "vhost"; without /dev/vhost-net the device is still given, without them; a
    device taken by another object never gets them."""
    host = SimulatedHost.build(root, "bf3")
    pf = "enp3s0f0np0"
    host.set_numvfs(pf, 2)
    vhost_vf, other_vf = vf(host, pf, 0), vf(host, pf, 1)
    host.bind_driver(vhost_vf, "vfio-pci")
    sf = host.add_sf(pf, 4)
    if loaded:
        host.load_module("vhost_net")
        host.load_module("tun")
    group = host.link_name(f"/sys/bus/pci/devices/{vhost_vf}/iommu_group")
    vhost = ["/dev/vhost-net", "/dev/net/tun"] if loaded else []
    entry = {"vhost": {"net-mount": "/dev/vhost-net", "tun-mount": "/dev/net/tun"}} \
        if loaded else {}
    resources = [
        {"resourceName": "dpdk", "selectors": [{"pciAddresses": [other_vf]},
                                               {"pciAddresses": [vhost_vf], "needVhostNet": True}]},
        {"resourceName": "sf", "deviceType": "auxNetDevice", "selectors": {
            "auxTypes": ["sf"], "needVhostNet": True}},
    ]

    async def main() -> None:
        async with sriov_serving(host, resources) as kubelet:
            got = await kubelet.allocate("intel.com/dpdk", [vhost_vf])
            assert paths(got) == ["/dev/vfio/vfio", f"/dev/vfio/{group}", *vhost]
            assert info(got, "PCIDEVICE_INTEL_COM_DPDK")[vhost_vf] == {
                "generic": {"deviceID": vhost_vf}, "vfio": {
                    "mount": "/dev/vfio/vfio", "dev-mount": f"/dev/vfio/{group}"}, **entry}
            plain = await kubelet.allocate("intel.com/dpdk", [other_vf])
            assert paths(plain) == []
            assert "vhost" not in info(plain, "PCIDEVICE_INTEL_COM_DPDK")[other_vf]
            sf_got = await kubelet.allocate("intel.com/sf", [sf])
            assert paths(sf_got) == vhost
            assert info(sf_got, "PCIDEVICE_INTEL_COM_SF")[sf] == {
                "generic": {"deviceID": sf}, **entry}

    asyncio.run(main())


ADDITIONAL_INFO_CASES: dict[str, tuple[Any, dict[str, str] | None]] = {
    "should return an empty list if there are no environment variables": (None, None),
    "should return an object with environment variables": (
        {"*": {"test": "test"}}, {"test": "test"}),
    "should return an object with specific selector for environment variable": (
        {"*": {"test": "test"}, "DEV": {"test": "test1"}}, {"test": "test1"}),
    "should return an object with specific selector for multiple environment variable": (
        {"*": {"test": "test", "bla": "bla"}, "DEV": {"test": "test1"}},
        {"test": "test1", "bla": "bla"}),
    "should return an object with multiple specific selector for environment variable": (
        {"*": {"test": "test"}, "DEV": {"test": "test1", "bla": "bla"}},
        {"test": "test1", "bla": "bla"}),
    "additionalInfo without an entry for the device": (
        {"0000:86:00.0": {"token": "abc"}}, {}),
}


@pytest.mark.parametrize("case", list(ADDITIONAL_INFO_CASES))
def test_sriov_additional_info(root: Path, case: str) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/infoprovider/extraInfoProvider_test.go,
    "GetEnvVal", the case named by `case`, and pkg/auxnetdevice/auxNetDevice_test.go "should
    populate additional info fields" (a scalable function's "*" token): the "extra" entry of the
    _INFO variable merges "*" with the device's own entry, which wins. As upstream, a config with
    additionalInfo gives every device an "extra" entry, empty when neither "*" nor the device is
    listed; without additionalInfo there is none."""
    host = SimulatedHost.build(root, "bf3")
    host.set_numvfs("enp3s0f0np0", 1)
    dev = vf(host, "enp3s0f0np0", 0)
    sf = host.add_sf("enp3s0f1np1", 2)
    extra, want = ADDITIONAL_INFO_CASES[case]
    conf: dict[str, Any] = {}
    if extra is not None:
        conf["additionalInfo"] = {(dev if k == "DEV" else k): v for k, v in extra.items()}
    resources = [{"resourceName": "vf", "selectors": {"pciAddresses": [dev]}, **conf},
                 {"resourceName": "sf", "deviceType": "auxNetDevice",
                  "selectors": {"auxTypes": ["sf"]},
                  "additionalInfo": {"*": {"token": "3e49019f-412f-4f02-824e-4cd195944205"}}}]

    async def main() -> None:
        async with sriov_serving(host, resources) as kubelet:
            got = info(await kubelet.allocate("intel.com/vf"), "PCIDEVICE_INTEL_COM_VF")[dev]
            assert got.get("extra") == want
            assert ("extra" in got) == (extra is not None)
            sf_info = info(await kubelet.allocate("intel.com/sf"), "PCIDEVICE_INTEL_COM_SF")[sf]
            assert sf_info == {"generic": {"deviceID": sf}, "extra": {
                "token": "3e49019f-412f-4f02-824e-4cd195944205"}}

    asyncio.run(main())


def test_sriov_allocate_requests_and_server_options(root: Path) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/resources/server_test.go, "creating new
    instance of resource server" (endpoint <prefix>_<resourceName>.sock), "allocating" entries
    "allocating successfully 1 deviceID", "empty AllocateRequest" and (pending upstream) "allocating
    deviceID that does not exist", "running PreStartContainer" and "running GetDevicePluginOptions",
    with pkg/factory/factory_test.go "when resource pool uses overridden prefix": a device the
    plugin does not advertise is refused, naming it."""
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs(PF0, 1)
    dev = vf(host, PF0, 0)
    resources = [{"resourceName": "fake", "selectors": {"pfNames": [PF0]}},
                 {"resourceName": "fake", "resourcePrefix": "overridden",
                  "selectors": {"pciAddresses": [host.address(PF1)]}}]

    async def main() -> None:
        async with sriov_serving(host, resources) as kubelet:
            assert {n: kubelet.resources[n].endpoint for n in advertised(kubelet)} == {
                "intel.com/fake": "intel.com_fake.sock", "overridden/fake": "overridden_fake.sock"}
            client = stub(kubelet, "intel.com/fake")
            one = await client.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[dev])]))
            assert len(one.container_responses) == 1
            assert one.container_responses[0].envs["PCIDEVICE_INTEL_COM_FAKE"] == dev
            empty = await client.Allocate(pb.AllocateRequest())
            assert list(empty.container_responses) == []
            with pytest.raises(aio.AioRpcError) as e:
                await client.Allocate(pb.AllocateRequest(container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=["00:00.02"])]))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert e.value.details() == "intel.com/fake: unknown device(s) 00:00.02"
            options = await client.GetDevicePluginOptions(pb.Empty())
            assert (options.pre_start_required, options.get_preferred_allocation_available) \
                == (False, False)
            assert await client.PreStartContainer(pb.PreStartContainerRequest(
                devices_ids=[dev])) == pb.PreStartContainerResponse()

    asyncio.run(main())


def test_sriov_device_info_files(root: Path) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/netdevice/netResourcePool_test.go,
    "Saving and Cleaning DevInfo files" "for valid pci devices" (both its): an allocated VF's
    device-info file names its PCI address, and its RDMA device when an isRdma selector took it; the
    files go when the plugin stops. Upstream's prefix "fakeOrg.io" is written in lower case here:
    the kubelet refuses capitals in a resource's domain."""
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs(PF0, 2)
    rdma_vf, plain_vf = vf(host, PF0, 0), vf(host, PF0, 1)
    resources = [{"resourceName": "fakeResource", "resourcePrefix": "fakeorg.io", "selectors": [
        {"pciAddresses": [rdma_vf], "isRdma": True}, {"pciAddresses": [plain_vf]}]}]
    path = f"{DEVINFO}/fakeorg.io-fakeResource-%s-device.json"

    async def main() -> None:
        async with sriov_serving(host, resources) as kubelet:
            await kubelet.allocate("fakeorg.io/fakeResource", [rdma_vf, plain_vf])
            assert json.loads(host.path(path % rdma_vf).read_text()) == {
                "type": "pci", "version": "1.1.0",
                "pci": {"pci-address": rdma_vf, "rdma-device": host.rdma_device(rdma_vf)}}
            assert json.loads(host.path(path % plain_vf).read_text()) == {
                "type": "pci", "version": "1.1.0", "pci": {"pci-address": plain_vf}}
        assert not host.exists(path % rdma_vf) and not host.exists(path % plain_vf)

    asyncio.run(main())


TOPOLOGY_CASES: dict[str, tuple[str | None, bool, list[int]]] = {
    "finding zero NUMA node": ("0", False, [0]),
    "finding positive NUMA node": ("1", False, [1]),
    "finding negative NUMA node": ("-1", False, []),
    "reading the device path fails": (None, False, []),
    "converting the NUMA node to integer fails": ("invalid content", False, []),
    "should not populate topology due to config option being set": ("1", True, []),
}


@pytest.mark.parametrize("case", list(TOPOLOGY_CASES))
def test_sriov_topology(root: Path, case: str) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/utils/utils_test.go, "getting NUMA node
    of device", the case named by `case`, with pkg/devices/host_test.go and
    pkg/accelerator/accelDevice_test.go ("should not populate topology due to negative numa_node",
    "... missing numa_node", "... config option being set") and pkg/devices/api_test.go: the kubelet
    is told a device's NUMA node when sysfs gives one and excludeTopology is not set, for network
    devices and accelerators alike."""
    numa, exclude, want = TOPOLOGY_CASES[case]
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs(PF0, 1)
    dev = vf(host, PF0, 0)
    host.add_pci_device("0000:5e:00.0", "8086", "0d5c", 0x120000, driver="vfio-pci")
    for address in (dev, "0000:5e:00.0"):
        node = host.path(f"/sys/bus/pci/devices/{address}/numa_node")
        if numa is None:
            node.unlink()
        else:
            node.write_text(numa + "\n")
    conf = {"excludeTopology": True} if exclude else {}
    resources = [{"resourceName": "net", "selectors": {"pciAddresses": [dev]}, **conf},
                 {"resourceName": "qat", "deviceType": "accelerator",
                  "selectors": {"devices": ["0d5c"]}, **conf}]

    async def main() -> None:
        async with sriov_serving(host, resources) as kubelet:
            for name, address in (("intel.com/net", dev), ("intel.com/qat", "0000:5e:00.0")):
                device = kubelet.resources[name].devices[address]
                assert [n.ID for n in device.topology.nodes] == want
                assert device.health == "Healthy"

    asyncio.run(main())


# ------------------------------------------------------------------------------ accelerators

ACCELERATORS = {  # upstream's five mocks: address, vendor, device, driver
    "0000:03:02.0": ("8086", "abcd", "igb_uio"), "0000:03:02.1": ("8086", "123a", "igb_uio"),
    "0000:03:02.2": ("1111", "abcd", "igb_uio"), "0000:03:02.3": ("2222", "2222", "iavf"),
    "0000:03:02.4": ("3333", "1024", "vfio-pci"),
}
ACCEL_FILTER_CASES: dict[str, tuple[Any, set[str]]] = {
    "vendors": ({"vendors": ["8086"]}, {"0000:03:02.0", "0000:03:02.1"}),
    "devices": ({"devices": ["abcd"]}, {"0000:03:02.0", "0000:03:02.2"}),
    "drivers": ({"drivers": ["igb_uio"]}, {"0000:03:02.0", "0000:03:02.1", "0000:03:02.2"}),
    "pciAddresses": ({"pciAddresses": ["0000:03:02.0", "0000:03:02.3"]},
                     {"0000:03:02.0", "0000:03:02.3"}),
    "GetFilteredDevices uses the specified selector index": (
        [{"vendors": ["None"]}, {"vendors": ["8086"]}], {"0000:03:02.0", "0000:03:02.1"}),
}


@pytest.mark.parametrize("case", list(ACCEL_FILTER_CASES))
def test_sriov_accelerator_filtered_devices(root: Path, case: str) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/accelerator/accelDeviceProvider_test.go,
    "getting Filtered devices", the case named by `case`, on accelerators (class 12) with the
    attributes of upstream's five mocks."""
    host = SimulatedHost.build(root, "cpu")
    for address, (vendor, device, driver) in ACCELERATORS.items():
        host.add_pci_device(address, vendor, device, 0x120000)
        host.bind_driver(address, driver)
    selectors, want = ACCEL_FILTER_CASES[case]
    assert served(host, [{"resourceName": "accel", "deviceType": "accelerator",
                          "selectors": selectors}]) == {"intel.com/accel": want}


def test_sriov_accelerator_discovery_and_allocate(root: Path) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/accelerator/accelDeviceProvider_test.go
    "adding 4 target devices" (an accelerator PF with VFs configured is offered like one without; a
    device whose class cannot be read, or without a driver, is not), accelDevice_test.go "should
    return AccelDevice object instance" and "device's PF name is not available" (a vfio-pci
    accelerator gets /dev/vfio/vfio and its group, and the generic and vfio _INFO entries), and
    accelResourcePool_test.go "getting DeviceSpecs" (two devices in one container: the nodes of
    both, each once)."""
    host = SimulatedHost.build(root, "cpu")
    devs = ["0000:00:00.1", "0000:00:00.2", "0000:00:00.3", "0000:00:00.4"]
    for address in devs:
        host.add_pci_device(address, "8086", "1024", 0x120000)
    host.bind_driver(devs[0], "vfio-pci")
    host.bind_driver(devs[1], "vfio-pci")
    host.bind_driver(devs[2], "vfio-pci")
    for name, value in (("sriov_totalvfs", "64"), ("sriov_numvfs", "32")):
        host.path(f"/sys/bus/pci/devices/{devs[0]}/{name}").write_text(value + "\n")
    host.path(f"/sys/bus/pci/devices/{devs[2]}/class").write_text("completely unparsable\n")
    groups = [host.link_name(f"/sys/bus/pci/devices/{d}/iommu_group") for d in devs[:2]]

    async def main() -> None:
        async with sriov_serving(host, [{"resourceName": "fake", "deviceType": "accelerator",
                                         "selectors": {"vendors": ["8086"]}}]) as kubelet:
            assert advertised(kubelet) == {"intel.com/fake": set(devs[:2])}
            got = await kubelet.allocate("intel.com/fake", devs[:2])
            assert paths(got) == ["/dev/vfio/vfio", *(f"/dev/vfio/{g}" for g in groups)]
            assert info(got, "PCIDEVICE_INTEL_COM_FAKE")[devs[0]] == {
                "generic": {"deviceID": devs[0]},
                "vfio": {"mount": "/dev/vfio/vfio", "dev-mount": f"/dev/vfio/{groups[0]}"}}

    asyncio.run(main())


# ------------------------------------------------------------------------------ scalable functions

AUX_FILTER_CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "vendors": ({"vendors": ["15b3"]}, ("sf1", "sf2")),
    "devices": ({"devices": ["a2dc"]}, ("sf1", "sf2")),
    "drivers": ({"drivers": ["mlx5_core"]}, ("sf1", "sf2")),
    "pfNames": ({"pfNames": ["enp3s0f0np0", "eth1"]}, ("sf1",)),
    "rootDevices": ({"rootDevices": ["0000:86:00.0", "0000:03:00.1"]}, ("sf2",)),
    "linkTypes": ({"linkTypes": ["infiniband"]}, ()),
    "linkTypes multi": ({"linkTypes": ["infiniband", "ether"]}, ("sf1", "sf2")),
    "rdma": ({"isRdma": True}, ("sf1", "sf2")),
    "auxTypes": ({"auxTypes": ["sf", "sf"]}, ("sf1", "sf2")),
    "GetFilteredDevices uses the specified selector index": (
        {"pfNames": ["enp3s0f1np1#2"]}, ("sf2",)),
}


@pytest.mark.parametrize("case", list(AUX_FILTER_CASES))
def test_sriov_aux_filtered_devices(root: Path, case: str) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin
    pkg/auxnetdevice/auxNetDeviceProvider_test.go, "getting Filtered devices", the case named by
    `case`, and "adding 3 target devices" (only PFs with auxiliary devices give any): scalable
    functions of a BlueField-3's two ports, one each, by their parent PF's attributes and their SF
    number (the index of pfNames#...). nicop serves only auxTypes "sf", so upstream's "bar" and
    "baz" become "sf" (see test_sriov_aux_valid_config); the selector-index case takes the second
    object of [{"vendors": ["None"]}, <this>]."""
    host = SimulatedHost.build(root, "bf3")
    sfs = {"sf1": host.add_sf("enp3s0f0np0", 1), "sf2": host.add_sf("enp3s0f1np1", 2)}
    selectors, want = AUX_FILTER_CASES[case]
    selector: Any = {"auxTypes": ["sf"], **selectors}
    if case.startswith("GetFilteredDevices"):
        selector = [{"auxTypes": ["sf"], "vendors": ["None"]}, selector]
    got = served(host, [{"resourceName": "sfs", "deviceType": "auxNetDevice",
                         "selectors": selector}])
    assert got == ({"intel.com/sfs": {sfs[n] for n in want}} if want else {})


def test_sriov_vf_whose_pf_has_no_netdev(root: Path) -> None:
    """k8snetworkplumbingwg/sriov-network-device-plugin pkg/netdevice/pciNetDevice_test.go and
    pkg/devices/devices_test.go "device's PF name is not available", with pkg/utils/utils_test.go
    "getting PF names legacy" ("device is a VF and interface name does not exist"): VFs whose PF has
    no netdev here (moved to another network namespace) are still offered and found by rootDevices,
    but a pfNames selector cannot take them."""
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs(PF0, 2)
    both = {vf(host, PF0, 0), vf(host, PF0, 1)}
    os.unlink(host.path(f"/sys/class/net/{PF0}"))
    shutil.rmtree(host.path("/sys/bus/pci/devices/0000:3b:00.0/net"))
    assert served(host, [{"resourceName": "by_name", "selectors": {"pfNames": [PF0]}},
                         {"resourceName": "by_root",
                          "selectors": {"rootDevices": ["0000:3b:00.0"]}},
                         {"resourceName": "rest", "selectors": {}}]) == {
        "intel.com/by_root": both, "intel.com/rest": {host.address(PF1)}}
