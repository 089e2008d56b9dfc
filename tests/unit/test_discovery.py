"""Discovery reads what the upstream plugins read, through the Host root."""

from __future__ import annotations

from pathlib import Path

from nicop.node.discovery import nic_report, scan
from nicop.node.host import Host
from nicop_sim.hardware import SimulatedHost


def test_dgx_nics_their_rdma_devices_and_numa(tmp_path: Path) -> None:
    SimulatedHost.build(tmp_path, "dgx")
    inv = scan(Host(tmp_path))  # a plain Host: discovery needs nothing from the simulator
    nics = list(inv.network_functions())
    assert len(nics) == 8
    assert {(f.vendor, f.device, f.driver) for f in nics} == {("15b3", "1021", "mlx5_core")}
    assert [f.numa_node for f in nics] == [0, 0, 0, 0, 1, 1, 1, 1]
    gpu = inv.functions["0000:1b:00.0"]  # the GPUs are PCI functions, but no NICs
    assert (gpu.vendor, gpu.class_code, gpu.driver, gpu.netdevs) == ("10de", 0x030200, "nvidia", ())
    first = inv.functions["0000:18:00.0"]
    assert first.netdev is not None
    assert (first.netdev.name, first.netdev.link_type, first.netdev.up) == (
        "ibp24s0", "infiniband", True)
    assert first.class_code == 0x020700
    assert first.total_vfs == 8 and first.num_vfs == 0 and first.pf is None
    (rdma,) = first.rdma
    assert rdma.name == "mlx5_0"
    assert rdma.char_devices == (
        "/dev/infiniband/uverbs0", "/dev/infiniband/issm0", "/dev/infiniband/umad0")
    assert rdma.port_state == "ACTIVE" and rdma.pkey == "0xffff"
    assert inv.rdma_cm == "/dev/infiniband/rdma_cm"


def test_vfs_know_their_pf_and_index(tmp_path: Path) -> None:
    host = SimulatedHost.build(tmp_path, "cx6dx")
    host.set_numvfs("enp59s0f1np1", 3)
    inv = scan(host)
    pf = inv.functions["0000:3b:00.1"]
    assert (pf.total_vfs, pf.num_vfs) == (8, 3)
    vf = inv.functions["0000:3b:01.4"]
    assert (vf.pf, vf.vf_index, vf.device, vf.total_vfs) == ("0000:3b:00.1", 2, "101e", None)
    assert vf.netdev is not None and vf.netdev.link_type == "ether"
    assert inv.pf_netdev(vf) == pf.netdev
    assert vf.iommu_group is not None and vf.numa_node == 0


def test_link_state_and_missing_rdma_are_seen(tmp_path: Path) -> None:
    host = SimulatedHost.build(tmp_path, "cx6dx")
    host.set_link("enp59s0f0np0", False)
    host.remove_rdma("enp59s0f1np1")
    inv = scan(host)
    port0, port1 = inv.functions["0000:3b:00.0"], inv.functions["0000:3b:00.1"]
    assert port0.netdev is not None and not port0.netdev.up
    assert port0.rdma[0].port_state == "DOWN"
    assert port1.rdma == ()


def test_interfaces_with_the_default_route(tmp_path: Path) -> None:
    host = SimulatedHost.build(tmp_path, "cx6dx")
    route = host.path("/proc/net/route")
    route.parent.mkdir(parents=True)
    route.write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "enp59s0f0np0\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
        "enp59s0f1np1\t0001A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
    )
    assert scan(host).default_route_ifaces == {"enp59s0f0np0"}


def test_scalable_functions_and_other_devices(tmp_path: Path) -> None:
    host = SimulatedHost.build(tmp_path, "bf3")
    name = host.add_sf("enp3s0f0np0", 5)
    host.add_pci_device("0000:81:00.0", "8086", "0d5c", 0x120000, driver="vfio-pci",
                        numa_node=1)
    inv = scan(host)
    sf = inv.aux[name]
    assert (sf.type, sf.parent, sf.sfnum) == ("sf", "0000:03:00.0", 5)
    assert [n.name for n in sf.netdevs] == ["enp3s0f0s5"] and sf.rdma[0].usable
    accel = inv.functions["0000:81:00.0"]
    assert (accel.base_class, accel.driver, accel.numa_node) == (0x12, "vfio-pci", 1)
    assert accel not in list(inv.network_functions())
    assert {f.device for f in inv.network_functions()} == {"a2dc"}


def test_the_nic_report_lists_each_mellanox_port_once_with_what_policies_select_by(
    tmp_path: Path,
) -> None:
    """What `nicop discover-node` answers: PFs only (the VFs made here are left out)."""
    host = SimulatedHost.build(tmp_path, "cx6dx")
    host.set_numvfs("enp59s0f1np1", 3)
    report = nic_report(scan(host))
    assert [(p["pciAddress"], p["deviceID"], p["linkType"], p["netdev"], p["totalVfs"],
             p["numVfs"]) for p in report] == [
        ("0000:3b:00.0", "101d", "ethernet", "enp59s0f0np0", 8, 0),
        ("0000:3b:00.1", "101d", "ethernet", "enp59s0f1np1", 8, 3)]
    assert all(p["vendor"] == "15b3" and p["rdma"] for p in report)
