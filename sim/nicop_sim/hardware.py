"""Simulated NIC hardware: which NICs a node has, and the sysfs tree the kernel would show for them.

A `Profile` decides the labels Node Feature Discovery would put on the node (OS, kernel, and
`pci-15b3.present` when a Mellanox NIC is present). `SimulatedHost.build` turns a profile into a
fixture root holding `/sys/bus/pci/devices`, `/sys/class/{net,infiniband,infiniband_verbs,
infiniband_mad}`, `/sys/kernel/iommu_groups` and `/dev/infiniband`, laid out like a real node with
mlx5_core, mlx5_ib, ib_uverbs, ib_umad and rdma_ucm loaded. Its methods change the tree the way
the kernel does (VFs appear when `sriov_numvfs` is written, links go down, drivers are rebound).
All state lives in the tree, so `SimulatedHost(root)` can attach to a tree another process built.
Facts (IDs, formats, numbering, errno rules) are those of the Linux kernel and the adapters.

A profile may also place GPUs, each behind a PCIe root complex of its own shared with one NIC (as
on a DGX H100), so that DRA's `resource.kubernetes.io/pcieRoot` can align GPU-NIC pairs.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import shutil
import signal
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from nicop.api.labels import MELLANOX_LABEL, NFD
from nicop.node.host import Host, Mounts

MELLANOX_VENDOR = "15b3"
NVIDIA_VENDOR = "10de"
GPU_CLASS = 0x030200  # display controller, 3D
# A ConnectX-8's Data Direct function: a DMA engine without network of its own, which mlx5_ib
# drives (data_direct.c is built into mlx5_ib, so the PCI driver bears its name). Its PCI ID is
# the kernel's; its class code is not in the sources at hand: DMA controller, after the name
# rdma-core's rdma_topo gives it ("ConnectX-8 DMA Controller").
DATA_DIRECT_DEVICE, DATA_DIRECT_CLASS, DATA_DIRECT_DRIVER = "2100", 0x080100, "mlx5_ib"
GRACE_ROOT_PORT = "22b2"  # an NVIDIA Grace PCIe root port (rdma_topo's table)
CX_SWITCH_PORT = "197c"  # the ports of a ConnectX-8's own PCIe switch (rdma_topo's table)
BRIDGE_CLASS = 0x060400
NFD_PREFIX = NFD
MELLANOX_PRESENT_LABEL = MELLANOX_LABEL
# On a simulated Node: the profile its hardware is built from.
PROFILE_ANNOTATION = "nicop.io/hardware-profile"


@dataclass(frozen=True)
class Nic:
    """One physical NIC: `ports` PCI functions (mlx5 has one port per function)."""

    model: str
    device_id: str
    ports: int
    link_type: str  # "eth" or "ib"
    numa_node: int = 0
    vendor_id: str = MELLANOX_VENDOR
    bus: int | None = None  # PCI bus number; None takes the next free one
    total_vfs: int = 8  # firmware NUM_OF_VFS per function
    vf_device_id: str = "101e"
    fw_version: str = ""
    board_id: str = ""
    subsystem_device: str = "0000"
    revision: int = 0
    # Bus of the PCIe root complex (pci0000:<root_bus>) the NIC sits behind; None shares root
    # complex 00 with the other NICs, each behind its own root port.
    root_bus: int | None = None
    domain: int = 0  # PCI domain of its functions
    # A ConnectX-8 with a Data Direct function: the PCI domain (on Grace, one root port) that
    # function sits in, with the NIC's GPU. The PFs then sit in `domain`, each side behind the
    # NIC's own switch.
    data_direct_domain: int | None = None


@dataclass(frozen=True)
class Gpu:
    """One GPU, behind root complex `root_bus` (for a GPU-NIC pair, the NIC's); with `domain`,
    behind the switch of the ConnectX-8 whose Data Direct function is in that domain."""

    product: str
    device_id: str
    bus: int
    root_bus: int
    numa_node: int = 0
    vendor_id: str = NVIDIA_VENDOR
    domain: int | None = None
    subsystem_device: str = "16c1"


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    nics: tuple[Nic, ...]
    gpus: tuple[Gpu, ...] = ()
    os_id: str = "ubuntu"
    os_version: str = "22.04"
    kernel: str = "5.15.0-122-generic"
    # False reproduces a node whose NIC Node Feature Discovery has not labelled (yet).
    nfd_labelled: bool = True
    extra_labels: dict[str, str] = field(default_factory=dict)

    @property
    def has_mellanox_nic(self) -> bool:
        return any(n.vendor_id == MELLANOX_VENDOR for n in self.nics)

    def node_labels(self) -> dict[str, str]:
        """The labels NFD (and kubelet) would put on a node with this hardware."""
        labels = {
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            f"{NFD_PREFIX}/system-os_release.ID": self.os_id,
            f"{NFD_PREFIX}/system-os_release.VERSION_ID": self.os_version,
            f"{NFD_PREFIX}/system-os_release.VERSION_ID.major": self.os_version.split(".")[0],
            f"{NFD_PREFIX}/kernel-version.full": self.kernel,
        }
        if self.has_mellanox_nic and self.nfd_labelled:
            labels[MELLANOX_PRESENT_LABEL] = "true"
        labels.update(self.extra_labels)
        return labels


CX6DX = Nic(model="ConnectX-6 Dx", device_id="101d", ports=2, link_type="eth", bus=0x3B,
            fw_version="22.38.1900", board_id="MT_0000000436", subsystem_device="0016")
CX7_IB = Nic(model="ConnectX-7", device_id="1021", ports=1, link_type="ib", bus=0x4B,
             fw_version="28.39.1002", board_id="MT_0000000838", subsystem_device="0041")
BF3 = Nic(model="BlueField-3", device_id="a2dc", ports=2, link_type="eth", bus=0x03,
          fw_version="32.47.1088", board_id="MT_0000000884", subsystem_device="0022", revision=1)

# The eight compute NICs of a DGX H100: PCI bus and NUMA node of each (DGX OS names ibp<bus>s0).
DGX_BUSES = ((0x18, 0), (0x40, 0), (0x4F, 0), (0x5E, 0), (0x9A, 1), (0xC0, 1), (0xCE, 1), (0xDC, 1))
# Each NIC shares a PCIe switch, under a root complex of its own, with one H100 GPU: the root
# complex's bus is 3 below the NIC's, the GPU's bus 3 above (0000:15 -> NIC 18, GPU 1b).
DGX_ROOT_OFFSET, DGX_GPU_OFFSET = -3, 3
H100 = Gpu(product="NVIDIA H100 80GB HBM3", device_id="2330", bus=0, root_bus=0)

# One GB300 compute tray's host: two Grace CPUs, each with two B300 GPUs and two ConnectX-8
# SuperNICs (800G InfiniBand). Grace gives each root port a PCI domain of its own. A NIC's PF
# sits behind one root port; its Data Direct function sits behind another, under the NIC's
# switch with its GPU, as rdma_topo expects (root port -> switch -> Data Direct function, and
# -> switch -> switch -> GPU: the GPU at dddd:06:00.0). GPUDirect traffic takes that path, so
# the GPU's root is the Data Direct function's, never the PF's.
# (PF domain, GPU and Data Direct domain, NUMA node) of each pair; the GPU domains are those an
# ND GB300 v6 VM shows (its pcieRoot pci0008:00 ...), the PF domains a guess.
GB300_PAIRS = ((0x0000, 0x0008, 0), (0x0002, 0x0009, 0), (0x0010, 0x0018, 1), (0x0012, 0x0019, 1))
CX8_IB = Nic(model="ConnectX-8", device_id="1023", ports=1, link_type="ib", bus=0x03,
             fw_version="40.44.1036")
# GB110 (B300) with its C2C link to Grace: device 31c2, subsystem 21f1 (gpu-admin-tools).
B300 = Gpu(product="NVIDIA GB300", device_id="31c2", bus=0x06, root_bus=0,
           subsystem_device="21f1")

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "dgx",
            "DGX-like GPU node: 8 ConnectX-7 InfiniBand NICs across 2 NUMA nodes, each paired "
            "with an H100 GPU behind its own PCIe root complex",
            tuple(replace(CX7_IB, bus=bus, numa_node=numa, root_bus=bus + DGX_ROOT_OFFSET)
                  for bus, numa in DGX_BUSES),
            gpus=tuple(replace(H100, bus=bus + DGX_GPU_OFFSET, root_bus=bus + DGX_ROOT_OFFSET,
                               numa_node=numa) for bus, numa in DGX_BUSES),
            os_version="22.04",
            kernel="5.15.0-122-generic",
        ),
        Profile(
            "gb300",
            "GB300-like GPU node: 4 ConnectX-8 InfiniBand NICs, each with a Data Direct "
            "function behind the PCIe root of its B300 GPU, not behind its own",
            tuple(replace(CX8_IB, domain=nic, data_direct_domain=gpu, numa_node=numa)
                  for nic, gpu, numa in GB300_PAIRS),
            gpus=tuple(replace(B300, domain=gpu, numa_node=numa) for _, gpu, numa in GB300_PAIRS),
            os_version="24.04",
            kernel="6.8.0-45-generic",
        ),
        Profile(
            "cx6dx",
            "Ethernet GPU node: one dual-port ConnectX-6 Dx (RoCE, SR-IOV)",
            (CX6DX,),
            os_version="24.04",
            kernel="6.8.0-45-generic",
        ),
        Profile(
            "cx7-ib",
            "InfiniBand node: one single-port ConnectX-7",
            (CX7_IB,),
            os_version="22.04",
            kernel="5.15.0-122-generic",
        ),
        Profile(
            "bf3",
            "Node with a BlueField-3 DPU in NIC mode (dual-port Ethernet)",
            (BF3,),
            os_version="24.04",
            kernel="6.8.0-45-generic",
        ),
        Profile(
            "cx6dx-unlabelled",
            "ConnectX-6 Dx node labelled by an NFD with its default deviceLabelFields "
            "(class and vendor), so it lacks pci-15b3.present",
            (CX6DX,),
            os_version="24.04",
            kernel="6.8.0-45-generic",
            nfd_labelled=False,
            extra_labels={f"{NFD_PREFIX}/pci-0200_{MELLANOX_VENDOR}.present": "true"},
        ),
        Profile("cpu", "CPU-only node without a Mellanox NIC", (), os_version="24.04",
                kernel="6.8.0-45-generic"),
    )
}

# With --nodes N the local cluster cycles through this layout.
DEFAULT_LAYOUT = ("dgx", "cx6dx", "cx6dx", "cx6dx-unlabelled")


def profile_named(value: str) -> Profile | None:
    """A profile by its name, or the one a replayed node carries as JSON (nicop_sim.replay:
    `{"nics": [{"model", "deviceID", "ports", "linkType", "bus", "totalVfs"}]}`)."""
    if value in PROFILES or not value.startswith("{"):
        return PROFILES.get(value)
    data = json.loads(value)
    nics = tuple(Nic(model=n["model"], device_id=n["deviceID"], ports=int(n["ports"]),
                     link_type=n["linkType"], bus=n.get("bus"),
                     total_vfs=int(n.get("totalVfs", 8))) for n in data.get("nics") or [])
    return Profile("replayed", "a node of a support bundle, its NICs as its agents reported them",
                   nics)


def layout(nodes: int, profiles: list[str] | None = None) -> list[Profile]:
    """The profile of each of `nodes` nodes: `profiles` (or the default layout) repeated."""
    names = profiles or list(DEFAULT_LAYOUT)
    unknown = [n for n in names if n not in PROFILES]
    if unknown:
        raise ValueError(
            f"unknown hardware profile {', '.join(unknown)}; known: {', '.join(PROFILES)}"
        )
    return [PROFILES[names[i % len(names)]] for i in range(nodes)]


# ------------------------------------------------------------------------------ the sysfs tree

PCI_DEVICES = "/sys/bus/pci/devices"
PCI_DRIVERS = "/sys/bus/pci/drivers"
AUX_DEVICES = "/sys/bus/auxiliary/devices"
CLASS_NET = "/sys/class/net"
CLASS_IB = "/sys/class/infiniband"
CLASS_VERBS = "/sys/class/infiniband_verbs"
CLASS_MAD = "/sys/class/infiniband_mad"
IOMMU_GROUPS = "/sys/kernel/iommu_groups"
DEV_IB = "/dev/infiniband"
DEV_VFIO = "/dev/vfio"
CLASS_UIO = "/sys/class/uio"
UIO_DRIVERS = ("igb_uio", "uio_pci_generic")  # PCI drivers that give a device a /dev/uioN
VDPA_DEVICES = "/sys/bus/vdpa/devices"
VDPA_DRIVERS = "/sys/bus/vdpa/drivers"
IB_CORE_NETNS_MODE = "/sys/module/ib_core/parameters/netns_mode"
DDPTOOL_NO_PROFILE = 8  # ddptool's exit code for an Intel device that runs no DDP profile
GID_TABLE_LENGTH = 128
ZERO_GID = ":".join(["0000"] * 8)
NUMA_CPUS = ("0-55,112-167", "56-111,168-223")  # a 2-socket Xeon 8480C, as on a DGX H100
ARPHRD_ETHER, ARPHRD_INFINIBAND = 1, 32
PF_DRIVER = "mlx5_core"


def pci_address(bus: int, devfn: int, domain: int = 0) -> str:
    return f"{domain:04x}:{bus:02x}:{devfn >> 3:02x}.{devfn & 7:x}"


def _split_address(address: str) -> tuple[int, int, int]:
    """(domain, bus, devfn) of `dddd:bb:dd.f`."""
    domain, bus, rest = address.split(":")
    dev, fn = rest.split(".")
    return int(domain, 16), int(bus, 16), (int(dev, 16) << 3) | int(fn, 16)


def _lowest_free(taken: set[int]) -> int:
    n = 0
    while n in taken:
        n += 1
    return n


FAULTS_DIR = ".sim-faults"
IOMMU_OFF = f"{FAULTS_DIR}/iommu-off"  # present: IOMMU disabled (BIOS or kernel command line)
STOP_AFTER_NUMVFS = "stop-after-sriov_numvfs"  # the VFs exist, no driver is bound yet
# What of a node's tree is its hardware and kernel (the rest, on a real node, is the node's own).
HARDWARE_PATHS = ("/sys", "/dev/infiniband", "/proc/modules", "/proc/sys/kernel/osrelease",
                  "/lib/modules", "/etc/os-release", f"/{FAULTS_DIR}")


def hardware_mounts(host_root: Path | str, tree: Path | str) -> Mounts:
    """The tree's hardware seen under `host_root`, every other path as it is: how an agent in a
    real node's container sees its simulated NICs and kernel."""
    root = str(host_root).rstrip("/")
    return Mounts({f"{root}{p}": f"{str(tree).rstrip('/')}{p}" for p in HARDWARE_PATHS})


class SimulatedHost(Host):
    """A `Host` whose root is a fixture tree, with the kernel's behaviour for the files it changes.

    Writes through `write()` to `sriov_numvfs` take the kernel's path (VFs created or removed,
    errno on refusal); every other write is a plain file write. What the kernel would know from
    the hardware (MACs, firmware, a function's netdev name) is kept in a hidden `.sim/` directory
    of each PCI function, which discovery never reads.
    """

    def __init__(self, root: Path | str, mounts: Mounts | None = None) -> None:
        super().__init__(root, mounts)
        self._fail_numvfs: dict[str, int] = {}

    # -------------------------------------------------------------------- building
    @classmethod
    def build(cls, root: Path | str, profile: Profile | str, seed: int = 0) -> SimulatedHost:
        """Create the tree of a node with `profile`'s NICs under `root`, all links up.

        `seed` varies MACs and GUIDs between simulated nodes of one cluster.
        """
        prof = PROFILES[profile] if isinstance(profile, str) else profile
        host = cls(root)
        host.root.mkdir(parents=True, exist_ok=True)
        for d in (PCI_DEVICES, f"{PCI_DRIVERS}/{PF_DRIVER}", f"{PCI_DRIVERS}/vfio-pci",
                  AUX_DEVICES, CLASS_NET, CLASS_IB, IOMMU_GROUPS, DEV_IB):
            host.path(d).mkdir(parents=True, exist_ok=True)
        host._file(f"{CLASS_VERBS}/abi_version", "6")
        host._file(f"{CLASS_MAD}/abi_version", "5")
        host._file("/sys/class/misc/rdma_cm/abi_version", "4")
        host._file(f"{DEV_IB}/rdma_cm", "")
        used_buses: set[int] = set()
        for index, nic in enumerate(prof.nics):
            bus = nic.bus if nic.bus is not None else _lowest_free(used_buses | {0})
            used_buses.add(bus)
            host._add_nic(index, nic, bus, seed)
        for index, gpu in enumerate(prof.gpus):
            host._add_gpu(index, gpu, seed)
        return host

    def _add_nic(self, index: int, nic: Nic, bus: int, seed: int) -> None:
        if nic.data_direct_domain is not None:
            parent = self._cx_switch_port(nic.domain, 0)
        elif nic.root_bus is None:
            parent = f"/sys/devices/pci0000:00/0000:00:{index + 1:02x}.0"
            self._file(f"{parent}/vendor", "0x8086")  # the root port the NIC sits behind
        else:
            parent = self._switch_port(nic.root_bus, 0)
        vpd = _vpd(nic.model, f"MT25{index:02d}XZ0{seed & 0xFFF:03X}", _vpd_uuid(seed, index))
        for fn in range(nic.ports):
            address = pci_address(bus, fn, nic.domain)
            self._add_function(
                address, parent, nic.vendor_id, nic.device_id, _class_code(nic.link_type),
                nic.numa_node, nic.revision, nic.subsystem_device, PF_DRIVER,
            )
            dev = self._pci(address)
            # Dual-function cards reserve room for all of PF0's VFs before PF1's (kernel iov.c).
            offset = (nic.ports - fn) if fn == 0 else fn * nic.total_vfs + (nic.ports - fn)
            for name, value in (
                ("sriov_totalvfs", str(nic.total_vfs)), ("sriov_numvfs", "0"),
                ("sriov_offset", str(offset)), ("sriov_stride", "1"),
                ("sriov_vf_device", nic.vf_device_id), ("sriov_drivers_autoprobe", "1"),
            ):
                self._file(f"{dev}/{name}", value)
            mac = f"b8:3f:d2:{seed & 0xFF:02x}:{index:02x}:{fn:02x}"
            self._file(f"{dev}/.sim/mac", mac)
            self._file(f"{dev}/.sim/fw", f"{nic.fw_version}\n{nic.board_id}")
            self.path(f"{dev}/vpd").write_bytes(vpd)
            prefix = "ib" if nic.link_type == "ib" else "en"
            if nic.domain:  # udev's names spell a domain other than 0 (decimal, as the bus)
                prefix += f"P{nic.domain}"
            base = f"{prefix}p{bus}s0" + (f"f{fn}" if nic.ports > 1 else "")
            name = base if nic.link_type == "ib" else f"{base}np{fn}"
            self._file(f"{dev}/.sim/vf_base", base)
            self._file(f"{dev}/.sim/netdev", name)
            self._bind_mlx5(address, name, mac, guid=_guid(mac))
        if nic.data_direct_domain is not None:
            address = pci_address(bus, 0, nic.data_direct_domain)
            self._add_function(
                address, self._cx_switch_port(nic.data_direct_domain, 0), nic.vendor_id,
                DATA_DIRECT_DEVICE, DATA_DIRECT_CLASS, nic.numa_node, nic.revision,
                nic.subsystem_device, DATA_DIRECT_DRIVER,
            )
            self.path(f"{self._pci(address)}/vpd").write_bytes(vpd)  # the PF's V3: its pair

    def _add_gpu(self, index: int, gpu: Gpu, seed: int) -> None:
        """A GPU bound to the nvidia driver; what NVML would tell (UUID, product) is in `.sim/`."""
        if gpu.domain is None:
            address, parent = pci_address(gpu.bus, 0), self._switch_port(gpu.root_bus, 1)
        else:
            address, parent = pci_address(gpu.bus, 0, gpu.domain), self._cx_gpu_port(gpu.domain)
        self._add_function(address, parent, gpu.vendor_id, gpu.device_id, GPU_CLASS,
                           gpu.numa_node, 0xA1, gpu.subsystem_device, "nvidia")
        dev = self._pci(address)
        self._file(f"{dev}/.sim/gpu_uuid", _gpu_uuid(seed, index))
        self._file(f"{dev}/.sim/gpu_product", gpu.product)

    def _switch_port(self, root_bus: int, port: int) -> str:
        """Downstream port `port` of the PCIe switch under root complex `root_bus`'s first root
        port: root port 0000:RR:01.0, switch 0000:RR+1:00.0, ports 0000:RR+2:0p.0."""
        root = f"/sys/devices/pci0000:{root_bus:02x}/0000:{root_bus:02x}:01.0"
        switch = f"{root}/0000:{root_bus + 1:02x}:00.0"
        parent = f"{switch}/0000:{root_bus + 2:02x}:{port:02x}.0"
        self._file(f"{root}/vendor", "0x8086")
        self._file(f"{switch}/vendor", "0x1000")  # a Broadcom PEX switch, as on a DGX
        self._file(f"{parent}/vendor", "0x1000")
        return parent

    def _cx_switch_port(self, domain: int, port: int) -> str:
        """Downstream port `port` of a ConnectX-8's switch behind the Grace root port of PCI
        domain `domain`: root port dddd:00:00.0, switch dddd:01:00.0, ports dddd:02:0p.0."""
        root = f"/sys/devices/pci{domain:04x}:00/{domain:04x}:00:00.0"
        switch = f"{root}/{domain:04x}:01:00.0"
        parent = f"{switch}/{domain:04x}:02:{port:02x}.0"
        self._bridge(root, NVIDIA_VENDOR, GRACE_ROOT_PORT)
        for bridge in (switch, parent):
            self._bridge(bridge, MELLANOX_VENDOR, CX_SWITCH_PORT)
        return parent

    def _cx_gpu_port(self, domain: int) -> str:
        """Where a GB300's GPU hangs: behind the switch's port 1, a second switch (dddd:04:00.0)
        and its port (dddd:05:00.0), so the GPU is dddd:06:00.0."""
        inner = f"{self._cx_switch_port(domain, 1)}/{domain:04x}:04:00.0"
        parent = f"{inner}/{domain:04x}:05:00.0"
        for bridge in (inner, parent):
            self._bridge(bridge, MELLANOX_VENDOR, CX_SWITCH_PORT)
        return parent

    def _bridge(self, path: str, vendor: str, device: str) -> None:
        for name, value in (("vendor", vendor), ("device", device),
                            ("class", f"{BRIDGE_CLASS:06x}")):
            self._file(f"{path}/{name}", f"0x{value}")

    def add_pci_device(
        self, address: str, vendor: str, device: str, class_code: int,
        driver: str | None = None, numa_node: int = 0,
    ) -> None:
        """Plug in another PCI function (an accelerator, another vendor's NIC), no netdev."""
        parent = "/sys/devices/pci0000:00/0000:00:1f.0"
        self._file(f"{parent}/vendor", "0x8086")
        self._add_function(address, parent, vendor, device, class_code, numa_node, 0, "0000",
                           driver)

    def _add_function(
        self, address: str, parent: str, vendor: str, device: str, cls_code: int, numa: int,
        revision: int, subsystem_device: str, driver: str | None,
    ) -> None:
        dev = f"{parent}/{address}"
        self._file(f"{dev}/vendor", f"0x{vendor}")
        self._file(f"{dev}/device", f"0x{device}")
        self._file(f"{dev}/class", f"0x{cls_code:06x}")
        self._file(f"{dev}/revision", f"0x{revision:02x}")
        self._file(f"{dev}/subsystem_vendor", f"0x{vendor}")
        self._file(f"{dev}/subsystem_device", f"0x{subsystem_device}")
        self._file(
            f"{dev}/modalias",
            f"pci:v0000{vendor.upper()}d0000{device.upper()}sv0000{vendor.upper()}"
            f"sd0000{subsystem_device.upper()}bc{cls_code >> 16:02X}sc{(cls_code >> 8) & 0xFF:02X}"
            f"i{cls_code & 0xFF:02X}",
        )
        self._file(f"{dev}/numa_node", str(numa))
        self._file(f"{dev}/local_cpulist", NUMA_CPUS[numa % 2] if numa >= 0 else "0-223")
        self._file(f"{dev}/enable", "1")
        self._file(f"{dev}/driver_override", "(null)")
        if not self.exists(f"/{IOMMU_OFF}"):
            group = _lowest_free({int(g) for g in self.listdir(IOMMU_GROUPS)})
            self._link(f"{IOMMU_GROUPS}/{group}/devices/{address}", dev)
            self._link(f"{dev}/iommu_group", f"{IOMMU_GROUPS}/{group}")
        self._link(f"{PCI_DEVICES}/{address}", dev)
        if driver:
            self._set_driver_link(address, driver)

    # -------------------------------------------------------------------- queries
    def functions(self) -> list[str]:
        return self.listdir(PCI_DEVICES)

    def pfs(self) -> list[str]:
        """PCI addresses of the SR-IOV capable functions."""
        return [a for a in self.functions() if self.exists(f"{self._pci(a)}/sriov_totalvfs")]

    def gpus(self) -> list[str]:
        """PCI addresses of the GPUs."""
        return [a for a in self.functions()
                if self.read(f"{PCI_DEVICES}/{a}/vendor") == f"0x{NVIDIA_VENDOR}"
                and (self.read_int(f"{PCI_DEVICES}/{a}/class", 16) or 0) >> 16 == 0x03]

    def vfs(self, pf: str) -> list[str]:
        dev = self._pci(self.address(pf))
        links = [n for n in self.listdir(dev) if n.startswith("virtfn")]
        links.sort(key=lambda n: int(n[len("virtfn"):]))
        return [self.link_name(f"{dev}/{n}") or "" for n in links]

    def netdev(self, address: str) -> str | None:
        names = self.listdir(f"{PCI_DEVICES}/{address}/net")
        return names[0] if names else None

    def rdma_device(self, address: str) -> str | None:
        names = self.listdir(f"{PCI_DEVICES}/{address}/infiniband")
        return names[0] if names else None

    def address(self, name: str) -> str:
        """The PCI address of `name`, a PCI address or a netdev name."""
        if self.exists(f"{PCI_DEVICES}/{name}"):
            return name
        if self.exists(f"{CLASS_NET}/{name}/device"):
            return self.link_name(f"{CLASS_NET}/{name}/device") or ""
        raise FileNotFoundError(errno.ENOENT, f"no PCI device or netdev {name!r}", str(self.root))

    # -------------------------------------------------------------------- kernel behaviour
    def write(self, path: str, text: str) -> None:
        """A write to a sysfs attribute; `sriov_numvfs` and the PCI drivers' `bind`, `unbind`,
        `drivers_probe` and `driver_override` behave as in the kernel."""
        real = self.path(path)
        parts = path.strip("/").split("/")
        if real.name == "sriov_numvfs" and real.exists():
            self.set_numvfs(real.resolve().parent.name, text)
        elif parts[:4] == ["sys", "bus", "pci", "drivers"] and parts[-1] == "unbind":
            self.bind_driver(text, None)
        elif parts[:4] == ["sys", "bus", "pci", "drivers"] and parts[-1] == "bind":
            override = self.read(f"{PCI_DEVICES}/{text}/driver_override")
            if override not in (None, "(null)", parts[4]):
                raise OSError(errno.EINVAL, "Invalid argument", path)
            self.bind_driver(text, parts[4])
        elif path == "/sys/bus/pci/drivers_probe":
            override = self.read(f"{PCI_DEVICES}/{text}/driver_override")
            self.bind_driver(text, override if override not in (None, "(null)") else PF_DRIVER)
        elif real.name == "driver_override":
            super().write(path, "(null)" if text == "\x00" else text)
        else:
            super().write(path, text)

    def fail_numvfs_writes(self, pf: str, err: int | None = errno.EBUSY) -> None:
        """Make writes to `pf`'s sriov_numvfs fail with `err`, like a busy driver; None heals."""
        address = self.address(pf)
        if err is None:
            self._fail_numvfs.pop(address, None)
        else:
            self._fail_numvfs[address] = err

    def set_numvfs(self, pf: str, count: int | str) -> None:
        """Write `count` to the PF's sriov_numvfs, with the kernel's checks (iov.c)."""
        address = self.address(pf)
        dev = self._pci(address)
        where = f"{PCI_DEVICES}/{address}/sriov_numvfs"
        if not self.exists(f"{dev}/sriov_totalvfs"):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", where)
        try:
            n = int(str(count).strip())
            if not 0 <= n <= 0xFFFF:
                raise ValueError
        except ValueError:
            raise OSError(errno.EINVAL, "Invalid argument", where) from None
        total = int(self._read(f"{dev}/sriov_totalvfs"))
        current = int(self._read(f"{dev}/sriov_numvfs"))
        if n > total:
            raise OSError(errno.ERANGE, "Numerical result out of range", where)
        if n == current:
            return
        if address in self._fail_numvfs:
            err = self._fail_numvfs[address]
            raise OSError(err, os.strerror(err), where)
        if self.link_name(f"{dev}/driver") is None:
            raise FileNotFoundError(errno.ENOENT, "no driver bound to the PF", where)
        if n and current:
            raise OSError(errno.EBUSY, f"{current} VFs already enabled. Disable before "
                          f"enabling {n} VFs", where)
        if n == 0:
            for vf in reversed(self.vfs(address)):
                self._remove_function(vf)
            for link in self.listdir(dev):
                if link.startswith("virtfn"):
                    os.unlink(self.path(f"{dev}/{link}"))
        else:
            self._enable_vfs(address, n)
        self._file(f"{dev}/sriov_numvfs", str(n))
        self._planted(STOP_AFTER_NUMVFS)

    def plant_fault(self, fault: str) -> None:
        """Make the next process that gets to `fault` stop itself there (SIGSTOP), so a test can
        kill it at exactly that point of its work."""
        path = self.path(f"/{FAULTS_DIR}/{fault}")
        path.parent.mkdir(exist_ok=True)
        path.touch()

    def _planted(self, fault: str) -> None:
        try:
            self.path(f"/{FAULTS_DIR}/{fault}").unlink()
        except FileNotFoundError:
            return
        os.kill(os.getpid(), signal.SIGSTOP)

    def _enable_vfs(self, pf: str, count: int) -> None:
        dev = self._pci(pf)
        domain, bus, devfn = _split_address(pf)
        offset = int(self._read(f"{dev}/sriov_offset"))
        stride = int(self._read(f"{dev}/sriov_stride"))
        autoprobe = self._read(f"{dev}/sriov_drivers_autoprobe") == "1"
        parent = str(PurePosixPath(dev).parent)
        pf_mac = self._read(f"{dev}/.sim/mac")
        base = self._read(f"{dev}/.sim/vf_base")
        pf_net = self.netdev(pf)
        up = pf_net is not None and self._read(f"{CLASS_NET}/{pf_net}/operstate") == "up"
        for i in range(count):
            pos = devfn + offset + stride * i
            vf = pci_address(bus + (pos >> 8), pos & 0xFF, domain)
            self._add_function(
                vf, parent, self._read(f"{dev}/vendor")[2:], self._read(f"{dev}/sriov_vf_device"),
                int(self._read(f"{dev}/class"), 16), int(self._read(f"{dev}/numa_node")),
                int(self._read(f"{dev}/revision"), 16), self._read(f"{dev}/subsystem_device")[2:],
                PF_DRIVER if autoprobe else None,
            )
            self._link(f"{parent}/{vf}/physfn", dev)
            self._link(f"{dev}/virtfn{i}", f"{parent}/{vf}")
            vf_mac = _derived_mac(pf_mac, 0x02, i + 1)
            self._file(f"{parent}/{vf}/.sim/mac", vf_mac)
            self._file(f"{parent}/{vf}/.sim/fw", self._read(f"{dev}/.sim/fw"))
            self._file(f"{parent}/{vf}/.sim/netdev", f"{base}v{i}")
            if autoprobe:
                self._bind_mlx5(vf, f"{base}v{i}", vf_mac,
                                guid="0000:0000:0000:0000", up=up)

    def set_routes(self, routes: dict[str, str]) -> None:
        """/proc/net/route with one route per IPv4 network (`0.0.0.0/0`: the default route),
        through the interface named: how the node reaches the cluster."""
        lines = ["Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU"
                 "\tWindow\tIRTT"]
        for network, iface in routes.items():
            net = ipaddress.IPv4Network(network)
            dest, mask = (addr.packed[::-1].hex().upper()
                          for addr in (net.network_address, net.netmask))
            lines.append(f"{iface}\t{dest}\t00000000\t0001\t0\t0\t0\t{mask}\t0\t0\t0")
        self._file("/proc/net/route", "\n".join(lines) + "\n")

    def set_link(self, ifname: str, up: bool) -> None:
        """Carrier on or off on `ifname`; a PF's VFs follow it (VF link state `auto`)."""
        address = self.address(ifname)
        self._set_link_state(ifname, up)
        for vf in self.vfs(address) if self.exists(f"{self._pci(address)}/sriov_totalvfs") else []:
            vf_net = self.netdev(vf)
            if vf_net:
                self._set_link_state(vf_net, up)

    def set_admin(self, ifname: str, up: bool) -> None:
        """`ip link set <ifname> up|down`: IFF_UP in `flags`; an administratively down link is
        operationally down whatever its carrier."""
        net = f"{CLASS_NET}/{ifname}"
        flags = int(self.read(f"{net}/flags") or "0x1003", 16)
        self._file(f"{net}/flags", hex(flags | 1 if up else flags & ~1))
        carrier = self.read(f"{net}/carrier") == "1"
        self._file(f"{net}/operstate", "up" if up and carrier else "down")

    def set_link_up(self, ifname: str) -> None:
        """What the agents' netlink call does on a real node."""
        self.set_admin(ifname, True)

    def _set_link_state(self, ifname: str, up: bool) -> None:
        net = f"{CLASS_NET}/{ifname}"
        self._file(f"{net}/operstate", "up" if up else "down")
        self._file(f"{net}/carrier", "1" if up else "0")
        address = self.address(ifname)
        rdma = self.rdma_device(address)
        if rdma:
            port = f"{CLASS_IB}/{rdma}/ports/1"
            self._file(f"{port}/state", "4: ACTIVE" if up else "1: DOWN")
            self._file(f"{port}/phys_state", "5: LinkUp" if up else "3: Disabled")

    def set_iommu(self, enabled: bool) -> None:
        """IOMMU off: functions made from now on (VFs) get no IOMMU group, and vfio-pci refuses
        them, as the kernel's vfio-pci probe does."""
        marker = self.path(f"/{IOMMU_OFF}")
        if enabled:
            marker.unlink(missing_ok=True)
        else:
            marker.parent.mkdir(exist_ok=True)
            marker.touch()

    def bind_driver(self, address: str, driver: str | None) -> None:
        """Unbind the function's driver, then bind `driver` (`mlx5_core`, `vfio-pci`) if given."""
        dev = self._pci(address)
        if driver == "vfio-pci" and self.link_name(f"{dev}/iommu_group") is None:
            raise OSError(errno.EINVAL, "Invalid argument", f"{PCI_DRIVERS}/vfio-pci/bind")
        if self.link_name(f"{dev}/driver") == PF_DRIVER:
            self._remove_rdma(address)
            for name in self.listdir(f"{dev}/net"):
                os.unlink(self.path(f"{CLASS_NET}/{name}"))
            shutil.rmtree(self.path(f"{dev}/net"), ignore_errors=True)
        self._unbind(address)
        if driver == PF_DRIVER:
            name = self._read(f"{dev}/.sim/netdev")
            physfn = self.link_name(f"{dev}/physfn")
            pf_net = physfn and self.netdev(physfn)
            up = not pf_net or self._read(f"{CLASS_NET}/{pf_net}/operstate") == "up"
            mac = self._read(f"{dev}/.sim/mac")
            self._bind_mlx5(address, name, mac, guid=_guid(mac) if not physfn
                            else "0000:0000:0000:0000", up=up)
        elif driver == "vfio-pci":
            self._set_driver_link(address, driver)
            group = self.link_name(f"{dev}/iommu_group")
            self._file(f"{DEV_VFIO}/vfio", "")
            self._file(f"{DEV_VFIO}/{group}", "")
        elif driver in UIO_DRIVERS:
            self._set_driver_link(address, driver)
            number = _lowest_free({int(n[3:]) for n in self.listdir(CLASS_UIO)})
            uio = f"{dev}/uio/uio{number}"
            self._file(f"{uio}/name", driver)
            self._file(f"{uio}/dev", f"243:{number}")
            self._link(f"{CLASS_UIO}/uio{number}", uio)
            self._file(f"/dev/uio{number}", "")
        elif driver is not None:
            self._set_driver_link(address, driver)

    def remove_rdma(self, address: str) -> None:
        """The function's RDMA device and its character devices vanish (mlx5_ib detached)."""
        self._remove_rdma(self.address(address))

    def add_rdma(self, address: str) -> str:
        """Attach an RDMA device to the function (mlx5_ib probing it); returns its name."""
        address = self.address(address)
        dev = self._pci(address)
        net = self.netdev(address)
        up = net is not None and self._read(f"{CLASS_NET}/{net}/operstate") == "up"
        mac = self._read(f"{dev}/.sim/mac")
        guid = "0000:0000:0000:0000" if self.exists(f"{dev}/physfn") else _guid(mac)
        return self._add_rdma(address, net, guid, up)

    def add_sf(self, pf: str, sfnum: int) -> str:
        """Create a scalable function on `pf` (devlink port add, activate); returns its name."""
        address = self.address(pf)
        dev = self._pci(address)
        taken = {int(n.rsplit(".", 1)[1]) for n in self.listdir(AUX_DEVICES) if ".sf." in n}
        name = f"mlx5_core.sf.{_lowest_free(taken | {0, 1})}"
        aux = f"{dev}/{name}"
        self._file(f"{aux}/sfnum", str(sfnum))
        self._link(f"{aux}/driver", "/sys/bus/auxiliary/drivers/mlx5_core.sf")
        self._link(f"{AUX_DEVICES}/{name}", aux)
        mac = _derived_mac(self._read(f"{dev}/.sim/mac"), 0x06, sfnum)
        base = self._read(f"{dev}/.sim/vf_base")
        self._add_netdev(aux, f"{base}s{sfnum}", "eth", mac, up=True)
        self._add_rdma_at(aux, f"{base}s{sfnum}", _guid(mac), up=True, link_type="eth")
        return name

    def add_vdpa(self, address: str, driver: str = "vhost_vdpa") -> str:
        """`vdpa dev add` on the function (a VF whose driver offers vDPA), the new device bound
        to `driver` (vhost_vdpa, which gives it a /dev/vhost-vdpa-N, or virtio_vdpa); returns
        the vdpa device's name."""
        dev = self._pci(self.address(address))
        number = _lowest_free({int(n[4:]) for n in self.listdir(VDPA_DEVICES)})
        name = f"vdpa{number}"
        where = f"{dev}/{name}"
        self._link(f"{where}/driver", f"{VDPA_DRIVERS}/{driver}")
        self._link(f"{VDPA_DEVICES}/{name}", where)
        if driver == "vhost_vdpa":
            self._file(f"{where}/vhost-vdpa-{number}/dev", f"511:{number}")
            self._file(f"/dev/vhost-vdpa-{number}", "")
        return name

    def _remove_vdpa(self, dev: str, name: str) -> None:
        for entry in self.listdir(f"{dev}/{name}"):
            if entry.startswith("vhost-vdpa-"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path(f"/dev/{entry}"))
        os.unlink(self.path(f"{VDPA_DEVICES}/{name}"))
        shutil.rmtree(self.path(f"{dev}/{name}"))

    def set_pkey(self, address: str, pkey: str) -> None:
        """The partition key at index 0 of port 1 of the function's RDMA device, as the subnet
        manager (or ib-kubernetes through it) sets it for a VF."""
        rdma = self.rdma_device(self.address(address))
        if rdma is None:
            raise FileNotFoundError(errno.ENOENT, f"{address} has no RDMA device", address)
        self._file(f"{CLASS_IB}/{rdma}/ports/1/pkeys/0", pkey)

    def set_acpi_index(self, address: str, index: int) -> None:
        """The function's ACPI index (`acpi_index`), as firmware gives onboard devices."""
        self._file(f"{self._pci(self.address(address))}/acpi_index", str(index))

    def set_rdma_netns_mode(self, mode: str) -> None:
        """`rdma system set netns shared|exclusive`: ib_core's netns_mode parameter."""
        if mode not in ("shared", "exclusive"):
            raise ValueError(f"netns mode {mode!r} is neither shared nor exclusive")
        self._file(IB_CORE_NETNS_MODE, "Y" if mode == "shared" else "N")

    def load_module(self, module: str) -> None:
        """`modprobe` of a module that makes a character device for pods: vhost_net
        (/dev/vhost-net) or tun (/dev/net/tun)."""
        nodes = {"vhost_net": "/dev/vhost-net", "tun": "/dev/net/tun"}
        if module not in nodes:
            raise ValueError(f"module {module!r} is not simulated")
        self._file(nodes[module], "")

    def unload_module(self, module: str) -> None:
        """`modprobe -r`: ib_umad takes every umad and issm device with it, rdma_ucm the node's
        /dev/infiniband/rdma_cm, ib_uverbs every uverbs device (the RDMA devices stay)."""
        classes = {"ib_umad": CLASS_MAD, "ib_uverbs": CLASS_VERBS}
        if module == "rdma_ucm":
            for path in (f"{DEV_IB}/rdma_cm", "/sys/class/misc/rdma_cm/abi_version"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path(path))
            return
        if module not in classes:
            raise ValueError(f"module {module!r} is not simulated")
        cls = classes[module]
        for entry in self.listdir(cls):
            if entry == "abi_version":
                continue
            where = os.path.realpath(self.path(f"{cls}/{entry}"))
            for path in (f"{cls}/{entry}", f"{DEV_IB}/{entry}"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path(path))
            shutil.rmtree(where, ignore_errors=True)

    def set_ddp_profile(self, address: str, profile: str | None) -> None:
        """Load DDP profile `profile` on a PF (its VFs run it too); None leaves it without."""
        dev = self._pci(self.address(address))
        if profile is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(f"{dev}/.sim/ddp"))
        else:
            self._file(f"{dev}/.sim/ddp", profile)

    def install_ddptool(self, bin_dir: Path) -> Path:
        """A `ddptool` in `bin_dir` answering `ddptool -l -a -j -s <PCI address>` for this node's
        functions as Intel's tool does: the profile as JSON, exit code 8 for an Intel device
        without one, an error for other vendors' devices."""
        bin_dir.mkdir(parents=True, exist_ok=True)
        tool = bin_dir / "ddptool"
        package = '"track_id": "80000008", "version": "1.0.3.0", "name": "%s"'
        answer = ('{"DDPInventory": {"device": "%s", "address": "%s", "name": "", "display": "", '
                  f'"DDPpackage": {{{package}}}}}}}\\n')
        tool.write_text("\n".join((
            "#!/bin/sh",
            "for arg; do address=$arg; done",
            f'dev="{self.path(PCI_DEVICES)}/$address"',
            'if [ ! -e "$dev/vendor" ]; then echo "no device $address" >&2; exit 2; fi',
            'if [ "$(cat "$dev/vendor")" != 0x8086 ]; then echo "not supported" >&2; exit 2; fi',
            'profile=$(cat "$dev/.sim/ddp" 2>/dev/null || cat "$dev/physfn/.sim/ddp" 2>/dev/null)',
            f'if [ -z "$profile" ]; then exit {DDPTOOL_NO_PROFILE}; fi',
            f"printf '{answer}' \"$(cut -c3- \"$dev/device\")\" \"$address\" \"$profile\"",
            "",
        )))
        tool.chmod(0o755)
        return tool

    # -------------------------------------------------------------------- internals
    def _pci(self, address: str) -> str:
        """The real sysfs directory of a PCI function (what /sys/bus/pci/devices links to)."""
        link = self.path(f"{PCI_DEVICES}/{address}").resolve()
        return "/sys/" + str(link.relative_to(self.path("/sys").resolve()))

    def _read(self, path: str) -> str:
        text = self.read(path)
        if text is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return text

    def _file(self, path: str, content: str) -> None:
        p = self.path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content + "\n" if content else "")

    def _link(self, path: str, target: str) -> None:
        """A relative symlink, as sysfs has them, so the tree works under any root."""
        p = self.path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(p):
            p.unlink()
        # Spelled up to the target's parent and down again, so even a link to an ancestor (a
        # netdev's `device`) names its target: ../../../0000:3b:00.0, not ../..
        parent = os.path.relpath(os.path.dirname(target), os.path.dirname(path))
        os.symlink(os.path.join(parent, os.path.basename(target)), p)

    def _set_driver_link(self, address: str, driver: str) -> None:
        dev = self._pci(address)
        self.path(f"{PCI_DRIVERS}/{driver}").mkdir(parents=True, exist_ok=True)
        self._link(f"{dev}/driver", f"{PCI_DRIVERS}/{driver}")
        self._link(f"{PCI_DRIVERS}/{driver}/{address}", dev)

    def _unbind(self, address: str) -> None:
        dev = self._pci(address)
        driver = self.link_name(f"{dev}/driver")
        if driver is None:
            return
        os.unlink(self.path(f"{dev}/driver"))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(f"{PCI_DRIVERS}/{driver}/{address}"))
        if driver == "vfio-pci":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(f"{DEV_VFIO}/{self.link_name(f'{dev}/iommu_group')}"))
        for uio in self.listdir(f"{dev}/uio"):
            for path in (f"{CLASS_UIO}/{uio}", f"/dev/{uio}"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path(path))
        shutil.rmtree(self.path(f"{dev}/uio"), ignore_errors=True)
        for entry in self.listdir(dev):  # vDPA devices go with the driver that made them
            if entry.startswith("vdpa") and self.exists(f"{VDPA_DEVICES}/{entry}"):
                self._remove_vdpa(dev, entry)

    def _bind_mlx5(self, address: str, name: str, mac: str, guid: str, up: bool = True) -> None:
        """What mlx5_core + mlx5_ib + ib_ipoib do when they probe a function."""
        dev = self._pci(address)
        self._set_driver_link(address, PF_DRIVER)
        link_type = "ib" if self._read(f"{dev}/class") == "0x020700" else "eth"
        self._add_netdev(dev, name, link_type, mac if link_type == "eth" else _ipoib_addr(guid), up)
        if link_type == "eth" and not self.exists(f"{dev}/physfn"):
            self._file(f"{dev}/net/{name}/phys_port_name", f"p{_split_address(address)[2] & 7}")
        self._add_rdma(address, name, guid, up)

    def _add_netdev(self, dev: str, name: str, link_type: str, address: str, up: bool) -> None:
        net = f"{dev}/net/{name}"
        ib = link_type == "ib"
        ifindex = len(self.listdir(CLASS_NET)) + 2  # 1 is lo
        for attr, value in (
            ("type", str(ARPHRD_INFINIBAND if ib else ARPHRD_ETHER)),
            ("addr_len", "20" if ib else "6"), ("address", address),
            ("mtu", "4092" if ib else "1500"), ("ifindex", str(ifindex)), ("dev_port", "0"),
            ("operstate", "up" if up else "down"), ("carrier", "1" if up else "0"),
            ("flags", "0x1003"),  # IFF_UP | IFF_BROADCAST | IFF_MULTICAST
            ("speed", ("400000" if ib else "100000") if up else "-1"),
        ):
            self._file(f"{net}/{attr}", value)
        if ib:
            self._file(f"{net}/pkey", "0xffff")
            self._file(f"{net}/mode", "datagram")
        self._link(f"{net}/device", dev)
        self._link(f"{CLASS_NET}/{name}", net)

    def _add_rdma(self, address: str, netdev: str | None, guid: str, up: bool) -> str:
        dev = self._pci(address)
        link_type = "ib" if self._read(f"{dev}/class") == "0x020700" else "eth"
        return self._add_rdma_at(dev, netdev, guid, up, link_type)

    def _add_rdma_at(
        self, dev: str, netdev: str | None, guid: str, up: bool, link_type: str
    ) -> str:
        taken = {int(n.rsplit("_", 1)[1]) for n in self.listdir(CLASS_IB) if "_" in n}
        name = f"mlx5_{_lowest_free(taken)}"
        ib = f"{dev}/infiniband/{name}"
        fw, _, board = (self.read(f"{dev}/.sim/fw") or "").partition("\n")
        pci_dev = self.read(f"{dev}/device")
        for attr, value in (
            ("node_type", "1: CA"), ("node_guid", guid), ("sys_image_guid", guid),
            ("fw_ver", fw), ("hca_type", f"MT{int(pci_dev, 16)}" if pci_dev else "MT4126"),
            ("hw_rev", "0"), ("board_id", board), ("node_desc", f"{name}"),
        ):
            self._file(f"{ib}/{attr}", value)
        port = f"{ib}/ports/1"
        is_ib = link_type == "ib"
        for attr, value in (
            ("state", "4: ACTIVE" if up else "1: DOWN"),
            ("phys_state", "5: LinkUp" if up else "3: Disabled"),
            ("link_layer", "InfiniBand" if is_ib else "Ethernet"),
            ("rate", "400 Gb/sec (4X NDR)" if is_ib else "100 Gb/sec (4X EDR)"),
            ("lid", "0x0"), ("sm_lid", "0x0"), ("pkeys/0", "0xffff"),
            ("gids/0", f"fe80:0000:0000:0000:{guid}"),
        ):
            self._file(f"{port}/{attr}", value)
        # The rest of the port's GID table, empty entries reading as zeros (mlx5: 128 on
        # these ports); on RoCE the link-local address fills entry 0 (v1) and 1 (v2).
        for index in range(1, GID_TABLE_LENGTH):
            self._file(f"{port}/gids/{index}", ZERO_GID)
        if not is_ib and netdev:
            self._file(f"{port}/gids/1", f"fe80:0000:0000:0000:{guid}")
            for index, kind in ((0, "IB/RoCE v1"), (1, "RoCE v2")):
                self._file(f"{port}/gid_attrs/ndevs/{index}", netdev)
                self._file(f"{port}/gid_attrs/types/{index}", kind)
        self._link(f"{ib}/device", dev)
        self._link(f"{CLASS_IB}/{name}", ib)
        verbs = _lowest_free({int(n[6:]) for n in self.listdir(CLASS_VERBS) if n[6:].isdigit()})
        mad = _lowest_free({int(n[4:]) for n in self.listdir(CLASS_MAD)
                            if n.startswith("umad")})
        for cls, entry, files in (
            (CLASS_VERBS, f"uverbs{verbs}", {"ibdev": name, "abi_version": "1",
                                              "dev": f"231:{192 + verbs}"}),
            (CLASS_MAD, f"umad{mad}", {"ibdev": name, "port": "1", "dev": f"231:{mad}"}),
            (CLASS_MAD, f"issm{mad}", {"ibdev": name, "port": "1", "dev": f"231:{64 + mad}"}),
        ):
            where = f"{dev}/{PurePosixPath(cls).name}/{entry}"
            for attr, value in files.items():
                self._file(f"{where}/{attr}", value)
            self._link(f"{where}/device", dev)
            self._link(f"{cls}/{entry}", where)
            self._file(f"{DEV_IB}/{entry}", "")
        return name

    def _remove_rdma(self, address: str) -> None:
        self._remove_rdma_at(self._pci(address))

    def _remove_rdma_at(self, dev: str) -> None:
        for cls in (CLASS_VERBS, CLASS_MAD):
            sub = f"{dev}/{PurePosixPath(cls).name}"
            for entry in self.listdir(sub):
                for path in (f"{cls}/{entry}", f"{DEV_IB}/{entry}"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.path(path))
            shutil.rmtree(self.path(sub), ignore_errors=True)
        for name in self.listdir(f"{dev}/infiniband"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(f"{CLASS_IB}/{name}"))
        shutil.rmtree(self.path(f"{dev}/infiniband"), ignore_errors=True)

    def _remove_function(self, address: str) -> None:
        dev = self._pci(address)
        self._unbind(address)
        self._remove_rdma_at(dev)
        for name in self.listdir(f"{dev}/net"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(f"{CLASS_NET}/{name}"))
        group = self.link_name(f"{dev}/iommu_group")
        if group is not None:
            shutil.rmtree(self.path(f"{IOMMU_GROUPS}/{group}"), ignore_errors=True)
        os.unlink(self.path(f"{PCI_DEVICES}/{address}"))
        shutil.rmtree(self.path(dev))


def _class_code(link_type: str) -> int:
    """PCI class of a ConnectX port: InfiniBand controller or Ethernet controller."""
    return 0x020700 if link_type == "ib" else 0x020000


def _vpd(name: str, serial: str, uuid: str) -> bytes:
    """A ConnectX VPD image (PCI 3.0 VPD): the product name, then the read-only part with the
    serial number (SN), the UUID all functions of the adapter share (V3) and the checksum (RV)
    that makes every byte up to it add up to 0."""
    def large(tag: int, data: bytes) -> bytes:
        return bytes([tag]) + len(data).to_bytes(2, "little") + data

    def keyword(key: str, value: bytes) -> bytes:
        return key.encode() + bytes([len(value)]) + value

    read_only = keyword("SN", serial.encode()) + keyword("V3", uuid.encode())
    head = large(0x82, name.encode()) + large(0x90, read_only + keyword("RV", b"\0"))
    checksum = -sum(head[:-1]) & 0xFF
    return head[:-1] + bytes([checksum]) + bytes([0x78])  # 0x78: the end tag


def _vpd_uuid(seed: int, index: int) -> str:
    """An adapter's V3 UUID, 32 hex digits as ConnectX firmware writes it, fixed per NIC."""
    return f"{seed & 0xFFFF:04x}{index:04x}" + "a1d25eed" * 3


def _gpu_uuid(seed: int, index: int) -> str:
    """A GPU UUID as nvidia-smi prints it, fixed per node (`seed`) and GPU."""
    n = (seed & 0xFFFF) << 16 | index
    return f"GPU-{n:08x}-5a1d-4c3e-9b00-{0x0d6a0000_0000 + n:012x}"


def _derived_mac(pf_mac: str, kind: int, n: int) -> str:
    """A locally administered MAC for function `n` of a PF: kind, the PF's low bytes, `n`."""
    low = pf_mac.split(":")[3:]
    return f"{kind:02x}:{':'.join(low)}:{n >> 8 & 0xFF:02x}:{n & 0xFF:02x}"


def _guid(mac: str) -> str:
    """The node GUID mlx5 derives from a MAC: OUI, 03:00, then the low three bytes."""
    b = mac.split(":")
    return f"{b[0]}{b[1]}:{b[2]}03:00{b[3]}:{b[4]}{b[5]}"


def _ipoib_addr(guid: str) -> str:
    """An IPoIB hardware address: flags and QPN, then the port GID (fe80::<port GUID>)."""
    g = guid.replace(":", "")
    gid = "fe80000000000000" + g
    return "00:00:10:47:" + ":".join(gid[i:i + 2] for i in range(0, 32, 2))

