"""`nicop rdma-device-plugin`: the RDMA shared device plugin, a drop-in for
Mellanox/k8s-rdma-shared-dev-plugin (same config file, resource names, socket names and Allocate
answer).

Each configList entry is a pool of NICs chosen by selectors, advertised as `rdmaHcaMax` shared
slots ("0", "1", ...) of `<resourcePrefix>/<resourceName>`; a container given any slot gets the
/dev/infiniband character devices of every NIC in the pool, plus rdma_cm. As upstream, a NIC
is shared only if its RDMA device has uverbs and umad and the node has rdma_cm.

Where nicop differs: health is checked per NIC (upstream never changes it). A NIC whose link is
down, that lost its RDMA device, or whose rdma_cm is missing is logged with the reason; the pool's
slots stay Healthy while one of its NICs can serve, and turn Unhealthy only when none can (and
back when one recovers), within a poll interval. Allocate lists rdma_cm once, not once per NIC.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from nicop.node.deviceplugin import api_pb2 as pb
from nicop.node.deviceplugin import cdi
from nicop.node.deviceplugin.config import ConfigError, entry_name, parse, read_json
from nicop.node.deviceplugin.server import (
    AllocationError,
    Device,
    DevicePluginServer,
    ServerSet,
    run_agent,
)
from nicop.node.discovery import Inventory, PciFunction, RdmaDevice, scan
from nicop.node.host import Host
from nicop.node.report import Reporter
from nicop.node.watched import WatchedFile

log = logging.getLogger(__name__)

DEFAULT_CONFIG = Path("/k8s-rdma-shared-dev-plugin/config.json")
DEFAULT_PREFIX = "rdma"
DEFAULT_PERIODIC_UPDATE = 60
RESOURCE_NAME = re.compile(r"^[a-zA-Z0-9_]+$")
# What upstream's --use-cdi writes: kind nvidia.com/net-rdma, one device per NIC by PCI address.
CDI_VENDOR = "nvidia.com"
CDI_CLASS = "net-rdma"
# What each NIC must have to be shared, as upstream requires (with the node's rdma_cm); the module
# that makes each, for the message.
REQUIRED_CHAR_DEVICES = {"uverbs": "ib_uverbs", "umad": "ib_umad"}


class Selectors(BaseModel):
    """OR within a list, AND between lists; values compared exactly, as upstream does."""

    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)

    vendors: list[str] = []
    device_ids: list[str] = Field(default=[], alias="deviceIDs")
    drivers: list[str] = []
    if_names: list[str] = Field(default=[], alias="ifNames")
    link_types: list[str] = Field(default=[], alias="linkTypes")

    @property
    def empty(self) -> bool:
        return not (self.vendors or self.device_ids or self.drivers or self.if_names
                    or self.link_types)

    def matches(self, fn: PciFunction) -> bool:
        """Whether `fn` is selected; every list that is set must contain its value."""
        net = fn.netdev
        return (
            (not self.vendors or fn.vendor in self.vendors)
            and (not self.device_ids or fn.device in self.device_ids)
            and (not self.drivers or fn.driver in self.drivers)
            and (not self.if_names or (net is not None and net.name in self.if_names))
            and (not self.link_types or (net is not None and net.link_type in self.link_types))
        )


class ResourceConfig(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)

    resource_name: str = Field(alias="resourceName")
    resource_prefix: str = Field(default=DEFAULT_PREFIX, alias="resourcePrefix")
    rdma_hca_max: int = Field(default=0, alias="rdmaHcaMax")
    devices: list[str] | None = None  # deprecated: the same as selectors.ifNames
    selectors: Selectors | None = None

    @property
    def full_name(self) -> str:
        return f"{self.resource_prefix or DEFAULT_PREFIX}/{self.resource_name}"


class Config(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)

    periodic_update_interval: int | None = Field(default=None, alias="periodicUpdateInterval")
    config_list: list[ResourceConfig] = Field(alias="configList")

    @property
    def update_interval(self) -> int:
        """Seconds between rediscoveries of the pools' NICs; 0 turns it off."""
        if self.periodic_update_interval is None:
            return DEFAULT_PERIODIC_UPDATE
        return self.periodic_update_interval


def load_config(path: Path) -> Config:
    """Read and check a config file as upstream does; ConfigError names the entry and field."""
    data = read_json(path)
    config = parse(Config, data, path, "configList")
    if config.update_interval < 0:
        raise ConfigError(f"{path}: periodicUpdateInterval: must be 0 (off) or more seconds, "
                          f"got {config.update_interval}")
    if not config.config_list:
        raise ConfigError(f"{path}: configList: no resources configured; add at least one "
                          '{"resourceName": ..., "selectors": {...}}')
    seen: dict[str, ResourceConfig] = {}
    for i, res in enumerate(config.config_list):
        where = f"{path}: {entry_name(data, 'configList', i)}"
        if not RESOURCE_NAME.match(res.resource_name):
            raise ConfigError(
                f"{where}: resourceName: {res.resource_name!r} may contain only letters, digits "
                f"and '_' ({RESOURCE_NAME.pattern}); hyphens are not allowed"
            )
        if res.resource_name in seen:  # the socket is named by resourceName alone
            first = seen[res.resource_name]
            raise ConfigError(
                f"{where}: resourceName: {res.resource_name!r} is already used by "
                f"{first.full_name}; both would serve the socket {res.resource_name}.sock, "
                "whatever their resourcePrefix: give each entry its own resourceName")
        seen[res.resource_name] = res
        if res.rdma_hca_max < 0:
            raise ConfigError(f"{where}: rdmaHcaMax: must be 0 or more, got {res.rdma_hca_max}")
        # As upstream: an empty selectors object or devices list counts as not given.
        selectors = res.selectors if res.selectors and not res.selectors.empty else None
        if res.devices and selectors is not None:
            raise ConfigError(f"{where}: devices: cannot specify both devices and selectors; "
                              "move the names to selectors.ifNames")
        if res.devices:
            log.warning("%s: devices: deprecated, use selectors.ifNames", where)
            selectors = Selectors(ifNames=res.devices)
        if selectors is None:
            raise ConfigError(f"{where}: selectors: required, with at least one of vendors, "
                              "deviceIDs, drivers, ifNames, linkTypes (or the deprecated "
                              "devices list)")
        res.selectors = selectors
    return config


EXCLUSIVE_NETNS = "incorrect RDMA subsystem network namespace"
NETNS_MODE = "/sys/module/ib_core/parameters/netns_mode"


def check_netns_mode(host: Host) -> None:
    """Refuse the RDMA subsystem's exclusive network namespace mode, as upstream does: there an
    RDMA device is visible in one namespace only, so it cannot be shared between pods. A kernel
    without the setting (or without ib_core loaded yet) passes."""
    mode = host.read(NETNS_MODE)
    if mode in ("N", "0"):
        raise ConfigError(
            f"{EXCLUSIVE_NETNS}: the RDMA subsystem is in exclusive mode ({NETNS_MODE} is "
            f"{mode}), where each RDMA device lives in one network namespace and cannot be "
            "shared; run `rdma system set netns shared` on the node, or for exclusive devices "
            "use the SR-IOV device plugin with rdma-cni")


class Pool:
    """One configList entry: its NICs, their health, and what Allocate hands out."""

    def __init__(self, conf: ResourceConfig, host: Host | None = None,
                 use_cdi: bool = False) -> None:
        self.conf = conf
        self.host = host
        self.use_cdi = use_cdi
        self.resource_name = conf.full_name
        self.socket_name = f"{conf.resource_name}.sock"
        self.members: list[str] = []  # PCI addresses
        self._inventory: Inventory | None = None
        self._problems: dict[str, str] = {}

    def refresh(self, inv: Inventory) -> None:
        """Rediscover the pool's NICs: those the selectors match whose RDMA device has every
        character device a pod needs (or had them: a NIC that loses one stays in the pool,
        unhealthy, until it comes back). Upstream leaves a NIC out the same way, so a pool
        whose NICs all lack one (often rdma_cm, before rdma_ucm is loaded) advertises nothing."""
        assert self.conf.selectors is not None
        members = []
        for fn in inv.network_functions():
            if not self.conf.selectors.matches(fn):
                continue
            missing = _missing(fn, inv)
            if missing is None or fn.address in self.members:
                members.append(fn.address)
                if fn.address not in self.members:
                    self._set_up(fn)
            else:
                log.info("%s: %s matches but %s; skipped", self.resource_name, _describe(fn),
                         missing, extra={"resource": self.resource_name})
        if members != self.members:
            log.info("%s: NICs %s", self.resource_name,
                     ", ".join(_describe(inv.functions[a]) for a in members) or "none",
                     extra={"resource": self.resource_name})
        self.members = members

    def _set_up(self, fn: PciFunction) -> None:
        """Bring a NIC's netdev administratively up when it joins the pool, as upstream does at
        start (RDMA traffic over RoCE needs the netdev up)."""
        net = fn.netdev
        if self.host is None or net is None or self.host.link_admin_up(net.name) is not False:
            return
        try:
            self.host.set_link_up(net.name)
            log.info("%s: set link %s up", self.resource_name, net.name,
                     extra={"resource": self.resource_name})
        except OSError as e:
            log.warning("%s: cannot set link %s up: %s", self.resource_name, net.name, e,
                        extra={"resource": self.resource_name})

    def devices(self, inv: Inventory) -> list[Device]:
        """The shared slots: Healthy while at least one NIC of the pool can serve."""
        self._inventory = inv
        problems = {a: p for a in self.members if (p := _problem(inv, a))}
        for address, problem in problems.items():
            if self._problems.get(address) != problem:
                log.warning("%s: %s: %s", self.resource_name, address, problem,
                        extra={"resource": self.resource_name})
        for address in self._problems.keys() - problems.keys():
            log.info("%s: %s recovered", self.resource_name, address,
                     extra={"resource": self.resource_name})
        self._problems = problems
        if not self.members:
            return []
        healthy = len(problems) < len(self.members)
        return [Device(str(i), healthy=healthy) for i in range(self.conf.rdma_hca_max)]

    def char_devices(self) -> dict[str, list[str]]:
        """Per NIC of the pool that can serve (by PCI address), the character devices of its
        complete RDMA devices; none without the node's rdma_cm."""
        inv = self._inventory
        result: dict[str, list[str]] = {}
        if inv is None or inv.rdma_cm is None:
            return result
        for address in self.members:
            fn = inv.functions.get(address)
            paths = [p for r in (fn.rdma if fn else ()) if _complete(r) for p in r.dev_nodes]
            if paths:
                result[address] = paths
        return result

    def cdi_devices(self) -> dict[str, list[str]]:
        """The devices of the pool's CDI spec: each NIC's character devices and rdma_cm."""
        inv = self._inventory
        rdma_cm = inv.rdma_cm if inv is not None else None
        return {a: [*paths, rdma_cm] for a, paths in self.char_devices().items() if rdma_cm}

    @property
    def cdi_file(self) -> str:
        return f"{CDI_VENDOR}_{self.conf.resource_name}"

    def allocate(self, ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        """Every character device of every NIC of the pool that can serve, each once, then
        rdma_cm; with CDI, a reference to each such NIC of the pool's spec."""
        found = self.char_devices()
        if not found:
            raise AllocationError("no NIC of this pool has all its RDMA character devices "
                                  "(uverbs, umad and the node's rdma_cm)")
        if self.use_cdi:
            return cdi.response(CDI_VENDOR, CDI_CLASS, list(found))
        assert self._inventory is not None and self._inventory.rdma_cm is not None
        paths = [p for nic in found.values() for p in nic] + [self._inventory.rdma_cm]
        return pb.ContainerAllocateResponse(devices=[
            pb.DeviceSpec(container_path=p, host_path=p, permissions="rwm")
            for p in dict.fromkeys(paths)
        ])


def _complete(rdma: RdmaDevice) -> bool:
    kinds = {p.rsplit("/", 1)[-1].rstrip("0123456789") for p in rdma.dev_nodes}
    return all(k in kinds for k in REQUIRED_CHAR_DEVICES)


def _missing(fn: PciFunction, inv: Inventory) -> str | None:
    """What a NIC lacks to be shared (an RDMA device with uverbs and umad, and the node's
    rdma_cm), with the module that provides it; None when it has everything."""
    if not fn.rdma:
        return "no RDMA device (is mlx5_ib loaded?)"
    if not any(_complete(r) for r in fn.rdma):
        kinds = {p.rsplit("/", 1)[-1].rstrip("0123456789") for r in fn.rdma
                 for p in r.dev_nodes}
        lacking = [k for k in REQUIRED_CHAR_DEVICES if k not in kinds]
        return (f"{','.join(r.name for r in fn.rdma)} has no "
                + " and no ".join(f"/dev/infiniband/{k}* (is {REQUIRED_CHAR_DEVICES[k]} loaded?)"
                                  for k in lacking))
    if inv.rdma_cm is None:
        return "/dev/infiniband/rdma_cm is missing (is rdma_ucm loaded?)"
    return None


def _problem(inv: Inventory, address: str) -> str | None:
    """Why a NIC cannot serve RDMA right now, or None."""
    fn = inv.functions.get(address)
    if fn is None:
        return "the PCI device is gone"
    missing = _missing(fn, inv)
    if missing is not None:
        return missing
    net = fn.netdev
    if net is not None and not net.up:
        return f"link {net.name} is {net.operstate}"
    if net is None and fn.rdma[0].port_state not in ("ACTIVE", ""):
        return f"port 1 of {fn.rdma[0].name} is {fn.rdma[0].port_state}"
    return None


def _describe(fn: PciFunction) -> str:
    rdma = ",".join(r.name for r in fn.rdma)
    return f"{fn.address} ({fn.netdev.name if fn.netdev else 'no netdev'}" + (
        f", {rdma})" if rdma else ")")


class RdmaAgent:
    """The agent process: one server per pool, health checked every poll interval."""

    def __init__(
        self, config: Config, host: Host, socket_dir: Path, poll_interval: float = 0.5, *,
        config_path: Path | None = None, reporter: Reporter | None = None,
        use_cdi: bool = False,
    ) -> None:
        """With `config_path`, the file is read again when it changes: a valid one replaces the
        running config, an invalid or unreadable one is reported and the running one kept.
        With `use_cdi`, each pool's NICs are described in a CDI spec file and Allocate refers
        to them."""
        self.host = host
        self.config = config
        self.socket_dir = socket_dir
        self.poll_interval = poll_interval
        self.use_cdi = use_cdi
        self.cdi = cdi.SpecFiles(host)
        self.pools = [Pool(c, host, use_cdi) for c in config.config_list]
        self.servers = ServerSet()
        self.reporter = reporter or Reporter()
        self._watched = WatchedFile(config_path) if config_path else None
        if self._watched:
            self._watched.changed()  # what was loaded
        self._bad: str | None = None
        self._next_refresh = 0.0

    async def run(self, stop: asyncio.Event) -> None:
        if self.use_cdi:  # a previous run's (only this plugin's: other nvidia.com specs stay)
            self.cdi.remove(p.cdi_file for p in self.pools)
        for pool in self.pools:
            self._serve(pool)
        try:
            await run_agent(self.servers, self.tick, self.poll_interval, stop)
        finally:
            self.cdi.clear()
            await self.reporter.close()

    def _serve(self, pool: Pool) -> None:
        self.servers.start(DevicePluginServer(
            pool.resource_name, self.socket_dir, pool.socket_name, pool.allocate,
            poll_interval=self.poll_interval,
        ))

    async def reload(self) -> None:
        """Take a changed config file: pools added, changed or removed; servers with it."""
        assert self._watched is not None
        try:
            config = load_config(self._watched.path)
        except ConfigError as e:
            if self._bad != str(e):
                self._bad = str(e)
                await self.reporter.warn("ConfigInvalid", f"{e}; still serving the last good "
                                         "config")
            return
        if self._bad is not None:
            self._bad = None
            await self.reporter.info("ConfigLoaded", f"{self._watched.path} is valid again")
        if config == self.config:
            return
        log.info("config %s changed: resources %s", self._watched.path,
                 ", ".join(c.full_name for c in config.config_list))
        old = {p.resource_name: p for p in self.pools}
        self.config = config
        self.pools = [Pool(c, self.host, self.use_cdi) for c in config.config_list]
        for name in old.keys() - {p.resource_name for p in self.pools}:
            await self.servers.stop(name)
        for pool in self.pools:
            server = self.servers.servers.get(pool.resource_name)
            if server is None:
                self._serve(pool)
            else:
                server.allocate = pool.allocate
        self._next_refresh = 0.0  # find the new pools' NICs now

    async def tick(self) -> Inventory:
        """Health of the pools' NICs every tick; which NICs they hold every update interval.
        Returns what the scan saw."""
        if self._watched is not None and self._watched.changed():
            await self.reload()
        now = asyncio.get_running_loop().time()
        if now >= self._next_refresh:
            inv = scan(self.host)
            for pool in self.pools:
                pool.refresh(inv)
            interval = self.config.update_interval
            self._next_refresh = now + interval if interval else float("inf")
        else:
            inv = scan(self.host, only={a for p in self.pools for a in p.members})
        for pool in self.pools:
            devices = pool.devices(inv)
            if self.use_cdi:  # before the kubelet can hand a slot out
                self.cdi.write(pool.cdi_file, f"{CDI_VENDOR}/{CDI_CLASS}", pool.cdi_devices())
            self.servers.servers[pool.resource_name].update(devices)
        if self.use_cdi:
            self.cdi.keep(p.cdi_file for p in self.pools)
        return inv
