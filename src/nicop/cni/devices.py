"""What sysfs says about a PCI function: its netdev, its PF, its VF index, its driver.

Read through the node's `Host`, so a fixture tree can stand in for /sys while the links
themselves are real (in tests, veth pairs named like the fixture's VF netdevs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nicop.cni.spec import config_error
from nicop.node.host import Host

PCI_DEVICES = "/sys/bus/pci/devices"
AUX_DEVICES = "/sys/bus/auxiliary/devices"
PCI_ADDRESS = re.compile(r"^(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
USERSPACE_DRIVERS = ("vfio-pci", "uio_pci_generic", "igb_uio")


@dataclass
class PciNetDevice:
    pci: str
    netdev: str | None
    driver: str | None
    pf: str | None = None
    """The PF's netdev, for a VF."""
    vf_index: int | None = None
    """N such that the PF's virtfnN is this function."""

    @property
    def userspace(self) -> bool:
        """Bound to a DPDK driver: no netdev to move, no addresses to configure."""
        return self.driver in USERSPACE_DRIVERS


def normalize_pci(field: str, value: object) -> str:
    """A full PCI address (domain:bus:device.function) from a config value, or a CNI error."""
    if not isinstance(value, str) or not PCI_ADDRESS.match(value):
        raise config_error(field, f"{value!r} is not a PCI address such as 0000:3b:00.2")
    value = value.lower()
    return value if value.count(":") == 2 else "0000:" + value


def pci_device(host: Host, field: str, pci: str) -> PciNetDevice:
    """The function at `pci` with its netdev and, for a VF, its PF and index."""
    dev = f"{PCI_DEVICES}/{pci}"
    if not host.exists(dev):
        raise config_error(field, f"no PCI device {pci} on this node")
    nets = host.listdir(f"{dev}/net")
    device = PciNetDevice(pci=pci, netdev=nets[0] if nets else None,
                          driver=host.link_name(f"{dev}/driver"))
    pf_nets = host.listdir(f"{dev}/physfn/net")
    if pf_nets:
        device.pf = pf_nets[0]
        for entry in host.listdir(f"{dev}/physfn"):
            if entry.startswith("virtfn") and host.link_name(f"{dev}/physfn/{entry}") == pci:
                device.vf_index = int(entry[len("virtfn"):])
                break
    return device


def kernel_path_netdev(host: Host, path: str) -> str | None:
    """The first netdev under a /sys/devices/... path (host-device's `kernelpath`)."""
    nets = host.listdir(f"{path.rstrip('/')}/net")
    return nets[0] if nets else None
