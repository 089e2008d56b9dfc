"""`nicop sriov-device-plugin`: the SR-IOV network device plugin, a drop-in for
k8snetworkplumbingwg/sriov-network-device-plugin (same config file, resource and socket names,
environment variables, device specs and device-info files).

Each resourceList entry is a pool of devices chosen by selectors: VFs and PFs without VFs
(`netDevice`), scalable functions (`auxNetDevice`), or accelerators; every device is advertised
with its ID (PCI address or auxiliary device name) and NUMA node, and is given to one container.

Where nicop differs: the host is rescanned every poll interval, so VFs created or removed later
appear or vanish without a restart; the config file is reloaded when it changes (an invalid new
config is logged and the running one kept); a device whose PF link is down is Unhealthy; an entry
that cannot be served is skipped and reported as an Event on the agent's pod while the others are
served (upstream exits on a repeated resource name, for one); in CDI mode a device without
device nodes (a VF on its kernel driver) is left out of the spec instead of making it invalid;
`pfNames`/`rootDevices` items naming one PF twice add up (upstream uses the first only);
uio_pci_generic devices get their /dev/uioN as igb_uio ones do.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nicop.node.deviceplugin import api_pb2 as pb
from nicop.node.deviceplugin import cdi
from nicop.node.deviceplugin.config import (
    ConfigError,
    dotted,
    entry_name,
    parse,
    parse_part,
    read_json,
)
from nicop.node.deviceplugin.ddp import Profiles
from nicop.node.deviceplugin.server import (
    AllocationError,
    Device,
    DevicePluginServer,
    ServerSet,
    run_agent,
)
from nicop.node.discovery import (
    ACCELERATOR_CLASS,
    PCI_DEVICES,
    AuxDevice,
    Inventory,
    Netdev,
    PciFunction,
    RdmaDevice,
    scan,
)
from nicop.node.host import Host
from nicop.node.report import Reporter

log = logging.getLogger(__name__)

DEFAULT_CONFIG = Path("/etc/pcidp/config.json")
DEFAULT_PREFIX = "intel.com"
DEVICE_INFO_DIR = "/var/run/k8s.cni.cncf.io/devinfo/dp"
DEVICE_INFO_VERSION = "1.1.0"
RESOURCE_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")
DEVICE_TYPES = ("netDevice", "accelerator", "auxNetDevice")
VHOST_DEVICES = ("/dev/vhost-net", "/dev/net/tun")
VFIO_CONTAINER = "/dev/vfio/vfio"
# Drivers whose device is a /dev/uioN: upstream's two, and uio_pci_generic, whose devices upstream
# hands out without their uioN.
UIO_DRIVERS = ("uio", "igb_uio", "uio_pci_generic")
RDMA_INFO_KEYS = ("uverbs", "umad", "issm")  # with rdma_cm and rdma_dev: upstream's rdma entry
_PF_ITEM = re.compile(r"^([^#]+)(?:#(\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*))?$")


# ----------------------------------------------------------------------------- config

class Selectors(BaseModel):
    """Fields every deviceType has; within a list OR, between fields AND. An object without any
    field (`{}`) takes every device of its deviceType, as upstream's."""

    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)

    vendors: list[str] = []
    devices: list[str] = []
    drivers: list[str] = []


class AccelSelectors(Selectors):
    pci_addresses: list[str] = Field(default=[], alias="pciAddresses")


class _NetworkSelectors(Selectors):
    """Fields of the two network deviceTypes."""

    pf_names: list[str] = Field(default=[], alias="pfNames")
    root_devices: list[str] = Field(default=[], alias="rootDevices")
    link_types: list[str] = Field(default=[], alias="linkTypes")
    # Upstream's field has no json tag: "IsRdma" (what operators write) and "isRdma" both work.
    is_rdma: bool = Field(default=False, alias="isRdma")
    need_vhost_net: bool = Field(default=False, alias="needVhostNet")
    acpi_indexes: list[str] = Field(default=[], alias="acpiIndexes")


class NetSelectors(_NetworkSelectors):
    pci_addresses: list[str] = Field(default=[], alias="pciAddresses")
    p_keys: list[str] = Field(default=[], alias="pKeys")
    ddp_profiles: list[str] = Field(default=[], alias="ddpProfiles")
    vdpa_type: str = Field(default="", alias="vdpaType")


class AuxSelectors(_NetworkSelectors):
    aux_types: list[str] = Field(default=[], alias="auxTypes")


SELECTOR_MODELS: dict[str, type[Selectors]] = {
    "netDevice": NetSelectors, "auxNetDevice": AuxSelectors, "accelerator": AccelSelectors,
}
VDPA_TYPES = ("vhost", "virtio")
VDPA_DRIVERS = {"vhost_vdpa": "vhost", "virtio_vdpa": "virtio"}


class ResourceConfig(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)

    resource_name: str = Field(alias="resourceName")
    resource_prefix: str = Field(default="", alias="resourcePrefix")
    device_type: str = Field(default="netDevice", alias="deviceType")
    exclude_topology: bool = Field(default=False, alias="excludeTopology")
    selectors: Any = None  # one object or a list; checked against the deviceType's fields
    # None when the config has none: upstream gives every device an "extra" entry (empty when
    # neither "*" nor the device's ID is listed) as soon as the config has an additionalInfo.
    additional_info: dict[str, dict[str, str]] | None = Field(default=None, alias="additionalInfo")


class Config(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)

    resource_list: list[Any] = Field(alias="resourceList")  # entries checked one by one


@dataclass(frozen=True)
class Resource:
    """A checked resourceList entry."""

    name: str  # <prefix>/<resourceName>
    conf: ResourceConfig
    selectors: tuple[Selectors, ...]

    @property
    def prefix(self) -> str:
        return self.name.split("/")[0]

    @property
    def socket_name(self) -> str:
        return f"{self.prefix}_{self.conf.resource_name}.sock"

    @property
    def env_name(self) -> str:
        return f"PCIDEVICE_{self.prefix}_{self.conf.resource_name}".replace(".", "_").upper()

    @property
    def cdi_kind(self) -> str:
        """The CDI class of the pool's devices, as upstream names it."""
        return CDI_KINDS[self.conf.device_type]


CDI_KINDS = {"netDevice": "net-pci", "accelerator": "net-accel", "auxNetDevice": "net-sf"}
CDI_FILE_PREFIX = "sriov-dp-"


@dataclass(frozen=True)
class LoadedConfig:
    """The usable entries of a config file, and why the others were skipped."""

    resources: list[Resource]
    skipped: list[str]


def load_config(path: Path, default_prefix: str = DEFAULT_PREFIX) -> LoadedConfig:
    """Read and check a config file. An entry that is wrong or asks for what cannot be served is
    skipped with the reason (naming the entry and the field), and the others are served; a file
    that is not a config at all, or has no usable entry, is a ConfigError."""
    data = read_json(path)
    config = parse(Config, data, path, "resourceList")
    if not config.resource_list:
        raise ConfigError(f"{path}: resourceList: no resources configured")
    resources: list[Resource] = []
    skipped: list[str] = []
    for i, raw in enumerate(config.resource_list):
        where = f"{path}: {entry_name(data, 'resourceList', i)}"
        try:
            resource = _resource(raw, where, default_prefix)
            if any(r.name == resource.name for r in resources):
                raise ConfigError(f"{where}: resourceName: {resource.name} is defined twice; "
                                  "the first definition is served")
        except ConfigError as e:
            log.warning("%s; entry skipped", e)
            skipped.append(str(e))
            continue
        resources.append(resource)
    if not resources:
        raise ConfigError("; ".join(skipped) + " (no usable resource left)")
    return LoadedConfig(resources, skipped)


def _resource(raw: Any, where: str, default_prefix: str) -> Resource:
    conf = parse_part(ResourceConfig, raw, lambda loc: f"{where}: {dotted(loc)}")
    if not RESOURCE_NAME.match(conf.resource_name):
        raise ConfigError(f"{where}: resourceName: {conf.resource_name!r} may contain only "
                          f"letters, digits, '_' and '-' ({RESOURCE_NAME.pattern})")
    if conf.device_type not in DEVICE_TYPES:
        raise ConfigError(f"{where}: deviceType: {conf.device_type!r} is not one of "
                          f"{', '.join(DEVICE_TYPES)}")
    name = f"{conf.resource_prefix or default_prefix}/{conf.resource_name}"
    return Resource(name, conf, _selectors(conf, where))


def _selectors(conf: ResourceConfig, where: str) -> tuple[Selectors, ...]:
    raw = conf.selectors
    items = [raw] if isinstance(raw, dict) else raw
    if not isinstance(items, list):
        raise ConfigError(f"{where}: selectors: required, an object or a list of objects, "
                          "e.g. {\"vendors\": [\"15b3\"], \"devices\": [\"101e\"]}")
    if not items:
        raise ConfigError(f"{where}: selectors: an empty list selects no device")
    model = SELECTOR_MODELS[conf.device_type]
    result: list[Selectors] = []
    for j, item in enumerate(items):
        at = "selectors" if isinstance(raw, dict) else f"selectors[{j}]"

        def place(loc: tuple[Any, ...], at: str = at) -> str:
            return f"{where}: {dotted((at, *loc))}"

        sel = parse_part(model, item, place)
        if isinstance(sel, _NetworkSelectors):
            for field, values in (("pfNames", sel.pf_names), ("rootDevices", sel.root_devices)):
                for k, value in enumerate(values):
                    if problem := _pf_item_problem(value):
                        log.warning("%s: %s.%s[%d]: %s; it matches no device", where, at, field,
                                    k, problem)
        if isinstance(sel, NetSelectors):
            if sel.vdpa_type and sel.vdpa_type not in VDPA_TYPES:
                raise ConfigError(f"{where}: {at}.vdpaType: {sel.vdpa_type!r} is not one of "
                                  f"{', '.join(VDPA_TYPES)}")
            if sel.vdpa_type and sel.is_rdma:
                raise ConfigError(f"{where}: {at}: isRdma and vdpaType cannot be used together "
                                  "(a vDPA device has no RDMA device); remove one")
        if isinstance(sel, AuxSelectors) and (not sel.aux_types or set(sel.aux_types) - {"sf"}):
            raise ConfigError(f"{where}: {at}.auxTypes: must be [\"sf\"] (scalable functions), "
                              f"got {json.dumps(sel.aux_types)}")
        result.append(sel)
    return tuple(result)


def _pf_item_problem(value: str) -> str | None:
    """Why a `pfNames`/`rootDevices` item such as `ens1f0#0-3,7` is malformed, or None."""
    if _PF_ITEM.match(value) is None:
        return f"{value!r} is not <PF>[#<i>,<a>-<b>,...]"
    for part in value.partition("#")[2].split(",") if "#" in value else ():
        first, _, last = part.partition("-")
        if last and int(first) > int(last):
            return f"range {part} in {value!r} runs backwards (write {last}-{first})"
    return None


def _index_sets(values: Sequence[str]) -> dict[str, set[int] | None]:
    """`["ens1f0#0-3,7", "ens1f1"]` -> {"ens1f0": {0, 1, 2, 3, 7}, "ens1f1": None (all)}; a
    malformed item takes no index."""
    result: dict[str, set[int] | None] = {}
    for value in values:
        name, _, spec = value.partition("#")
        taken: set[int] = set()
        if _PF_ITEM.match(value) is not None and not spec:
            result[name.lower()] = None
            continue
        if _PF_ITEM.match(value) is not None:  # else malformed: matches nothing
            for part in spec.split(","):
                first, _, last = part.partition("-")
                taken.update(range(int(first), int(last or first) + 1))
        current = result.get(name.lower(), set())
        if current is not None:
            result[name.lower()] = current | taken
    return result


# ----------------------------------------------------------------------------- devices

@dataclass(frozen=True)
class Candidate:
    """A device a pool may take, with what the selectors look at."""

    id: str
    vendor: str
    device: str
    driver: str | None
    numa_node: int
    pci: PciFunction | None  # None for auxiliary devices
    pf: PciFunction | None
    index: int | None  # VF index, or SF number
    netdev: Netdev | None
    link: Netdev | None  # the netdev whose link decides health (the PF's, for a VF)
    rdma: tuple[RdmaDevice, ...]
    acpi_index: str | None
    aux_type: str | None = None  # "sf" for a scalable function

    @property
    def link_type(self) -> str:
        for net in (self.netdev, self.link):
            if net is not None and net.link_type:
                return net.link_type
        return ""


def candidates(inv: Inventory, device_type: str) -> list[Candidate]:
    if device_type == "auxNetDevice":
        return [_aux_candidate(inv, aux) for aux in inv.aux.values()
                if aux.parent in inv.functions]
    if device_type == "accelerator":
        return [_pci_candidate(inv, fn) for fn in inv.functions.values()
                if fn.base_class == ACCELERATOR_CLASS and fn.driver]
    result = []
    for fn in inv.network_functions():
        if not fn.driver:
            continue  # unbound: nothing can use it
        if fn.total_vfs is not None and fn.num_vfs > 0:
            continue  # a PF whose VFs are configured is not handed out itself
        if any(n.name in inv.default_route_ifaces for n in fn.netdevs):
            log.debug("%s carries the default route; not offered", fn.address)
            continue
        result.append(_pci_candidate(inv, fn))
    return result


def _pci_candidate(inv: Inventory, fn: PciFunction) -> Candidate:
    pf = inv.functions.get(fn.pf) if fn.pf else None
    return Candidate(
        id=fn.address, vendor=fn.vendor, device=fn.device, driver=fn.driver,
        numa_node=fn.numa_node, pci=fn, pf=pf, index=fn.vf_index, netdev=fn.netdev,
        link=inv.pf_netdev(fn), rdma=fn.rdma, acpi_index=fn.acpi_index,
    )


def _aux_candidate(inv: Inventory, aux: AuxDevice) -> Candidate:
    parent = inv.functions[aux.parent]
    return Candidate(
        id=aux.name, vendor=parent.vendor, device=parent.device, driver=parent.driver,
        numa_node=parent.numa_node, pci=None, pf=parent, index=aux.sfnum,
        netdev=aux.netdevs[0] if aux.netdevs else None, link=parent.netdev, rdma=aux.rdma,
        acpi_index=None, aux_type=aux.type,
    )


def selects(sel: Selectors, c: Candidate, host: Host, ddp: Profiles | None = None) -> bool:
    """Whether selector object `sel` takes candidate `c` (AND of every field that is set, in
    upstream's order, so that DDP profiles are asked for only when the rest matched)."""
    if sel.vendors and c.vendor not in sel.vendors:
        return False
    if sel.devices and c.device not in sel.devices:
        return False
    if sel.drivers and c.driver not in sel.drivers:
        return False
    if isinstance(sel, AccelSelectors | NetSelectors) and sel.pci_addresses \
            and c.id not in sel.pci_addresses:
        return False
    if not isinstance(sel, _NetworkSelectors):
        return True
    if isinstance(sel, NetSelectors) and sel.acpi_indexes and c.acpi_index not in sel.acpi_indexes:
        return False
    if isinstance(sel, AuxSelectors) and c.aux_type not in sel.aux_types:
        return False
    if sel.pf_names and not _in_pf(sel.pf_names, c.pf.netdev.name if c.pf and c.pf.netdev
                                   else None, c.index):
        return False
    if sel.root_devices and not _in_pf(sel.root_devices, c.pf.address if c.pf else None,
                                       c.index):
        return False
    if sel.link_types and c.link_type not in sel.link_types:
        return False
    if isinstance(sel, NetSelectors) and sel.ddp_profiles and (
            c.pci is None or (ddp or Profiles()).get(c.id) not in sel.ddp_profiles):
        return False
    if isinstance(sel, NetSelectors) and sel.p_keys and pkey(c) not in sel.p_keys:
        return False
    if sel.is_rdma and not any(r.usable for r in c.rdma):
        return False
    if isinstance(sel, NetSelectors) and sel.vdpa_type:
        found = vdpa(host, c)
        return found is not None and found.type == sel.vdpa_type
    return True


def pkey(c: Candidate) -> str | None:
    """The InfiniBand partition key at index 0 of an IB device's first RDMA device (what
    `pKeys` compares, as written in sysfs); Ethernet devices have none, whatever their RDMA
    device's table holds."""
    if c.pci is None or c.link_type != "infiniband" or not c.rdma:
        return None
    return c.rdma[0].pkey


@dataclass(frozen=True)
class Vdpa:
    """A vDPA device on a PCI function."""

    name: str  # vdpa0: the vdpa bus device, "parent-device" in the device-info file
    type: str  # vhost or virtio, by the vdpa bus driver it is bound to
    path: str | None  # /dev/vhost-vdpa-N, for vhost


def vdpa(host: Host, c: Candidate) -> Vdpa | None:
    """The vDPA device of a PCI function, if it has one bound to vhost_vdpa or virtio_vdpa."""
    if c.pci is None:
        return None
    base = f"{PCI_DEVICES}/{c.id}"
    for entry in host.listdir(base):
        kind = VDPA_DRIVERS.get(host.link_name(f"{base}/{entry}/driver") or "")
        if entry.startswith("vdpa") and kind:
            chars = [e for e in host.listdir(f"{base}/{entry}") if e.startswith("vhost-vdpa-")]
            path = f"/dev/{chars[0]}" if chars and kind == "vhost" else None
            return Vdpa(entry, kind, path)
    return None


def _in_pf(values: Sequence[str], pf: str | None, index: int | None) -> bool:
    if pf is None or index is None:
        return False  # PFs themselves, and VFs without a PF (in a VM), never match
    wanted = _index_sets(values)
    if pf.lower() not in wanted:
        return False
    indexes = wanted[pf.lower()]
    return indexes is None or index in indexes


@dataclass(frozen=True)
class Taken:
    """A device in a pool, with the selector flags that decide what Allocate gives."""

    candidate: Candidate
    rdma: bool
    vhost: bool  # the selector asks for vhost-net and /dev/vhost-net exists
    vdpa: Vdpa | None = None  # the selector asks for this vDPA type and the device has it


class Pool:
    """One resource: the devices its selectors took in the last scan, and Allocate."""

    def __init__(self, resource: Resource, host: Host, use_cdi: bool = False,
                 ddp: Profiles | None = None) -> None:
        self.resource = resource
        self.host = host
        self.use_cdi = use_cdi
        self.ddp = ddp or Profiles()
        self.devices: dict[str, Taken] = {}
        self.rdma_cm: str | None = None
        self._no_vhost_net_warned = False

    def select(self, inv: Inventory, found: list[Candidate], taken: set[str]) -> list[Device]:
        """Take matching candidates not `taken` by an earlier pool; returns the device list."""
        self.rdma_cm = inv.rdma_cm
        devices: dict[str, Taken] = {}
        for sel in self.resource.selectors:
            for c in found:
                if c.id in taken or c.id in devices:
                    continue
                if selects(sel, c, self.host, self.ddp):
                    devices[c.id] = self._taken(sel, c)
        taken.update(devices)
        if devices.keys() != self.devices.keys():
            log.info("%s: devices %s", self.resource.name, ", ".join(devices) or "none",
                     extra={"resource": self.resource.name})
        self.devices = devices
        exclude = self.resource.conf.exclude_topology
        return [
            Device(
                t.candidate.id,
                healthy=_healthy(t),
                numa_node=None if exclude or t.candidate.numa_node < 0 else t.candidate.numa_node,
            )
            for t in devices.values()
        ]

    def _taken(self, sel: Selectors, c: Candidate) -> Taken:
        """`c` as selector object `sel` took it: which extras Allocate gives with it."""
        if not isinstance(sel, _NetworkSelectors):
            return Taken(c, rdma=False, vhost=False)
        vhost = sel.need_vhost_net and self.host.exists(VHOST_DEVICES[0])
        if sel.need_vhost_net and not vhost and not self._no_vhost_net_warned:
            log.warning("%s: needVhostNet is set but %s does not exist (is vhost_net loaded?); "
                        "its devices are given without it", self.resource.name,
                        VHOST_DEVICES[0], extra={"resource": self.resource.name})
            self._no_vhost_net_warned = True
        found = vdpa(self.host, c) if isinstance(sel, NetSelectors) and sel.vdpa_type else None
        return Taken(c, rdma=sel.is_rdma and found is None, vhost=vhost, vdpa=found)

    def allocate(self, ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        specs: dict[str, pb.DeviceSpec] = {}
        info: dict[str, dict[str, dict[str, str]]] = {}
        for device_id in ids:
            t = self.devices.get(device_id)
            if t is None:
                raise AllocationError(f"device {device_id} is no longer in the pool")
            info[device_id] = self._device(t, specs)
        if self.resource.conf.device_type == "netDevice":
            for device_id in ids:
                self._write_device_info(self.devices[device_id])
        env = self.resource.env_name
        envs = {env: ",".join(ids), f"{env}_INFO": json.dumps(info, sort_keys=True)}
        if self.use_cdi:  # the devices' nodes are in the spec file; refer to those that have any
            nodes = self.cdi_devices()
            return cdi.response(self.resource.prefix, self.resource.cdi_kind,
                                [i for i in ids if i in nodes], envs)
        return pb.ContainerAllocateResponse(
            envs=envs,
            devices=list(specs.values()),
        )

    def _device(self, t: Taken, specs: dict[str, pb.DeviceSpec]) -> dict[str, dict[str, str]]:
        """Add the device's specs; returns its entry of the _INFO variable."""
        c = t.candidate

        def add(host_path: str, container_path: str | None = None) -> None:
            specs.setdefault(host_path, pb.DeviceSpec(
                host_path=host_path, container_path=container_path or host_path,
                permissions="rw"))

        info: dict[str, dict[str, str]] = {"generic": {"deviceID": c.id}}
        if c.driver == "vfio-pci" and c.pci is not None:
            add(VFIO_CONTAINER)
            info["vfio"] = {"mount": VFIO_CONTAINER}
            group = c.pci.iommu_group
            if group is not None:  # else (no IOMMU group) only the container device, as upstream
                name = self.host.read(f"/sys/kernel/iommu_groups/{group}/name")
                add(f"/dev/vfio/noiommu-{group}" if name == "vfio-noiommu"
                    else f"/dev/vfio/{group}", f"/dev/vfio/{group}")
                info["vfio"]["dev-mount"] = f"/dev/vfio/{group}"
        elif c.driver in UIO_DRIVERS and c.pci is not None:
            entries = self.host.listdir(f"{PCI_DEVICES}/{c.id}/uio")
            info["uio"] = {}
            if entries:  # one uioN per device
                add(f"/dev/{entries[0]}")
                info["uio"]["mount"] = f"/dev/{entries[0]}"
        if t.vdpa is not None:
            info["vdpa"] = {}
            if t.vdpa.path:
                add(t.vdpa.path)
                info["vdpa"]["mount"] = t.vdpa.path
        elif t.rdma:
            rdma: dict[str, str] = {}
            for dev in c.rdma:
                for path in dev.char_devices:
                    add(path)
                    kind = path.rsplit("/", 1)[1].rstrip("0123456789")
                    if kind in RDMA_INFO_KEYS:
                        rdma.setdefault(kind, path)
            if self.rdma_cm:
                add(self.rdma_cm)
                rdma["rdma_cm"] = self.rdma_cm
            if c.rdma:
                rdma["rdma_dev"] = c.rdma[0].name
            info["rdma"] = rdma
        if t.vhost:
            if all(self.host.exists(p) for p in VHOST_DEVICES):
                for path in VHOST_DEVICES:
                    add(path)
            info["vhost"] = {"net-mount": VHOST_DEVICES[0], "tun-mount": VHOST_DEVICES[1]}
        extra = self.resource.conf.additional_info
        if extra is not None:
            info["extra"] = {**extra.get("*", {}), **extra.get(c.id, {})}
        return info

    def cdi_devices(self) -> dict[str, list[str]]:
        """Each device's nodes, for the CDI spec; devices without any (a VF on its kernel
        driver) are left out, as a CDI device must change something."""
        result = {}
        for device_id, t in self.devices.items():
            specs: dict[str, pb.DeviceSpec] = {}
            self._device(t, specs)
            if specs:
                result[device_id] = list(specs)
        return result

    @property
    def cdi_file(self) -> str:
        """The spec file name upstream uses: sriov-dp-<vendor>-<class>-<resourceName>."""
        r = self.resource
        return f"{CDI_FILE_PREFIX}{r.prefix}-{r.cdi_kind}-{r.conf.resource_name}"

    def device_info_path(self, device_id: str) -> str:
        name = self.resource.name.replace("/", "-")
        return f"{DEVICE_INFO_DIR}/{name}-{device_id.replace('/', '-')}-device.json"

    def _write_device_info(self, t: Taken) -> None:
        """The device-info spec file the CNI reads; replaced on every Allocate."""
        info: dict[str, Any]
        if t.vdpa is not None:
            vdpa_info = {"parent-device": t.vdpa.name, "driver": t.vdpa.type}
            if t.vdpa.path:
                vdpa_info["path"] = t.vdpa.path
            vdpa_info["pci-address"] = t.candidate.id
            info = {"type": "vdpa", "version": DEVICE_INFO_VERSION, "vdpa": vdpa_info}
        else:
            pci: dict[str, str] = {"pci-address": t.candidate.id}
            if t.rdma and t.candidate.rdma:
                pci["rdma-device"] = ",".join(r.name for r in t.candidate.rdma)
            info = {"type": "pci", "version": DEVICE_INFO_VERSION, "pci": pci}
        path = self.host.path(self.device_info_path(t.candidate.id))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
            path.write_text(json.dumps(info))
            path.chmod(0o444)
        except OSError as e:
            raise AllocationError(f"cannot write device info file {path}: {e.strerror}") from e

    def remove_device_info(self) -> None:
        for device_id in self.devices:
            self.host.path(self.device_info_path(device_id)).unlink(missing_ok=True)


def _healthy(t: Taken) -> bool:
    link = t.candidate.link or t.candidate.netdev
    if link is not None and not link.up:
        return False
    return not (t.rdma and not any(r.usable for r in t.candidate.rdma))


# ----------------------------------------------------------------------------- the agent

class SriovAgent:
    """The agent process: rescans the host and rereads the config every poll interval."""

    def __init__(
        self, config_path: Path, host: Host, socket_dir: Path, *,
        default_prefix: str = DEFAULT_PREFIX, poll_interval: float = 0.5,
        reporter: Reporter | None = None, use_cdi: bool = False,
    ) -> None:
        self.config_path = config_path
        self.host = host
        self.socket_dir = socket_dir
        self.default_prefix = default_prefix
        self.poll_interval = poll_interval
        self.use_cdi = use_cdi
        self.servers = ServerSet()
        self.pools: list[Pool] = []
        self.skipped: list[str] = []  # entries of the config that are not served, and why
        self.reporter = reporter or Reporter()
        self.cdi = cdi.SpecFiles(host)
        self.ddp = Profiles()
        self._config_text: str | None = None
        self._bad: str | None = None
        self._reported: list[str] = []
        self.load()

    def load(self) -> str | None:
        """(Re)read the config file if it changed. Raises ConfigError on the first load only;
        later, a file that cannot be read or is invalid is returned as the problem (the running
        config stays)."""
        first = not self.pools and self._config_text is None and self._bad is None
        try:
            text = self.config_path.read_text()
        except OSError as e:
            problem = f"cannot read config file {self.config_path}: {e.strerror}"
            if first:
                raise ConfigError(problem) from None
            self._config_text = None  # whatever comes back is read again
            return problem
        if text == self._config_text:
            return self._bad
        self._config_text = text
        try:
            loaded = load_config(self.config_path, self.default_prefix)
        except ConfigError as e:
            if first:
                raise
            return str(e)
        if not first:
            log.info("config %s changed: resources %s", self.config_path,
                     ", ".join(r.name for r in loaded.resources))
        old = {p.resource.name: p for p in self.pools}
        self.pools = [Pool(r, self.host, self.use_cdi, self.ddp) for r in loaded.resources]
        self.skipped = loaded.skipped
        for pool in self.pools:
            if pool.resource.name in old:
                pool.devices = old[pool.resource.name].devices
        return None

    async def run(self, stop: asyncio.Event) -> None:
        if self.use_cdi:
            self.cdi.remove_matching(CDI_FILE_PREFIX)  # a previous run's, as upstream
        try:
            await run_agent(self.servers, self.tick, self.poll_interval, stop)
        finally:
            for pool in self.pools:
                pool.remove_device_info()
            self.cdi.clear()
            await self.reporter.close()

    async def tick(self) -> tuple[Inventory, str | None]:
        """Reread the config, rescan the host, serve what they select; returns what it saw."""
        problem = self.load()
        if problem != self._bad:
            if problem is not None:
                await self.reporter.warn("ConfigInvalid", f"{problem}; still serving the last "
                                         "good config")
            else:
                await self.reporter.info("ConfigLoaded", f"{self.config_path} is valid again")
            self._bad = problem
        if self.skipped != self._reported:
            for reason in self.skipped:
                if reason not in self._reported:
                    await self.reporter.warn("ResourceSkipped", f"{reason}; entry skipped, the "
                                             "other resources are served")
            self._reported = list(self.skipped)
        inv = scan(self.host)
        found: dict[str, list[Candidate]] = {t: candidates(inv, t) for t in DEVICE_TYPES}
        taken: set[str] = set()
        wanted = set()
        for pool in self.pools:
            devices = pool.select(inv, found[pool.resource.conf.device_type], taken)
            name = pool.resource.name
            wanted.add(name)
            if self.use_cdi:  # before the kubelet can hand a device out
                self.cdi.write(pool.cdi_file, f"{pool.resource.prefix}/"
                               f"{pool.resource.cdi_kind}", pool.cdi_devices())
            server = self.servers.servers.get(name)
            if server is not None and server.socket_name != pool.resource.socket_name:
                await self.servers.stop(name)
                server = None
            if server is None and devices:  # upstream creates no server for an empty pool
                server = self._server(pool)
                self.servers.start(server)
            if server is not None:
                server.allocate = pool.allocate  # the pool is new after a config reload
                server.update(devices)
        self.cdi.keep(p.cdi_file for p in self.pools)
        for name in set(self.servers.servers) - wanted:
            log.info("%s: no longer configured; stopping its plugin", name)
            await self.servers.stop(name)
        return inv, problem

    def _server(self, pool: Pool) -> DevicePluginServer:
        return DevicePluginServer(
            pool.resource.name, self.socket_dir, pool.resource.socket_name, pool.allocate,
            poll_interval=self.poll_interval,
        )
