"""The `sriov` and `ib-sriov` plugins: a VF into the pod with its MAC, VLAN or GUID, and back.

Config, cache files and checks are sriov-cni's and ib-sriov-cni's: `deviceID` (the VF's PCI
address, injected by Multus), vlan/vlanQoS/vlanProto, mac, spoofchk, trust, link_state,
min/max_tx_rate, ipam; the netconf cached in `/var/lib/cni/sriov/<containerID>-<ifname>` with
the VF's original state under `OrigVfState`, and `/var/lib/cni/sriov/pci/<pci>` naming the
netns that holds the VF. A cache written by upstream sriov-cni or ib-sriov-cni is understood by
DEL, so a node can switch plugins with pods running.

The cache holds the netconf with upstream's defaults filled in (vlanQoS 0 and vlanProto
802.1q once a vlan is set, the MAC from CNI_ARGS or runtimeConfig, lowercased), so either
plugin can DEL what the other added. Unlike upstream, it is written before the VF moves: a
daemon killed halfway leaves enough behind for DEL (or GC) to find the VF, wherever it was
left, and put it back.

As upstream, an `mtu` in the netconf is not applied: the VF keeps the MTU the node gave it (the
SR-IOV policy sets it on the PF), and the result reports that MTU.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass

from nicop.cni.attach import DevicePlugin
from nicop.cni.devices import PciNetDevice, normalize_pci, pci_device
from nicop.cni.netlink import Link, Netns, announce, enable_notify, get_link
from nicop.cni.plugin import conf_get, optional_int, parse_mac
from nicop.cni.rdma import EXCLUSIVE
from nicop.cni.spec import CniError, Code, Obj, Request, config_error
from nicop.cni.state import write_json
from nicop.cni.vf import ETH_P_8021AD, ETH_P_8021Q, LINK_STATES, VfControl, VfState

log = logging.getLogger(__name__)

VLAN_PROTOS = {"802.1q": ETH_P_8021Q, "802.1ad": ETH_P_8021AD}
GUID = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){7}$")
ZERO_GUID = "00:00:00:00:00:00:00:00"
ALL_F_GUID = "ff:ff:ff:ff:ff:ff:ff:ff"
DEFAULT_GUID = "FF:FF:FF:FF:FF:FF:FF:FF"
"""What ib-sriov-cni records as the GUID to restore when it cannot read one (vfio-pci VFs)."""
ZERO_MAC = "00:00:00:00:00:00"
MAC_TRIES, MAC_RETRY_SECONDS = 20, 0.1
"""sriov-cni sets an admin MAC up to 20 times, 100 ms apart, until the PF reports it (a VF's
driver may answer EBUSY right after another pod released it)."""


def set_admin_mac(vfs: VfControl, pf: str, vf: int, mac: str) -> None:
    """The VF's admin MAC on the PF, read back until it holds (sriov-cni's SetVFHardwareMAC)."""
    problem = ""
    for attempt in range(MAC_TRIES):
        if attempt:
            time.sleep(MAC_RETRY_SECONDS)
        try:
            vfs.set_mac(pf, vf, mac)
        except CniError as e:
            problem = e.msg
            continue
        if vfs.get(pf, vf).mac.lower() == mac.lower():
            return
        problem = "hardware mac address is different from requested one"
    raise CniError(Code.INTERNAL, f"failed to set MAC address to {mac}: {problem}",
                   f"VF {vf} of {pf} does not keep the MAC; does its driver allow setting it?")


def _unicast(field_name: str, mac: str | None) -> str | None:
    """A MAC a VF can take: 6 bytes, not multicast, not all zeros (the kernel's
    is_valid_ether_addr); refused here, before anything on the node changes."""
    if mac is None:
        return None
    octets = mac.split(":")
    if len(octets) != 6 or int(octets[0], 16) & 1 or mac == ZERO_MAC:
        raise config_error(field_name, f"{mac} is not a unicast Ethernet MAC address such as "
                           "02:00:00:00:00:01")
    return mac


def _on_off(config: Obj, key: str) -> bool | None:
    """sriov-cni's reading of spoofchk/trust: "on" turns it on, any other string off."""
    value = conf_get(config, key)
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise config_error(key, f"{value!r} invalid: value must be \"on\" or \"off\"")
    if value not in ("on", "off"):
        log.warning("%s: %r is not \"on\" or \"off\"; taken as \"off\", as sriov-cni does",
                    key, value)
    return value == "on"


def _link_state(config: Obj) -> int | None:
    value = conf_get(config, "link_state")
    if value in (None, ""):
        return None
    if value not in LINK_STATES:
        raise config_error("link_state", f"{value!r} invalid: value must be auto, enable or "
                           "disable")
    return LINK_STATES[value]


def _device_id(config: Obj) -> str:
    value = conf_get(config, "deviceID")
    if value in (None, ""):
        raise config_error("deviceID", "required: the VF's PCI address, which Multus adds from "
                           "the pod's device-plugin resource (check the network's "
                           "k8s.v1.cni.cncf.io/resourceName annotation and the pod's resource "
                           "request)")
    return normalize_pci("deviceID", value)


@dataclass
class SriovConf:
    device_id: str
    vlan: int | None = None
    qos: int | None = None
    proto: int | None = None
    proto_name: str | None = None
    mac: str | None = None
    spoofchk: bool | None = None
    trust: bool | None = None
    link_state: int | None = None
    min_tx_rate: int | None = None
    max_tx_rate: int | None = None


def parse_sriov(req: Request) -> SriovConf:
    """sriov-cni's netconf with its checks (pkg/config LoadConf), errors naming the field."""
    c = req.config
    conf = SriovConf(device_id=_device_id(c))
    conf.vlan = optional_int(c, "vlan", 0, 4094)
    conf.qos = optional_int(c, "vlanQoS", 0, 7)
    proto = conf_get(c, "vlanProto")
    if conf.qos is not None and conf.vlan is None:
        raise config_error("vlanQoS", "requires vlan")
    if conf.qos and not conf.vlan:
        raise config_error("vlanQoS", "vlan id must be configured to set vlan QoS to a non-zero "
                           "value")
    if proto not in (None, ""):
        if not isinstance(proto, str) or proto.lower() not in VLAN_PROTOS:
            raise config_error("vlanProto", f"{proto!r} invalid: value must be 802.1q or "
                               "802.1ad")
        if conf.vlan is None:
            raise config_error("vlanProto", "requires vlan")
        conf.proto_name = proto.lower()
        conf.proto = VLAN_PROTOS[conf.proto_name]
        if conf.proto == ETH_P_8021AD and not conf.vlan:
            raise config_error("vlanProto", "vlan id must be configured to set vlan proto "
                               "802.1ad")
    conf.mac = _unicast("mac", parse_mac("mac", conf_get(c, "mac")))
    if req.args.get("MAC"):
        conf.mac = _unicast("CNI_ARGS MAC", parse_mac("CNI_ARGS MAC", req.args["MAC"]))
    runtime = c.get("runtimeConfig") or {}
    if isinstance(runtime, dict) and runtime.get("mac"):
        conf.mac = _unicast("runtimeConfig.mac", parse_mac("runtimeConfig.mac", runtime["mac"]))
    conf.spoofchk = _on_off(c, "spoofchk")
    conf.trust = _on_off(c, "trust")
    conf.link_state = _link_state(c)
    conf.min_tx_rate = optional_int(c, "min_tx_rate", 0)
    conf.max_tx_rate = optional_int(c, "max_tx_rate", 0)
    if conf.min_tx_rate and conf.max_tx_rate and conf.max_tx_rate < conf.min_tx_rate:
        raise config_error("max_tx_rate", f"{conf.max_tx_rate} is below min_tx_rate "
                           f"{conf.min_tx_rate} (0 means unlimited)")
    return conf


class SriovPlugin(DevicePlugin):
    """`type: sriov` (sriov-cni)."""

    cache_dir = "/var/lib/cni/sriov"

    def parse(self, req: Request) -> SriovConf:
        return parse_sriov(req)

    def resolve(self, conf: SriovConf) -> PciNetDevice:
        """The VF: sriov-cni takes nothing else (a PF or plain device is host-device's)."""
        dev = pci_device(self.ctx.host, "deviceID", conf.device_id)
        if dev.pf is None or dev.vf_index is None:
            raise config_error("deviceID", f"{dev.pci} is not a VF (no physfn): failed to get "
                               "VF information; sriov takes SR-IOV virtual functions, "
                               "host-device any other device")
        return super().resolve(conf)

    def pod_mac(self, conf: SriovConf) -> str | None:
        return conf.mac

    def cache_fields(self, conf: SriovConf, dev: PciNetDevice, orig: VfState | None) -> Obj:
        """sriov-cni's NetConf after LoadConf and the MAC merge: vlanQoS and vlanProto get
        their defaults once a vlan is set, and unset pointers are cached as null."""
        vlan_set = conf.vlan is not None
        return {
            "MAC": conf.mac or "", "vlan": conf.vlan,
            "vlanQoS": (conf.qos or 0) if vlan_set else None,
            "vlanProto": (conf.proto_name or "802.1q") if vlan_set else None,
            "min_tx_rate": conf.min_tx_rate, "max_tx_rate": conf.max_tx_rate,
        }

    def result_interface(self, req: Request, conf: SriovConf, dev: PciNetDevice,
                         moved: Link | None, cache: Obj) -> Obj:
        """sriov-cni's GetMacAddressForResult: the MAC asked for, else the netdev's, else
        (DPDK) the admin MAC unless it is unset; `mtu` the VF's (DPDK: its PF's)."""
        iface: Obj = {"name": req.ifname, "sandbox": req.netns}
        admin = str((cache.get("OrigVfState") or {}).get("AdminMAC") or "")
        mac = conf.mac or (moved.mac if moved is not None
                           else admin if admin not in ("", ZERO_MAC) else "")
        if mac:
            iface["mac"] = mac
        if cache.get("MTU"):
            iface["mtu"] = cache["MTU"]
        return iface

    def configured(self, pod: Netns, req: Request, result: Obj) -> None:
        enable_notify(pod, req.ifname)
        if result["ips"]:
            announce(pod, req.ifname, result["ips"])

    def apply_vf(self, conf: SriovConf, dev: PciNetDevice, orig: VfState | None,
                 cache: Obj) -> None:
        """sriov-cni's ApplyVFConfig, in its order; an unset rate is 0 (unlimited)."""
        assert dev.pf is not None and dev.vf_index is not None
        pf, vf, vfs = dev.pf, dev.vf_index, self.ctx.vfs
        if conf.vlan is not None:
            vfs.set_vlan(pf, vf, conf.vlan, conf.qos or 0, conf.proto or ETH_P_8021Q)
        if conf.mac:
            set_admin_mac(vfs, pf, vf, conf.mac)
        if conf.min_tx_rate is not None or conf.max_tx_rate is not None:
            vfs.set_rate(pf, vf, conf.min_tx_rate or 0, conf.max_tx_rate or 0)
        if conf.spoofchk is not None:
            vfs.set_spoofchk(pf, vf, conf.spoofchk)
        if conf.trust is not None:
            vfs.set_trust(pf, vf, conf.trust)
        if conf.link_state is not None:
            vfs.set_link_state(pf, vf, conf.link_state)

    def reset_vf(self, cache: Obj) -> None:
        """sriov-cni's ResetVFConfig: restore what the config had set, and the admin MAC the
        VF had whenever it was recorded (a driver may change it along with the VF's MAC)."""
        pf, vf = cache.get("Master"), cache.get("VFID")
        if not pf or vf is None:
            return
        o = cache.get("OrigVfState") or {}
        vfs = self.ctx.vfs
        if conf_get(cache, "vlan") is not None:
            vfs.set_vlan(pf, vf, int(o.get("Vlan", 0)), int(o.get("VlanQoS", 0)),
                         int(o.get("VlanProto") or ETH_P_8021Q))
        if conf_get(cache, "spoofchk") not in (None, ""):
            vfs.set_spoofchk(pf, vf, bool(o.get("SpoofChk", True)))
        if o.get("AdminMAC"):
            set_admin_mac(vfs, pf, vf, str(o["AdminMAC"]))
        if conf_get(cache, "trust") not in (None, ""):
            vfs.set_trust(pf, vf, bool(o.get("Trust", False)))
        if conf_get(cache, "min_tx_rate") is not None or conf_get(cache, "max_tx_rate") is not None:
            vfs.set_rate(pf, vf, int(o.get("MinTxRate", 0)), int(o.get("MaxTxRate", 0)))
        if conf_get(cache, "link_state") not in (None, ""):
            vfs.set_link_state(pf, vf, int(o.get("LinkState", 0)))


@dataclass
class IbConf:
    device_id: str
    guid: str | None = None
    link_state: int | None = None
    rdma_isolation: bool = False
    vfio: bool = False
    """vfioPciMode: the device is passed to a VM; no netdev, no IPAM, no RDMA move."""
    ib_kubernetes: bool = False
    pkey: str = ""


IB_KUBERNETES_MARKER = "mellanox.infiniband.app"
"""The args.cni key ib-kubernetes sets to "configured" once the GUID is in the subnet manager."""
IB_CONFIGURED = "configured"
VFIO_PCI = "vfio-pci"


class IbSriovPlugin(DevicePlugin):
    """`type: ib-sriov` (ib-sriov-cni): an InfiniBand VF with its GUID and, with
    `rdmaIsolation`, its RDMA device in the pod's namespace; with `vfioPciMode` (or a device
    bound to vfio-pci) a VF or PF for a VM, whose GUID alone is set."""

    cache_dir = "/var/lib/cni/ib-sriov"
    restores_mac = False

    def parse(self, req: Request) -> IbConf:
        c = req.config
        conf = IbConf(device_id=_device_id(c))
        runtime = c.get("runtimeConfig") or {}
        args_cni = ((c.get("args") or {}).get("cni") or {}) if isinstance(c.get("args"),
                                                                            dict) else {}
        conf.ib_kubernetes = bool(conf_get(c, "ibKubernetesEnabled"))
        if conf.ib_kubernetes and args_cni.get(IB_KUBERNETES_MARKER) != IB_CONFIGURED:
            raise CniError(Code.TRY_AGAIN_LATER,
                           f"args.cni: InfiniBand status \"{IB_KUBERNETES_MARKER}\" is not "
                           f"\"{IB_CONFIGURED}\" (ibKubernetesEnabled is true)",
                           "ib-kubernetes sets it once the pod's GUID is in the subnet manager; "
                           "check the ib-kubernetes pod, or set ibKubernetesEnabled to false")
        guid = (runtime.get("infinibandGUID") if isinstance(runtime, dict) else None) \
            or args_cni.get("guid")
        where = "runtimeConfig.infinibandGUID" if isinstance(runtime, dict) and \
            runtime.get("infinibandGUID") else "args.cni.guid"
        if guid:
            if not isinstance(guid, str) or not GUID.match(guid):
                raise config_error(where, f"{guid!r} is not a GUID such as "
                                   "02:00:00:00:00:00:00:01")
            if guid.lower() == ZERO_GUID:
                raise config_error(where, "the all-zero GUID is not a valid GUID")
            conf.guid = guid.lower()
        conf.rdma_isolation = bool(conf_get(c, "rdmaIsolation"))
        if conf.rdma_isolation:
            mode = self.ctx.rdma.netns_mode()
            if mode != EXCLUSIVE:
                raise CniError(Code.INTERNAL, f"rdmaIsolation: the node's RDMA subsystem "
                               f"network namespace mode is {mode}, rdmaIsolation needs "
                               f"{EXCLUSIVE}", "run `rdma system set netns exclusive` on the "
                               "node (and set ib_core netns_mode=0 to keep it across reboots), "
                               "or set rdmaIsolation to false")
        section = c.get("ipam")
        if isinstance(section, dict) and section.get("type") == "dhcp":
            raise config_error("ipam.type", "dhcp is not supported with InfiniBand")
        conf.link_state = _link_state(c)
        conf.vfio = bool(conf_get(c, "vfioPciMode"))
        pkey = conf_get(c, "pkey")
        conf.pkey = pkey if isinstance(pkey, str) else ""
        return conf

    def resolve(self, conf: IbConf) -> PciNetDevice:
        """ib-sriov-cni's device checks: vfio-pci turns vfioPciMode on (asking for it on
        another driver is an error); a PF only in that mode; a VF needs its GUID from
        ib-kubernetes when that is enabled (a PF has its own)."""
        dev = pci_device(self.ctx.host, "deviceID", conf.device_id)
        on_vfio = dev.driver == VFIO_PCI
        if conf.vfio and not on_vfio:
            raise config_error("vfioPciMode", f"vfioPciMode is enabled but device {dev.pci} is "
                               f"not bound to vfio-pci driver (driver {dev.driver or 'none'})")
        conf.vfio = on_vfio
        if dev.pf is None:
            if not conf.vfio:
                raise CniError(Code.INVALID_CONFIG, f"deviceID: PF device {dev.pci} requires "
                               "vfioPciMode to be enabled", "ib-sriov takes a PF only when it "
                               "is bound to vfio-pci; host-device moves a PF's netdev")
            return dev
        if conf.ib_kubernetes and not conf.guid:
            raise config_error("args.cni.guid", "required when ibKubernetesEnabled is true "
                               "(ib-kubernetes assigns it)")
        if dev.netdev is None and not conf.vfio:
            raise config_error("deviceID", f"{dev.pci} has no network device (driver "
                               f"{dev.driver or 'none'}); is it a VF bound to its kernel "
                               "driver?")
        return dev

    def runs_ipam(self, conf: IbConf, dev: PciNetDevice) -> bool:
        return not conf.vfio

    def releases_ipam(self, cache: Obj) -> bool:
        return not cache.get("vfioPciMode")

    def cache_fields(self, conf: IbConf, dev: PciNetDevice, orig: VfState | None) -> Obj:
        """ib-sriov-cni's cached NetConf: the VF's node name, the GUID to restore (filled in
        once it is read), the pkey; vfioPciMode as detected."""
        fields: Obj = {"HostIFNames": "" if conf.vfio else dev.netdev or "",
                       "HostIFGUID": "", "pkey": conf.pkey}
        if conf.vfio:
            fields["vfioPciMode"] = True
        return fields

    def result_interface(self, req: Request, conf: IbConf, dev: PciNetDevice,
                         moved: Link | None, cache: Obj) -> Obj:
        """ib-sriov-cni prints the interface's name and sandbox only."""
        return {"name": req.ifname, "sandbox": req.netns}

    def apply_vf(self, conf: IbConf, dev: PciNetDevice, orig: VfState | None,
                 cache: Obj) -> None:
        """ib-sriov-cni's order: link state, GUID (and the rebind it needs), then the RDMA
        device into the pod, before the netdev follows it."""
        if dev.pf is None or dev.vf_index is None:
            return  # a PF on vfio-pci: nothing to set
        if conf.link_state is not None:
            self.ctx.vfs.set_link_state(dev.pf, dev.vf_index, conf.link_state)
        if conf.guid:
            cache["HostIFGUID"] = DEFAULT_GUID if conf.vfio else self._current_guid(dev, orig)
            self._save(cache)
            self.ctx.vfs.set_guid(dev.pf, dev.vf_index, conf.guid)
            if not conf.vfio:
                self._rebind(dev)
        elif not conf.vfio:
            self._check_guid(dev)
        if conf.rdma_isolation and not conf.vfio:
            self._isolate_rdma(dev, cache)

    def _save(self, cache: Obj) -> None:
        write_json(self.ctx.host, self.cache_path(cache["nicop"]["containerID"],
                                                  cache["ContIFNames"]), cache)

    def _check_guid(self, dev: PciNetDevice) -> None:
        """Without a GUID to set, the VF must already have one the subnet manager can use."""
        mac = self.ctx.host.read(f"/sys/class/net/{dev.netdev}/address") or ""
        guid = ":".join(mac.split(":")[12:]) if mac.count(":") == 19 else ""
        if not guid or guid.lower() in (ZERO_GUID, ALL_F_GUID):
            raise CniError(Code.INTERNAL, f"deviceID: VF {dev.pci} ({dev.netdev}) GUID is not "
                           f"valid ({guid or 'no IPoIB address'})",
                           "give one in runtimeConfig.infinibandGUID or args.cni.guid, or let "
                           "ib-kubernetes assign it (ibKubernetesEnabled: true)")

    def _isolate_rdma(self, dev: PciNetDevice, cache: Obj) -> None:
        names = self.ctx.host.listdir(f"/sys/bus/pci/devices/{dev.pci}/infiniband")
        if len(names) != 1:
            raise CniError(Code.INTERNAL, f"rdmaIsolation: VF {dev.pci} has "
                           f"{len(names) or 'no'} RDMA devices {names or ''}, expected exactly "
                           "one", "is mlx5_ib loaded and the VF bound to mlx5_core?")
        netns = str(cache["nicop"]["netns"])
        cache["RdmaNetState"] = {"version": "1.0", "deviceID": dev.pci,
                                 "sandboxRdmaDevName": names[0],
                                 "containerRdmaDevName": names[0]}
        cache["nicop"]["rdmaMoved"] = False
        self._save(cache)
        self.ctx.rdma.move(names[0], "", netns)
        cache["nicop"]["rdmaMoved"] = True
        self._save(cache)

    def _current_guid(self, dev: PciNetDevice, orig: VfState | None) -> str:
        """The VF's GUID now: the last 8 bytes of its 20-byte IPoIB address."""
        mac = self.ctx.host.read(f"/sys/class/net/{dev.netdev}/address") if dev.netdev else None
        if mac and mac.count(":") == 19:
            return ":".join(mac.split(":")[12:])
        return (orig.node_guid if orig else "") or ZERO_GUID

    def _rebind(self, dev: PciNetDevice, timeout: float = 10.0) -> bool:
        """A new GUID takes effect when the VF's driver probes it again; the netdev comes back,
        possibly under another name. Returns whether the VF was rebound."""
        drivers = f"/sys/bus/pci/drivers/{dev.driver}"
        if dev.driver is None or not self.ctx.host.exists(f"{drivers}/unbind"):
            return False
        try:
            self.ctx.host.write(f"{drivers}/unbind", dev.pci)
            self.ctx.host.write(f"{drivers}/bind", dev.pci)
        except OSError as e:
            raise CniError(Code.INTERNAL, f"rebinding {dev.pci} to {dev.driver} to apply its "
                           f"GUID: {e.strerror or e}") from None
        deadline = time.monotonic() + timeout
        while not (nets := self.ctx.host.listdir(f"/sys/bus/pci/devices/{dev.pci}/net")):
            if time.monotonic() > deadline:
                raise CniError(Code.INTERNAL, f"{dev.pci} has no network device {timeout:g}s "
                               f"after rebinding it to {dev.driver}")
            time.sleep(0.05)
        dev.netdev = nets[0]
        return True

    def reset_vf(self, cache: Obj) -> None:
        """The link state, while the VF is still in the pod; its GUID once it is back (see
        after_release)."""
        pf, vf = cache.get("Master"), cache.get("VFID")
        if not pf or vf is None:
            return
        o = cache.get("OrigVfState") or {}
        if conf_get(cache, "link_state") not in (None, ""):
            self.ctx.vfs.set_link_state(pf, vf, int(o.get("LinkState", 0)))

    def after_release(self, cache: Obj, netns: str) -> None:
        """ib-sriov-cni's DEL order: the netdev is back, then the RDMA device (a namespace
        already gone has given it back by itself), then the GUID the VF had, which takes effect
        when the VF is bound again; the netdev that comes back gets its node name again."""
        state = cache.get("RdmaNetState") or {}
        name = state.get("containerRdmaDevName")
        moved = (cache.get("nicop") or {}).get("rdmaMoved", True)
        if name and moved and netns and os.path.exists(netns):
            self.ctx.rdma.move(str(name), netns, "")
        self._restore_guid(cache)

    def _restore_guid(self, cache: Obj) -> None:
        pf, vf, pci = cache.get("Master"), cache.get("VFID"), str(cache.get("deviceID") or "")
        # HostIFGUID (ib-sriov-cni's, and nicop's); older nicop caches: OrigVfState.GUID.
        guid = str(cache.get("HostIFGUID") or (
            (cache.get("OrigVfState") or {}).get("GUID") if cache.get("GUID") else "") or "")
        if not pf or vf is None or not guid:
            return
        if guid.lower() == ZERO_GUID:
            guid = ALL_F_GUID
        if not GUID.match(guid):
            log.warning("not restoring GUID %r of VF %s of %s: not a GUID", guid, vf, pf)
            return
        self.ctx.vfs.set_guid(pf, vf, guid.lower())
        if cache.get("vfioPciMode") or not pci:
            return
        dev = pci_device(self.ctx.host, "deviceID", pci)
        host_name = str((cache.get("OrigVfState") or {}).get("HostIFName")
                        or cache.get("HostIFNames") or "")
        try:
            rebound = self._rebind(dev)
        except CniError as e:  # the GUID is set; it applies at the VF's next probe
            log.warning("VF %s: %s", pci, e.msg)
            return
        if rebound and host_name and dev.netdev and dev.netdev != host_name:
            with self.ctx.host_ns.ipr() as h:
                link = get_link(h, dev.netdev)
                if link is not None:
                    h.link("set", index=link.index, ifname=host_name)
