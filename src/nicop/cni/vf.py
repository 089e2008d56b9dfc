"""VF settings held by the PF (VLAN, admin MAC, rates, spoof check, trust, link state, GUIDs).

The kernel keeps these on the PF's netdev (IFLA_VF_INFO), not on the VF. `VfControl` is the one
interface the plugins use: `NetlinkVfControl` talks to the kernel (a simulated node brings its
own, nicop_sim.pf).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pyroute2.netlink.exceptions import NetlinkError

from nicop.cni.netlink import Netns, get_link, netlink_error
from nicop.cni.spec import CniError, Code

ETH_P_8021Q = 0x8100
ETH_P_8021AD = 0x88A8
LINK_STATES = {"auto": 0, "enable": 1, "disable": 2}


@dataclass
class VfState:
    """What the PF says about one VF (ip link show <pf>: the "vf N" line)."""

    mac: str = "00:00:00:00:00:00"
    vlan: int = 0
    qos: int = 0
    proto: int = ETH_P_8021Q
    spoofchk: bool = True
    trust: bool = False
    min_tx_rate: int = 0
    max_tx_rate: int = 0
    link_state: int = 0
    node_guid: str = ""
    port_guid: str = ""


class VfControl(Protocol):
    def get(self, pf: str, vf: int) -> VfState: ...
    def set_vlan(self, pf: str, vf: int, vlan: int, qos: int, proto: int) -> None: ...
    def set_mac(self, pf: str, vf: int, mac: str) -> None: ...
    def set_rate(self, pf: str, vf: int, min_rate: int, max_rate: int) -> None: ...
    def set_spoofchk(self, pf: str, vf: int, on: bool) -> None: ...
    def set_trust(self, pf: str, vf: int, on: bool) -> None: ...
    def set_link_state(self, pf: str, vf: int, state: int) -> None: ...
    def set_guid(self, pf: str, vf: int, guid: str) -> None: ...


class NetlinkVfControl:
    """The kernel's VF settings, through RTM_SETLINK on the PF in the node's namespace."""

    def __init__(self, host: Netns) -> None:
        self.host = host

    def _set(self, pf: str, vf: int, what: str, **spec: Any) -> None:
        with self.host.ipr() as h:
            link = get_link(h, pf)
            if link is None:
                raise CniError(Code.INTERNAL, f"PF {pf} not found on the node")
            try:
                h.link("set", index=link.index, vf={"vf": vf, **spec})
            except NetlinkError as e:
                raise netlink_error(f"setting {what} of VF {vf} on {pf}", e) from None

    def get(self, pf: str, vf: int) -> VfState:
        with self.host.ipr() as h:
            link = get_link(h, pf)
            if link is None:
                raise CniError(Code.INTERNAL, f"PF {pf} not found on the node")
            msg = h.link("get", index=link.index, ext_mask=1)[0]
        vfs = msg.get_attr("IFLA_VFINFO_LIST")
        for info in vfs.get_attrs("IFLA_VF_INFO") if vfs is not None else []:
            mac = info.get_attr("IFLA_VF_MAC")
            if mac is None or mac["vf"] != vf:
                continue
            state = VfState(mac=mac["mac"])
            if (vlan := info.get_attr("IFLA_VF_VLAN")) is not None:
                state.vlan, state.qos = vlan["vlan"], vlan["qos"]
            vlist = info.get_attr("IFLA_VF_VLAN_LIST")
            if vlist is not None and (first := vlist.get_attr("IFLA_VF_VLAN_INFO")) is not None:
                state.proto = first["proto"] or ETH_P_8021Q
            if (rate := info.get_attr("IFLA_VF_RATE")) is not None:
                state.min_tx_rate, state.max_tx_rate = rate["min_tx_rate"], rate["max_tx_rate"]
            if (spoof := info.get_attr("IFLA_VF_SPOOFCHK")) is not None:
                state.spoofchk = spoof["spoofchk"] == 1
            if (trust := info.get_attr("IFLA_VF_TRUST")) is not None:
                state.trust = trust["trust"] == 1
            if (ls := info.get_attr("IFLA_VF_LINK_STATE")) is not None:
                state.link_state = ls["link_state"]
            return state
        raise CniError(Code.INTERNAL, f"{pf} reports no VF {vf}",
                       "is it a PF with SR-IOV enabled (sriov_numvfs > 0)?")

    def set_vlan(self, pf: str, vf: int, vlan: int, qos: int, proto: int) -> None:
        self._set(pf, vf, "the VLAN", vlan=[{"vlan": vlan, "qos": qos, "proto": proto}])

    def set_mac(self, pf: str, vf: int, mac: str) -> None:
        self._set(pf, vf, "the MAC", mac=mac)

    def set_rate(self, pf: str, vf: int, min_rate: int, max_rate: int) -> None:
        self._set(pf, vf, "the rates", rate={"min_tx_rate": min_rate, "max_tx_rate": max_rate})

    def set_spoofchk(self, pf: str, vf: int, on: bool) -> None:
        self._set(pf, vf, "spoof checking", spoofchk=int(on))

    def set_trust(self, pf: str, vf: int, on: bool) -> None:
        self._set(pf, vf, "trust", trust=int(on))

    def set_link_state(self, pf: str, vf: int, state: int) -> None:
        self._set(pf, vf, "the link state", link_state=state)

    def set_guid(self, pf: str, vf: int, guid: str) -> None:
        self._set(pf, vf, "the node GUID", ib_node_guid=guid)
        self._set(pf, vf, "the port GUID", ib_port_guid=guid)
