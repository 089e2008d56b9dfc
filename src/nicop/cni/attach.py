"""Attaching a node device to a pod and giving it back: what sriov, ib-sriov and host-device share.

ADD claims the device (a per-device lock, and for PCI devices a file naming the netns that holds
it), records what DEL needs in the plugin's cache directory under /var/lib/cni *before* moving
anything, applies the PF-side settings, moves the netdev into the pod, runs IPAM and configures
the addresses. Any failure undoes what was done. DEL (and GC for attachments the runtime no
longer knows) replays the cache: IPAM DEL, PF settings restored, the netdev renamed and moved
back, wherever an interrupted ADD left it. Every step is safe to repeat.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any

from nicop.cni.devices import PciNetDevice, pci_device
from nicop.cni.ipam import ipam_section
from nicop.cni.netlink import (
    Link,
    Netns,
    check_link,
    configure_ips,
    get_link,
    move_in,
    move_out,
    open_netns,
    temp_name,
)
from nicop.cni.plugin import NodeContext, valid_attachments
from nicop.cni.spec import (
    CniError,
    Code,
    Obj,
    Request,
    config_error,
    empty_result,
    parse_result,
)
from nicop.cni.state import read_json, remove, write_json
from nicop.cni.vf import VfState

log = logging.getLogger(__name__)


def orig_state(state: VfState | None, host_name: str, mac: str, mtu: int) -> Obj:
    """OrigVfState as sriov-cni caches it (Go field names)."""
    s = state or VfState()
    return {
        "HostIFName": host_name, "SpoofChk": s.spoofchk, "Trust": s.trust, "AdminMAC": s.mac,
        "EffectiveMAC": mac, "Vlan": s.vlan, "VlanQoS": s.qos, "VlanProto": s.proto,
        "MinTxRate": s.min_tx_rate, "MaxTxRate": s.max_tx_rate, "LinkState": s.link_state,
        "MTU": mtu, "GUID": s.node_guid,
    }


def cached_config(config: Obj, replaced: set[str]) -> Obj:
    """The netconf as the cache keeps it: without prevResult and runtimeConfig (what the
    runtime passes per call), without an empty `dns` (as the Go library writes a NetConf), and
    without the keys the plugin caches in normalized form (`replaced`, matched like Go's
    encoding/json, ignoring case)."""
    lower = {k.lower() for k in replaced}
    return {k: v for k, v in config.items()
            if k not in ("prevResult", "runtimeConfig") and k.lower() not in lower
            and not (k == "dns" and not (isinstance(v, dict) and any(v.values())))}


class DevicePlugin:
    """A plugin that moves one node device into the pod (subclasses say which, and how)."""

    cache_dir = "/var/lib/cni/sriov"
    aliased = False
    """Whether the upstream plugin, too, marks the moved link with its node name as alias."""
    restores_mac = True
    """Whether DEL gives the netdev back the MAC it had before the pod (sriov-cni's ReleaseVF
    does; an IPoIB address is the driver's to choose)."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    # ------------------------------------------------------------------ hooks
    def parse(self, req: Request) -> Any:
        """The validated config (errors name the field)."""
        raise NotImplementedError

    def resolve(self, conf: Any) -> PciNetDevice:
        """The device the config asks for; by default the PCI function `deviceID` names."""
        dev = pci_device(self.ctx.host, "deviceID", conf.device_id)
        if dev.netdev is None and not dev.userspace:
            raise config_error("deviceID", f"{dev.pci} has no network device (driver "
                               f"{dev.driver or 'none'}); is it a VF bound to its kernel "
                               "driver?")
        return dev

    def apply_vf(self, conf: Any, dev: PciNetDevice, orig: VfState | None, cache: Obj) -> None:
        """PF-side settings for the pod (ADD)."""

    def reset_vf(self, cache: Obj) -> None:
        """Undo apply_vf from what the cache recorded (DEL)."""

    def after_release(self, cache: Obj, netns: str) -> None:
        """What DEL undoes once the netdev is back on the node."""

    def check_without_result(self, req: Request) -> None:
        """CHECK without prevResult: the upstream sriov plugins' CHECK does nothing at all."""
        log.info("CHECK of %s/%s without prevResult: nothing to compare", req.container_id,
                 req.ifname)

    def pod_mac(self, conf: Any) -> str | None:
        return None

    def cache_fields(self, conf: Any, dev: PciNetDevice, orig: VfState | None) -> Obj:
        """The plugin's own cached fields, with its defaults filled in (upstream's NetConf)."""
        return {}

    def runs_ipam(self, conf: Any, dev: PciNetDevice) -> bool:
        return True

    def releases_ipam(self, cache: Obj) -> bool:
        return True

    def result_interface(self, req: Request, conf: Any, dev: PciNetDevice, moved: Link | None,
                         cache: Obj) -> Obj:
        """interfaces[0] of the ADD result, with the fields the upstream plugin prints."""
        iface: Obj = {"name": req.ifname, "sandbox": req.netns}
        if moved is not None:
            iface["mac"] = moved.mac
        return iface

    def result_dns(self, req: Request, ipam_result: Obj) -> Obj:
        """The result's dns: what IPAM returned (sriov-cni and ib-sriov-cni pass it on)."""
        return dict(ipam_result.get("dns") or {})

    def configured(self, pod: Netns, req: Request, result: Obj) -> None:
        """After the interface is up with its addresses (sriov announces them)."""

    def device_mtu(self, dev: PciNetDevice) -> int | None:
        """The MTU to record for a device without netdev: its PF's (sriov-cni's DPDK mode)."""
        return self.ctx.host.read_int(f"/sys/class/net/{dev.pf}/mtu") if dev.pf else None

    # ------------------------------------------------------------------ paths
    def cache_path(self, container_id: str, ifname: str) -> str:
        return f"{self.cache_dir}/{container_id}-{ifname}"

    def pci_path(self, pci: str) -> str:
        return f"{self.cache_dir}/pci/{pci}"

    # ------------------------------------------------------------------ ADD
    def add(self, req: Request) -> Obj:
        conf = self.parse(req)
        dev = self.resolve(conf)
        if self.runs_ipam(conf, dev):
            self.ctx.ipam.validate(req)
        with self.ctx.locks.hold(dev.pci or dev.netdev or ""):
            stale = read_json(self.ctx.host, self.cache_path(req.container_id, req.ifname))
            if stale is not None:
                log.info("releasing what an interrupted ADD of %s/%s left", req.container_id,
                         req.ifname)
                self._release(stale, str((stale.get("nicop") or {}).get("netns", "")), req)
            if dev.pci:
                self._check_free(dev.pci)
            with open_netns(req.netns) as pod:
                return self._attach(req, conf, dev, pod)

    def _check_free(self, pci: str) -> None:
        holder = self.ctx.host.read(self.pci_path(pci))
        if holder is None:
            return
        if holder and os.path.exists(holder):
            raise CniError(Code.DEVICE_BUSY, f"deviceID: pci address {pci} is already allocated",
                           f"the VF is attached in network namespace {holder}")
        remove(self.ctx.host, self.pci_path(pci))  # its pod's namespace is gone

    def _attach(self, req: Request, conf: Any, dev: PciNetDevice, pod: Netns) -> Obj:
        host = self.ctx.host
        orig: VfState | None = None
        if dev.pf is not None and dev.vf_index is not None:
            orig = self.ctx.vfs.get(dev.pf, dev.vf_index)
        link = None
        if dev.netdev is not None:
            with self.ctx.host_ns.ipr() as h:
                link = get_link(h, dev.netdev)
            if link is None:
                raise CniError(Code.DEVICE_BUSY, f"device {dev.netdev} "
                               + (f"({dev.pci}) " if dev.pci else "") + "is not on the node",
                               "it is attached to another pod, or was renamed")
        mac = self.pod_mac(conf)
        temp = temp_name()
        fields = self.cache_fields(conf, dev, orig)
        cache: Obj = {
            **cached_config(req.config, set(fields)),
            "deviceID": dev.pci, "Master": dev.pf, "VFID": dev.vf_index,
            "ContIFNames": req.ifname, "MTU": link.mtu if link else self.device_mtu(dev),
            "OrigVfState": orig_state(orig, dev.netdev or "", link.mac if link else "",
                                       link.mtu if link else 0),
            **fields,
            "nicop": {"containerID": req.container_id, "netns": req.netns, "temp": temp,
                      "up": bool(link and link.up),
                      "alias": link.alias if link else "", "args": req.env.get("CNI_ARGS", ""),
                      "userspace": dev.userspace},
        }
        write_json(host, self.cache_path(req.container_id, req.ifname), cache)
        if dev.pci:
            write_json(host, self.pci_path(dev.pci), req.netns.encode())
        try:
            self.apply_vf(conf, dev, orig, cache)
            moved = None
            if dev.netdev is not None:
                moved = move_in(self.ctx.host_ns, pod, dev.netdev, req.ifname, temp=temp,
                                mac=mac)
            result = empty_result()
            if self.runs_ipam(conf, dev):
                result = self.ctx.ipam.add(req)
                if ipam_section(req.config) is not None and not result["ips"]:
                    raise CniError(Code.INTERNAL, "IPAM plugin returned missing IP config")
            for ip in result["ips"]:
                ip["interface"] = 0
            if moved is not None:
                if result["ips"]:
                    configure_ips(pod, req.ifname, result)
                self.configured(pod, req, result)
        except BaseException:
            try:
                self._release(cache, req.netns, req, same=True)
            except Exception:
                log.exception("undoing the failed ADD of %s/%s", req.container_id, req.ifname)
            raise
        result["dns"] = self.result_dns(req, result)
        result["interfaces"] = [self.result_interface(req, conf, dev, moved, cache)]
        return result

    # ------------------------------------------------------------------ DEL
    def delete(self, req: Request) -> None:
        cache = read_json(self.ctx.host, self.cache_path(req.container_id, req.ifname))
        if cache is None:
            # Nothing of this attachment on the node; an address may still be held (an ADD
            # that died before caching): IPAM DEL is idempotent.
            with contextlib.suppress(CniError):
                if ipam_section(req.config) is not None:
                    self.ctx.ipam.delete(req)
            return
        with self.ctx.locks.hold(self._lock_key(cache)):
            self._release(cache, req.netns, req, same=True)

    @staticmethod
    def _lock_key(cache: Obj) -> str:
        return str(cache.get("deviceID") or (cache.get("OrigVfState") or {}).get("HostIFName", ""))

    def _ipam_request(self, cache: Obj, netns: str, trigger: Request | None) -> Request:
        """The IPAM DEL of a cached attachment when the runtime's own DEL is not at hand (GC,
        an interrupted ADD): the cached config, with CNI_PATH from whatever triggered it."""
        nic = cache.get("nicop") or {}
        config = {k: v for k, v in cache.items()
                  if k not in ("nicop", "OrigVfState", "Master", "VFID", "ContIFNames")}
        env = {
            **(trigger.env if trigger else {}), "CNI_COMMAND": "DEL",
            "CNI_CONTAINERID": str(nic.get("containerID", "")), "CNI_NETNS": netns,
            "CNI_IFNAME": str(cache.get("ContIFNames", "")), "CNI_ARGS": str(nic.get("args", "")),
        }
        args: dict[str, str] = {}
        for pair in env["CNI_ARGS"].split(";"):
            k, _, v = pair.partition("=")
            if k:
                args[k] = v
        return Request(plugin="", command="DEL", container_id=env["CNI_CONTAINERID"],
                       netns=netns, ifname=env["CNI_IFNAME"], args=args,
                       path=trigger.path if trigger else [], config=config,
                       stdin=json.dumps(config).encode(), env=env)

    def _release(self, cache: Obj, netns: str, req: Request | None = None,
                 same: bool = False) -> None:
        """Give the device back to the node as it was; every step is safe to repeat.

        `req` triggered the release; `same` says it is the runtime's own call for this
        attachment (its DEL, or the ADD being undone), whose config IPAM DEL then gets.
        """
        host = self.ctx.host
        nic = cache.get("nicop") or {}
        netns = netns or str(nic.get("netns") or "")
        ifname = str(cache.get("ContIFNames") or (req.ifname if req and same else ""))
        container_id = str(nic.get("containerID") or (req.container_id if req and same else ""))
        if ipam_section(cache) is not None and self.releases_ipam(cache):
            self.ctx.ipam.delete(req if req is not None and same
                                 else self._ipam_request(cache, netns, req))
        self.reset_vf(cache)
        orig = cache.get("OrigVfState") or {}
        # ib-sriov-cni caches the VF's node name as HostIFNames, sriov-cni in OrigVfState.
        host_name = str(orig.get("HostIFName") or cache.get("HostIFNames") or "")
        if host_name and not nic.get("userspace"):
            pod = None
            if netns and os.path.exists(netns):
                with contextlib.suppress(CniError):
                    pod = open_netns(netns)
            try:
                restore_mac = (orig.get("EffectiveMAC") or None) if self.restores_mac else None
                restore_mtu = orig.get("MTU") or None
                for name in (ifname, nic.get("temp")):
                    if not name:
                        continue
                    outcome = move_out(self.ctx.host_ns, pod, name, host_name, mac=restore_mac,
                                       mtu=restore_mtu, up=bool(nic.get("up")),
                                       alias=str(nic.get("alias") or ""),
                                       ours=bool(nic) or self.aliased)
                    if outcome != "not found":
                        break
                log.info("released %s (%s): %s", cache.get("deviceID"), host_name, outcome)
            finally:
                if pod is not None:
                    pod.close()
        self.after_release(cache, netns)
        pci = str(cache.get("deviceID", ""))
        holder = host.read(self.pci_path(pci)) if pci else None
        if holder is not None and (holder in ("", netns, nic.get("netns"))
                                   or not os.path.exists(holder)):
            remove(host, self.pci_path(pci))
        remove(host, self.cache_path(container_id, ifname))

    # ------------------------------------------------------------------ CHECK, STATUS, GC
    def check(self, req: Request) -> None:
        prev = req.config.get("prevResult")
        if not prev:
            self.check_without_result(req)
            return
        with open_netns(req.netns) as pod:
            cache = read_json(self.ctx.host, self.cache_path(req.container_id, req.ifname))
            userspace = self.checked_userspace(req, cache)
            result = parse_result(prev)
            iface = next((i for i in result["interfaces"]
                          if i.get("name") == req.ifname and i.get("sandbox") == req.netns), None)
            if iface is None:
                named: Obj = next((i for i in result["interfaces"]
                                   if i.get("name") == req.ifname), {})
                raise CniError(Code.INTERNAL, f"Sandbox in prevResult {named.get('sandbox', '')} "
                               f"doesn't match configured netns: {req.netns}",
                               f"prevResult names no interface {req.ifname} in {req.netns}")
            if not userspace:
                check_link(pod, req.ifname, iface.get("mac"), result["ips"], result["routes"])
        self.ctx.ipam.check(req)

    def checked_userspace(self, req: Request, cache: Obj | None) -> bool:
        """Whether the attachment CHECK looks at has no netdev; sriov and ib-sriov need their
        cache for it (nicop's CHECK compares; upstream's does nothing)."""
        if cache is None:
            raise CniError(Code.INTERNAL, f"no attachment of container {req.container_id} "
                           f"interface {req.ifname} on this node",
                           f"nothing in {self.cache_dir}: the ADD did not succeed here, or the "
                           "attachment was deleted")
        return bool((cache.get("nicop") or {}).get("userspace"))

    def status(self, req: Request) -> None:
        """Ready, as the upstream plugins (which implement no STATUS) always are: a pool this
        node lacks fails the pod's ADD with a clear error, not the node's network readiness."""

    def gc(self, req: Request) -> None:
        valid = valid_attachments(req)
        for entry in self.ctx.host.listdir(self.cache_dir):
            if entry == "pci" or entry.startswith("."):
                continue
            cache = read_json(self.ctx.host, f"{self.cache_dir}/{entry}")
            if not isinstance(cache, dict) or cache.get("name") != req.name:
                continue
            nic = cache.get("nicop") or {}
            if (nic.get("containerID"), cache.get("ContIFNames")) in valid:
                continue
            with self.ctx.locks.hold(self._lock_key(cache)):
                log.info("GC: releasing %s of %s", cache.get("deviceID"), entry)
                try:
                    self._release(cache, str(nic.get("netns", "")), req)
                except CniError as e:
                    log.warning("GC: could not release %s: %s", entry, e.msg)
        section = ipam_section(req.config)
        if section is not None and section["type"] == "nv-ipam":
            self.ctx.ipam.collect(req)
