"""The driver container's agent on simulated nodes: what a user sees on the node and in the log."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nicop.node import preflight
from nicop.node.driver import (
    READY_FILE,
    DriverAgent,
    DriverConfig,
    DriverError,
    ValidationFailed,
    nic_functions,
)
from nicop.node.kernel import loaded_modules, probe, version_matches
from nicop.node.preflight import Refusal, Reporter
from nicop_sim.hardware import PROFILES, SimulatedHost
from nicop_sim.kernel import SimulatedBackend, SimulatedKernel

NEW = "24.10-1.1.4.0"
OLD = "24.07-0.6.1.0"
CX6DX = PROFILES["cx6dx"]


@dataclass
class Node:
    host: SimulatedHost
    kernel: SimulatedKernel
    backend: SimulatedBackend = field(init=False)

    def __post_init__(self) -> None:
        self.backend = SimulatedBackend(self.kernel)

    @property
    def ready(self) -> bool:
        return self.host.exists(READY_FILE)

    def driver(self) -> str | None:
        """What `cat /sys/module/mlx5_core/version` shows; None for inbox or no driver."""
        return self.kernel.version("mlx5_core")

    def devices(self) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
        return {a: (f.netdevs, f.rdma) for a, f in nic_functions(self.host).items()}


def make_node(tmp_path: Path, profile: str = "cx6dx", driver: str | None = None,
              loaded: tuple[str, ...] | None = None) -> Node:
    prof = PROFILES[profile]
    host = SimulatedHost.build(tmp_path / "node", prof)
    kwargs = {} if loaded is None else {"loaded": loaded}
    kernel = SimulatedKernel.boot(tmp_path / "node", prof.kernel, driver_version=driver,
                                  os_id=prof.os_id, os_version=prof.os_version, **kwargs)
    return Node(host, kernel)


def config(**kw: object) -> DriverConfig:
    values: dict[str, object] = {"version": NEW, "validation_timeout": 1.0,
                                 "poll_interval": 0.05}
    values.update(kw)
    return DriverConfig(**values)  # type: ignore[arg-type]


async def _run_until_ready(agent: DriverAgent, node: Node) -> str | None:
    """Run the agent until it marks the node ready, then stop it (SIGTERM); or until it fails.

    Returns what the readiness file held while the agent ran (None: never written).
    """
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await asyncio.sleep(0)  # the agent starts (and drops a stale readiness file)
    seen = None
    for _ in range(250):
        if node.ready:
            seen = node.host.read(READY_FILE)
            break
        if task.done():
            break
        await asyncio.sleep(0.02)
    stop.set()
    await task
    return seen


def run(node: Node, cfg: DriverConfig | None = None) -> str | None:
    """Run the agent on `node` until ready and stop it; what the readiness file held."""
    agent = DriverAgent(cfg or config(), node.host, node.backend)
    return asyncio.run(_run_until_ready(agent, node))


class Recorder(Reporter):
    """What the agent shows on the node, each time it changes."""

    def __init__(self) -> None:
        super().__init__(None, None)
        self.shown: list[list[str]] = []

    async def show(self, refusals: Iterable[Refusal]) -> None:
        refusals = list(refusals)
        self.shown.append([r.message() for r in refusals])
        await super().show(refusals)


def held(node: Node, cfg: DriverConfig | None = None) -> str:
    """Run the agent until it holds the reload; stop it; what it shows as the reason."""
    recorder = Recorder()
    agent = DriverAgent(cfg or config(), node.host, node.backend, reporter=recorder)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        for _ in range(250):
            if (recorder.shown and recorder.shown[-1]) or task.done():
                break
            await asyncio.sleep(0.02)
        stop.set()
        await task

    asyncio.run(scenario())
    assert recorder.shown and recorder.shown[-1], "the agent did not hold the reload"
    assert not node.ready and not any(c.startswith("rmmod") for c in node.backend.commands)
    return "; ".join(recorder.shown[-1])


@pytest.fixture
def cx6dx(tmp_path: Path) -> Node:
    return make_node(tmp_path)


# ------------------------------------------------------------------------------ install


def test_fresh_install_replaces_the_inbox_driver_and_marks_the_node_ready(
    cx6dx: Node, caplog: pytest.LogCaptureFixture
) -> None:
    before = cx6dx.devices()
    assert cx6dx.driver() is None  # inbox mlx5_core has no version file
    seen_ready = []

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(DriverAgent(config(), cx6dx.host, cx6dx.backend).run(stop))
        while not cx6dx.ready:
            assert not task.done(), task.result()
            await asyncio.sleep(0.02)
        seen_ready.append(cx6dx.host.read(READY_FILE))
        stop.set()
        await task

    with caplog.at_level(logging.INFO, "nicop.driver"):
        asyncio.run(scenario())
    assert seen_ready == [NEW]
    assert cx6dx.driver() == NEW
    assert cx6dx.backend.builds == [(NEW, CX6DX.kernel)]  # no precompiled package: built
    assert cx6dx.devices() == before  # same netdevs and RDMA devices, same names
    assert set(loaded_modules(cx6dx.host)) >= {"mlx5_core", "mlx5_ib", "ib_core", "rdma_ucm",
                                               "ib_ipoib", "ib_umad", "mlx_compat"}
    log = caplog.text
    assert "building it from sources" in log
    assert "unloading mlx5_core" in log and "loading mlx5_ib" in log
    assert log.index("unloading ib_core") < log.index("unloading mlx5_core")


def test_precompiled_packages_are_installed_without_a_build(cx6dx: Node) -> None:
    cx6dx.backend.precompiled.add(NEW)
    assert run(cx6dx) == NEW
    assert cx6dx.driver() == NEW
    assert cx6dx.backend.builds == []


def test_node_without_any_driver_gets_its_devices(tmp_path: Path) -> None:
    node = make_node(tmp_path, "cx7-ib", loaded=())
    assert node.devices() == {}
    assert run(node) == NEW
    assert node.driver() == NEW
    assert node.devices() == {"0000:4b:00.0": (("ibp75s0",), ("mlx5_0",))}
    assert node.host.exists("/dev/infiniband/uverbs0")
    assert node.host.exists("/dev/infiniband/rdma_cm")


def test_already_current_driver_is_left_alone(tmp_path: Path) -> None:
    node = make_node(tmp_path, driver="24.10-1.1.4")  # mlx5_core reports 3 parts
    assert run(node) == NEW  # ready
    assert node.backend.commands == []  # no rmmod, no modprobe
    assert node.backend.builds == []


def test_versions_match_as_the_module_reports_them() -> None:
    assert version_matches("24.10-1.1.4", "24.10-1.1.4.0")
    assert version_matches("25.10-1.2.8", "doca3.2.0-25.10-1.2.8.0-1")
    assert version_matches("26.07-1.0.0", "doca3.5.0-26.07-1.0.0.0-0")
    assert not version_matches("26.07-0.7.0", "doca3.5.0-26.07-1.0.0.0-0")
    assert not version_matches("24.07-0.6.1", "24.10-1.1.4.0")
    assert not version_matches(None, "24.10-1.1.4.0")


def test_build_failure_is_reported_and_the_old_driver_keeps_running(cx6dx: Node) -> None:
    cx6dx.backend.fail_build = "mlx5_core/en_main.c:42: error: implicit declaration"
    with pytest.raises(DriverError, match=r"cannot install driver 24.10-1.1.4.0 for kernel "
                       r"6.8.0-45-generic: .*implicit declaration"):
        run(cx6dx)
    assert cx6dx.kernel.is_loaded("mlx5_core") and cx6dx.driver() is None
    assert not cx6dx.ready


def test_create_ifnames_udev_writes_the_naming_rule(cx6dx: Node) -> None:
    run(cx6dx, config(create_ifnames_udev=True))
    rule = cx6dx.host.read("/host/etc/udev/rules.d/77-mlnx-net-names.rules") or ""
    assert 'DRIVERS!="mlx5_core"' in rule and "np[01]" in rule


# ------------------------------------------------------------------------------ blockers


def test_upgrade_blocked_by_a_storage_module_names_it_and_the_switch(tmp_path: Path) -> None:
    node = make_node(tmp_path, driver=OLD)
    node.kernel.modprobe("ib_isert")  # an iSER target serving volumes over RDMA
    message = held(node)
    assert "ib_isert (storage over RDMA) holds" in message
    assert "UNLOAD_STORAGE_MODULES=true" in message
    assert node.backend.builds == []  # refused before a long compile
    assert node.driver() == "24.07-0.6.1.0" and not node.ready
    assert node.kernel.is_loaded("ib_isert")


def test_upgrade_with_unload_storage_modules_reloads_them_from_the_new_driver(
    tmp_path: Path,
) -> None:
    node = make_node(tmp_path, driver=OLD)
    node.kernel.modprobe("ib_isert")
    assert run(node, config(unload_storage_modules=True)) == NEW
    assert node.driver() == NEW
    assert node.kernel.version("ib_isert") == NEW  # back, from the new driver


def test_nfs_over_rdma_needs_enable_nfsrdma_to_come_back(
    cx6dx: Node, caplog: pytest.LogCaptureFixture
) -> None:
    cx6dx.kernel.modprobe("rpcrdma")
    assert re.search(r"rpcrdma \(NFS/NVMe over RDMA\) holds .*ENABLE_NFSRDMA=true", held(cx6dx))
    with caplog.at_level(logging.WARNING, "nicop.driver"):
        run(cx6dx, config(unload_storage_modules=True))
    assert "rpcrdma stays unloaded" in caplog.text
    assert not cx6dx.kernel.is_loaded("rpcrdma")


def test_enable_nfsrdma_loads_the_drivers_nfs_and_nvme_modules(cx6dx: Node) -> None:
    cx6dx.kernel.modprobe("nvme_rdma")
    assert run(cx6dx, config(enable_nfsrdma=True)) == NEW
    assert cx6dx.kernel.version("nvme_rdma") == NEW
    assert cx6dx.kernel.version("rpcrdma") == NEW


def test_third_party_rdma_driver_blocks_unless_allowed(
    cx6dx: Node, caplog: pytest.LogCaptureFixture
) -> None:
    cx6dx.kernel.modprobe("irdma")  # an Intel E810 next to the ConnectX
    assert "irdma (another RDMA driver) holds ib_core; fix: set UNLOAD_THIRD_PARTY_RDMA_" \
        "MODULES=true" in held(cx6dx)
    with caplog.at_level(logging.WARNING, "nicop.driver"):
        run(cx6dx, config(unload_third_party_modules=True))
    assert cx6dx.driver() == NEW
    assert not cx6dx.kernel.is_loaded("irdma")
    assert "irdma stays unloaded" in caplog.text


def test_a_module_no_switch_covers_is_named_with_the_way_out(cx6dx: Node) -> None:
    cx6dx.kernel.modprobe("nvidia_peermem")
    assert re.search(r"nvidia_peermem \(GPUDirect RDMA.*\) holds ib_core and no switch .*"
                     r"\(rmmod nvidia_peermem\)",
                     held(cx6dx, config(unload_storage_modules=True,
                                        unload_third_party_modules=True)))
    assert cx6dx.kernel.is_loaded("nvidia_peermem")


def test_devices_in_use_stop_the_reload_before_anything_is_unloaded(tmp_path: Path) -> None:
    node = make_node(tmp_path, driver=OLD)
    node.kernel.hold("ib_uverbs")  # a training pod has /dev/infiniband/uverbs0 open
    with pytest.raises(DriverError, match=r"ib_uverbs is in use .*drain it"):
        run(node)
    assert not any(c.startswith("rmmod") for c in node.backend.commands)
    assert node.driver() == "24.07-0.6.1.0"
    assert node.kernel.is_loaded("mlx5_ib")


# ------------------------------------------------------------------------------ preflight


def test_a_held_reload_goes_on_by_itself_once_the_cause_is_gone(tmp_path: Path) -> None:
    """A storage module holds the old driver: the agent holds, with no restart, and reloads as
    soon as somebody unloads the module."""
    node = make_node(tmp_path, driver=OLD)
    node.kernel.modprobe("ib_srp")
    recorder = Recorder()
    agent = DriverAgent(config(preflight_interval=0.05), node.host, node.backend,
                        reporter=recorder)

    async def scenario() -> str | None:
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        while not (recorder.shown and recorder.shown[-1]):
            await asyncio.sleep(0.02)
        assert node.driver() == OLD and not node.ready
        node.kernel.rmmod("ib_srp")  # the user's fix
        for _ in range(250):
            if node.ready:
                break
            await asyncio.sleep(0.02)
        seen = node.host.read(READY_FILE)
        stop.set()
        await task
        return seen

    assert asyncio.run(scenario()) == NEW
    assert recorder.shown[-1] == []  # the refusal is taken back
    assert node.driver() == NEW


def mlx5_netdev(node: Node) -> str:
    return sorted(n for f in nic_functions(node.host).values() for n in f.netdevs)[0]


def test_the_management_interface_on_a_connectx_port_holds_the_reload(tmp_path: Path) -> None:
    """The default route goes out of a ConnectX port: unloading mlx5_core would cut the node
    off, so the agent holds and names the interface, the route and the switch."""
    node = make_node(tmp_path, driver=OLD)
    port = mlx5_netdev(node)
    node.host.set_routes({"0.0.0.0/0": port, "10.0.0.0/24": port})
    message = held(node)
    assert f"{port} carries the default route and goes down with mlx5_core" in message
    assert "ALLOW_MANAGEMENT_INTERFACE_RELOAD=true in spec.ofedDriver.env" in message
    assert run(node, config(allow_management_reload=True)) == NEW


def test_the_interface_holding_the_internal_ip_counts_even_without_the_default_route(
        tmp_path: Path) -> None:
    """Management on a ConnectX port with the default route elsewhere: the most specific route
    holding the node's InternalIP names it; a bond over the port is followed to it."""
    node = make_node(tmp_path, driver=OLD)
    port = mlx5_netdev(node)
    node.host.set_routes({"0.0.0.0/0": "eno1", "10.0.0.0/16": "eno1", "10.0.7.0/24": port})
    (refusal,) = preflight.management(node.host, "10.0.7.12", allowed=False)
    assert refusal.cause.startswith(f"{port} holds the node's InternalIP 10.0.7.12")
    assert preflight.management(node.host, "10.0.9.12", allowed=False) == []
    node.host.set_routes({"10.0.7.0/24": "bond0"})
    bond = node.host.path("/sys/class/net/bond0")
    bond.mkdir(parents=True)
    (bond / f"lower_{port}").symlink_to(f"../{port}")
    (refusal,) = preflight.management(node.host, "10.0.7.12", allowed=False)
    assert refusal.cause.startswith(f"bond0 (over {port}) holds the node's InternalIP")


def test_force_precompiled_holds_rather_than_compiles_for_a_kernel_without_packages(
        tmp_path: Path) -> None:
    """forcePrecompiled and no precompiled driver for the running kernel: no build, the old
    driver stays; once packages for the kernel exist the agent installs them."""
    node = make_node(tmp_path, driver=OLD)
    node.backend.precompiled = {NEW}
    node.kernel.withhold_precompiled()
    message = held(node, config(force_precompiled=True))
    assert f"no precompiled driver {NEW} for kernel {node.kernel.release}" in message
    assert "unset spec.ofedDriver.forcePrecompiled" in message
    assert node.backend.builds == [] and node.driver() == OLD
    node.kernel.withhold_precompiled(False)
    assert run(node, config(force_precompiled=True)) == NEW
    assert node.backend.builds == []


# ------------------------------------------------------------------------------ validation


def test_validation_failure_keeps_the_readiness_file_absent(cx6dx: Node) -> None:
    cx6dx.host.path(READY_FILE).parent.mkdir(parents=True)
    cx6dx.host.path(READY_FILE).write_text("24.07\n")  # left over from the last driver
    cx6dx.kernel.fail_probe.add("0000:3b:00.1")  # mlx5_core fails to probe port 1
    with pytest.raises(ValidationFailed) as err:
        run(cx6dx)
    assert "0000:3b:00.1 (had enp59s0f1np1, mlx5_1) is not bound to mlx5_core" in str(err.value)
    assert not cx6dx.ready
    cx6dx.kernel.fail_probe.clear()


def test_module_that_fails_to_load_is_named(cx6dx: Node) -> None:
    cx6dx.kernel.fail_load["mlx5_ib"] = "Unknown symbol in module"
    with pytest.raises(DriverError, match=r"cannot load mlx5_ib: .*Unknown symbol"):
        run(cx6dx)
    assert not cx6dx.ready


def test_vfs_go_with_the_old_driver_and_do_not_fail_validation(cx6dx: Node) -> None:
    cx6dx.host.set_numvfs("enp59s0f0np0", 4)
    assert run(cx6dx) == NEW
    assert cx6dx.host.read("/sys/class/net/enp59s0f0np0/device/sriov_numvfs") == "0"


# ------------------------------------------------------------------------------ stopping


def test_stop_removes_the_readiness_file_and_keeps_the_driver(cx6dx: Node) -> None:
    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(DriverAgent(config(), cx6dx.host, cx6dx.backend).run(stop))
        while not cx6dx.ready:
            await asyncio.sleep(0.02)
        stop.set()  # SIGTERM
        await task

    asyncio.run(scenario())
    assert not cx6dx.ready
    assert cx6dx.driver() == NEW  # without RESTORE_DRIVER_ON_POD_TERMINATION


def test_restore_on_termination_brings_the_inbox_driver_back(cx6dx: Node) -> None:
    before = cx6dx.devices()
    run(cx6dx, config(restore_on_termination=True, create_ifnames_udev=True))
    assert not cx6dx.ready
    assert cx6dx.kernel.is_loaded("mlx5_core") and cx6dx.driver() is None
    assert not cx6dx.kernel.is_loaded("mlx_compat")
    assert cx6dx.devices() == before
    assert not cx6dx.host.exists("/host/etc/udev/rules.d/77-mlnx-net-names.rules")
    assert "modprobe -d /host mlx5_core" in cx6dx.backend.commands


def test_restore_takes_the_new_drivers_nfs_modules_out_and_loads_the_inbox_ones(
    cx6dx: Node,
) -> None:
    cx6dx.kernel.modprobe("rpcrdma")  # an NFS-over-RDMA mount
    assert run(cx6dx, config(enable_nfsrdma=True, restore_on_termination=True)) == NEW
    assert cx6dx.driver() is None
    assert cx6dx.kernel.is_loaded("rpcrdma") and cx6dx.kernel.version("rpcrdma") is None


def test_stop_during_the_build_leaves_the_running_driver_alone(tmp_path: Path) -> None:
    node = make_node(tmp_path, driver=OLD)
    node.backend.build_seconds = 0.5

    async def scenario() -> None:
        stop = asyncio.Event()
        cfg = config(restore_on_termination=True)
        task = asyncio.create_task(DriverAgent(cfg, node.host, node.backend).run(stop))
        while not node.backend.builds:
            await asyncio.sleep(0.01)
        stop.set()
        await task

    asyncio.run(scenario())
    assert node.backend.commands == []  # nothing unloaded, nothing restored
    assert node.driver() == "24.07-0.6.1.0" and not node.ready


# ------------------------------------------------------------------------------ probes


def test_probes_follow_the_agent(cx6dx: Node) -> None:
    host = cx6dx.host
    ok, reason = probe(host, "startup")
    assert not ok and "does not exist" in reason
    assert probe(host, "liveness") == (True, "mlx5_core inbox loaded")
    ok, reason = probe(host, "readiness", version=NEW)
    assert not ok and "validation pending" in reason

    while_ready: list[tuple[bool, str]] = []

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(DriverAgent(config(), host, cx6dx.backend).run(stop))
        while not cx6dx.ready:
            await asyncio.sleep(0.02)
        while_ready.extend([probe(host, "startup"), probe(host, "readiness", version=NEW),
                            probe(host, "readiness", version="25.01-0.6.0.0")])
        stop.set()
        await task

    asyncio.run(scenario())
    assert while_ready == [
        (True, f"driver ready (mlx5_core {NEW} loaded)"),
        (True, f"mlx5_core {NEW} loaded, ready"),
        (False, f"mlx5_core {NEW} loaded, want 25.01-0.6.0.0"),
    ]
    assert probe(host, "startup")[0] is False  # stopped: the file is gone
    for module in ("rdma_ucm", "ib_ipoib", "ib_umad", "mlx5_ib", "mlx5_core"):
        cx6dx.kernel.rmmod(module)
    assert probe(host, "liveness") == (False, "mlx5_core is not loaded")
    assert probe(host, "readiness") == (False, "mlx5_core is not loaded")


# ------------------------------------------------------------------------------ configuration


def test_config_reads_the_upstream_environment() -> None:
    cfg = DriverConfig.from_env({
        "NVIDIA_NIC_DRIVER_VER": NEW, "NODE_NAME": "worker-3",
        "UNLOAD_STORAGE_MODULES": "true", "UNLOAD_THIRD_PARTY_RDMA_MODULES": "True",
        "ENABLE_NFSRDMA": "false", "RESTORE_DRIVER_ON_POD_TERMINATION": "1",
        "CREATE_IFNAMES_UDEV": "true", "STORAGE_MODULES": "ib_isert:nvme_rdma",
        "DRIVER_READY_PATH": "/run/x/.ready",
    })
    assert (cfg.version, cfg.node_name, cfg.ready_file) == (NEW, "worker-3", "/run/x/.ready")
    assert cfg.unload_storage_modules and cfg.unload_third_party_modules
    assert cfg.restore_on_termination and cfg.create_ifnames_udev and not cfg.enable_nfsrdma
    assert cfg.storage_modules == ("ib_isert", "nvme_rdma")
    assert DriverConfig.from_env({"NVIDIA_NIC_DRIVER_VER": OLD}, version=NEW).version == NEW
    with pytest.raises(DriverError, match=r"NVIDIA_NIC_DRIVER_VER or --version"):
        DriverConfig.from_env({})
