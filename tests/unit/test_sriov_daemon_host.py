"""The config daemon's host side on a simulated ConnectX-6 Dx node: what it reports, what it
decides, and what it writes (sriov_numvfs 0 then N, MTUs, VF drivers)."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from nicop.node.sriov_daemon import (
    ApplyError,
    Kernel,
    PfStore,
    Work,
    apply_work,
    discover,
    plan,
)
from nicop_sim.hardware import SimulatedHost

PF0, PF1 = "enp59s0f0np0", "enp59s0f1np1"
PCI0, PCI1 = "0000:3b:00.0", "0000:3b:00.1"


class KernelHost(SimulatedHost):
    """A simulated host that counts sriov_numvfs writes."""

    def __init__(self, root: Path | str) -> None:
        super().__init__(root)
        self.numvfs_writes: list[tuple[str, str]] = []

    def write(self, path: str, text: str) -> None:
        if path.endswith("/sriov_numvfs"):
            self.numvfs_writes.append((path.strip("/").split("/")[-2], text))
        super().write(path, text)


class FakeFirmware:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def set_link_type(self, pf: dict[str, Any], link_type: str) -> None:
        self.calls.append(f"link {pf['pciAddress']} {link_type}")

    def reboot(self) -> None:
        self.calls.append("reboot")


@pytest.fixture
def host(tmp_path: Path) -> KernelHost:
    built = KernelHost.build(tmp_path, "cx6dx", seed=7)
    assert isinstance(built, KernelHost)
    return built


def spec(numvfs: int = 8, pf_mtu: int | None = None, **group: Any) -> dict[str, Any]:
    iface: dict[str, Any] = {"pciAddress": PCI0, "name": PF0, "numVfs": numvfs, "vfGroups": [
        {"resourceName": "vf", "deviceType": "netdevice", "vfRange": f"0-{numvfs - 1}",
         "policyName": "p", **group}]}
    if pf_mtu:
        iface["mtu"] = pf_mtu
    return {"interfaces": [iface]}


def converge(host: KernelHost, wanted: dict[str, Any]) -> Work:
    """One daemon pass: plan against the host, apply; returns the plan."""
    store = PfStore(host)
    work = plan(wanted, discover(host, store.load()), store.load())
    apply_work(Kernel(host), store, FakeFirmware(), work)
    return work


def test_status_uses_upstreams_keys(host: KernelHost) -> None:
    host.set_numvfs(PF0, 2)
    pf0, pf1 = discover(host, vf_vlan=lambda pf, vf: 100 if vf == 1 else 0)
    assert (pf0["name"], pf0["pciAddress"], pf0["totalvfs"], pf0["numVfs"]) == (PF0, PCI0, 8, 2)
    assert (pf0["vendor"], pf0["deviceID"], pf0["linkType"], pf0["mtu"]) == (
        "15b3", "101d", "ETH", 1500)
    assert [vf["vfID"] for vf in pf0["Vfs"]] == [0, 1]
    assert pf0["Vfs"][0]["deviceID"] == "101e" and pf0["Vfs"][0]["driver"] == "mlx5_core"
    assert "Vlan" not in pf0["Vfs"][0] and pf0["Vfs"][1]["Vlan"] == 100
    assert "Vfs" not in pf1 and pf1["numVfs"] == 0


def test_creating_vfs_needs_no_drain_and_writes_zero_then_n(host: KernelHost) -> None:
    host.set_numvfs(PF0, 2)
    host.numvfs_writes.clear()
    work = converge(host, spec(8))
    assert work.drain  # the PF had VFs: a pod may be using one
    assert host.numvfs_writes == [(PCI0, "0"), (PCI0, "8")]
    fresh = KernelHost.build(host.root.parent / "fresh", "cx6dx")
    assert isinstance(fresh, KernelHost)
    work = converge(fresh, spec(8))
    assert not work.drain  # 0 -> N
    assert fresh.numvfs_writes == [(PCI0, "8")]
    assert len(fresh.vfs(PF0)) == 8


def test_the_same_spec_again_changes_nothing(host: KernelHost) -> None:
    converge(host, spec(8, pf_mtu=9000))
    host.numvfs_writes.clear()
    work = converge(host, spec(8, pf_mtu=9000))
    assert not work and host.numvfs_writes == []


def test_pf_mtu_is_only_raised_and_vf_mtu_follows_the_group(host: KernelHost) -> None:
    converge(host, spec(4, pf_mtu=9000, mtu=9000))
    assert host.read(f"/sys/class/net/{PF0}/mtu") == "9000"
    assert host.read("/sys/class/net/enp59s0f0v0/mtu") == "9000"
    work = converge(host, spec(4, pf_mtu=1500, mtu=9000))
    assert not work  # a lower PF MTU in the spec is no reason to touch the PF
    assert host.read(f"/sys/class/net/{PF0}/mtu") == "9000"


def test_vfio_groups_are_bound_through_driver_override(host: KernelHost) -> None:
    wanted = {"interfaces": [{"pciAddress": PCI0, "name": PF0, "numVfs": 4, "vfGroups": [
        {"resourceName": "dpdk", "deviceType": "vfio-pci", "vfRange": "0-1", "policyName": "d"},
        {"resourceName": "kernel", "deviceType": "netdevice", "vfRange": "2-3",
         "policyName": "k"}]}]}
    converge(host, wanted)
    vfs = host.vfs(PF0)
    drivers = [host.link_name(f"/sys/bus/pci/devices/{vf}/driver") for vf in vfs]
    assert drivers == ["vfio-pci", "vfio-pci", "mlx5_core", "mlx5_core"]
    assert all(host.read(f"/sys/bus/pci/devices/{vf}/driver_override") == "(null)" for vf in vfs)
    # Moving the VFs back to netdevice gives them their kernel driver again.
    converge(host, spec(4))
    assert {host.link_name(f"/sys/bus/pci/devices/{vf}/driver") for vf in vfs} == {"mlx5_core"}
    assert not plan(spec(4), discover(host), {})


def test_a_failing_write_names_the_pf_and_the_step(host: KernelHost) -> None:
    host.fail_numvfs_writes(PF0, errno.EBUSY)
    with pytest.raises(ApplyError) as e:
        converge(host, spec(8))
    assert str(e.value) == (f"PF {PF0} ({PCI0}): creating 8 VFs (writing 8 to sriov_numvfs) "
                            "failed: Device or resource busy")
    host.fail_numvfs_writes(PF0, None)
    converge(host, spec(8))
    assert len(host.vfs(PF0)) == 8


def test_more_vfs_than_the_pf_supports(host: KernelHost) -> None:
    with pytest.raises(ApplyError, match=r"16 VFs asked, but the PF supports at most 8"):
        converge(host, spec(16))


def test_a_pass_interrupted_after_zero_finishes_the_job(host: KernelHost) -> None:
    converge(host, spec(8))
    host.set_numvfs(PF0, 0)  # killed between "0" and "4"
    work = plan(spec(4), discover(host), PfStore(host).load())
    assert work and not work.drain  # nothing left to drain: the PF has no VFs now
    converge(host, spec(4))
    assert len(host.vfs(PF0)) == 4


def test_pfs_dropped_from_the_spec_are_reset_only_if_configured_here(host: KernelHost) -> None:
    host.set_numvfs(PF1, 2)  # created by someone else
    converge(host, spec(8))
    work = converge(host, {})
    assert work.drain and [pf["name"] for pf in work.reset] == [PF0]
    assert host.vfs(PF0) == [] and len(host.vfs(PF1)) == 2
    assert not plan({}, discover(host), PfStore(host).load())


def test_a_pf_whose_apply_failed_half_way_is_reset_when_dropped(host: KernelHost) -> None:
    """IOMMU off: the VFs are made but vfio-pci refuses them, so the apply fails after
    sriov_numvfs; the policy deleted, the PF's VFs still go (it was configured here)."""
    host.set_iommu(False)
    wanted = spec(2)
    wanted["interfaces"][0]["vfGroups"][0]["deviceType"] = "vfio-pci"
    with pytest.raises(ApplyError, match="no IOMMU group"):
        converge(host, wanted)
    assert len(host.vfs(PF0)) == 2
    work = converge(host, {})
    assert [pf["name"] for pf in work.reset] == [PF0] and host.vfs(PF0) == []


def test_a_link_type_change_is_firmware_and_a_reboot(host: KernelHost) -> None:
    wanted = spec(8)
    wanted["interfaces"][0]["linkType"] = "ib"
    store = PfStore(host)
    work = plan(wanted, discover(host), store.load())
    assert work.reboot and work.drain
    firmware = FakeFirmware()
    assert apply_work(Kernel(host), store, firmware, work)
    assert firmware.calls == [f"link {PCI0} ib", "reboot"]
    assert host.vfs(PF0) == []  # nothing else is configured before the reboot
