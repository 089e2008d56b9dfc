"""`nicop sriov-device-plugin` on simulated nodes, driven by the kubelet stand-in."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from nicop.cli import app
from nicop.node.deviceplugin.config import ConfigError
from nicop.node.deviceplugin.server import DEVICE_PLUGIN_PATH
from nicop.node.deviceplugin.sriov import SriovAgent, load_config
from nicop_sim.hardware import SimulatedHost
from nicop_sim.kubelet import Kubelet

RDMA_VF = "nvidia.com/sriov_rdma_vf"
ENV = "PCIDEVICE_NVIDIA_COM_SRIOV_RDMA_VF"
DEVINFO = "/var/run/k8s.cni.cncf.io/devinfo/dp"


@pytest.fixture
def root() -> Iterator[Path]:
    """A short node root: gRPC binds unix socket paths of at most 105 bytes."""
    path = Path(tempfile.mkdtemp(prefix="sriov-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def write_config(root: Path, config: dict[str, Any]) -> Path:
    path = root / "config.json"
    tmp = root / "config.json.tmp"
    tmp.write_text(json.dumps(config))
    tmp.replace(path)  # as a ConfigMap update lands: atomically
    return path


def rdma_vfs(**selectors: Any) -> dict[str, Any]:
    return {"resourceList": [{
        "resourceName": "sriov_rdma_vf", "resourcePrefix": "nvidia.com",
        "selectors": {"vendors": ["15b3"], "devices": ["101e"], "drivers": ["mlx5_core"],
                      "isRdma": True, **selectors},
    }]}


@contextlib.asynccontextmanager
async def running(host: SimulatedHost, config: dict[str, Any]) -> AsyncIterator[Kubelet]:
    sockdir = host.path(DEVICE_PLUGIN_PATH)
    kubelet = Kubelet(sockdir)
    await kubelet.start()
    stop = asyncio.Event()
    agent = SriovAgent(write_config(host.root, config), host, sockdir, poll_interval=0.1)
    task = asyncio.create_task(agent.run(stop))
    try:
        yield kubelet
    finally:
        stop.set()
        await task
        await kubelet.close()


def numa(kubelet: Kubelet, resource: str) -> dict[str, list[int]]:
    return {i: [n.ID for n in d.topology.nodes]
            for i, d in kubelet.resources[resource].devices.items()}


@pytest.mark.parametrize(("profile", "pf", "vfs", "numa_node"), [
    ("cx6dx", "enp59s0f0np0", ["0000:3b:00.2", "0000:3b:00.3"], 0),
    ("cx7-ib", "ibp75s0", ["0000:4b:00.1", "0000:4b:00.2"], 0),
    ("bf3", "enp3s0f1np1", ["0000:03:01.2", "0000:03:01.3"], 0),
    ("dgx", "ibp220s0", ["0000:dc:00.1", "0000:dc:00.2"], 1),
])
def test_every_profile_gives_one_vf_per_device_with_its_rdma_devices(
    root: Path, profile: str, pf: str, vfs: list[str], numa_node: int
) -> None:
    host = SimulatedHost.build(root, profile)
    host.set_numvfs(pf, 2)
    rdma = [host.rdma_device(vf) for vf in vfs]

    async def main() -> None:
        async with running(host, rdma_vfs()) as kubelet:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {RDMA_VF: 2})
            assert numa(kubelet, RDMA_VF) == {vf: [numa_node] for vf in vfs}
            response = await kubelet.allocate(RDMA_VF, [vfs[1]])
            assert response.envs[ENV] == vfs[1]
            info = json.loads(response.envs[f"{ENV}_INFO"])
            assert info[vfs[1]]["generic"] == {"deviceID": vfs[1]}
            assert info[vfs[1]]["rdma"]["rdma_dev"] == rdma[1]
            assert info[vfs[1]]["rdma"]["rdma_cm"] == "/dev/infiniband/rdma_cm"
            paths = [d.host_path for d in response.devices]
            assert info[vfs[1]]["rdma"]["uverbs"] in paths
            assert "/dev/infiniband/rdma_cm" in paths
            assert {d.permissions for d in response.devices} == {"rw"}
            file = host.path(f"{DEVINFO}/{RDMA_VF.replace('/', '-')}-{vfs[1]}-device.json")
            assert json.loads(file.read_text()) == {
                "type": "pci", "version": "1.1.0",
                "pci": {"pci-address": vfs[1], "rdma-device": rdma[1]}}
            assert stat.S_IMODE(file.stat().st_mode) == 0o444
            await kubelet.allocate(RDMA_VF, [vfs[1]])  # the file is replaced, not refused

    asyncio.run(main())
    assert host.listdir(DEVINFO) == []  # cleaned up when the plugin stops


def test_vfio_vfs_get_their_iommu_group(root: Path) -> None:
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs("enp59s0f1np1", 2)
    vf = host.vfs("enp59s0f1np1")[1]
    host.bind_driver(vf, "vfio-pci")
    group = host.link_name(f"/sys/bus/pci/devices/{vf}/iommu_group")
    config = {"resourceList": [{"resourceName": "dpdk", "resourcePrefix": "nvidia.com",
                                "selectors": [{"drivers": ["vfio-pci"]}],
                                "additionalInfo": {"*": {"team": "a"}}}]}

    async def main() -> None:
        async with running(host, config) as kubelet:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {"nvidia.com/dpdk": 1})
            response = await kubelet.allocate("nvidia.com/dpdk")
            assert [(d.host_path, d.container_path) for d in response.devices] == [
                ("/dev/vfio/vfio", "/dev/vfio/vfio"), (f"/dev/vfio/{group}", f"/dev/vfio/{group}")]
            assert json.loads(response.envs["PCIDEVICE_NVIDIA_COM_DPDK_INFO"]) == {vf: {
                "generic": {"deviceID": vf},
                "vfio": {"mount": "/dev/vfio/vfio", "dev-mount": f"/dev/vfio/{group}"},
                "extra": {"team": "a"}}}

    asyncio.run(main())


def test_vfs_created_later_are_advertised_without_a_restart(root: Path) -> None:
    host = SimulatedHost.build(root, "cx6dx")

    async def main() -> None:
        async with running(host, rdma_vfs()) as kubelet:
            await asyncio.sleep(0.3)
            assert RDMA_VF not in kubelet.resources  # no VFs yet: nothing to serve, as upstream
            host.write("/sys/class/net/enp59s0f0np0/device/sriov_numvfs", "4")
            await kubelet.wait_for(lambda: kubelet.allocatable() == {RDMA_VF: 4}, timeout=2)
            host.set_numvfs("enp59s0f1np1", 2)
            await kubelet.wait_for(lambda: kubelet.allocatable() == {RDMA_VF: 6}, timeout=2)
            host.set_numvfs("enp59s0f0np0", 0)
            await kubelet.wait_for(lambda: sorted(kubelet.health(RDMA_VF)) == [
                "0000:3b:01.2", "0000:3b:01.3"], timeout=2)

    asyncio.run(main())


def test_pf_link_down_makes_its_vfs_unhealthy_within_2s(root: Path) -> None:
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs("enp59s0f0np0", 2)
    host.set_numvfs("enp59s0f1np1", 2)

    async def main() -> None:
        async with running(host, rdma_vfs()) as kubelet:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {RDMA_VF: 4})
            started = time.monotonic()
            host.set_link("enp59s0f1np1", False)
            await kubelet.wait_for(lambda: kubelet.allocatable() == {RDMA_VF: 2}, timeout=2)
            assert time.monotonic() - started < 2
            assert kubelet.health(RDMA_VF) == {
                "0000:3b:00.2": "Healthy", "0000:3b:00.3": "Healthy",
                "0000:3b:01.2": "Unhealthy", "0000:3b:01.3": "Unhealthy"}
            host.set_link("enp59s0f1np1", True)
            await kubelet.wait_for(lambda: kubelet.allocatable() == {RDMA_VF: 4}, timeout=2)

    asyncio.run(main())


def test_a_changed_config_file_is_reloaded_and_a_broken_one_ignored(root: Path) -> None:
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs("enp59s0f0np0", 4)
    host.set_numvfs("enp59s0f1np1", 4)

    async def main() -> None:
        async with running(host, rdma_vfs()) as kubelet:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {RDMA_VF: 8})
            write_config(root, {"resourceList": [
                {"resourceName": "port0", "resourcePrefix": "nvidia.com",
                 "selectors": {"pfNames": ["enp59s0f0np0#0-1,3"]}},
                {"resourceName": "port1", "resourcePrefix": "nvidia.com",
                 "selectors": {"rootDevices": ["0000:3b:00.1#2-3"]}},
            ]})
            # the resource left the config: its plugin stops, the kubelet loses its stream
            await kubelet.wait_for(lambda: not kubelet.resources[RDMA_VF].connected, timeout=2)
            await kubelet.wait_for(lambda: {k: v for k, v in kubelet.allocatable().items()
                                            if k != RDMA_VF}
                                   == {"nvidia.com/port0": 3, "nvidia.com/port1": 2}, timeout=2)
            assert sorted(kubelet.health("nvidia.com/port0")) == [
                "0000:3b:00.2", "0000:3b:00.3", "0000:3b:00.5"]
            assert sorted(kubelet.health("nvidia.com/port1")) == ["0000:3b:01.4", "0000:3b:01.5"]
            (root / "config.json").write_text('{"resourceList": [')
            await asyncio.sleep(0.3)
            assert kubelet.allocatable()["nvidia.com/port0"] == 3

    asyncio.run(main())


def test_earlier_resources_take_devices_first_and_topology_can_be_left_out(root: Path) -> None:
    host = SimulatedHost.build(root, "dgx")
    host.set_numvfs("ibp24s0", 3)
    host.set_numvfs("ibp154s0", 3)
    config = {"resourceList": [
        {"resourceName": "first", "selectors": {"pfNames": ["IBP24S0#0"]}},
        {"resourceName": "rest", "excludeTopology": True,
         "selectors": [{"devices": ["101e"], "linkTypes": ["infiniband"]}]},
    ]}

    async def main() -> None:
        async with running(host, config) as kubelet:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {
                "intel.com/first": 1, "intel.com/rest": 5})
            assert numa(kubelet, "intel.com/first") == {"0000:18:00.1": [0]}
            assert set(map(tuple, numa(kubelet, "intel.com/rest").values())) == {()}

    asyncio.run(main())


def test_pfs_with_vfs_and_the_default_route_nic_are_not_offered(root: Path) -> None:
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs("enp59s0f1np1", 1)
    route = host.path("/proc/net/route")
    route.parent.mkdir(parents=True)
    route.write_text("Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n"
                     "enp59s0f0np0\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\n")
    config = {"resourceList": [{"resourceName": "all", "selectors": {"vendors": ["15b3"]}}]}

    async def main() -> None:
        async with running(host, config) as kubelet:
            await kubelet.wait_for(lambda: "intel.com/all" in kubelet.resources)
            assert sorted(kubelet.health("intel.com/all")) == ["0000:3b:01.2"]

    asyncio.run(main())


def test_scalable_functions_and_accelerators(root: Path) -> None:
    host = SimulatedHost.build(root, "bf3")
    sf = host.add_sf("enp3s0f0np0", 7)
    host.add_pci_device("0000:81:00.0", "8086", "0d5c", 0x120000, driver="vfio-pci",
                        numa_node=1)
    config = {"resourceList": [
        {"resourceName": "bf3_sf", "resourcePrefix": "nvidia.com", "deviceType": "auxNetDevice",
         "selectors": {"pfNames": ["enp3s0f0np0#0-10"], "auxTypes": ["sf"], "IsRdma": True}},
        {"resourceName": "qat", "deviceType": "accelerator",
         "selectors": {"vendors": ["8086"], "devices": ["0d5c"]}},
    ]}

    async def main() -> None:
        async with running(host, config) as kubelet:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {
                "nvidia.com/bf3_sf": 1, "intel.com/qat": 1})
            assert numa(kubelet, "intel.com/qat") == {"0000:81:00.0": [1]}
            response = await kubelet.allocate("nvidia.com/bf3_sf")
            assert response.envs["PCIDEVICE_NVIDIA_COM_BF3_SF"] == sf
            assert "/dev/infiniband/rdma_cm" in [d.host_path for d in response.devices]
            accel = await kubelet.allocate("intel.com/qat")
            assert "/dev/vfio/vfio" in [d.host_path for d in accel.devices]
        assert host.listdir(DEVINFO) == []  # device-info files are for netDevice pools only

    asyncio.run(main())


def test_config_format_is_upstreams(root: Path) -> None:
    resources = load_config(write_config(root, {"resourceList": [
        {"resourceName": "sriov-net_0", "selectors": {"IsRdma": True, "vendors": ["15b3"]}},
        {"resourceName": "b", "resourcePrefix": "nvidia.com",
         "selectors": [{"isRdma": True, "drivers": ["mlx5_core"]}, {"drivers": ["vfio-pci"]}]},
    ]}), default_prefix="example.org")
    first, second = resources.resources
    assert (first.name, first.socket_name, first.env_name) == (
        "example.org/sriov-net_0", "example.org_sriov-net_0.sock",
        "PCIDEVICE_EXAMPLE_ORG_SRIOV-NET_0")
    assert getattr(first.selectors[0], "is_rdma", False)
    assert [getattr(s, "is_rdma", False) for s in second.selectors] == [True, False]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('{"resourceList": [}', "not valid JSON at line 1 column 19"),
        ({"resourceList": [{"resourceName": "a", "deviceType": "gpu",
                            "selectors": {"vendors": ["15b3"]}}]},
         'resourceList[0] ("a"): deviceType: \'gpu\' is not one of netDevice, accelerator, '
         "auxNetDevice"),
        ({"resourceList": [{"resourceName": "a", "selectors": []}]},
         'resourceList[0] ("a"): selectors: an empty list selects no device'),
        ({"resourceList": [{"resourceName": "a"}]}, 'resourceList[0] ("a"): selectors: required'),
        ({"resourceList": [{"resourceName": "junk.net.0", "selectors": {"vendors": ["15b3"]}}]},
         "resourceName: 'junk.net.0' may contain only letters, digits, '_' and '-'"),
        ({"resourceList": [{"resourceName": "a", "deviceType": "auxNetDevice",
                            "selectors": {"vendors": ["15b3"]}}]},
         'selectors.auxTypes: must be ["sf"]'),
        ({"resourceList": [{"resourceName": "a", "selectors": {"isRdma": "yes"}}]},
         "selectors.isRdma: input should be a valid boolean"),
        ({"resourceList": [{"resourceName": "a", "selectors": {"vdpaType": "vdpa"}}]},
         "selectors.vdpaType: 'vdpa' is not one of vhost, virtio"),
        ({"resourceList": [{"resourceName": "a", "selectors": {"vdpaType": "vhost",
                                                                "isRdma": True}}]},
         "selectors: isRdma and vdpaType cannot be used together"),
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


def test_the_command_exits_with_the_problem(root: Path) -> None:
    path = write_config(root, {"resourceList": [{"resourceName": "a", "deviceType": "gpu",
                                                 "selectors": {"vendors": ["15b3"]}}]})
    result = CliRunner().invoke(app, ["sriov-device-plugin", "--config-file", str(path),
                                      "--host-root", str(root)])
    assert result.exit_code == 1
    assert "deviceType: 'gpu' is not one of" in result.output
