"""The device plugins on upstream's own inputs: the configs of their unit tests and docs, and the
arguments of their DaemonSets, on simulated nodes driven by the kubelet stand-in."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from nicop.cli import app
from nicop.node.deviceplugin.config import ConfigError
from nicop.node.deviceplugin.rdma import NETNS_MODE, RdmaAgent, check_netns_mode
from nicop.node.deviceplugin.rdma import load_config as load_rdma
from nicop.node.deviceplugin.server import DEVICE_PLUGIN_PATH
from nicop.node.deviceplugin.sriov import SriovAgent
from nicop.node.deviceplugin.sriov import load_config as load_sriov
from nicop.node.report import Reporter
from nicop.operator.states import rdma_dp, sriov_dp
from nicop.operator.states.base import Context
from nicop_sim.hardware import SimulatedHost
from nicop_sim.kubelet import Kubelet

PF0, PF1 = "enp59s0f0np0", "enp59s0f1np1"  # the two ports of the cx6dx profile


@pytest.fixture
def root() -> Iterator[Path]:
    """A short node root: gRPC binds unix socket paths of at most 105 bytes."""
    path = Path(tempfile.mkdtemp(prefix="dpu-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def write(root: Path, config: dict[str, Any]) -> Path:
    path = root / "config.json"
    path.write_text(json.dumps(config))
    return path


class Recorded(Reporter):
    """What an agent reports on its pod (its Events), kept in order, without an API server."""

    def __init__(self) -> None:
        super().__init__()
        self.reports: list[tuple[str, str]] = []

    async def warn(self, reason: str, message: str) -> None:
        self.reports.append((reason, message))

    async def info(self, reason: str, message: str) -> None:
        self.reports.append((reason, message))


@contextlib.asynccontextmanager
async def rdma(host: SimulatedHost, config: dict[str, Any],
               use_cdi: bool = False) -> AsyncIterator[Kubelet]:
    sockdir = host.path(DEVICE_PLUGIN_PATH)
    kubelet = Kubelet(sockdir)
    await kubelet.start()
    stop = asyncio.Event()
    agent = RdmaAgent(load_rdma(write(host.root, config)), host, sockdir, 0.1, use_cdi=use_cdi)
    task = asyncio.create_task(agent.run(stop))
    try:
        yield kubelet
    finally:
        stop.set()
        await task
        await kubelet.close()


@contextlib.asynccontextmanager
async def sriov(host: SimulatedHost, config: dict[str, Any], reporter: Reporter | None = None,
                use_cdi: bool = False) -> AsyncIterator[Kubelet]:
    sockdir = host.path(DEVICE_PLUGIN_PATH)
    kubelet = Kubelet(sockdir)
    await kubelet.start()
    stop = asyncio.Event()
    agent = SriovAgent(write(host.root, config), host, sockdir, poll_interval=0.1,
                       reporter=reporter, use_cdi=use_cdi)
    task = asyncio.create_task(agent.run(stop))
    try:
        yield kubelet
    finally:
        stop.set()
        await task
        await kubelet.close()


async def logged(caplog: pytest.LogCaptureFixture, text: str) -> None:
    async with asyncio.timeout(10):
        while text not in caplog.text:
            await asyncio.sleep(0.05)


def vf(host: SimulatedHost, pf: str, index: int) -> str:
    return host.link_name(f"/sys/bus/pci/devices/{host.address(pf)}/virtfn{index}") or ""


# ----------------------------------------------------------------------------- 8: RDMA health

def test_one_nic_with_its_link_down_leaves_the_shared_pool_schedulable(
        root: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Upstream (k8s-rdma-shared-dev-plugin server.go newResourceServer) advertises all
    rdmaHcaMax slots Healthy whatever its NICs do; the pool of network-operator's example
    NicClusterPolicy (rdma_shared_device_a, rdmaHcaMax 63, two ifNames) keeps its 63 slots while
    one NIC is down. nicop turns them Unhealthy only when no NIC of the pool can serve."""
    host = SimulatedHost.build(root, "cx6dx")
    config = {"configList": [{"resourceName": "rdma_shared_device_a", "rdmaHcaMax": 63,
                              "selectors": {"ifNames": [PF0, PF1]}}]}
    name = "rdma/rdma_shared_device_a"

    async def main() -> None:
        async with rdma(host, config) as kubelet:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {name: 63})
            host.set_link(PF0, False)
            await logged(caplog, f"link {PF0} is down")
            assert kubelet.allocatable() == {name: 63}
            response = await kubelet.allocate(name)
            assert "/dev/infiniband/uverbs1" in [d.host_path for d in response.devices]
            host.set_link(PF1, False)
            await kubelet.wait_for(lambda: kubelet.allocatable() == {name: 0})
            host.set_link(PF0, True)
            await kubelet.wait_for(lambda: kubelet.allocatable() == {name: 63})

    with caplog.at_level(logging.INFO):
        asyncio.run(main())


def test_the_selected_netdevs_are_set_up_at_start(root: Path) -> None:
    """Upstream's InitServers brings every selected netdev up; the config is the one of
    upstream's resources_manager_test "Read valid config file" (deprecated `devices` list)."""
    host = SimulatedHost.build(root, "cx6dx")
    host.set_admin(PF1, False)
    assert host.link_admin_up(PF1) is False
    config = {"configList": [{"resourceName": "hca_shared_devices_a", "rdmaHcaMax": 1000,
                              "devices": [PF0, PF1]}]}

    async def main() -> None:
        async with rdma(host, config) as kubelet:
            name = "rdma/hca_shared_devices_a"
            await kubelet.wait_for(lambda: kubelet.allocatable() == {name: 1000})
            assert host.link_admin_up(PF1) is True
            assert host.read(f"/sys/class/net/{PF1}/operstate") == "up"

    asyncio.run(main())


def test_exclusive_rdma_netns_mode_is_refused_with_upstreams_message(root: Path) -> None:
    """Upstream's ValidateRdmaSystemMode: exclusive mode exits with "incorrect RDMA subsystem
    network namespace"; shared mode, or a kernel without the setting, passes."""
    host = SimulatedHost.build(root, "cx6dx")
    check_netns_mode(host)  # no ib_core parameter: an old kernel passes
    host.set_rdma_netns_mode("shared")
    assert host.path(NETNS_MODE).read_text() == "Y\n"
    check_netns_mode(host)
    host.set_rdma_netns_mode("exclusive")
    config = write(root, {"configList": [{"resourceName": "hca_shared_devices_a",
                                          "rdmaHcaMax": 1000, "devices": ["ib0", "ib1"]}]})
    result = CliRunner().invoke(app, ["rdma-device-plugin", "--config-file", str(config),
                                      "--host-root", str(root)])
    assert result.exit_code == 1
    output = " ".join(result.output.split())
    assert "incorrect RDMA subsystem network namespace" in output
    assert "rdma system set netns shared" in output


# ----------------------------------------------------------------------------- 9: SR-IOV entries

UPSTREAM_CONFIGMAP = [  # sriov-network-device-plugin deployments/configMap.yaml
    {"resourceName": "intel_sriov_netdevice",
     "selectors": {"vendors": ["8086"], "devices": ["154c", "10ed"],
                   "drivers": ["i40evf", "ixgbevf"]}},
    {"resourceName": "intel_sriov_dpdk",
     "selectors": {"vendors": ["8086"], "devices": ["154c", "10ed"], "drivers": ["vfio-pci"],
                   "pfNames": ["enp0s0f0", "enp2s2f1"]}},
    {"resourceName": "mlnx_sriov_rdma",
     "selectors": {"vendors": ["15b3"], "devices": ["1018"], "drivers": ["mlx5_ib"],
                   "isRdma": True}},
]


def test_a_bad_entry_is_skipped_and_reported_while_the_others_are_served(root: Path) -> None:
    """Upstream's configMap.yaml plus entries its docs show (ddpProfiles, vdpaType) and two it
    cannot serve (an unknown deviceType, `"selectors": []`): those two are skipped, each reported
    on the agent's pod, and every other resource is served."""
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs(PF0, 2)
    config = {"resourceList": [
        *UPSTREAM_CONFIGMAP,
        {"resourceName": "intel_gtp", "selectors": {
            "vendors": ["8086"], "devices": ["158b"], "ddpProfiles": ["GTPv1-C/U IPv4/IPv6"]}},
        {"resourceName": "mlnx_vdpa", "selectors": {
            "vendors": ["15b3"], "devices": ["101e"], "vdpaType": "vhost"}},
        {"resourceName": "fpga", "deviceType": "gpu", "selectors": {"vendors": ["8086"]}},
        {"resourceName": "nothing", "selectors": []},
        {"resourceName": "mlnx_vf", "selectors": {"vendors": ["15b3"], "devices": ["101e"]}},
    ]}
    reporter = Recorded()

    async def main() -> None:
        async with sriov(host, config, reporter) as kubelet:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {"intel.com/mlnx_vf": 2})
            skipped = [m for r, m in reporter.reports if r == "ResourceSkipped"]
            assert len(skipped) == 2
            assert "resourceList[5] (\"fpga\"): deviceType: 'gpu' is not one of" in skipped[0]
            assert 'resourceList[6] ("nothing"): selectors: an empty list' in skipped[1]

    asyncio.run(main())


def test_empty_selectors_take_every_device(root: Path) -> None:
    """`"selectors": {}` has no filter in upstream's GetFilteredDevices: every VF, and every
    PF without VFs, is in the pool."""
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs(PF0, 2)

    async def main() -> None:
        async with sriov(host, {"resourceList": [{"resourceName": "all", "selectors": {}}]}) \
                as kubelet:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {"intel.com/all": 3})
            assert set(kubelet.resources["intel.com/all"].devices) == {
                vf(host, PF0, 0), vf(host, PF0, 1), host.address(PF1)}

    asyncio.run(main())


def test_pf_names_with_vf_ranges_and_malformed_items(root: Path) -> None:
    """The pfNames of upstream's deviceSelectors_test ("ens2f0#1", "ens2f1#0,3-5,7", with this
    node's PF names) select the same VFs; a malformed item ("#a-b") and a backwards range
    ("#6-2") match nothing, and never the whole PF."""
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs(PF0, 8)
    host.set_numvfs(PF1, 8)
    config = {"resourceList": [{"resourceName": "ranges", "selectors": {
        "pfNames": [f"{PF0}#1", f"{PF1}#0,3-5,7", f"{PF0}#a-b", f"{PF1}#6-2"]}}]}
    want = {vf(host, PF0, 1), *(vf(host, PF1, i) for i in (0, 3, 4, 5, 7))}

    async def main() -> None:
        async with sriov(host, config) as kubelet:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {"intel.com/ranges": 6})
            assert set(kubelet.resources["intel.com/ranges"].devices) == want

    asyncio.run(main())


def test_duplicate_aux_types_are_accepted(root: Path) -> None:
    """auxTypes ["sf", "sf"] is an auxNetDevice selector for scalable functions, as upstream."""
    host = SimulatedHost.build(root, "cx6dx")
    sf = host.add_sf(PF0, 3)
    config = {"resourceList": [{"resourceName": "sfs", "deviceType": "auxNetDevice",
                                "selectors": {"vendors": ["15b3"], "auxTypes": ["sf", "sf"]}}]}

    async def main() -> None:
        async with sriov(host, config) as kubelet:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {"intel.com/sfs": 1})
            assert set(kubelet.resources["intel.com/sfs"].devices) == {sf}

    asyncio.run(main())


# ----------------------------------------------------------------------------- 10: key case

def test_sriov_keys_in_another_case_never_widen_a_selector(root: Path) -> None:
    """Go's encoding/json matches keys case-insensitively, so upstream reads `PfNames`,
    `Vendors`, `NeedVhostNet` and `isrdma` as their fields; dropping them would take every VF."""
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs(PF0, 4)
    host.set_numvfs(PF1, 4)
    config = {"resourceList": [{"resourceName": "a", "selectors": {
        "Vendors": ["15b3"], "PfNames": [f"{PF0}#0-1"], "isrdma": True}}]}
    loaded = load_sriov(write(root, config))
    (sel,) = loaded.resources[0].selectors
    assert getattr(sel, "pf_names", None) == [f"{PF0}#0-1"]
    assert getattr(sel, "is_rdma", False) is True

    async def main() -> None:
        async with sriov(host, config) as kubelet:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {"intel.com/a": 2})
        host.load_module("vhost_net")
        host.load_module("tun")
        vhost = {"resourceList": [{"resourceName": "v", "selectors": {
            "PfNames": [PF1], "NeedVhostNet": True}}]}
        async with sriov(host, vhost) as kubelet:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {"intel.com/v": 4})
            response = await kubelet.allocate("intel.com/v")
            assert [d.host_path for d in response.devices] == ["/dev/vhost-net", "/dev/net/tun"]

    asyncio.run(main())


def test_rdma_keys_in_another_case_never_widen_a_selector(root: Path) -> None:
    """Upstream README's selectors written `Vendors`/`deviceIds`: a deviceIDs list that no NIC of
    the node matches leaves the pool empty instead of taking every Mellanox NIC."""
    host = SimulatedHost.build(root, "cx6dx")
    config = {"configList": [{"resourceName": "hca_shared_devices_b", "rdmaHcaMax": 500,
                              "selectors": {"Vendors": ["15b3"], "deviceIds": ["1017"]}}]}
    assert load_rdma(write(root, config)).config_list[0].selectors.device_ids == ["1017"]

    async def main() -> None:
        async with rdma(host, config) as kubelet:
            name = "rdma/hca_shared_devices_b"
            await kubelet.wait_for(lambda: name in kubelet.resources
                                   and kubelet.resources[name].connected)
            assert kubelet.capacity() == {name: 0}

    asyncio.run(main())


# ----------------------------------------------------------------------------- 11: RDMA config

def test_rdma_config_edge_cases_read_as_upstream(root: Path) -> None:
    """Upstream's ValidateConfigs keys uniqueness on resourceName alone (the socket is
    <resourceName>.sock), takes `devices` when selectors are empty, and Go reads
    `rdmaHcaMax: null` as 0 (resources_manager_test "Valid config list with 0 number of
    resources")."""
    twice = {"configList": [
        {"resourceName": "test_config", "rdmaHcaMax": 100, "devices": ["ib0"]},
        {"resourceName": "test_config", "resourcePrefix": "nvidia.com", "rdmaHcaMax": 500,
         "devices": ["ib1"]}]}
    with pytest.raises(ConfigError) as e:
        load_rdma(write(root, twice))
    assert "'test_config' is already used by rdma/test_config" in str(e.value)
    assert "test_config.sock" in str(e.value)
    config = load_rdma(write(root, {"configList": [
        {"resourceName": "test_config", "rdmaHcaMax": None, "devices": ["ib0"],
         "selectors": {}}]}))
    (res,) = config.config_list
    assert res.rdma_hca_max == 0
    assert res.selectors is not None and res.selectors.if_names == ["ib0"]


# ----------------------------------------------------------------------------- 12: args and CDI

SRIOV_ARGS = ["--log-dir=sriovdp", "--log-level=10", "--resource-prefix=openshift.io",
              "--use-cdi", "--log-max-size=100", "--log-max-files=5", "--log-max-age=30"]


def test_upstream_daemonset_arguments_are_accepted(root: Path) -> None:
    """The arguments of network-operator's and sriov-network-operator's DaemonSets and of
    sriov-network-device-plugin's entrypoint.sh: the agents take them (a config problem is what
    stops them here, not a usage error)."""
    bad = write(root, {"resourceList": [{"resourceName": "a", "deviceType": "gpu",
                                         "selectors": {}}]})
    result = CliRunner().invoke(app, ["sriov-device-plugin", *SRIOV_ARGS,
                                      f"--config-file={bad}", "--host-root", str(root)])
    assert result.exit_code == 1, result.output
    assert "deviceType: 'gpu'" in result.output
    bad = write(root, {"configList": []})
    result = CliRunner().invoke(app, ["rdma-device-plugin", "--use-cdi", f"--config-file={bad}",
                                      "--host-root", str(root)])
    assert result.exit_code == 1, result.output
    assert "no resources configured" in result.output


def test_nicop_agents_get_upstreams_arguments() -> None:
    """network-operator renders `--use-cdi` (both plugins) and `--log-dir=sriovdp
    --log-level=10` (SR-IOV) into the plugin containers; nicop's agents get the same."""
    config = json.dumps({"configList": [{"resourceName": "rdma", "rdmaHcaMax": 63,
                                         "selectors": {"vendors": ["15b3"]}}]})
    spec = {"image": "nicop", "config": config, "useCdi": True}
    ctx = Context({"metadata": {"name": "p", "uid": "u"}, "spec": {}}, "nvidia-network-operator",
                  agent_image="reg/nicop:1")

    def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
        (ds,) = [o for o in objects if o["kind"] == "DaemonSet"]
        return ds["spec"]["template"]["spec"]["containers"][0]  # type: ignore[no-any-return]

    rdma_c = container(rdma_dp.render(ctx, spec, "spec.rdmaSharedDevicePlugin"))
    assert rdma_c["command"] == ["nicop", "rdma-device-plugin", "--metrics-port=9531"]
    assert rdma_c["args"] == ["--use-cdi"]
    sriov_c = container(sriov_dp.render(ctx, {**spec, "config": json.dumps(
        {"resourceList": UPSTREAM_CONFIGMAP})}, "spec.sriovDevicePlugin"))
    assert sriov_c["args"] == ["--log-dir=sriovdp", "--log-level=10", "--use-cdi"]


def test_rdma_cdi_mode_writes_the_spec_and_refers_to_it(root: Path) -> None:
    """Upstream's --use-cdi (pkg/cdi cdi_test): a spec of kind nvidia.com/net-rdma, one device
    per NIC named by its PCI address with its RDMA character devices, written as
    /var/run/cdi/nvidia.com_<resourceName>.yaml, and Allocate answering with the annotation
    cdi.k8s.io/nvidia.com_net-rdma (plus the same names as CDI devices) instead of device
    specs."""
    host = SimulatedHost.build(root, "cx6dx")
    config = {"configList": [{"resourceName": "hca_shared_devices_a", "rdmaHcaMax": 10,
                              "selectors": {"vendors": ["15b3"]}}]}
    nics = [host.address(PF0), host.address(PF1)]
    spec_file = host.path("/var/run/cdi/nvidia.com_hca_shared_devices_a.yaml")

    async def main() -> None:
        async with rdma(host, config, use_cdi=True) as kubelet:
            name = "rdma/hca_shared_devices_a"
            await kubelet.wait_for(lambda: kubelet.allocatable() == {name: 10})
            response = await kubelet.allocate(name)
            assert not response.devices
            refs = [f"nvidia.com/net-rdma={a}" for a in nics]
            assert dict(response.annotations) == {"cdi.k8s.io/nvidia.com_net-rdma": ",".join(refs)}
            assert [d.name for d in response.cdi_devices] == refs
            spec = yaml.safe_load(spec_file.read_text())
            assert spec["kind"] == "nvidia.com/net-rdma"
            assert [d["name"] for d in spec["devices"]] == nics
            nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
            assert {"path": "/dev/infiniband/uverbs0", "hostPath": "/dev/infiniband/uverbs0",
                    "permissions": "rw"} in nodes
            assert nodes[-1]["path"] == "/dev/infiniband/rdma_cm"
        assert not spec_file.exists()  # removed when the plugin stops, as upstream

    asyncio.run(main())


def test_sriov_cdi_mode_writes_the_spec_and_refers_to_it(root: Path) -> None:
    """Upstream's --use-cdi (pkg/cdi cdi_test "should return container annotation"): kind
    <prefix>/net-pci, annotation cdi.k8s.io/<prefix>_net-pci = <prefix>/net-pci=<PCI address>,
    the PCIDEVICE_* variables still set, spec file sriov-dp-<prefix>-net-pci-<resourceName>."""
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs(PF0, 2)
    config = {"resourceList": [{"resourceName": "sriov_rdma", "resourcePrefix": "example.com",
                                "selectors": {"vendors": ["15b3"], "devices": ["101e"],
                                              "isRdma": True}}]}
    spec_file = host.path("/var/run/cdi/sriov-dp-example.com-net-pci-sriov_rdma.yaml")

    async def main() -> None:
        async with sriov(host, config, use_cdi=True) as kubelet:
            name = "example.com/sriov_rdma"
            await kubelet.wait_for(lambda: kubelet.allocatable() == {name: 2})
            device = vf(host, PF0, 0)
            response = await kubelet.allocate(name, [device])
            assert not response.devices
            assert dict(response.annotations) == {
                "cdi.k8s.io/example.com_net-pci": f"example.com/net-pci={device}"}
            assert [d.name for d in response.cdi_devices] == [f"example.com/net-pci={device}"]
            assert response.envs["PCIDEVICE_EXAMPLE_COM_SRIOV_RDMA"] == device
            spec = yaml.safe_load(spec_file.read_text())
            assert spec["kind"] == "example.com/net-pci"
            assert {d["name"] for d in spec["devices"]} == {device, vf(host, PF0, 1)}
        assert not spec_file.exists()

    asyncio.run(main())


def test_log_dir_writes_the_log_under_var_log(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--log-dir=sriovdp` (network-operator's argument): upstream's entrypoint logs to
    /var/log/sriovdp as well as stderr; so does nicop's agent."""
    from nicop import logs
    from nicop.cli.agents import _log_file
    from nicop.node.host import MOUNTS_ENV

    monkeypatch.setenv(MOUNTS_ENV, json.dumps({"/var/log": str(root / "log")}))
    before = list(logging.getLogger().handlers)
    logs.setup("info")
    try:
        _log_file("sriovdp", "sriovdp", 1, 2)
        logging.getLogger("nicop.test").info("serving intel.com/mlnx_vf")
        assert "serving intel.com/mlnx_vf" in (root / "log/sriovdp/sriovdp.log").read_text()
    finally:
        for handler in logging.getLogger().handlers:
            handler.close()
        logging.getLogger().handlers[:] = before
