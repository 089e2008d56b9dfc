"""What NICs a node has, read from sysfs through a `Host`: PCI functions, their netdevs and link
state, RDMA devices and their character devices, PF/VF relations, scalable functions and NUMA.

A scan is a snapshot; agents rescan and compare, because sysfs changes without notice (VFs
created, drivers rebound, links flapping). Values are normalised the way the upstream plugins
compare them: vendor and device IDs as four lower-case hex digits, link types as netlink names.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from nicop.node.host import Host

PCI_DEVICES = "/sys/bus/pci/devices"
AUX_DEVICES = "/sys/bus/auxiliary/devices"
CLASS_NET = "/sys/class/net"
DEV_INFINIBAND = "/dev/infiniband"
RDMA_CM = f"{DEV_INFINIBAND}/rdma_cm"
# Where the character devices of an RDMA device sit in sysfs: under the device's parent (the PCI
# function), one directory per class, each entry naming its RDMA device in `ibdev`.
RDMA_CHAR_CLASSES = ("infiniband_verbs", "infiniband_mad", "infiniband_cm")
# ARPHRD_* from /sys/class/net/<if>/type, named as netlink's EncapType names them.
LINK_TYPES = {1: "ether", 32: "infiniband", 772: "loopback", 65534: "none"}
NETWORK_CLASS = 0x02
ACCELERATOR_CLASS = 0x12


@dataclass(frozen=True)
class Netdev:
    name: str
    link_type: str  # "ether", "infiniband", ... ("" when unknown)
    operstate: str  # up, down, lowerlayerdown, unknown, ...

    @property
    def up(self) -> bool:
        # "unknown" is what drivers without operstate reporting show for a working link.
        return self.operstate in ("up", "unknown")


@dataclass(frozen=True)
class RdmaDevice:
    name: str  # mlx5_0
    char_devices: tuple[str, ...]  # host paths: /dev/infiniband/uverbs0, umad0, issm0 ...
    """What the kernel registered (sysfs): where the runtime finds them on the node."""
    dev_nodes: tuple[str, ...]
    """Those of `char_devices` this view of /dev holds. A privileged container that does not
    mount the node's /dev has a copy made when it started, without the nodes of VFs made
    since; only an agent that mounts /dev can tell a node missing on the host."""
    port_state: str  # "ACTIVE", "DOWN", ... of port 1
    pkey: str | None  # P_Key at index 0 of port 1 (0xffff = default partition)

    @property
    def usable(self) -> bool:
        """Has the verbs device a process needs to open it."""
        return any(_kind(p) == "uverbs" for p in self.char_devices)


@dataclass(frozen=True)
class PciFunction:
    address: str
    vendor: str
    device: str
    class_code: int  # 24 bits: 0x020000 Ethernet, 0x020700 InfiniBand
    driver: str | None
    numa_node: int  # -1 when the firmware gives none
    iommu_group: str | None
    netdevs: tuple[Netdev, ...]
    rdma: tuple[RdmaDevice, ...]
    pf: str | None  # PF address, for a VF
    vf_index: int | None
    total_vfs: int | None  # None unless SR-IOV is enabled in firmware (PFs only)
    num_vfs: int
    acpi_index: str | None

    @property
    def netdev(self) -> Netdev | None:
        return self.netdevs[0] if self.netdevs else None

    @property
    def base_class(self) -> int:
        return self.class_code >> 16


@dataclass(frozen=True)
class AuxDevice:
    """An auxiliary device, such as a scalable function `mlx5_core.sf.2` of a PCI function."""

    name: str
    type: str  # "sf", "eth", "rdma", ...
    parent: str  # PCI address
    sfnum: int | None
    netdevs: tuple[Netdev, ...]
    rdma: tuple[RdmaDevice, ...]


@dataclass(frozen=True)
class Inventory:
    functions: dict[str, PciFunction]
    aux: dict[str, AuxDevice]
    rdma_cm: str | None  # /dev/infiniband/rdma_cm when rdma_ucm is loaded
    default_route_ifaces: frozenset[str]

    def network_functions(self) -> Iterator[PciFunction]:
        return (f for f in self.functions.values() if f.base_class == NETWORK_CLASS)

    def pf_netdev(self, fn: PciFunction) -> Netdev | None:
        """The netdev of a VF's PF (or of the function itself when it is no VF)."""
        owner = self.functions.get(fn.pf) if fn.pf else fn
        return owner.netdev if owner else None


def scan(host: Host, only: Collection[str] | None = None) -> Inventory:
    """Read every PCI function (or `only` these), auxiliary device and RDMA device of the host."""
    addresses = [a for a in host.listdir(PCI_DEVICES) if only is None or a in only]
    vf_indexes = {}  # VF address -> its N in the PF's virtfnN link
    for address in addresses:
        for link in host.listdir(f"{PCI_DEVICES}/{address}"):
            if link.startswith("virtfn"):
                vf = host.link_name(f"{PCI_DEVICES}/{address}/{link}")
                if vf:
                    vf_indexes[vf] = int(link[len("virtfn"):])
    functions = {a: _pci_function(host, a, vf_indexes.get(a)) for a in addresses}
    aux = {}
    for name in host.listdir(AUX_DEVICES):
        kind = name.split(".")[1] if name.count(".") >= 2 else ""
        path = f"{AUX_DEVICES}/{name}"
        aux[name] = AuxDevice(
            name=name,
            type=kind,
            parent=host.path(path).resolve().parent.name,
            sfnum=host.read_int(f"{path}/sfnum"),
            netdevs=_netdevs(host, path),
            rdma=_rdma(host, path),
        )
    return Inventory(
        functions=functions,
        aux=aux,
        rdma_cm=RDMA_CM if host.exists(RDMA_CM) else None,
        default_route_ifaces=_default_route_ifaces(host),
    )


def _pci_function(host: Host, address: str, vf_index: int | None) -> PciFunction:
    path = f"{PCI_DEVICES}/{address}"
    pf = host.link_name(f"{path}/physfn")
    numa = host.read_int(f"{path}/numa_node")
    return PciFunction(
        address=address,
        vendor=_hex4(host.read(f"{path}/vendor")),
        device=_hex4(host.read(f"{path}/device")),
        class_code=host.read_int(f"{path}/class", 16) or 0,
        driver=host.link_name(f"{path}/driver"),
        numa_node=-1 if numa is None else numa,
        iommu_group=host.link_name(f"{path}/iommu_group"),
        netdevs=_netdevs(host, path),
        rdma=_rdma(host, path),
        pf=pf,
        vf_index=vf_index,
        total_vfs=host.read_int(f"{path}/sriov_totalvfs"),
        num_vfs=host.read_int(f"{path}/sriov_numvfs") or 0,
        acpi_index=host.read(f"{path}/acpi_index"),
    )


def _netdevs(host: Host, device_path: str) -> tuple[Netdev, ...]:
    result = []
    for name in host.listdir(f"{device_path}/net"):
        net = f"{CLASS_NET}/{name}"
        arphrd = host.read_int(f"{net}/type")
        result.append(Netdev(
            name=name,
            link_type=LINK_TYPES.get(arphrd, "") if arphrd is not None else "",
            operstate=host.read(f"{net}/operstate") or "unknown",
        ))
    return tuple(result)


def _rdma(host: Host, device_path: str) -> tuple[RdmaDevice, ...]:
    names = host.listdir(f"{device_path}/infiniband")
    if not names:
        return ()
    char_devices: dict[str, list[str]] = {}
    for cls in RDMA_CHAR_CLASSES:
        for entry in host.listdir(f"{device_path}/{cls}"):
            ibdev = host.read(f"{device_path}/{cls}/{entry}/ibdev")
            if ibdev:
                char_devices.setdefault(ibdev, []).append(f"{DEV_INFINIBAND}/{entry}")
    result = []
    for name in names:
        port = f"{device_path}/infiniband/{name}/ports/1"
        state = host.read(f"{port}/state") or ""
        result.append(RdmaDevice(
            name=name,
            char_devices=tuple(char_devices.get(name, ())),
            dev_nodes=tuple(p for p in char_devices.get(name, ()) if host.exists(p)),
            port_state=state.partition(": ")[2] or state,
            pkey=host.read(f"{port}/pkeys/0"),
        ))
    return tuple(result)


def _default_route_ifaces(host: Host) -> frozenset[str]:
    """Interfaces carrying an IPv4 default route (/proc/net/route: destination and mask 0)."""
    text = host.read("/proc/net/route") or ""
    ifaces = set()
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[1] == "00000000" and fields[7] == "00000000":
            ifaces.add(fields[0])
    return frozenset(ifaces)


def _hex4(value: str | None) -> str:
    """`0x15b3` -> `15b3`."""
    if not value:
        return ""
    return value.lower().removeprefix("0x").rjust(4, "0")


def _kind(char_device: str) -> str:
    """`/dev/infiniband/uverbs3` -> `uverbs`."""
    return char_device.rsplit("/", 1)[-1].rstrip("0123456789")


def nic_report(inventory: Inventory) -> list[dict[str, Any]]:
    """The host's Mellanox NIC ports (PFs), as `nicop discover-node` reports them: what a policy
    selects NICs by (vendor, device ID, link type, interface name) and what SR-IOV needs."""
    ports = []
    for fn in sorted(inventory.network_functions(), key=lambda f: f.address):
        if fn.pf is not None or fn.vendor != "15b3":
            continue
        ports.append({
            "pciAddress": fn.address, "vendor": fn.vendor, "deviceID": fn.device,
            "linkType": "infiniband" if (fn.class_code >> 8) == 0x0207 else "ethernet",
            "netdev": fn.netdev.name if fn.netdev else None, "numaNode": fn.numa_node,
            "totalVfs": fn.total_vfs or 0, "numVfs": fn.num_vfs, "rdma": bool(fn.rdma)})
    return ports
