"""The `host-device` plugin: any node netdev into the pod, found by name, MAC, kernel path or PCI.

Config as containernetworking/plugins' host-device: `device`, `hwaddr`, `kernelpath`,
`pciBusID`, with `runtimeConfig.deviceID` (and Multus' top-level `deviceID`) naming a PCI
address or an auxiliary device such as a scalable function (`mlx5_core.sf.4`, found under
/sys/bus/auxiliary/devices). A device on a DPDK driver is left where it is (the result names the
pod's interface without a MAC, IPAM still runs), as upstream does. An `mtu` is not applied
(upstream ignores it too). The node name is also set as the link alias, as upstream does, so a
pod attached by the upstream plugin can be detached by this one, and CHECK needs no cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from nicop.cni.attach import DevicePlugin
from nicop.cni.devices import (
    AUX_DEVICES,
    PCI_ADDRESS,
    PciNetDevice,
    kernel_path_netdev,
    normalize_pci,
    pci_device,
)
from nicop.cni.ipam import ipam_section
from nicop.cni.netlink import Link, find_link, get_link, move_out, open_netns
from nicop.cni.plugin import conf_get, parse_mac
from nicop.cni.spec import CniError, Code, Obj, Request, config_error
from nicop.cni.state import read_json


@dataclass
class HostDeviceConf:
    device: str | None = None
    hwaddr: str | None = None
    kernelpath: str | None = None
    pci: str | None = None
    aux: str | None = None
    """An auxiliary device's name, such as mlx5_core.sf.4 (a scalable function)."""

    @property
    def device_id(self) -> str:
        return self.pci or ""


class HostDevicePlugin(DevicePlugin):
    cache_dir = "/var/lib/cni/host-device"
    aliased = True

    def parse(self, req: Request) -> HostDeviceConf:
        c = req.config
        conf = HostDeviceConf()
        device = conf_get(c, "device")
        if device not in (None, ""):
            if not isinstance(device, str) or len(device) > 15 or "/" in device:
                raise config_error("device", f"{device!r} is not an interface name")
            conf.device = device
        conf.hwaddr = parse_mac("hwaddr", conf_get(c, "hwaddr"))
        kernelpath = conf_get(c, "kernelpath")
        if kernelpath not in (None, ""):
            if not isinstance(kernelpath, str) or not kernelpath.startswith("/sys/devices/"):
                raise config_error("kernelpath", f"kernel device path {kernelpath!r} must be "
                                   "absolute and begin with /sys/devices/")
            conf.kernelpath = kernelpath
        runtime = c.get("runtimeConfig") or {}
        for key, value in (("runtimeConfig.deviceID", runtime.get("deviceID")
                            if isinstance(runtime, dict) else None),
                           ("pciBusID", conf_get(c, "pciBusID")),
                           ("deviceID", conf_get(c, "deviceID"))):
            if value in (None, ""):
                continue
            if key != "pciBusID" and isinstance(value, str) and not PCI_ADDRESS.match(value):
                if not self.ctx.host.exists(f"{AUX_DEVICES}/{value}"):
                    raise config_error(key, f"runtime config DeviceID {value} not found or "
                                       "unsupported (neither a PCI address nor a device under "
                                       f"{AUX_DEVICES})")
                conf.aux = value
            else:
                conf.pci = normalize_pci(key, value)
            break
        if not (conf.device or conf.hwaddr or conf.kernelpath or conf.pci or conf.aux):
            raise config_error("device", 'specify either "device", "hwaddr", "kernelpath" or '
                               '"pciBusID"')
        return conf

    def resolve(self, conf: HostDeviceConf) -> PciNetDevice:
        """The node device, tried in upstream's order: name, MAC, kernel path, PCI address."""
        if conf.device:
            return PciNetDevice(pci="", netdev=conf.device, driver=None)
        if conf.hwaddr:
            with self.ctx.host_ns.ipr() as h:
                link = find_link(h, mac=conf.hwaddr)
            if link is None:
                raise config_error("hwaddr", f"no device with MAC {conf.hwaddr} on the node")
            return PciNetDevice(pci="", netdev=link.name, driver=None)
        if conf.kernelpath:
            name = kernel_path_netdev(self.ctx.host, conf.kernelpath)
            if name is None:
                raise config_error("kernelpath", f"no network device under {conf.kernelpath}")
            return PciNetDevice(pci="", netdev=name, driver=None)
        if conf.aux:
            nets = self.ctx.host.listdir(f"{AUX_DEVICES}/{conf.aux}/net")
            if not nets:
                raise config_error("runtimeConfig.deviceID", f"auxiliary device {conf.aux} has "
                                   "no network device (is the scalable function active?)")
            return PciNetDevice(pci="", netdev=nets[0], driver=None)
        assert conf.pci is not None
        dev = pci_device(self.ctx.host, "pciBusID", conf.pci)
        if dev.netdev is None and not dev.userspace:
            raise config_error("pciBusID", f"failed to find device name for pci address "
                               f"{conf.pci}")
        return dev

    def result_interface(self, req: Request, conf: HostDeviceConf, dev: PciNetDevice,
                         moved: Link | None, cache: Obj) -> Obj:
        """host-device prints name, MAC and sandbox (name and sandbox for a DPDK device)."""
        iface: Obj = {"name": moved.name if moved else req.ifname}
        if moved is not None:
            iface["mac"] = moved.mac
        iface["sandbox"] = req.netns
        return iface

    def result_dns(self, req: Request, ipam_result: Obj) -> Obj:
        """host-device sets the result's dns to the netconf's when IPAM ran (whatever IPAM
        said), and prints none without IPAM."""
        dns = req.config.get("dns")
        if ipam_section(req.config) is None or not isinstance(dns, dict):
            return {}
        return dict(dns)

    def checked_userspace(self, req: Request, cache: Obj | None) -> bool:
        """host-device's CHECK works from the netconf alone: an attachment made by the
        upstream plugin has no cache."""
        if cache is not None:
            return bool((cache.get("nicop") or {}).get("userspace"))
        conf = self.parse(req)
        return conf.pci is not None and pci_device(self.ctx.host, "pciBusID", conf.pci).userspace

    def check_without_result(self, req: Request) -> None:
        raise CniError(Code.INTERNAL, "Required prevResult missing",
                       "CHECK compares the pod with the ADD result the runtime passes as "
                       "prevResult")

    def delete(self, req: Request) -> None:
        cache = read_json(self.ctx.host, self.cache_path(req.container_id, req.ifname))
        if cache is None and req.netns:
            self._detach_uncached(req)
        super().delete(req)

    def _detach_uncached(self, req: Request) -> None:
        """An attachment without a cache (upstream's): the alias holds the node name."""
        try:
            pod = open_netns(req.netns)
        except CniError:
            return
        with pod:
            with pod.ipr() as p:
                link = get_link(p, req.ifname)
            if link is None or not link.alias:
                return
            with self.ctx.locks.hold(link.alias):
                move_out(self.ctx.host_ns, pod, req.ifname, link.alias)
