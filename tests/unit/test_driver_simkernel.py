"""The simulated kernel the driver tests run on: it must refuse and change what a real one does."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from nicop_sim.hardware import SimulatedHost
from nicop_sim.kernel import SimulatedKernel

RELEASE = "6.8.0-45-generic"


@pytest.fixture
def node(tmp_path: Path) -> tuple[SimulatedHost, SimulatedKernel]:
    host = SimulatedHost.build(tmp_path / "node", "cx6dx")
    return host, SimulatedKernel.boot(tmp_path / "node", RELEASE)


def test_boot_shows_the_inbox_stack_as_lsmod_would(
    node: tuple[SimulatedHost, SimulatedKernel],
) -> None:
    host, _ = node
    lines = {line.split()[0]: line.split() for line in
             (host.read("/proc/modules") or "").splitlines()}
    assert lines["ib_core"][3] == "ib_cm,ib_ipoib,ib_umad,ib_uverbs,iw_cm,mlx5_ib,rdma_cm,rdma_ucm,"
    assert lines["ib_core"][2] == "8"  # refcnt: its holders
    assert lines["mlx5_ib"][2:5] == ["0", "-", "Live"]
    assert host.read("/sys/module/mlx5_core/version") is None  # inbox: no version
    assert host.read("/sys/module/mlx5_core/holders/mlx5_ib/initstate") == "live"
    assert host.read("/proc/sys/kernel/osrelease") == RELEASE


def test_rmmod_refuses_a_held_module_and_names_the_holders(
    node: tuple[SimulatedHost, SimulatedKernel],
) -> None:
    _, kernel = node
    with pytest.raises(OSError) as err:
        kernel.rmmod("mlx5_core")
    assert err.value.errno == errno.EBUSY
    assert "Module mlx5_core is in use by: mlx5_ib" in str(err.value)
    kernel.hold("rdma_ucm")  # a process has /dev/infiniband/rdma_cm open
    with pytest.raises(OSError, match=r"Module rdma_ucm is in use$"):
        kernel.rmmod("rdma_ucm")
    with pytest.raises(OSError, match=r"not currently loaded"):
        kernel.rmmod("nvme_rdma")


def test_an_unload_killed_halfway_leaves_the_module_unloaded_and_its_holds_gone(
    node: tuple[SimulatedHost, SimulatedKernel],
) -> None:
    """A driver container killed in the middle of an rmmod (its initstate gone, its directory,
    its hold on mlx5_core and /proc/modules not yet updated): as after a real kernel's rmmod,
    which no process kill splits, the module is not loaded, holds nothing, and loads again."""
    host, kernel = node
    host.path("/sys/module/mlx5_ib/initstate").unlink()
    assert not kernel.is_loaded("mlx5_ib") and "mlx5_ib" not in kernel.holders("mlx5_core")
    kernel.modprobe("mlx5_ib")  # the next process sees it unloaded and loads it
    assert kernel.holders("mlx5_core") == ["mlx5_ib"]
    first = (host.read("/proc/modules") or "").splitlines()[0].split()
    assert first[0] == "mlx5_ib" and first[2:4] == ["0", "-"]  # loaded last, listed first
    host.path("/sys/module/mlx5_ib/initstate").unlink()
    kernel.rmmod("ib_ipoib")  # any later command shows the kernel as it is
    modules = [line.split()[0] for line in (host.read("/proc/modules") or "").splitlines()]
    assert "mlx5_ib" not in modules and "ib_ipoib" not in modules and "mlx5_core" in modules


def test_unloading_mlx5_takes_the_devices_and_vfs_away(
    node: tuple[SimulatedHost, SimulatedKernel],
) -> None:
    host, kernel = node
    host.set_numvfs("enp59s0f0np0", 2)
    kernel.rmmod("rdma_ucm")
    assert not host.exists("/dev/infiniband/rdma_cm")
    for module in ("ib_ipoib", "ib_umad", "mlx5_ib"):
        kernel.rmmod(module)
    assert host.listdir("/sys/class/infiniband") == []
    assert not host.exists("/dev/infiniband/uverbs0")
    assert host.exists("/sys/class/net/enp59s0f0v1")  # VFs live until mlx5_core goes
    kernel.rmmod("mlx5_core")
    assert host.listdir("/sys/class/net") == []
    assert host.read("/sys/bus/pci/devices/0000:3b:00.0/sriov_numvfs") == "0"
    assert host.link_name("/sys/bus/pci/devices/0000:3b:00.0/driver") is None
    kernel.modprobe("mlx5_ib")  # pulls mlx5_core, ib_core, ib_uverbs in
    assert host.listdir("/sys/class/net") == ["enp59s0f0np0", "enp59s0f1np1"]
    assert host.listdir("/sys/class/infiniband") == ["mlx5_0", "mlx5_1"]


def test_the_driver_package_wins_over_inbox_and_mixing_builds_fails(
    node: tuple[SimulatedHost, SimulatedKernel],
) -> None:
    host, kernel = node
    kernel.install_driver("24.10-1.1.4")
    assert kernel.installed_version() == "24.10-1.1.4"
    for module in ("rdma_ucm", "ib_ipoib", "ib_umad", "mlx5_ib"):
        kernel.rmmod(module)
    # ib_core is still the inbox one: the new mlx5_ib cannot bind to its symbols.
    with pytest.raises(OSError, match=r"could not insert 'mlx5_ib'.*disagrees about version"):
        kernel.modprobe("mlx5_ib")
    for module in ("rdma_cm", "iw_cm", "ib_cm", "ib_uverbs", "ib_core", "mlx5_core", "mlxfw"):
        kernel.rmmod(module)
    kernel.modprobe("mlx5_ib")
    assert host.read("/sys/module/mlx5_core/version") == "24.10-1.1.4"
    assert host.read("/sys/module/mlx5_core/taint") == "OE"
    assert "mlx_compat" in (host.read("/proc/modules") or "")
