"""The simulated NIC hardware: trees that look like a real node's, changed as the kernel does."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from nicop_sim.hardware import (
    MELLANOX_PRESENT_LABEL,
    PROFILES,
    SimulatedHost,
    layout,
)
from nicop_sim.platform import SimulatedPlatform

PCI = "/sys/bus/pci/devices"


@pytest.fixture
def cx6dx(tmp_path: Path) -> SimulatedHost:
    return SimulatedHost.build(tmp_path / "node", "cx6dx")


def test_profiles_keep_their_labels() -> None:
    assert PROFILES["dgx"].node_labels()[MELLANOX_PRESENT_LABEL] == "true"
    assert MELLANOX_PRESENT_LABEL not in PROFILES["cx6dx-unlabelled"].node_labels()
    assert MELLANOX_PRESENT_LABEL not in PROFILES["cpu"].node_labels()
    assert [p.name for p in layout(5)] == ["dgx", "cx6dx", "cx6dx", "cx6dx-unlabelled", "dgx"]


@pytest.mark.parametrize(
    ("profile", "netdevs", "pci_class", "device"),
    [
        ("cx6dx", ["enp59s0f0np0", "enp59s0f1np1"], "0x020000", "0x101d"),
        ("cx7-ib", ["ibp75s0"], "0x020700", "0x1021"),
        ("bf3", ["enp3s0f0np0", "enp3s0f1np1"], "0x020000", "0xa2dc"),
        ("dgx", ["ibp24s0", "ibp64s0", "ibp79s0", "ibp94s0", "ibp154s0", "ibp192s0",
                 "ibp206s0", "ibp220s0"], "0x020700", "0x1021"),
    ],
)
def test_profile_tree_has_one_function_per_port(
    tmp_path: Path, profile: str, netdevs: list[str], pci_class: str, device: str
) -> None:
    host = SimulatedHost.build(tmp_path / "node", profile)
    pfs = host.pfs()
    assert sorted(host.netdev(a) or "" for a in pfs) == sorted(netdevs)
    assert [host.rdma_device(a) for a in pfs] == [f"mlx5_{i}" for i in range(len(pfs))]
    for address in pfs:
        dev = f"{PCI}/{address}"
        assert host.read(f"{dev}/vendor") == "0x15b3"
        assert host.read(f"{dev}/device") == device
        assert host.read(f"{dev}/class") == pci_class
        assert (host.read(f"{dev}/modalias") or "").startswith(
            f"pci:v000015B3d0000{device[2:].upper()}sv000015B3")
        assert host.link_name(f"{dev}/driver") == "mlx5_core"
        assert host.read(f"{dev}/sriov_numvfs") == "0"
        assert host.read(f"{dev}/sriov_vf_device") == "101e"
        netdev = host.netdev(address)
        assert host.link_name(f"/sys/class/net/{netdev}/device") == address
        assert host.read(f"/sys/class/net/{netdev}/operstate") == "up"
    for i in range(len(pfs)):
        for node in (f"uverbs{i}", f"umad{i}", f"issm{i}"):
            assert host.exists(f"/dev/infiniband/{node}")
        assert host.read(f"/sys/class/infiniband_verbs/uverbs{i}/ibdev") == f"mlx5_{i}"
    assert host.exists("/dev/infiniband/rdma_cm")


def test_dgx_spreads_its_nics_over_two_numa_nodes(tmp_path: Path) -> None:
    host = SimulatedHost.build(tmp_path / "node", "dgx")
    numa = [host.read(f"{PCI}/{a}/numa_node") for a in host.pfs()]
    assert numa.count("0") == 4 and numa.count("1") == 4
    assert host.read("/sys/class/infiniband/mlx5_0/ports/1/link_layer") == "InfiniBand"
    assert host.read("/sys/class/infiniband/mlx5_0/hca_type") == "MT4129"


def _root_complex(host: SimulatedHost, address: str) -> str:
    """The first element under /sys/devices of the function's sysfs directory."""
    real = host.path(f"{PCI}/{address}").resolve()
    return real.relative_to(host.path("/sys/devices").resolve()).parts[0]


def test_dgx_pairs_each_nic_with_a_gpu_behind_its_own_root_complex(tmp_path: Path) -> None:
    host = SimulatedHost.build(tmp_path / "node", "dgx")
    nics, gpus = host.pfs(), host.gpus()
    assert gpus == ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
                    "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"]
    roots = [_root_complex(host, a) for a in nics]
    assert len(set(roots)) == 8 and roots[0] == "pci0000:15"
    assert [_root_complex(host, a) for a in gpus] == roots
    for nic, gpu in zip(nics, gpus, strict=True):
        dev = f"{PCI}/{gpu}"
        assert (host.read(f"{dev}/vendor"), host.read(f"{dev}/device"),
                host.read(f"{dev}/class")) == ("0x10de", "0x2330", "0x030200")
        assert host.read(f"{dev}/numa_node") == host.read(f"{PCI}/{nic}/numa_node")
        assert host.link_name(f"{dev}/driver") == "nvidia"
        assert host.netdev(gpu) is None and host.rdma_device(gpu) is None
    host.set_numvfs(nics[0], 2)  # VFs sit next to their PF, behind its root complex
    assert {_root_complex(host, vf) for vf in host.vfs(nics[0])} == {roots[0]}


def test_other_profiles_keep_their_nics_under_root_complex_00(tmp_path: Path) -> None:
    host = SimulatedHost.build(tmp_path / "node", "cx6dx")
    assert host.gpus() == []
    assert {_root_complex(host, a) for a in host.pfs()} == {"pci0000:00"}


def test_writing_numvfs_creates_vfs_where_the_kernel_puts_them(cx6dx: SimulatedHost) -> None:
    cx6dx.write("/sys/class/net/enp59s0f0np0/device/sriov_numvfs", "4")
    cx6dx.set_numvfs("enp59s0f1np1", 2)
    # PF0 has offset 2; PF1's VFs start after the room reserved for all 8 of PF0's.
    assert cx6dx.vfs("0000:3b:00.0") == [f"0000:3b:00.{i}" for i in range(2, 6)]
    assert cx6dx.vfs("0000:3b:00.1") == ["0000:3b:01.2", "0000:3b:01.3"]
    vf = f"{PCI}/0000:3b:00.2"
    assert cx6dx.link_name(f"{vf}/physfn") == "0000:3b:00.0"
    assert cx6dx.read(f"{vf}/device") == "0x101e"
    assert cx6dx.read(f"{vf}/class") == "0x020000"
    assert not cx6dx.exists(f"{vf}/sriov_totalvfs")  # SR-IOV attributes exist on PFs only
    assert cx6dx.netdev("0000:3b:00.2") == "enp59s0f0v0"
    assert cx6dx.netdev("0000:3b:01.3") == "enp59s0f1v1"
    assert cx6dx.rdma_device("0000:3b:00.2") == "mlx5_2"
    assert cx6dx.read("/sys/class/infiniband/mlx5_2/hca_type") == "MT4126"
    assert cx6dx.read(f"{PCI}/0000:3b:00.0/sriov_numvfs") == "4"


def test_numvfs_follows_the_kernel_rules(cx6dx: SimulatedHost) -> None:
    pf = "enp59s0f0np0"
    cx6dx.set_numvfs(pf, 4)
    with pytest.raises(OSError) as busy:
        cx6dx.set_numvfs(pf, 2)
    assert busy.value.errno == errno.EBUSY
    assert "Disable before enabling" in str(busy.value)
    cx6dx.set_numvfs(pf, 4)  # the same value again is a no-op
    with pytest.raises(OSError) as too_many:
        cx6dx.set_numvfs(pf, 9)
    assert too_many.value.errno == errno.ERANGE
    with pytest.raises(OSError) as garbage:
        cx6dx.write(f"{PCI}/0000:3b:00.0/sriov_numvfs", "many")
    assert garbage.value.errno == errno.EINVAL
    cx6dx.set_numvfs(pf, 0)
    cx6dx.set_numvfs(pf, 2)
    assert len(cx6dx.vfs(pf)) == 2
    with pytest.raises(FileNotFoundError):
        cx6dx.set_numvfs("0000:3b:00.2", 1)  # a VF has no sriov_numvfs


def test_numvfs_without_driver_or_with_a_busy_driver_fails(cx6dx: SimulatedHost) -> None:
    cx6dx.fail_numvfs_writes("enp59s0f0np0", errno.EBUSY)
    with pytest.raises(OSError) as busy:
        cx6dx.set_numvfs("enp59s0f0np0", 2)
    assert busy.value.errno == errno.EBUSY
    assert cx6dx.vfs("enp59s0f0np0") == []
    cx6dx.fail_numvfs_writes("enp59s0f0np0", None)
    cx6dx.set_numvfs("enp59s0f0np0", 2)
    cx6dx.bind_driver("0000:3b:00.1", None)
    assert cx6dx.netdev("0000:3b:00.1") is None
    with pytest.raises(FileNotFoundError):
        cx6dx.set_numvfs("0000:3b:00.1", 2)
    cx6dx.bind_driver("0000:3b:00.1", "mlx5_core")
    assert cx6dx.netdev("0000:3b:00.1") == "enp59s0f1np1"
    assert cx6dx.read("/sys/class/infiniband/mlx5_1/node_guid") == "b83f:d203:0000:0001"
    cx6dx.set_numvfs("0000:3b:00.1", 2)


def test_disabling_vfs_removes_every_trace(cx6dx: SimulatedHost) -> None:
    before = _tree(cx6dx.root)
    cx6dx.set_numvfs("enp59s0f0np0", 3)
    assert _tree(cx6dx.root) != before
    cx6dx.set_numvfs("enp59s0f0np0", 0)
    assert _tree(cx6dx.root) == before
    cx6dx.set_numvfs("enp59s0f0np0", 1)  # freed numbers are taken again
    assert cx6dx.rdma_device(cx6dx.vfs("enp59s0f0np0")[0]) == "mlx5_2"


def test_link_state_flips_and_vfs_follow_their_pf(cx6dx: SimulatedHost) -> None:
    cx6dx.set_numvfs("enp59s0f0np0", 2)
    cx6dx.set_link("enp59s0f0np0", False)
    assert cx6dx.read("/sys/class/net/enp59s0f0np0/operstate") == "down"
    assert cx6dx.read("/sys/class/net/enp59s0f0np0/carrier") == "0"
    assert cx6dx.read("/sys/class/net/enp59s0f0v1/operstate") == "down"
    assert cx6dx.read("/sys/class/infiniband/mlx5_0/ports/1/state") == "1: DOWN"
    assert cx6dx.read("/sys/class/net/enp59s0f1np1/operstate") == "up"
    cx6dx.set_link("enp59s0f0np0", True)
    assert cx6dx.read("/sys/class/infiniband/mlx5_0/ports/1/state") == "4: ACTIVE"
    assert cx6dx.read("/sys/class/net/enp59s0f0v1/operstate") == "up"


def test_binding_a_vf_to_vfio_replaces_netdev_and_rdma_with_a_vfio_group(
    cx6dx: SimulatedHost,
) -> None:
    cx6dx.set_numvfs("enp59s0f0np0", 1)
    vf = cx6dx.vfs("enp59s0f0np0")[0]
    group = cx6dx.link_name(f"{PCI}/{vf}/iommu_group")
    cx6dx.bind_driver(vf, "vfio-pci")
    assert cx6dx.link_name(f"{PCI}/{vf}/driver") == "vfio-pci"
    assert cx6dx.netdev(vf) is None and cx6dx.rdma_device(vf) is None
    assert cx6dx.exists(f"/dev/vfio/{group}") and cx6dx.exists("/dev/vfio/vfio")
    cx6dx.bind_driver(vf, "mlx5_core")
    assert not cx6dx.exists(f"/dev/vfio/{group}")
    assert cx6dx.netdev(vf) == "enp59s0f0v0" and cx6dx.rdma_device(vf) == "mlx5_2"


def test_rdma_device_can_vanish_and_return(cx6dx: SimulatedHost) -> None:
    cx6dx.remove_rdma("enp59s0f1np1")
    assert cx6dx.rdma_device("0000:3b:00.1") is None
    assert not cx6dx.exists("/dev/infiniband/uverbs1")
    assert cx6dx.add_rdma("enp59s0f1np1") == "mlx5_1"
    assert cx6dx.exists("/dev/infiniband/uverbs1")


def test_a_tree_built_elsewhere_can_be_driven(cx6dx: SimulatedHost) -> None:
    again = SimulatedHost(cx6dx.root)
    again.set_numvfs("enp59s0f0np0", 2)
    assert cx6dx.vfs("0000:3b:00.0") == ["0000:3b:00.2", "0000:3b:00.3"]


def test_scalable_function_appears_on_the_auxiliary_bus(cx6dx: SimulatedHost) -> None:
    name = cx6dx.add_sf("enp59s0f0np0", 88)
    aux = f"/sys/bus/auxiliary/devices/{name}"
    assert name.startswith("mlx5_core.sf.")
    assert cx6dx.read(f"{aux}/sfnum") == "88"
    assert cx6dx.listdir(f"{aux}/net") == ["enp59s0f0s88"]
    assert cx6dx.path(aux).resolve().parent.name == "0000:3b:00.0"


def _tree(root: Path) -> set[str]:
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            found.add(os.path.relpath(os.path.join(dirpath, name), root))
    return found


def test_uio_drivers_give_a_vf_its_uio_device(cx6dx: SimulatedHost) -> None:
    cx6dx.set_numvfs("enp59s0f0np0", 2)
    first, second = cx6dx.vfs("enp59s0f0np0")
    cx6dx.bind_driver(first, "igb_uio")
    cx6dx.bind_driver(second, "uio_pci_generic")
    assert cx6dx.listdir(f"{PCI}/{first}/uio") == ["uio0"]
    assert cx6dx.listdir(f"{PCI}/{second}/uio") == ["uio1"]
    assert cx6dx.exists("/dev/uio0") and cx6dx.exists("/sys/class/uio/uio1")
    cx6dx.bind_driver(first, None)
    assert not cx6dx.exists("/dev/uio0") and not cx6dx.exists(f"{PCI}/{first}/uio")


def test_vdpa_devices_sit_under_their_vf_and_go_with_its_driver(cx6dx: SimulatedHost) -> None:
    cx6dx.set_numvfs("enp59s0f0np0", 2)
    first, second = cx6dx.vfs("enp59s0f0np0")
    assert cx6dx.add_vdpa(first) == "vdpa0"
    assert cx6dx.add_vdpa(second, "virtio_vdpa") == "vdpa1"
    assert cx6dx.link_name(f"{PCI}/{first}/vdpa0/driver") == "vhost_vdpa"
    assert cx6dx.listdir(f"{PCI}/{first}/vdpa0") == ["driver", "vhost-vdpa-0"]
    assert cx6dx.exists("/dev/vhost-vdpa-0") and not cx6dx.exists("/dev/vhost-vdpa-1")
    assert cx6dx.listdir("/sys/bus/vdpa/devices") == ["vdpa0", "vdpa1"]
    cx6dx.bind_driver(first, "vfio-pci")
    assert cx6dx.listdir("/sys/bus/vdpa/devices") == ["vdpa1"]
    assert not cx6dx.exists("/dev/vhost-vdpa-0")


def test_modules_take_their_character_devices(cx6dx: SimulatedHost) -> None:
    cx6dx.unload_module("ib_umad")
    assert cx6dx.listdir("/dev/infiniband") == ["rdma_cm", "uverbs0", "uverbs1"]
    assert cx6dx.listdir(f"{PCI}/0000:3b:00.0/infiniband_mad") == []
    cx6dx.unload_module("rdma_ucm")
    assert cx6dx.listdir("/dev/infiniband") == ["uverbs0", "uverbs1"]
    cx6dx.load_module("vhost_net")
    cx6dx.load_module("tun")
    assert cx6dx.exists("/dev/vhost-net") and cx6dx.exists("/dev/net/tun")
    with pytest.raises(ValueError, match="not simulated"):
        cx6dx.unload_module("mlx5_ib")


def test_firmware_and_fabric_attributes(cx6dx: SimulatedHost, tmp_path: Path) -> None:
    cx6dx.set_numvfs("enp59s0f0np0", 1)
    (vf,) = cx6dx.vfs("enp59s0f0np0")
    cx6dx.set_pkey(vf, "0x8001")
    cx6dx.set_acpi_index("enp59s0f1np1", 3)
    cx6dx.set_rdma_netns_mode("exclusive")
    assert cx6dx.read(f"/sys/class/infiniband/{cx6dx.rdma_device(vf)}/ports/1/pkeys/0") \
        == "0x8001"
    assert cx6dx.read(f"{PCI}/0000:3b:00.1/acpi_index") == "3"
    assert cx6dx.read("/sys/module/ib_core/parameters/netns_mode") == "N"


def test_ddptool_answers_from_the_tree(cx6dx: SimulatedHost, tmp_path: Path) -> None:
    import json
    import subprocess

    cx6dx.add_pci_device("0000:af:00.0", "8086", "1572", 0x020000, driver="i40e")
    cx6dx.add_pci_device("0000:af:00.1", "8086", "1572", 0x020000, driver="i40e")
    cx6dx.set_ddp_profile("0000:af:00.0", "GTPv1-C/U IPv4/IPv6 payload")
    tool = cx6dx.install_ddptool(tmp_path / "bin")

    def ddptool(address: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([tool, "-l", "-a", "-j", "-s", address], capture_output=True,
                              text=True, check=False)

    answer = json.loads(ddptool("0000:af:00.0").stdout)["DDPInventory"]
    assert answer["DDPpackage"]["name"] == "GTPv1-C/U IPv4/IPv6 payload"
    assert (answer["device"], answer["address"]) == ("1572", "0000:af:00.0")
    assert ddptool("0000:af:00.1").returncode == 8  # an Intel NIC without a profile
    assert ddptool("0000:3b:00.0").returncode != 0  # not an Intel NIC


def test_a_real_nodes_container_sees_the_trees_hardware_and_its_own_mounts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a real node (NICOP_SIM_SCOPE=hardware) an agent's host is its container's root with
    the tree's hardware and kernel in it: VFs it creates appear in the tree with their device
    nodes (where the node's runtime finds them), while what it writes under /run or /etc goes
    to its container's mounts, where the kubelet and the other agents look."""
    tree = SimulatedHost.build(tmp_path / "tree", "cx6dx")
    container = tmp_path / "host"
    container.mkdir()
    monkeypatch.setenv("NICOP_SIM_ROOT", str(tree.root))
    monkeypatch.setenv("NICOP_SIM_SCOPE", "hardware")
    host = SimulatedPlatform().host(container)
    pf = host.listdir("/sys/class/net")[0]
    host.write(f"/sys/class/net/{pf}/device/sriov_numvfs", "2")
    assert len(os.listdir(tree.path("/sys/class/net"))) == 4  # two ports, two VFs
    assert len([n for n in os.listdir(tree.path("/dev/infiniband"))
                if n.startswith("uverbs")]) == 4
    (container / "run/mellanox/drivers").mkdir(parents=True)
    host.write("/run/mellanox/drivers/.driver-ready", "x")
    assert (container / "run/mellanox/drivers/.driver-ready").exists()
    assert not tree.path("/run/mellanox").exists()
