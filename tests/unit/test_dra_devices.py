"""The DRA devices a node publishes for its RDMA NICs and VFs, read from simulated hardware."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from nicop.api import dra
from nicop.node.discovery import scan
from nicop.node.dra.devices import Device, node_devices, node_pool
from nicop_sim.gpu_dra import GPU_DRIVER, gpu_device_class, gpu_devices
from nicop_sim.hardware import SimulatedHost

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def devices_of(host: SimulatedHost) -> dict[str, Device]:
    return {d.name: d for d in node_devices(scan(host), host)}


def value(device: Device | dict[str, Any], name: str) -> Any:
    attrs = device.attributes if isinstance(device, Device) else device["attributes"]
    if name not in attrs:
        return None
    (v,) = attrs[name].values()
    return v


def of_kind(devices: dict[str, Device], kind: str) -> list[Device]:
    return [d for d in devices.values() if value(d, dra.KIND) == kind]


def test_a_dgx_publishes_eight_nics_each_behind_its_own_root_paired_with_a_gpu(
        tmp_path: Path) -> None:
    host = SimulatedHost.build(tmp_path, "dgx")
    nics = of_kind(devices_of(host), dra.KIND_PF)
    assert len(nics) == 8 and len(devices_of(host)) == 8  # the GPUs are no RDMA devices
    roots = {value(n, dra.PCIE_ROOT): n for n in nics}
    assert len(roots) == 8 and "pci0000:15" in roots
    first = roots["pci0000:15"]
    assert (value(first, dra.PCI_BUS_ID), value(first, dra.LINK_TYPE), value(first, dra.LINK_UP),
            value(first, dra.RDMA_DEVICE), value(first, dra.NUMA_NODE)) == (
        "0000:18:00.0", "infiniband", True, "mlx5_0", 0)
    assert value(first, dra.PORT_GUID) == "b83f:d203:0000:0000"
    assert value(first, dra.MAC_ADDRESS) is None
    assert first.attributes[dra.FIRMWARE_VERSION] == {"version": "28.39.1002"}

    gpus = gpu_devices(host)
    assert len(gpus) == 8
    # Each GPU's root names exactly one NIC, on the same NUMA node as the GPU's PCI function.
    paired = {value(g, dra.PCIE_ROOT) for g in gpus}
    assert paired == set(roots)
    for gpu in gpus:
        nic = roots[value(gpu, dra.PCIE_ROOT)]
        numa = host.read(f"/sys/bus/pci/devices/{value(gpu, dra.PCI_BUS_ID)}/numa_node")
        assert str(value(nic, dra.NUMA_NODE)) == numa
    gpu0 = gpus[0]
    assert gpu0["name"] == "gpu-0"
    assert (value(gpu0, "type"), value(gpu0, "index"), value(gpu0, "productName"),
            value(gpu0, dra.PCI_BUS_ID)) == ("gpu", 0, "NVIDIA H100 80GB HBM3", "0000:1b:00.0")
    assert re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", value(gpu0, "uuid"))
    assert len({value(g, "uuid") for g in gpus}) == 8
    assert gpu_device_class()["spec"]["selectors"] == [
        {"cel": {"expression": f'device.driver == "{GPU_DRIVER}"'}}]


def test_vfs_name_their_pf_and_index(tmp_path: Path) -> None:
    host = SimulatedHost.build(tmp_path, "cx6dx")
    host.set_numvfs("enp59s0f0np0", 4)
    vfs = of_kind(devices_of(host), dra.KIND_VF)
    assert [v.name for v in vfs] == [f"vf-0000-3b-00-{i}" for i in range(2, 6)]
    assert [(value(v, dra.PF_NAME), value(v, dra.VF_INDEX)) for v in vfs] == [
        ("enp59s0f0np0", i) for i in range(4)]
    vf = vfs[0]
    assert (value(vf, dra.LINK_TYPE), value(vf, dra.LINK_UP), value(vf, dra.DEVICE_ID),
            value(vf, dra.NETDEV), value(vf, dra.PCIE_ROOT)) == (
        "ethernet", True, "101e", "enp59s0f0v0", "pci0000:00")
    assert value(vf, dra.MAC_ADDRESS) == host.read("/sys/class/net/enp59s0f0v0/address")
    assert value(vf, dra.PORT_GUID) is None
    assert len(of_kind(devices_of(host), dra.KIND_PF)) == 2


def test_a_pf_and_its_vfs_share_one_counter_set_the_pf_takes_whole(tmp_path: Path) -> None:
    """A claim gets the PF or some of its VFs, never both: the PF consumes all its counter
    set's `vfs`, each VF one; a PF without VFs consumes nothing and has no set."""
    host = SimulatedHost.build(tmp_path, "cx6dx")
    host.set_numvfs("enp59s0f0np0", 2)
    pool = node_pool(scan(host), host)
    assert pool.counter_sets == [{"name": "pf-0000-3b-00-0", "counters": {"vfs": {"value": "2"}}}]
    consumed = {d["name"]: d.get("consumesCounters") for d in pool.devices}
    assert consumed == {
        "pf-0000-3b-00-0": [{"counterSet": "pf-0000-3b-00-0", "counters": {"vfs": {"value": "2"}}}],
        "pf-0000-3b-00-1": None,
        "vf-0000-3b-00-2": [{"counterSet": "pf-0000-3b-00-0", "counters": {"vfs": {"value": "1"}}}],
        "vf-0000-3b-00-3": [{"counterSet": "pf-0000-3b-00-0", "counters": {"vfs": {"value": "1"}}}],
    }
    host.set_numvfs("enp59s0f0np0", 0)
    pool = node_pool(scan(host), host)
    assert pool.counter_sets == [] and not any("consumesCounters" in d for d in pool.devices)


def test_a_pf_link_down_takes_its_vfs_out_and_back_under_the_same_names(tmp_path: Path) -> None:
    """The VFs of a PF whose link is down leave, and the PF with them (the scheduler would not
    see what its VFs' claims consume); a PF without VFs stays, with `linkUp: false`."""
    host = SimulatedHost.build(tmp_path, "cx6dx")
    host.set_numvfs("enp59s0f0np0", 2)
    before = devices_of(host)
    host.set_link("enp59s0f0np0", False)
    host.set_link("enp59s0f1np1", False)
    down = devices_of(host)
    assert sorted(down) == ["pf-0000-3b-00-1"]
    assert value(down["pf-0000-3b-00-1"], dra.LINK_UP) is False
    assert down["pf-0000-3b-00-1"].to_api()["taints"] == [
        {"key": "rdma.nicop.io/link-down", "value": "enp59s0f1np1", "effect": "NoSchedule"}]
    assert "taints" not in before["pf-0000-3b-00-1"].to_api()
    host.set_link("enp59s0f0np0", True)
    host.set_link("enp59s0f1np1", True)
    assert devices_of(host) == before


def test_names_are_dns_labels_unique_and_stable_and_devices_fit_the_api(tmp_path: Path) -> None:
    host = SimulatedHost.build(tmp_path, "dgx")
    for pf in host.pfs():
        host.set_numvfs(pf, 8)
    devices = node_devices(scan(host), host)
    assert len(devices) == 8 + 64
    names = [d.name for d in devices]
    assert len(set(names)) == len(names) and names == sorted(names)
    assert all(len(n) <= 63 and DNS_LABEL.fullmatch(n) for n in names)
    assert node_devices(scan(host), host) == devices  # a rescan gives the same devices
    for device in devices:
        assert len(device.attributes) <= dra.MAX_ATTRIBUTES_PER_DEVICE
        for name, typed in device.attributes.items():
            domain, _, ident = name.rpartition("/")
            assert domain in ("", dra.STANDARD_DOMAIN) and C_IDENTIFIER.fullmatch(ident)
            assert len(typed) == 1 and next(iter(typed)) in ("string", "int", "bool", "version")
            if "string" in typed:
                assert len(typed["string"]) <= dra.MAX_STRING_LENGTH


def test_vfio_vfs_stay_unbound_vfs_go_and_a_pf_without_rdma_is_tainted(tmp_path: Path) -> None:
    host = SimulatedHost.build(tmp_path, "cx7-ib")
    host.set_numvfs("ibp75s0", 3)
    _, vf1, vf2 = host.vfs("ibp75s0")
    host.bind_driver(vf1, "vfio-pci")
    host.bind_driver(vf2, None)
    devices = devices_of(host)
    assert sorted(devices) == ["pf-0000-4b-00-0", "vf-0000-4b-00-1", "vf-0000-4b-00-2"]
    vfio = devices["vf-0000-4b-00-2"]
    assert (value(vfio, dra.LINK_TYPE), value(vfio, dra.RDMA_DEVICE), value(vfio, dra.NETDEV),
            value(vfio, dra.VF_INDEX)) == ("infiniband", None, None, 1)
    assert vfio.attributes[dra.FIRMWARE_VERSION] == {"version": "28.39.1002"}  # the PF's
    assert value(devices["vf-0000-4b-00-1"], dra.PORT_GUID) is None  # no GUID assigned yet
    host.remove_rdma("ibp75s0")
    gone = devices_of(host)["pf-0000-4b-00-0"].to_api()
    assert gone["taints"] == [{"key": dra.TAINT_RDMA_MISSING, "value": "ibp75s0",
                               "effect": "NoSchedule"}]
    assert dra.RDMA_DEVICE not in gone["attributes"]


def test_driver_and_firmware_versions(tmp_path: Path) -> None:
    host = SimulatedHost.build(tmp_path, "cx7-ib")
    (pf,) = devices_of(host).values()
    assert value(pf, dra.DRIVER_VERSION) is None  # the inbox driver reports none
    module = host.path("/sys/module/mlx5_core/version")
    module.parent.mkdir(parents=True)
    module.write_text("25.10-1.2.8.0\n")
    host.path("/sys/class/infiniband/mlx5_0/fw_ver").write_text("16.26.0292\n")
    (pf,) = devices_of(host).values()
    assert value(pf, dra.DRIVER_VERSION) == "25.10-1.2.8.0"
    assert pf.attributes[dra.FIRMWARE_VERSION] == {"version": "16.26.292"}  # semver: no 0292


CEL = re.compile(
    r'device\.driver == "([^"]+)" && device\.attributes\["([^"]+)"\]\.(\w+) == "(\w+)"')


def selects(device_class: dict[str, Any], driver: str, device: Device) -> bool:
    """Evaluate the one form of selector the driver's classes use."""
    (selector,) = device_class["spec"]["selectors"]
    match = CEL.fullmatch(selector["cel"]["expression"])
    assert match, selector
    want_driver, domain, attr, want = match.groups()
    # Unqualified attributes of a slice are in the driver's domain.
    attrs = {f"{driver}/{k}" if "/" not in k else k: v for k, v in device.attributes.items()}
    return driver == want_driver and attrs.get(f"{domain}/{attr}") == {"string": want}


def test_device_classes_select_pfs_and_vfs_by_the_drivers_own_attribute(tmp_path: Path) -> None:
    host = SimulatedHost.build(tmp_path, "cx6dx")
    host.set_numvfs("enp59s0f0np0", 2)
    pf_class, vf_class, shared_class = dra.device_classes(labels={"app": "nicop"})
    assert (pf_class["apiVersion"], pf_class["kind"]) == ("resource.k8s.io/v1", "DeviceClass")
    assert (pf_class["metadata"], vf_class["metadata"]["name"]) == (
        {"name": "rdma.nicop.io", "labels": {"app": "nicop"}}, "vf.rdma.nicop.io")
    assert 'device.attributes["rdma.nicop.io"].kind == "vf"' in (
        vf_class["spec"]["selectors"][0]["cel"]["expression"])
    devices = node_devices(scan(host), host)
    assert [d.name for d in devices if selects(pf_class, dra.DRIVER, d)] == [
        "pf-0000-3b-00-0", "pf-0000-3b-00-1"]
    assert [d.name for d in devices if selects(vf_class, dra.DRIVER, d)] == [
        "vf-0000-3b-00-2", "vf-0000-3b-00-3"]
    assert not any(selects(vf_class, "gpu.nvidia.com", d) for d in devices)
    assert not any(selects(shared_class, dra.DRIVER, d) for d in devices)


def test_a_shared_roce_port_takes_63_pods_of_its_128_gid_entries(tmp_path: Path) -> None:
    """sharedRdma: a port without VFs is one device many claims hold (allowMultipleAllocations),
    each taking one of its `pods`: 63 on RoCE, whose 128-entry GID table (mlx5) keeps two for
    the port's link-local address and takes a RoCE v1 and a v2 entry per pod address; a port
    with VFs stays a PF, and the class of shared ports selects only them."""
    host = SimulatedHost.build(tmp_path, "cx6dx")
    host.set_numvfs("enp59s0f0np0", 2)
    devices = {d.name: d for d in node_devices(scan(host), host, shared=True)}
    assert sorted(devices) == ["pf-0000-3b-00-0", "shared-0000-3b-00-1", "vf-0000-3b-00-2",
                               "vf-0000-3b-00-3"]
    shared = devices["shared-0000-3b-00-1"].to_api()
    assert shared["allowMultipleAllocations"] is True
    assert shared["capacity"] == {"pods": {"value": "63", "requestPolicy": {
        "default": "1", "validValues": ["1"]}}}
    assert value(devices["shared-0000-3b-00-1"], dra.NETDEV) == "enp59s0f1np1"
    shared_class = dra.device_class(dra.SHARED_CLASS, dra.KIND_SHARED)
    assert [n for n, d in devices.items() if selects(shared_class, dra.DRIVER, d)] == [
        "shared-0000-3b-00-1"]
    dgx = SimulatedHost.build(tmp_path / "dgx", "dgx")
    ib = node_devices(scan(dgx), dgx, shared=True)[0].to_api()
    assert ib["capacity"]["pods"]["value"] == str(dra.IB_SHARED_PODS)


@pytest.mark.parametrize("profile", ["bf3", "cx6dx-unlabelled", "cpu"])
def test_other_profiles(tmp_path: Path, profile: str) -> None:
    host = SimulatedHost.build(tmp_path, profile)
    devices = devices_of(host)
    assert len(devices) == len(host.pfs())
    assert {value(d, dra.PCIE_ROOT) for d in devices.values()} <= {"pci0000:00"}
