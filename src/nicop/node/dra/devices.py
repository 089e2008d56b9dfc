"""The DRA devices of a node: one per RDMA-capable Mellanox PF, one per VF, with the attributes
claims select on (kind, link, NUMA node, PCIe root for GPU alignment, PF and VF index).

What is published:
- a PF with an RDMA device, whatever its link state (`linkUp` tells; a claim can require it);
  with its link down it carries the taint `rdma.nicop.io/link-down` (NoSchedule), so new claims
  go elsewhere unless they tolerate it, and it loses the taint when the link is back;
- with `shared` (draDriver.sharedRdma), a PF without VFs as one shared device instead
  (`shared-0000-3b-00-0`, kind `shared`): many claims at once, each taking one of its `pods`
  (see `dra.POD_CAPACITY`);
- a VF bound to a driver (vfio-pci counts), while its PF's link is up; once the SR-IOV DRA
  driver's SriovResourcePolicies exist, only the VFs they select, with the attributes of their
  DeviceAttributes (nicop.node.dra.vf_policy). A VF shares its PF's port,
  so with the PF down it can carry nothing: its device leaves the slice instead of staying
  allocatable with `linkUp: false`, and comes back, under the same name, when the link does.

A PF with VFs and its VFs consume the PF's counter set, so the PF goes to one claim whole or to
others VF by VF (see `dra.VF_COUNTER`). Such a PF leaves the slice with its VFs while its link is
down: the scheduler counts what allocated devices consume only from the devices it sees, so with
the VFs gone it would hand the PF out beside VFs that claims still hold.

Device names are DNS labels built from the PCI address (`pf-0000-3b-00-0`, `vf-0000-3b-00-2`):
unique per node, and the same on every rescan because addresses are, so an allocation keeps
naming the device it got. Attributes a node cannot read are left out, never guessed.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from typing import Any

from nicop.api import dra
from nicop.node import kernel
from nicop.node.discovery import NETWORK_CLASS, PCI_DEVICES, Inventory, PciFunction
from nicop.node.dra import data_direct
from nicop.node.dra.slices import PoolContent
from nicop.node.dra.vf_policy import Vf, VfPolicy
from nicop.node.host import Host

log = logging.getLogger(__name__)

MELLANOX_VENDOR = "15b3"
INFINIBAND_CLASS = 0x0207  # PCI base class and subclass of an InfiniBand controller
_PCIE_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")
_FIRMWARE = re.compile(r"(\d+)\.(\d+)\.(\d+)")
ZERO_GUID = "0000:0000:0000:0000"


@dataclass(frozen=True)
class Device:
    """One device of a ResourceSlice: its name and typed attribute values, as the API has them."""

    name: str
    attributes: dict[str, dict[str, Any]]  # {"linkUp": {"bool": True}, ...}
    consumes: tuple[str, int] | None = None  # (counter set, VFs' worth of its PF)
    taints: tuple[dict[str, str], ...] = ()
    shared_pods: int | None = None  # a shared port: how many claims it takes

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name,
                               "attributes": dict(sorted(self.attributes.items()))}
        if self.taints:
            out["taints"] = [dict(t) for t in self.taints]
        if self.shared_pods is not None:
            out["allowMultipleAllocations"] = True
            out["capacity"] = {dra.POD_CAPACITY: {
                "value": str(self.shared_pods),
                "requestPolicy": {"default": "1", "validValues": ["1"]}}}
        if self.consumes is not None:
            counter_set, amount = self.consumes
            out["consumesCounters"] = [{"counterSet": counter_set,
                                        "counters": {dra.VF_COUNTER: {"value": str(amount)}}}]
        return out


def device_name(kind: str, address: str) -> str:
    """`vf`, `0000:3b:00.2` -> `vf-0000-3b-00-2` (DNS labels allow neither `:` nor `.`)."""
    return f"{kind}-{address.replace(':', '-').replace('.', '-')}"


def node_pool(inv: Inventory, host: Host, *, shared: bool = False,
              vfs: VfPolicy | None = None) -> PoolContent:
    """The node's devices and counter sets, as the node's pool of ResourceSlices holds them."""
    return PoolContent([d.to_api() for d in node_devices(inv, host, shared=shared, vfs=vfs)],
                       counter_sets(inv))


def counter_sets(inv: Inventory) -> list[dict[str, Any]]:
    """One counter set per Mellanox PF with VFs: `vfs`, as many as the PF has."""
    return [{"name": device_name(dra.KIND_PF, fn.address),
             "counters": {dra.VF_COUNTER: {"value": str(fn.num_vfs)}}}
            for fn in sorted(inv.functions.values(), key=lambda f: f.address)
            if _mellanox_nic(fn) and fn.pf is None and fn.num_vfs > 0]


def _mellanox_nic(fn: PciFunction) -> bool:
    return fn.vendor == MELLANOX_VENDOR and fn.base_class == NETWORK_CLASS


def node_devices(inv: Inventory, host: Host, *, shared: bool = False,
                 vfs: VfPolicy | None = None) -> list[Device]:
    """The node's devices, ordered by name; with `shared`, ports without VFs as shared
    devices; with `vfs` (SriovResourcePolicies), only the VFs it selects, with its
    attributes."""
    driver_version = kernel.loaded_version(host)
    result = []
    for fn in inv.functions.values():
        if not _mellanox_nic(fn):
            continue
        if fn.pf is None:
            if fn.rdma and (fn.num_vfs == 0 or link_up(fn)):
                device = _device(inv, host, fn, None, driver_version)
                if shared and fn.num_vfs == 0:
                    device = _shared(host, fn, device)
                result.append(device)
            continue
        pf = inv.functions.get(fn.pf)
        if pf is None or not fn.driver or pf.num_vfs == 0:
            continue  # no PF, an unbound VF, or one going while sriov_numvfs is being reset
        if not link_up(pf):
            log.debug("VF %s left out: link of its PF %s is down", fn.address, pf.address)
            continue
        device = _device(inv, host, fn, pf, driver_version)
        if vfs is not None:
            pf_net = inv.pf_netdev(fn)
            extra = vfs.attributes(Vf(fn.vendor, fn.device, fn.address,
                                      pf_net.name if pf_net else None, pf.address,
                                      _link_type(fn)))
            if extra is None:
                continue  # no SriovResourcePolicy selects it
            device = replace(device, attributes={**extra, **device.attributes})
        result.append(device)
    return sorted(result, key=lambda d: d.name)


def link_up(fn: PciFunction) -> bool:
    """The function's port is up: its netdev, or without one its RDMA port."""
    if fn.netdev is not None:
        return fn.netdev.up
    return any(r.port_state == "ACTIVE" for r in fn.rdma)


def pcie_root(host: Host, address: str) -> str | None:
    """`pci<domain>:<bus>` of the root complex the function sits behind: the first element under
    /sys/devices of where /sys/bus/pci/devices/<address> links to (as Kubernetes' helper)."""
    try:
        target = host.path(f"{PCI_DEVICES}/{address}").resolve(strict=True)
        parts = target.relative_to(host.path("/sys/devices").resolve(strict=True)).parts
    except (OSError, ValueError):
        return None
    return parts[0] if parts and _PCIE_ROOT.fullmatch(parts[0]) else None


def _device(
    inv: Inventory, host: Host, fn: PciFunction, pf: PciFunction | None,
    driver_version: str | None,
) -> Device:
    kind = dra.KIND_VF if pf is not None else dra.KIND_PF
    link_type = _link_type(fn)
    rdma = fn.rdma[0].name if fn.rdma else None
    attrs: dict[str, Any] = {
        dra.KIND: kind,
        dra.PCI_ADDRESS: fn.address,
        dra.PCI_BUS_ID: fn.address,
        dra.PCIE_ROOT: pcie_root(host, fn.address),
        dra.NUMA_NODE: fn.numa_node,
        dra.STANDARD_NUMA_NODE: fn.numa_node if fn.numa_node >= 0 else None,
        dra.VENDOR_ID: fn.vendor,
        dra.DEVICE_ID: fn.device,
        dra.LINK_TYPE: link_type,
        dra.LINK_UP: link_up(fn),
        dra.RDMA_DEVICE: rdma,
        dra.NETDEV: fn.netdev.name if fn.netdev else None,
        dra.DRIVER_VERSION: driver_version,
    }
    if link_type == dra.LINK_INFINIBAND:
        attrs[dra.PORT_GUID] = _port_guid(host, fn.address, rdma)
    elif fn.netdev is not None:
        attrs[dra.MAC_ADDRESS] = host.read(f"/sys/class/net/{fn.netdev.name}/address")
    if pf is not None:
        pf_net = inv.pf_netdev(fn)
        attrs[dra.PF_NAME] = pf_net.name if pf_net else None
        attrs[dra.VF_INDEX] = fn.vf_index
    direct = data_direct.function(inv, host, fn) if pf is None else None
    if direct is not None:  # GPUDirect goes through it: its root is the one the GPU shares
        attrs[dra.NIC_PCIE_ROOT], attrs[dra.DATA_DIRECT] = attrs[dra.PCIE_ROOT], direct
        attrs[dra.PCIE_ROOT] = pcie_root(host, direct)
    firmware = _firmware(host, fn) or (_firmware(host, pf) if pf is not None else None)
    typed = {name: _typed(name, value) for name, value in attrs.items() if value is not None}
    if firmware:
        typed[dra.FIRMWARE_VERSION] = {"version": firmware}
    counter_pf = pf if pf is not None else fn
    consumes = None
    if counter_pf.num_vfs > 0:
        consumes = (device_name(dra.KIND_PF, counter_pf.address),
                    1 if pf is not None else fn.num_vfs)
    taints = () if attrs[dra.LINK_UP] else ({
        "key": dra.TAINT_LINK_DOWN, "value": fn.netdev.name if fn.netdev else fn.address,
        "effect": dra.TAINT_NO_SCHEDULE},)
    return Device(device_name(kind, fn.address), {k: v for k, v in typed.items() if v}, consumes,
                  taints)


def _shared(host: Host, fn: PciFunction, pf: Device) -> Device:
    """The PF's port as a shared device: its attributes, kind `shared`, and pods capacity."""
    attributes = {**pf.attributes, dra.KIND: {"string": dra.KIND_SHARED}}
    return replace(pf, name=device_name(dra.KIND_SHARED, fn.address), attributes=attributes,
                   shared_pods=shared_pods(host, fn))


def shared_pods(host: Host, fn: PciFunction) -> int:
    """How many pods a shared port takes: on RoCE, what its GID table leaves after the port's
    own two entries, two a pod; on InfiniBand, dra.IB_SHARED_PODS."""
    if _link_type(fn) == dra.LINK_INFINIBAND or not fn.rdma:
        return dra.IB_SHARED_PODS
    gids = host.listdir(f"{PCI_DEVICES}/{fn.address}/infiniband/{fn.rdma[0].name}/ports/1/gids")
    return max(0, (len(gids) - dra.GIDS_PER_POD) // dra.GIDS_PER_POD)


def _typed(name: str, value: Any) -> dict[str, Any]:
    """The API's one-of value; a string over the API's limit is left out (empty), not cut."""
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if len(value) > dra.MAX_STRING_LENGTH:
        log.warning("attribute %s left out: %r is longer than %d characters", name, value,
                    dra.MAX_STRING_LENGTH)
        return {}
    return {"string": value}


def _link_type(fn: PciFunction) -> str:
    """From the netdev when there is one, else from the PCI class (a VF bound to vfio-pci)."""
    if fn.netdev is not None and fn.netdev.link_type:
        return dra.LINK_INFINIBAND if fn.netdev.link_type == "infiniband" else dra.LINK_ETHERNET
    return dra.LINK_INFINIBAND if fn.class_code >> 8 == INFINIBAND_CLASS else dra.LINK_ETHERNET


def _port_guid(host: Host, address: str, rdma: str | None) -> str | None:
    """Port 1's GUID (the low half of its GID 0); None while unassigned (a fresh VF's is 0)."""
    if rdma is None:
        return None
    gid = host.read(f"{PCI_DEVICES}/{address}/infiniband/{rdma}/ports/1/gids/0") or ""
    guid = ":".join(gid.split(":")[4:])
    return guid if guid and guid != ZERO_GUID else None


def _firmware(host: Host, fn: PciFunction) -> str | None:
    """The firmware version as semver: mlx5's `22.38.1900`; leading zeros dropped (`0292`)."""
    for r in fn.rdma:
        text = host.read(f"{PCI_DEVICES}/{fn.address}/infiniband/{r.name}/fw_ver") or ""
        match = _FIRMWARE.match(text)
        if match:
            return ".".join(str(int(g)) for g in match.groups())
    return None
