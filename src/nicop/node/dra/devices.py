"""The DRA devices of a node: one per RDMA-capable Mellanox PF, one per VF, with the attributes
claims select on (kind, link, NUMA node, PCIe root for GPU alignment, PF and VF index).

What is published:
- a PF with an RDMA device, whatever its link state (`linkUp` tells; a claim can require it);
  with its link down it carries the taint `rdma.nicop.io/link-down` (NoSchedule), so new claims
  go elsewhere unless they tolerate it, and it loses the taint when the link is back; a PF
  whose RDMA device is gone (mlx5_ib unloaded, the device removed) stays, its netdev still
  there, tainted `rdma.nicop.io/rdma-missing`, until the RDMA device is back;
- with `shared` (draDriver.sharedRdma), a PF without VFs as one shared device instead
  (`shared-0000-3b-00-0`, kind `shared`): many claims at once, each taking one of its `pods`
  (see `dra.POD_CAPACITY`);
- a VF bound to a driver (vfio-pci counts), while its PF's link is up; once the SR-IOV DRA
  driver's SriovResourcePolicies exist, only the VFs they select, with the attributes of their
  DeviceAttributes (nicop.node.dra.vf_policy);
- unless the plugin serves SR-IOV resources (draDriver.sriovResources), no PF whose VFs an
  SriovNetworkNodePolicy makes for the SR-IOV device plugin, nor those VFs: a NIC is served by
  one of the two; with it, such VFs carry the policy's `resourceName`, which the DeviceClass of
  `nvidia.com/<resourceName>` selects (nicop.api.dra.sriov_class);
- a VF that the node's SriovNetworkNodeState plans but that is not ready yet (not made, not bound
  to the driver its deviceType asks, or without its RDMA device): published ahead, under the name
  it will have, with binding conditions (nicop.node.dra.vf_plan), and tainted
  `rdma.nicop.io/vf-failed` once the config daemon gave up on its PF. A VF shares its PF's port,
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
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from nicop.api import dra
from nicop.node import kernel
from nicop.node.discovery import NETWORK_CLASS, PCI_DEVICES, Inventory, PciFunction
from nicop.node.dra import data_direct
from nicop.node.dra.slices import PoolContent
from nicop.node.dra.vf_plan import VFIO, PlannedPf
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
    planned: PlannedPf | None = None  # a VF published before it is ready: its PF's plan

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name,
                               "attributes": dict(sorted(self.attributes.items()))}
        if self.planned is not None:
            out["bindingConditions"] = [dra.CONDITION_VF_READY]
            out["bindingFailureConditions"] = [dra.CONDITION_VF_FAILED]
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


def device_address(name: str) -> tuple[str, str] | None:
    """`vf-0000-3b-00-2` -> (`vf`, `0000:3b:00.2`); None for a name device_name did not make."""
    kind, _, rest = name.partition("-")
    parts = rest.split("-")
    if len(parts) != 4 or not all(parts):
        return None
    domain, bus, slot, function = parts
    return kind, f"{domain}:{bus}:{slot}.{function}"


def node_pool(inv: Inventory, host: Host, *, shared: bool = False,
              vfs: VfPolicy | None = None,
              plan: Mapping[str, PlannedPf] | None = None) -> PoolContent:
    """The node's devices and counter sets, as the node's pool of ResourceSlices holds them."""
    return pool_content(node_devices(inv, host, shared=shared, vfs=vfs, plan=plan), inv, plan)


def pool_content(devices: list[Device], inv: Inventory,
                 plan: Mapping[str, PlannedPf] | None = None) -> PoolContent:
    return PoolContent([d.to_api() for d in devices], counter_sets(inv, plan or {}))


def counter_sets(inv: Inventory, plan: Mapping[str, PlannedPf]) -> list[dict[str, Any]]:
    """One counter set per Mellanox PF with VFs, made or planned: `vfs`, as many."""
    return [{"name": device_name(dra.KIND_PF, fn.address),
             "counters": {dra.VF_COUNTER: {"value": str(vf_slots(fn, plan))}}}
            for fn in sorted(inv.functions.values(), key=lambda f: f.address)
            if _mellanox_nic(fn) and fn.pf is None and vf_slots(fn, plan) > 0]


def vf_slots(pf: PciFunction, plan: Mapping[str, PlannedPf]) -> int:
    """The PF's VFs as the counter set counts them: those it has, or more if more are planned."""
    planned = plan.get(pf.address)
    return max(pf.num_vfs, planned.num_vfs if planned else 0)


def _mellanox_nic(fn: PciFunction) -> bool:
    return fn.vendor == MELLANOX_VENDOR and fn.base_class == NETWORK_CLASS


def node_devices(inv: Inventory, host: Host, *, shared: bool = False,
                 vfs: VfPolicy | None = None,
                 plan: Mapping[str, PlannedPf] | None = None,
                 sriov_resources: bool = True) -> list[Device]:
    """The node's devices, ordered by name; with `shared`, ports without VFs as shared
    devices; with `vfs` (SriovResourcePolicies), only the VFs it selects, with its
    attributes; with `plan` (the node state's spec), the planned VFs not ready yet too, but
    without `sriov_resources` no PF whose VFs a policy's resourceName gives the device
    plugin, nor those VFs: one NIC is served one way."""
    plan = plan or {}
    plugins = set() if sriov_resources else {a for a, p in plan.items() if p.resources}
    driver_version = kernel.loaded_version(host)
    result = []
    made: set[tuple[str, int | None]] = set()  # (PF, VF index) of the VFs already published
    for fn in inv.functions.values():
        if not _mellanox_nic(fn) or (fn.pf or fn.address) in plugins:
            continue
        if fn.pf is None:
            if (fn.rdma or fn.netdev) and (vf_slots(fn, plan) == 0 or link_up(fn)):
                device = _device(inv, host, fn, None, driver_version, plan)
                if shared and vf_slots(fn, plan) == 0:
                    device = _shared(host, fn, device)
                result.append(device)
            continue
        pf = inv.functions.get(fn.pf)
        if pf is None or pf.num_vfs == 0 or not link_up(pf):
            continue  # no PF, a VF going while sriov_numvfs is being reset, or a PF link down
        planned = plan.get(pf.address)
        if planned is None and not fn.driver:
            continue  # an unbound VF nobody plans

        made.add((pf.address, fn.vf_index))
        chosen = _with_policy(vfs, _device(inv, host, fn, pf, driver_version, plan), pf)
        if chosen is not None and planned is not None and not _ready(fn, planned):
            chosen = _pending(chosen, planned)
        if chosen is not None:
            result.append(chosen)
    for planned in plan.values():
        pf = inv.functions.get(planned.address)
        if pf is None or not _mellanox_nic(pf) or not link_up(pf) or pf.address in plugins:
            continue
        for index in range(planned.num_vfs):
            if (pf.address, index) not in made:
                vf = _planned_vf(host, pf, index)
                if vf is None:
                    continue
                chosen = _with_policy(vfs, _device(inv, host, vf, pf, driver_version, plan), pf)
                if chosen is not None:
                    result.append(_pending(chosen, planned))
    return sorted(result, key=lambda d: d.name)


def _with_policy(vfs: VfPolicy | None, device: Device, pf: PciFunction) -> Device | None:
    """A VF with the attributes of the SriovResourcePolicy selecting it; None if none does
    (with no policies at all, every VF as it is)."""
    if vfs is None:
        return device
    attrs = device.attributes
    extra = vfs.attributes(Vf(
        attrs[dra.VENDOR_ID]["string"], attrs[dra.DEVICE_ID]["string"],
        attrs[dra.PCI_ADDRESS]["string"], pf.netdev.name if pf.netdev else None, pf.address,
        attrs[dra.LINK_TYPE]["string"]))
    if extra is None:
        return None  # no SriovResourcePolicy selects it
    return replace(device, attributes={**extra, **attrs})


def _ready(vf: PciFunction, planned: PlannedPf) -> bool:
    """Bound to the driver its deviceType asks; on the kernel's driver, with its RDMA device."""
    if vf.vf_index in planned.vfio:
        return vf.driver == VFIO
    return bool(vf.driver) and vf.driver != VFIO and bool(vf.rdma)


def _pending(device: Device, planned: PlannedPf) -> Device:
    """A planned VF: binding conditions, and once its PF failed, the taint that says so."""
    taints = device.taints
    if planned.failure is not None:
        taints = (*taints, {"key": dra.TAINT_VF_FAILED, "value": device.name,
                            "effect": dra.TAINT_NO_SCHEDULE})
    return replace(device, planned=planned, taints=taints)


def _planned_vf(host: Host, pf: PciFunction, index: int) -> PciFunction | None:
    """A VF not made yet, where its PF's SR-IOV capability places it (sriov_offset, _stride);
    its own attributes (netdev, MAC, RDMA device) come once it exists."""
    base = f"{PCI_DEVICES}/{pf.address}"
    offset, stride = host.read_int(f"{base}/sriov_offset"), host.read_int(f"{base}/sriov_stride")
    vf_device = (host.read(f"{base}/sriov_vf_device") or "").removeprefix("0x")
    if offset is None or stride is None or not vf_device:
        return None
    domain, bus, rest = pf.address.split(":")
    slot, function = rest.split(".")
    position = (int(slot, 16) << 3 | int(function)) + offset + stride * index
    address = (f"{domain}:{int(bus, 16) + (position >> 8):02x}:"
               f"{(position & 0xFF) >> 3:02x}.{position & 7:x}")
    return replace(pf, address=address, device=vf_device, driver=None, netdevs=(), rdma=(),
                   pf=pf.address, vf_index=index, total_vfs=None, num_vfs=0, acpi_index=None)


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
    driver_version: str | None, plan: Mapping[str, PlannedPf],
) -> Device:
    kind = dra.KIND_VF if pf is not None else dra.KIND_PF
    link_type = _link_type(fn)
    rdma = fn.rdma[0].name if fn.rdma else None
    attrs: dict[str, Any] = {
        dra.KIND: kind,
        dra.PCI_ADDRESS: fn.address,
        dra.PCI_BUS_ID: fn.address,
        dra.PCIE_ROOT: pcie_root(host, fn.address) or (pcie_root(host, pf.address) if pf else None),
        dra.NUMA_NODE: fn.numa_node,
        dra.STANDARD_NUMA_NODE: fn.numa_node if fn.numa_node >= 0 else None,
        dra.VENDOR_ID: fn.vendor,
        dra.DEVICE_ID: fn.device,
        dra.LINK_TYPE: link_type,
        dra.LINK_UP: link_up(pf if pf is not None else fn),  # a VF has its PF's port
        dra.RDMA_DEVICE: rdma,
        dra.NETDEV: fn.netdev.name if fn.netdev else None,
        dra.DRIVER_VERSION: driver_version,
    }
    if link_type == dra.LINK_INFINIBAND:
        attrs[dra.PORT_GUID] = _port_guid(host, fn.address, rdma)
    elif fn.netdev is not None:
        attrs[dra.MAC_ADDRESS] = host.read(f"/sys/class/net/{fn.netdev.name}/address")
    if pf is not None:
        pf_net = pf.netdev
        attrs[dra.PF_NAME] = pf_net.name if pf_net else None
        attrs[dra.VF_INDEX] = fn.vf_index
        planned = plan.get(pf.address)
        attrs[dra.RESOURCE_NAME] = planned.resource_of(fn.vf_index) if planned else None
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
    if vf_slots(counter_pf, plan) > 0:
        consumes = (device_name(dra.KIND_PF, counter_pf.address),
                    1 if pf is not None else vf_slots(fn, plan))
    value = fn.netdev.name if fn.netdev else fn.address
    taints = tuple({"key": key, "value": value, "effect": dra.TAINT_NO_SCHEDULE} for key, on in (
        (dra.TAINT_LINK_DOWN, not attrs[dra.LINK_UP]),
        (dra.TAINT_RDMA_MISSING, pf is None and not fn.rdma)) if on)
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
