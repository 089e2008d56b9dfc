"""`nicop sriov-config-daemon`: applies this node's SriovNetworkNodeState to the host.

The daemon reports the node's SR-IOV capable PFs and their VFs in the node state's
status.interfaces (upstream's keys, among them `Vfs`, `totalvfs` and per VF `Vlan`), and makes the
host match spec.interfaces, every step through the `Host` root:

- `sriov_numvfs`: 0 first, then N (the kernel refuses to change a non-zero count directly);
- the PF MTU, only ever raised; the VF MTU of netdevice groups;
- VF drivers: vfio-pci groups bound through `driver_override`, netdevice groups given back to
  their kernel driver through `drivers_probe`;
- PFs configured earlier but no longer in the spec get their VFs removed (the applied config of
  each PF is kept in `/etc/sriov-operator/pci/<address>`, as upstream does);
- a link type change (eth <-> ib) is a firmware setting (mstconfig) followed by a reboot.

Changing a PF that already has VFs may pull a VF from under a running pod, so the daemon asks the
operator for a drain first (annotations `sriovnetwork.openshift.io/state` on the Node and
`desired-state` on the node state: `Drain_Required`, or `Reboot_Required` for a firmware change)
and waits for `current-state: DrainComplete`; creating VFs on a PF that has none needs no drain.
When done it goes back to `Idle`, which lets the operator uncordon the node.

`syncStatus` is `InProgress` while it works and `Succeeded` once the host matches the spec. Where
upstream retries forever and leaves `InProgress` (its users' top complaint), nicop tries a bounded
number of times and then reports `Failed` with a `lastSyncError` that names the PF and the step
(e.g. "PF enp59s0f0np0 (0000:3b:00.0): creating 8 VFs (writing 8 to sriov_numvfs) failed: Device
or resource busy"), goes back to `Idle`, and tries again after a while or at once when the spec
changes. Every pass compares the spec with what the host shows, so applying the same spec again
changes nothing and a daemon killed half-way finishes the job when it starts again.

What it publishes in the status is also in its metrics: `nicop_sriov_sync_status{status}`,
`nicop_sriov_vfs{pf}` and the duration of the last apply, `nicop_sriov_last_apply_seconds`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import Gauge

from nicop import logs
from nicop.api.labels import (
    BLOCKED_ANNOTATION,
    CURRENT_STATE,
    DESIRED_STATE,
    DRAIN_COMPLETE,
    DRAIN_REQUIRED,
    IDLE,
    NODE_STATE_ANNOTATION,
    REBOOT_REQUIRED,
)
from nicop.backoff import doubling
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.conditions import with_condition
from nicop.kube.informer import Informer
from nicop.kube.resources import NODE, SRIOV_NODE_STATE, SRIOV_OPERATOR_CONFIG, Obj
from nicop.node.discovery import NETWORK_CLASS, Inventory, PciFunction, scan
from nicop.node.host import Host
from nicop.node.readiness import Readiness

log = logging.getLogger(__name__)

NODE_STATE = SRIOV_NODE_STATE
OPERATOR_CONFIG = SRIOV_OPERATOR_CONFIG

IN_PROGRESS = "InProgress"
SUCCEEDED = "Succeeded"
FAILED = "Failed"

SYNC_STATUS = Gauge("nicop_sriov_sync_status",
                    "1 for the node state's current syncStatus, 0 for the others", ["status"])
LAST_APPLY_SECONDS = Gauge("nicop_sriov_last_apply_seconds",
                           "Duration of the last apply of the node state's spec to the host "
                           "(all its attempts, without the drain)")
VFS = Gauge("nicop_sriov_vfs", "VFs configured on each PF of this node, by interface name",
            ["pf"])


def report_metrics(interfaces: list[Obj], sync_status: str) -> None:
    """The status the daemon publishes, as its metrics."""
    for status in (SUCCEEDED, IN_PROGRESS, FAILED):
        SYNC_STATUS.labels(status).set(1 if status == sync_status else 0)
    VFS.clear()  # PFs that went away go with it
    for iface in interfaces:
        VFS.labels(iface.get("name") or iface.get("pciAddress") or "").set(
            int(iface.get("numVfs") or 0))

PCI_DEVICES = "/sys/bus/pci/devices"
PCI_DRIVERS = "/sys/bus/pci/drivers"
CLASS_NET = "/sys/class/net"
DPDK_DRIVERS = ("vfio-pci", "igb_uio", "uio_pci_generic")
VFIO = "vfio-pci"
NETDEVICE = "netdevice"


class ApplyError(Exception):
    """One step on one PF failed; the message names both and the kernel's answer."""


# ------------------------------------------------------------------------------ discovery

@dataclass
class PfStore:
    """The last config applied to each PF (upstream's `/etc/sriov-operator/pci/<address>`), so
    PFs dropped from the spec are reset, and only those the operator configured."""

    host: Host
    directory: str = "/etc/sriov-operator/pci"

    def load(self) -> dict[str, Obj]:
        result = {}
        for name in self.host.listdir(self.directory):
            text = self.host.read(f"{self.directory}/{name}")
            with contextlib.suppress(ValueError, TypeError):
                result[name] = json.loads(text or "")
        return result

    def save(self, iface: Obj) -> None:
        path = self.host.path(f"{self.directory}/{iface['pciAddress']}")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(iface))
        tmp.replace(path)

    def remove(self, address: str) -> None:
        self.host.path(f"{self.directory}/{address}").unlink(missing_ok=True)


VfVlan = Callable[[str, int], "int | None"]
"""(PF netdev, VF index) -> the VF's VLAN as the PF reports it, or None when unknown."""


def _net(host: Host, name: str, attr: str) -> str | None:
    return host.read(f"{CLASS_NET}/{name}/{attr}")


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def discover(host: Host, stored: Mapping[str, Obj] | None = None,
             vf_vlan: VfVlan | None = None) -> list[Obj]:
    """status.interfaces: every SR-IOV capable PF with its VFs, in upstream's format.

    Unlike upstream, PFs missing from the supported-NIC list are reported too: the list is a
    support statement, and leaving a NIC out only hid it from users (upstream needs DEV_MODE).
    """
    inv = scan(host)
    stored = stored or {}
    result = []
    for fn in sorted(inv.functions.values(), key=lambda f: f.address):
        if fn.pf is not None or not fn.total_vfs or fn.base_class != NETWORK_CLASS:
            continue
        result.append(_interface(host, inv, fn, stored.get(fn.address), vf_vlan))
    return result


def _interface(host: Host, inv: Inventory, fn: PciFunction, stored: Obj | None,
               vf_vlan: VfVlan | None) -> Obj:
    iface: Obj = {"pciAddress": fn.address, "vendor": fn.vendor, "deviceID": fn.device}
    if fn.driver:
        iface["driver"] = fn.driver
    net = fn.netdev
    if net is not None:
        iface["name"] = net.name
        if mac := _net(host, net.name, "address"):
            iface["mac"] = mac
        if mtu := _int(_net(host, net.name, "mtu")):
            iface["mtu"] = mtu
        iface["linkSpeed"] = f"{_net(host, net.name, 'speed') or '-1'} Mb/s"
        iface["linkType"] = "IB" if net.link_type == "infiniband" else "ETH"
        iface["linkAdminState"] = "up" if net.up else "down"
    iface["numVfs"] = fn.num_vfs
    iface["totalvfs"] = fn.total_vfs
    iface["eSwitchMode"] = "legacy"
    if stored and stored.get("externallyManaged"):
        iface["externallyManaged"] = True
    vfs = sorted((f for f in inv.functions.values() if f.pf == fn.address),
                 key=lambda f: f.vf_index if f.vf_index is not None else -1)
    if vfs:
        iface["Vfs"] = [_vf(host, f, net.name if net else None, vf_vlan) for f in vfs]
    return iface


def _vf(host: Host, fn: PciFunction, pf_name: str | None, vf_vlan: VfVlan | None) -> Obj:
    vf: Obj = {"pciAddress": fn.address, "vendor": fn.vendor, "deviceID": fn.device,
               "vfID": fn.vf_index if fn.vf_index is not None else -1}
    if fn.driver:
        vf["driver"] = fn.driver
    if fn.netdev is not None:
        name = fn.netdev.name
        vf["name"] = name
        if mac := _net(host, name, "address"):
            vf["mac"] = mac
        if mtu := _int(_net(host, name, "mtu")):
            vf["mtu"] = mtu
    for rdma in fn.rdma:
        guid = host.read(f"{PCI_DEVICES}/{fn.address}/infiniband/{rdma.name}/node_guid")
        if guid and fn.netdev is not None and fn.netdev.link_type == "infiniband":
            vf["guid"] = guid
    if vf_vlan is not None and pf_name and fn.vf_index is not None:
        with contextlib.suppress(Exception):
            vlan = vf_vlan(pf_name, fn.vf_index)
            if vlan:
                vf["Vlan"] = vlan
    return vf


# ------------------------------------------------------------------------------ planning

def _range(vf_range: str) -> tuple[int, int]:
    first, _, last = vf_range.partition("-")
    return int(first), int(last)


def group_of(spec_iface: Obj, vf_id: int) -> Obj | None:
    for group in spec_iface.get("vfGroups") or []:
        first, last = _range(group.get("vfRange") or "0--1")
        if first <= vf_id <= last:
            found: Obj = group
            return found
    return None


def _link_type(value: str | None) -> str:
    return (value or "").lower()


def update_reason(spec_iface: Obj, found: Obj) -> str | None:
    """Why the PF differs from its spec (upstream's NeedToUpdateSriov), or None."""
    if spec_iface.get("linkType") and found.get("linkType") and _link_type(
            spec_iface["linkType"]) != _link_type(found["linkType"]):
        return f"link type {found['linkType']} -> {spec_iface['linkType'].upper()}"
    mtu = spec_iface.get("mtu") or 0
    if mtu and mtu > (found.get("mtu") or 0):
        return f"MTU {found.get('mtu')} -> {mtu}"
    wanted = int(spec_iface.get("numVfs") or 0)
    if wanted != int(found.get("numVfs") or 0):
        return f"numVfs {found.get('numVfs') or 0} -> {wanted}"
    if wanted == 0:
        return None
    for vf in found.get("Vfs") or []:
        group = group_of(spec_iface, vf["vfID"])
        driver = vf.get("driver") or ""
        if group is None:
            if driver in DPDK_DRIVERS:
                return f"VF {vf['vfID']} is on {driver} but in no group"
            continue
        if not driver:
            return f"VF {vf['vfID']} has no driver"
        if (group.get("deviceType") or NETDEVICE) == VFIO:
            if driver != VFIO:
                return f"VF {vf['vfID']} is on {driver}, not vfio-pci"
            continue
        if driver in DPDK_DRIVERS:
            return f"VF {vf['vfID']} is on {driver}, not its kernel driver"
        if group.get("mtu") and vf.get("mtu") and vf["mtu"] != group["mtu"]:
            return f"VF {vf['vfID']} MTU {vf['mtu']} -> {group['mtu']}"
    return None


@dataclass
class Work:
    """What one pass has to do on the host."""

    update: list[tuple[Obj, Obj, str]] = field(default_factory=list)  # spec, found, why
    reset: list[Obj] = field(default_factory=list)  # found PFs to take back to 0 VFs
    drain: bool = False
    reboot: bool = False

    def __bool__(self) -> bool:
        return bool(self.update or self.reset)

    def describe(self) -> str:
        parts = [f"{_pf(f)}: {why}" for _, f, why in self.update]
        parts += [f"{_pf(f)}: no longer configured" for f in self.reset]
        return "; ".join(parts)


def _pf(found: Obj) -> str:
    return f"PF {found.get('name') or '?'} ({found['pciAddress']})"


def plan(spec: Obj, found: list[Obj], stored: Mapping[str, Obj]) -> Work:
    """Compare the spec with the host; a drain is needed to change a PF that has VFs."""
    work = Work()
    by_address = {f["pciAddress"]: f for f in found}
    wanted = {i["pciAddress"]: i for i in spec.get("interfaces") or []}
    for address, spec_iface in sorted(wanted.items()):
        pf = by_address.get(address)
        if pf is None:
            log.warning("the spec names PF %s, which this node does not have", address)
            continue
        why = update_reason(spec_iface, pf)
        if why is None:
            continue
        work.update.append((spec_iface, pf, why))
        if why.startswith("link type"):
            work.reboot = True
        if int(pf.get("numVfs") or 0) > 0:
            work.drain = True
    for address, applied in sorted(stored.items()):
        pf = by_address.get(address)
        if address in wanted or pf is None or applied.get("externallyManaged"):
            continue
        if int(pf.get("numVfs") or 0) > 0:
            work.reset.append(pf)
            work.drain = True
    work.drain |= work.reboot
    return work


# ------------------------------------------------------------------------------ applying

class Firmware(Protocol):
    """What only the NIC's firmware can change; takes effect after a reboot."""

    def set_link_type(self, pf: Obj, link_type: str) -> None: ...
    def reboot(self) -> None: ...


class MstFirmware:
    """mstconfig (mstflint) for the link type, systemd-run for the reboot, as upstream does."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def _run(self, args: list[str], what: str) -> None:
        if shutil.which(args[0]) is None:
            raise ApplyError(f"{what}: {args[0]} not found; the daemon's image needs it "
                             "(mstflint for mstconfig)")
        done = subprocess.run(args, capture_output=True, text=True, check=False, timeout=300)
        if done.returncode != 0:
            raise ApplyError(f"{what} failed: {done.stderr.strip() or done.stdout.strip()}")

    def set_link_type(self, pf: Obj, link_type: str) -> None:
        port = int(pf["pciAddress"].rsplit(".", 1)[1], 16) + 1
        value = "IB" if _link_type(link_type) == "ib" else "ETH"
        self._run(["mstconfig", "-d", pf["pciAddress"], "-y", "set", f"LINK_TYPE_P{port}={value}"],
                  f"{_pf(pf)}: setting the link type to {value} (mstconfig)")

    def reboot(self) -> None:
        root = str(self.host.root)
        self._run(["chroot", root, "systemd-run", "--unit", "sriov-network-config-daemon-reboot",
                   "--description", "sriov-network-config-daemon reboot node", "/bin/sh", "-c",
                   "systemctl stop kubelet.service; reboot"], "rebooting the node")


class Kernel:
    """The sysfs writes that configure SR-IOV, with errors that name the PF and the step."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def _write(self, path: str, value: str, where: str, step: str) -> None:
        try:
            self.host.write(path, value)
        except OSError as e:
            raise ApplyError(f"{where}: {step} failed: {e.strerror or e}") from e

    def set_numvfs(self, pf: Obj, count: int) -> None:
        where, address = _pf(pf), pf["pciAddress"]
        path = f"{PCI_DEVICES}/{address}/sriov_numvfs"
        total = self.host.read_int(f"{PCI_DEVICES}/{address}/sriov_totalvfs") or 0
        if count > total:
            raise ApplyError(f"{where}: {count} VFs asked, but the PF supports at most {total} "
                             "(sriov_totalvfs); lower numVfs or raise NUM_OF_VFS in the firmware")
        current = self.host.read_int(path) or 0
        if current == count:
            return
        if current:
            self._write(path, "0", where, "removing its VFs (writing 0 to sriov_numvfs)")
        if count:
            self._write(path, str(count), where,
                        f"creating {count} VFs (writing {count} to sriov_numvfs)")
        deadline = time.monotonic() + 120
        while len(self.vfs(address)) != count:  # the kernel creates them synchronously
            if time.monotonic() > deadline:
                raise ApplyError(f"{where}: the {count} VFs did not appear within 120s")
            time.sleep(0.1)

    def vfs(self, pf_address: str) -> dict[int, str]:
        """VF index -> PCI address, from the PF's virtfnN links."""
        result = {}
        for entry in self.host.listdir(f"{PCI_DEVICES}/{pf_address}"):
            if entry.startswith("virtfn") and entry[6:].isdigit():
                address = self.host.link_name(f"{PCI_DEVICES}/{pf_address}/{entry}")
                if address:
                    result[int(entry[6:])] = address
        return result

    def set_mtu(self, ifname: str, mtu: int, where: str) -> None:
        self._write(f"{CLASS_NET}/{ifname}/mtu", str(mtu), where, f"setting the MTU to {mtu}")

    def driver(self, address: str) -> str | None:
        return self.host.link_name(f"{PCI_DEVICES}/{address}/driver")

    def unbind(self, address: str, where: str) -> None:
        driver = self.driver(address)
        if driver:
            self._write(f"{PCI_DRIVERS}/{driver}/unbind", address, where,
                        f"unbinding {address} from {driver}")

    def bind_vfio(self, address: str, where: str) -> None:
        """driver_override, then bind (upstream's BindDpdkDriver)."""
        if self.driver(address) == VFIO:
            return
        self.unbind(address, where)
        override = f"{PCI_DEVICES}/{address}/driver_override"
        if self.host.exists(override):
            self._write(override, VFIO, where, f"setting driver_override of {address}")
        try:
            self._write(f"{PCI_DRIVERS}/{VFIO}/bind", address, where,
                        f"binding {address} to vfio-pci")
        except ApplyError as e:
            if not self.host.exists(f"{PCI_DEVICES}/{address}/iommu_group"):
                raise ApplyError(f"{e}; the VF has no IOMMU group: make sure IOMMU is enabled "
                                 "in BIOS and on the kernel command line") from e
            raise
        finally:
            if self.host.exists(override):
                with contextlib.suppress(OSError):
                    self.host.write(override, "\x00")

    def bind_default(self, address: str, where: str) -> None:
        """Leave a DPDK driver and let the kernel probe the default one (drivers_probe)."""
        if self.driver(address) in DPDK_DRIVERS:
            self.unbind(address, where)
        override = f"{PCI_DEVICES}/{address}/driver_override"
        if self.host.exists(override):
            self._write(override, "\x00", where, f"clearing driver_override of {address}")
        if self.driver(address) is None:
            self._write("/sys/bus/pci/drivers_probe", address, where,
                        f"binding {address} to its kernel driver (drivers_probe)")


def apply_pf(kernel: Kernel, spec_iface: Obj, found: Obj) -> None:
    """Make one PF match its spec entry (no link type: that takes firmware and a reboot)."""
    where = _pf(found)
    address = found["pciAddress"]
    if not spec_iface.get("externallyManaged"):
        kernel.set_numvfs(found, int(spec_iface.get("numVfs") or 0))
    elif int(spec_iface.get("numVfs") or 0) > int(found.get("numVfs") or 0):
        raise ApplyError(f"{where}: externally managed with {found.get('numVfs') or 0} VFs, "
                         f"fewer than the {spec_iface['numVfs']} asked; create them first")
    mtu = int(spec_iface.get("mtu") or 0)
    if mtu and found.get("name") and mtu > int(found.get("mtu") or 0):
        kernel.set_mtu(found["name"], mtu, where)
    for index, vf in sorted(kernel.vfs(address).items()):
        group = group_of(spec_iface, index)
        vf_where = f"{where} VF {index} ({vf})"
        if group is None:
            if kernel.driver(vf) in DPDK_DRIVERS:
                kernel.bind_default(vf, vf_where)
            continue
        if (group.get("deviceType") or NETDEVICE) == VFIO:
            kernel.bind_vfio(vf, vf_where)
            continue
        kernel.bind_default(vf, vf_where)
        names = kernel.host.listdir(f"{PCI_DEVICES}/{vf}/net")
        vf_mtu = int(group.get("mtu") or 0)
        if vf_mtu and names and kernel.host.read_int(f"{CLASS_NET}/{names[0]}/mtu") != vf_mtu:
            kernel.set_mtu(names[0], vf_mtu, vf_where)


def reset_pf(kernel: Kernel, found: Obj) -> None:
    """A PF the operator configured and no policy wants any more: its VFs go."""
    kernel.set_numvfs(found, 0)


def apply_work(kernel: Kernel, store: PfStore, firmware: Firmware, work: Work) -> bool:
    """The host side of one apply (blocking: run it in a thread). True when it asked for a
    reboot, which a firmware change needs before anything else is configured."""
    if work.reboot:
        for spec_iface, found, why in work.update:
            if why.startswith("link type"):
                firmware.set_link_type(found, spec_iface["linkType"])
        firmware.reboot()
        return True
    for found in work.reset:
        reset_pf(kernel, found)
        store.remove(found["pciAddress"])
    for spec_iface, found, _ in work.update:
        store.save(spec_iface)  # ours from the first write: a half-applied PF is reset too
        apply_pf(kernel, spec_iface, found)
    return False


# ------------------------------------------------------------------------------ the daemon

@dataclass
class DaemonOptions:
    node_name: str
    namespace: str = "nvidia-network-operator"
    resync_interval: float = 30.0
    """Seconds between checks for drift when nothing changes."""
    max_attempts: int = 3
    """Tries of one apply before the node state is Failed."""
    retry_delay: float = 2.0
    """Seconds before the second try; doubles for each further one."""
    failed_retry_interval: float = 120.0
    """Seconds before a Failed spec is tried again (a new spec is tried at once)."""
    drain_timeout: float = 900.0
    """Seconds to wait for the operator to drain the node before giving up (Failed)."""
    store_dir: str = "/etc/sriov-operator/pci"


class SriovConfigDaemon:
    def __init__(self, client: ApiClient, host: Host, options: DaemonOptions, *,
                 vf_vlan: VfVlan | None = None, firmware: Firmware | None = None) -> None:
        self.client = client
        self.host = host
        self.opts = options
        self.kernel = Kernel(host)
        self.store = PfStore(host, options.store_dir)
        self.vf_vlan = vf_vlan
        self.firmware: Firmware = firmware or MstFirmware(host)
        ns = options.namespace
        self.states = Informer(client, NODE_STATE, ns,
                               field_selector=f"metadata.name={options.node_name}")
        self.configs = Informer(client, OPERATOR_CONFIG, ns, field_selector="metadata.name=default")
        self._changed = asyncio.Event()
        for informer in (self.states, self.configs):
            informer.on_change(lambda ev, obj, old: self._changed.set())
        self._failed: tuple[str, float] | None = None  # (spec hash, when) of the last failure
        self._applied_generation: int | None = None
        self._rebooting: str | None = None  # spec hash a reboot was asked for
        self._node_annotated = False
        self.passes = 0  # sync passes finished: what "it had its chance" is counted in
        self.about = logs.about(NODE_STATE.kind, options.node_name, ns)

    # ------------------------------------------------------------------ loop
    async def run(self, stop: asyncio.Event) -> None:
        """Sync until `stop` is set: on every change of the node state, and every resync."""
        tasks = [asyncio.create_task(i.run()) for i in (self.states, self.configs)]
        stopper = asyncio.create_task(stop.wait())
        readiness = Readiness()
        try:
            synced = asyncio.gather(self.states.synced.wait(), self.configs.synced.wait())
            first: list[asyncio.Future[Any]] = [synced, stopper]
            await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
            synced.cancel()
            log.info("started; host root %s", self.host.root, extra=self.about)
            while not stop.is_set():
                self._changed.clear()  # before reading the cache: no change goes unnoticed
                try:
                    delay = await self.sync()
                    readiness.set(True)  # it follows its node state (whose status says more)
                except (ApiError, OSError) as e:
                    log.warning("sync failed: %s; retrying", e, extra=self.about)
                    delay = min(self.opts.resync_interval, 5.0)
                except Exception:  # a bug must not stop the node's configuration for good
                    log.exception("sync failed; retrying", extra=self.about)
                    delay = self.opts.resync_interval
                self.passes += 1
                await self._wait(delay, stop)
        finally:
            readiness.clear()
            for task in [*tasks, stopper]:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _wait(self, timeout: float, stop: asyncio.Event | None = None) -> None:
        """Until the node state or the operator config changes (or `stop`, or the timeout).

        Callers clear `_changed` before they read the cache, so a change in between counts.
        """
        waiters = [asyncio.ensure_future(self._changed.wait())]
        if stop is not None:
            waiters.append(asyncio.ensure_future(stop.wait()))
        try:
            await asyncio.wait(waiters, timeout=max(timeout, 0.01),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()

    def _state(self) -> Obj | None:
        return self.states.store.get(f"{self.opts.namespace}/{self.opts.node_name}")

    def _config_spec(self) -> Obj:
        config = self.configs.store.get(f"{self.opts.namespace}/default")
        return (config or {}).get("spec") or {}

    # ------------------------------------------------------------------ one pass
    async def sync(self) -> float:
        """Report, compare, and (if needed) drain and apply; returns seconds to the next pass."""
        level = self._config_spec().get("logLevel")
        log.setLevel(logging.DEBUG if isinstance(level, int) and level > 0 else logging.NOTSET)
        state = self._state()
        if state is None:
            log.debug("no node state yet; the operator creates it", extra=self.about)
            return self.opts.resync_interval
        await self._annotate_node_once(state)
        spec = state.get("spec") or {}
        key = json.dumps(spec.get("interfaces") or [], sort_keys=True)
        stored = self.store.load()
        found = discover(self.host, stored, self.vf_vlan)
        work = plan(spec, found, stored)
        status = state.get("status") or {}
        generation = state["metadata"].get("generation")
        if not work:
            self._failed = None
            if self._rebooting == key:
                self._rebooting = None
            await self._request(IDLE)
            await self._publish(found, SUCCEEDED, "", generation)
            return self.opts.resync_interval
        if self._failed is not None and self._failed[0] == key:
            left = self._failed[1] + self.opts.failed_retry_interval - time.monotonic()
            if left > 0:
                await self._publish(found, FAILED, status.get("lastSyncError") or "", generation)
                return left
        if self._rebooting == key:
            return self.opts.resync_interval  # the reboot asked for has not happened yet
        log.info("host differs from the spec: %s", work.describe(), extra=self.about)
        await self._publish(found, IN_PROGRESS, status.get("lastSyncError") or "", generation)
        if work.drain and not self._config_spec().get("disableDrain"):
            problem = await self._drain(REBOOT_REQUIRED if work.reboot else DRAIN_REQUIRED)
            if problem:
                return await self._fail(key, problem)
        started = time.monotonic()
        error = await self._apply(key)
        LAST_APPLY_SECONDS.set(time.monotonic() - started)
        if error:
            return await self._fail(key, error)
        if self._rebooting == key:
            return self.opts.resync_interval
        await self._request(IDLE)
        stored = self.store.load()
        found = discover(self.host, stored, self.vf_vlan)
        self._failed = None
        log.info("applied", extra=self.about)
        await self._publish(found, SUCCEEDED, "", self._applied_generation)
        return self.opts.resync_interval

    async def _apply(self, key: str) -> str | None:
        """Apply the latest spec with bounded retries; the last error, or None."""
        error = None
        for attempt in range(1, self.opts.max_attempts + 1):
            state = self._state()
            if state is None:
                return "the node state was deleted while it was being applied"
            stored = self.store.load()
            found = discover(self.host, stored, self.vf_vlan)
            work = plan(state.get("spec") or {}, found, stored)
            try:
                if await asyncio.to_thread(apply_work, self.kernel, self.store, self.firmware,
                                           work):
                    self._rebooting = key
                else:
                    self._check_applied(state.get("spec") or {})
                self._applied_generation = state["metadata"].get("generation")
                return None
            except ApplyError as e:
                error = str(e)
            log.warning("attempt %d of %d failed: %s", attempt, self.opts.max_attempts, error,
                        extra=self.about)
            if attempt < self.opts.max_attempts:
                await self._publish(found, IN_PROGRESS, error)
                await asyncio.sleep(doubling(self.opts.retry_delay, attempt - 1))
        return error

    def _check_applied(self, spec: Obj) -> None:
        """Every write went through, but does the host now match? A driver that would not bind
        is a failure to report, not a reason to apply again at once, forever."""
        stored = self.store.load()
        left = plan(spec, discover(self.host, stored, self.vf_vlan), stored)
        if left:
            raise ApplyError(f"applied, but the host still differs: {left.describe()}")

    async def _fail(self, key: str, error: str) -> float:
        self._failed = (key, time.monotonic())
        log.error("giving up for now: %s", error, extra=self.about)
        await self._request(IDLE)
        stored = self.store.load()
        await self._publish(discover(self.host, stored, self.vf_vlan), FAILED, error)
        return self.opts.failed_retry_interval

    # ------------------------------------------------------------------ drain handshake
    async def _drain(self, wanted: str) -> str | None:
        """Ask for a drain and wait until it is complete; an error message on time-out."""
        deadline = time.monotonic() + self.opts.drain_timeout
        node = self.opts.node_name
        while True:
            self._changed.clear()
            state = self._state()
            if state is None:
                return "the node state was deleted while waiting for the drain"
            ann = state["metadata"].get("annotations") or {}
            desired, current = ann.get(DESIRED_STATE), ann.get(CURRENT_STATE)
            asked = desired in (wanted, REBOOT_REQUIRED)
            if asked and current == DRAIN_COMPLETE:
                return None
            if not asked and current in (None, IDLE):
                log.info("asking for a drain (%s)", wanted, extra=self.about)
                await self._request(wanted)
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                blocked = ann.get(BLOCKED_ANNOTATION)
                why = f": {blocked}" if blocked else (
                    " (the operator has not drained it: other nodes of its pool may be "
                    "draining, or pods are still terminating)")
                return (f"drain of node {node} did not complete within "
                        f"{self.opts.drain_timeout:.0f}s{why}")
            await self._wait(min(left, 5.0))

    async def _request(self, value: str) -> None:
        """Set the handshake annotation on the Node and on the node state."""
        state = self._state()
        if state is None:
            return
        if (state["metadata"].get("annotations") or {}).get(DESIRED_STATE) == value:
            return
        await self.client.patch(NODE, self.opts.node_name,
                                {"metadata": {"annotations": {NODE_STATE_ANNOTATION: value}}})
        updated = await self.client.patch(NODE_STATE, self.opts.node_name, {
            "metadata": {"annotations": {DESIRED_STATE: value}}}, self.opts.namespace)
        self.states.assume(updated)

    async def _annotate_node_once(self, state: Obj) -> None:
        """After a restart the Node's annotation may lag the node state's: align them once."""
        if self._node_annotated:
            return
        desired = (state["metadata"].get("annotations") or {}).get(DESIRED_STATE)
        if desired:
            await self.client.patch(NODE, self.opts.node_name, {
                "metadata": {"annotations": {NODE_STATE_ANNOTATION: desired}}})
        self._node_annotated = True

    # ------------------------------------------------------------------ status
    async def _publish(self, interfaces: list[Obj], sync_status: str, error: str,
                       generation: int | None = None) -> None:
        """The status, and the condition `Ready` for the spec generation the host was compared
        with (so the operator knows when a spec it wrote has been applied)."""
        report_metrics(interfaces, sync_status)
        state = self._state()
        if state is None:
            return
        status: dict[str, Any] = {"interfaces": interfaces, "syncStatus": sync_status,
                                  "lastSyncError": error}
        old = state.get("status") or {}
        if generation is not None:
            conditions = with_condition(
                old.get("conditions") or [], "Ready", sync_status == SUCCEEDED, sync_status,
                error or ("the host matches the spec" if sync_status == SUCCEEDED
                          else "applying the spec"), generation)
            if conditions is not None:
                status["conditions"] = conditions
        if all(old.get(k) == v for k, v in status.items()):
            return
        if old.get("syncStatus") != sync_status:
            log.info("syncStatus %s -> %s%s", old.get("syncStatus") or "(none)", sync_status,
                     f": {error}" if error else "", extra=self.about)
        try:
            updated = await self.client.patch(NODE_STATE, self.opts.node_name,
                                              {"status": status}, self.opts.namespace,
                                              subresource="status")
        except ApiError as e:
            if e.code == 404:
                return
            raise
        self.states.assume(updated)
