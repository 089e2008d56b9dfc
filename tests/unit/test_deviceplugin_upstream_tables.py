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
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio
from tests.unit.test_deviceplugin_upstream_inputs import PF0, PF1, write
from typer.testing import CliRunner

from nicop.cli import app
from nicop.node.deviceplugin import api_pb2 as pb
from nicop.node.deviceplugin import api_pb2_grpc as pb_grpc
from nicop.node.deviceplugin.config import ConfigError
from nicop.node.deviceplugin.rdma import RdmaAgent, Selectors
from nicop.node.deviceplugin.rdma import load_config as load_rdma
from nicop.node.deviceplugin.server import DEVICE_PLUGIN_PATH, RegistrationRejected
from nicop.node.discovery import Netdev, PciFunction
from nicop.sim.hardware import SimulatedHost
from nicop.sim.kubelet import Kubelet

DEVINFO = "/var/run/k8s.cni.cncf.io/devinfo/dp"


@pytest.fixture
def root() -> Iterator[Path]:
    """A short node root: unix socket paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="dpt-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def stub(kubelet: Kubelet, resource: str) -> Any:
    """A client of the plugin serving `resource`, on the kubelet's connection to it."""
    return pb_grpc.DevicePluginStub(kubelet.resources[resource].channel)  # type: ignore[no-untyped-call]


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
        await kubelet.wait_for(lambda: all(
            n in kubelet.resources and kubelet.resources[n].connected for n in names))
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
