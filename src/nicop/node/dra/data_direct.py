"""A ConnectX-8's Data Direct function: the PCIe path its GPUDirect traffic really takes.

From ConnectX-8 on, a NIC may expose beside its PFs a "Data Direct" PCI function (15b3:2100), a
DMA engine that its RDMA devices use to reach memory along another PCIe path. On GB300 and later
trays that function sits behind the PCIe root of the NIC's GPU, while the PFs sit behind a root
of their own: the root that aligns the NIC with its GPU is the Data Direct function's. (NVIDIA's
SR-IOV DRA driver publishes the PF's root there, and its documentation says it cannot align
these NICs.)

How a PF finds its function: the kernel pairs them by a VUID (the function reads it from its
VPD, the RDMA device asks the firmware) and tells user space only through an mlx5 verbs method
(GET_DATA_DIRECT_SYSFS_PATH, what NCCL calls), which needs the verbs device opened. The plugin
reads sysfs only, so it pairs them as rdma-core's rdma_topo does: by the UUID under keyword V3
of the read-only VPD, which the PFs and the Data Direct function of one adapter share
(/sys/bus/pci/devices/<address>/vpd; root reads it). Reading VPD goes to the device and is slow,
so a function's V3 is read once: it is the adapter's and does not change.
"""

from __future__ import annotations

import functools
import logging

from nicop.node.discovery import PCI_DEVICES, Inventory, PciFunction
from nicop.node.host import Host

log = logging.getLogger(__name__)

MELLANOX_VENDOR = "15b3"
DATA_DIRECT_DEVICE = "2100"  # the kernel's mlx5_data_direct_pci_table: ConnectX-8 Data Direct
VPD_READ_ONLY = 0x90  # the large resource holding the read-only keywords
VPD_END = 0x0F  # small resource name of the end tag (0x78)


def function(inv: Inventory, host: Host, pf: PciFunction) -> str | None:
    """The address of the Data Direct function of `pf`; None for NICs without one (all before
    ConnectX-8: no VPD is read then) and when more than one shares its V3 (no guessing)."""
    candidates = [f.address for f in inv.functions.values()
                  if f.vendor == MELLANOX_VENDOR and f.device == DATA_DIRECT_DEVICE]
    if not candidates:
        return None
    key = v3(host, pf.address)
    if key is None:
        return None
    matches = [a for a in candidates if v3(host, a) == key]
    if len(matches) > 1:
        log.warning("PF %s: Data Direct functions %s share its VPD V3 %s; publishing the PF's own "
                    "PCIe root", pf.address, ", ".join(matches), key)
        return None
    return matches[0] if matches else None


def v3(host: Host, address: str) -> str | None:
    """The V3 UUID of a function's VPD; None without VPD (or without the right to read it)."""
    try:
        path = host.path(f"{PCI_DEVICES}/{address}/vpd").resolve(strict=True)
    except OSError:
        return None
    return _v3(str(path))


@functools.lru_cache(maxsize=1024)
def _v3(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            value = read_only_keywords(f.read()).get("V3")
    except OSError:
        return None
    return (value.decode("ascii", "replace").strip() or None) if value else None


def read_only_keywords(vpd: bytes) -> dict[str, bytes]:
    """The keywords of a VPD image's read-only part (PCI VPD format: resources, each a tag and a
    length; in the read-only one, two-letter keywords with a one-byte length). What does not
    parse is left out."""
    keywords: dict[str, bytes] = {}
    at = 0
    while at < len(vpd):
        tag = vpd[at]
        if tag & 0x80:  # large resource: a 16-bit little-endian length
            length = int.from_bytes(vpd[at + 1:at + 3], "little")
            body, at = vpd[at + 3:at + 3 + length], at + 3 + length
        elif tag >> 3 == VPD_END:
            break
        else:
            body, at = vpd[at + 1:at + 1 + (tag & 7)], at + 1 + (tag & 7)
        if tag == VPD_READ_ONLY:
            i = 0
            while i + 3 <= len(body):
                size = body[i + 2]
                keywords[body[i:i + 2].decode("ascii", "replace")] = body[i + 3:i + 3 + size]
                i += 3 + size
    return keywords
