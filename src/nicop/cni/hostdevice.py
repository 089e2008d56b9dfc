"""The `host-device` plugin: any node netdev into the pod, found by name, MAC, kernel path or PCI.

Config as containernetworking/plugins' host-device: `device`, `hwaddr`, `kernelpath`,
`pciBusID`, with `runtimeConfig.deviceID` (and Multus' top-level `deviceID`) standing for the
PCI address. A device on a DPDK driver is left alone (empty result), as upstream does. The
node name is also set as the link alias, as upstream does, so a pod attached by the upstream
plugin can be detached by this one.
"""

from __future__ import annotations

from dataclasses import dataclass

from nicop.cni.attach import DevicePlugin
from nicop.cni.devices import PciNetDevice, kernel_path_netdev, normalize_pci, pci_device
from nicop.cni.netlink import find_link, get_link, move_out, open_netns
from nicop.cni.plugin import conf_get, optional_int, parse_mac
from nicop.cni.spec import CniError, Request, config_error
from nicop.cni.state import read_json


@dataclass
class HostDeviceConf:
    device: str | None = None
    hwaddr: str | None = None
    kernelpath: str | None = None
    pci: str | None = None
    mtu: int | None = None

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
            if value not in (None, ""):
                conf.pci = normalize_pci(key, value)
                break
        if not (conf.device or conf.hwaddr or conf.kernelpath or conf.pci):
            raise config_error("device", 'specify either "device", "hwaddr", "kernelpath" or '
                               '"pciBusID"')
        conf.mtu = optional_int(c, "mtu", 68, 65535)
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
        assert conf.pci is not None
        dev = pci_device(self.ctx.host, "pciBusID", conf.pci)
        if dev.netdev is None and not dev.userspace:
            raise config_error("pciBusID", f"failed to find device name for pci address "
                               f"{conf.pci}")
        return dev

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
