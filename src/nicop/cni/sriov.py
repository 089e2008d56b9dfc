"""The `sriov` and `ib-sriov` plugins: a VF into the pod with its MAC, VLAN or GUID, and back.

Config, cache files and checks are sriov-cni's and ib-sriov-cni's: `deviceID` (the VF's PCI
address, injected by Multus), vlan/vlanQoS/vlanProto, mac, spoofchk, trust, link_state,
min/max_tx_rate, ipam; the netconf cached in `/var/lib/cni/sriov/<containerID>-<ifname>` with
the VF's original state under `OrigVfState`, and `/var/lib/cni/sriov/pci/<pci>` naming the
netns that holds the VF. A cache written by upstream sriov-cni is understood by DEL, so a node
can switch plugins with pods running.

Unlike upstream, the cache is written before the VF moves: a daemon killed halfway leaves
enough behind for DEL (or GC) to find the VF, wherever it was left, and put it back.

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
from nicop.cni.devices import PciNetDevice, normalize_pci
from nicop.cni.plugin import conf_get, optional_int, parse_mac
from nicop.cni.rdma import EXCLUSIVE
from nicop.cni.spec import CniError, Code, Obj, Request, config_error
from nicop.cni.state import write_json
from nicop.cni.vf import ETH_P_8021AD, ETH_P_8021Q, LINK_STATES, VfState

log = logging.getLogger(__name__)

VLAN_PROTOS = {"802.1q": ETH_P_8021Q, "802.1ad": ETH_P_8021AD}
GUID = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){7}$")
ZERO_GUID = "00:00:00:00:00:00:00:00"
ALL_F_GUID = "ff:ff:ff:ff:ff:ff:ff:ff"


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
        conf.proto = VLAN_PROTOS[proto.lower()]
        if conf.proto == ETH_P_8021AD and not conf.vlan:
            raise config_error("vlanProto", "vlan id must be configured to set vlan proto "
                               "802.1ad")
    conf.mac = parse_mac("mac", conf_get(c, "mac"))
    if req.args.get("MAC"):
        conf.mac = parse_mac("CNI_ARGS MAC", req.args["MAC"])
    runtime = c.get("runtimeConfig") or {}
    if isinstance(runtime, dict) and runtime.get("mac"):
        conf.mac = parse_mac("runtimeConfig.mac", runtime["mac"])
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

    def pod_mac(self, conf: SriovConf) -> str | None:
        return conf.mac

    def apply_vf(self, conf: SriovConf, dev: PciNetDevice, orig: VfState | None,
                 cache: Obj) -> None:
        """sriov-cni's ApplyVFConfig, in its order."""
        settings = (conf.vlan, conf.mac, conf.min_tx_rate, conf.max_tx_rate, conf.spoofchk,
                    conf.trust, conf.link_state)
        if dev.pf is None or dev.vf_index is None:
            if any(s is not None for s in settings):
                raise config_error("deviceID", f"{dev.pci} is not a VF (no physfn): vlan, mac, "
                                   "rates, spoofchk, trust and link_state need one")
            return
        pf, vf, vfs = dev.pf, dev.vf_index, self.ctx.vfs
        base = orig or VfState()
        if conf.vlan is not None:
            vfs.set_vlan(pf, vf, conf.vlan, conf.qos or 0, conf.proto or ETH_P_8021Q)
        if conf.mac:
            vfs.set_mac(pf, vf, conf.mac)
        if conf.min_tx_rate is not None or conf.max_tx_rate is not None:
            min_rate = conf.min_tx_rate if conf.min_tx_rate is not None else base.min_tx_rate
            max_rate = conf.max_tx_rate if conf.max_tx_rate is not None else base.max_tx_rate
            vfs.set_rate(pf, vf, min_rate, max_rate)
        if conf.spoofchk is not None:
            vfs.set_spoofchk(pf, vf, conf.spoofchk)
        if conf.trust is not None:
            vfs.set_trust(pf, vf, conf.trust)
        if conf.link_state is not None:
            vfs.set_link_state(pf, vf, conf.link_state)

    def reset_vf(self, cache: Obj) -> None:
        """sriov-cni's ResetVFConfig: restore only what the config had set."""
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
        if cache.get("MAC"):
            vfs.set_mac(pf, vf, str(o.get("AdminMAC") or "00:00:00:00:00:00"))
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


IB_KUBERNETES_MARKER = "mellanox.infiniband.app"
"""The args.cni key ib-kubernetes sets to "configured" once the GUID is in the subnet manager."""
IB_CONFIGURED = "configured"


class IbSriovPlugin(DevicePlugin):
    """`type: ib-sriov` (ib-sriov-cni): an InfiniBand VF with its GUID and, with
    `rdmaIsolation`, its RDMA device in the pod's namespace."""

    cache_dir = "/var/lib/cni/ib-sriov"

    def parse(self, req: Request) -> IbConf:
        c = req.config
        conf = IbConf(device_id=_device_id(c))
        runtime = c.get("runtimeConfig") or {}
        args_cni = ((c.get("args") or {}).get("cni") or {}) if isinstance(c.get("args"),
                                                                            dict) else {}
        if conf_get(c, "ibKubernetesEnabled") and \
                args_cni.get(IB_KUBERNETES_MARKER) != IB_CONFIGURED:
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
        elif conf_get(c, "ibKubernetesEnabled"):
            raise config_error("args.cni.guid", "required when ibKubernetesEnabled is true "
                               "(ib-kubernetes assigns it)")
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
        return conf

    def apply_vf(self, conf: IbConf, dev: PciNetDevice, orig: VfState | None,
                 cache: Obj) -> None:
        """ib-sriov-cni's order: link state, GUID (and the rebind it needs), then the RDMA
        device into the pod, before the netdev follows it."""
        if dev.pf is None or dev.vf_index is None:
            if conf.guid or conf.link_state is not None:
                raise config_error("deviceID", f"{dev.pci} is not a VF (no physfn)")
        else:
            if conf.link_state is not None:
                self.ctx.vfs.set_link_state(dev.pf, dev.vf_index, conf.link_state)
            if conf.guid:
                cache["OrigVfState"]["GUID"] = self._current_guid(dev, orig)
                cache["GUID"] = conf.guid
                self._save(cache)
                self.ctx.vfs.set_guid(dev.pf, dev.vf_index, conf.guid)
                if self._rebind(dev):
                    cache["OrigVfState"]["HostIFName"] = dev.netdev
                    self._save(cache)
            elif dev.netdev is not None:
                self._check_guid(dev)
        if conf.rdma_isolation:
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

    def after_release(self, cache: Obj, netns: str) -> None:
        """The RDMA device back to the node, after its netdev (ib-sriov-cni's DEL order). A
        namespace already gone has given it back by itself."""
        state = cache.get("RdmaNetState") or {}
        name = state.get("containerRdmaDevName")
        moved = (cache.get("nicop") or {}).get("rdmaMoved", True)
        if not name or not moved or not netns or not os.path.exists(netns):
            return
        self.ctx.rdma.move(str(name), netns, "")

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
        pf, vf = cache.get("Master"), cache.get("VFID")
        if not pf or vf is None:
            return
        o = cache.get("OrigVfState") or {}
        if cache.get("GUID"):
            guid = str(o.get("GUID") or ZERO_GUID)
            self.ctx.vfs.set_guid(pf, vf, ALL_F_GUID if guid == ZERO_GUID else guid)
        if conf_get(cache, "link_state") not in (None, ""):
            self.ctx.vfs.set_link_state(pf, vf, int(o.get("LinkState", 0)))
