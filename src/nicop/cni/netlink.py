"""Links and namespaces through netlink (pyroute2): move a device into a pod and back.

The daemon never switches its own threads into a pod's namespace for longer than it takes to
open a netlink socket there: a socket stays bound to the namespace it was created in, so each
request holds one socket per namespace and the process itself stays in the node's namespace.
"""

from __future__ import annotations

import ctypes
import ipaddress
import logging
import os
import secrets
import socket
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from nicop.cni.spec import CniError, Code, Obj

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_NSFS_DEV = os.stat("/proc/self/ns/net").st_dev
T = TypeVar("T")
IFF_UP = 0x1
IFF_RUNNING = 0x40
ETH_P_ARP = 0x0806


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class Netns:
    """An open network namespace: its fd moves links into it, sockets made in it act on it."""

    def __init__(self, path: str | None = None) -> None:
        """Open the namespace at `path` (a bind mount such as /run/netns/x, or /proc/<pid>/ns/net);
        None is the calling thread's own namespace."""
        self.path = path or ""
        self.fd = os.open(path or "/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        if os.fstat(self.fd).st_dev != _NSFS_DEV:
            os.close(self.fd)
            raise NotADirectoryError(f"{path} is not a network namespace")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Netns:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def netlink_socket(self, kind: int = socket.SOCK_DGRAM, proto: int = 0) -> socket.socket:
        """A netlink socket bound to this namespace (the thread goes back at once)."""
        return self.socket(socket.AF_NETLINK, kind, proto)

    def socket(self, family: int, kind: int, proto: int = 0) -> socket.socket:
        """A socket of this namespace: it stays bound to it after the thread goes back."""
        return self._inside(lambda: socket.socket(family, kind, proto))

    def write_sysctl(self, path: str, value: str) -> None:
        """Write a /proc/sys/net file of this namespace (opened inside it, written outside)."""
        fd = self._inside(lambda: os.open(path, os.O_WRONLY | os.O_CLOEXEC))
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)

    def _inside(self, make: Callable[[], T]) -> T:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(self.fd)
            try:
                return make()
            finally:
                _setns(own)  # a failure here leaves the thread astray: let it raise loudly
        finally:
            os.close(own)

    @contextmanager
    def ipr(self) -> Iterator[Any]:
        """An IPRoute whose socket lives in this namespace."""
        ipr = IPRoute(use_socket=self.netlink_socket(), groups=0)
        try:
            yield ipr
        finally:
            ipr.close()


def open_netns(path: str, what: str = "CNI_NETNS") -> Netns:
    """The pod's namespace, or a CNI error naming the variable that points nowhere useful."""
    try:
        return Netns(path)
    except FileNotFoundError:
        raise CniError(Code.INVALID_ENV, f"{what}: network namespace {path} does not exist") \
            from None
    except OSError as e:
        raise CniError(Code.INVALID_ENV, f"{what}: cannot open network namespace {path}: "
                       f"{e.strerror or e}") from None


@dataclass
class Link:
    index: int
    name: str
    mac: str
    mtu: int
    up: bool
    alias: str
    altnames: tuple[str, ...] = ()
    running: bool = False
    """Up with carrier (IFF_RUNNING)."""


def _link(msg: Any) -> Link:
    props = msg.get_attr("IFLA_PROP_LIST")
    return Link(
        index=msg["index"],
        name=msg.get("ifname") or "",
        mac=msg.get("address") or "",
        mtu=msg.get("mtu") or 0,
        up=bool(msg["flags"] & IFF_UP),
        alias=msg.get("ifalias") or "",
        altnames=tuple(props.get_attrs("IFLA_ALT_IFNAME")) if props is not None else (),
        running=bool(msg["flags"] & IFF_RUNNING),
    )


def drop_altnames(ipr: Any, name: str, unwanted: set[str]) -> None:
    """Remove `name`'s alternative names that are in `unwanted`.

    Kernels that keep a device's old name as an altname on rename would otherwise leave the
    node's name on the pod's interface, or a pod's interface name on the VF that blocks the next
    pod's rename with EEXIST. Best effort: a name that will not go is logged.
    """
    link = get_link(ipr, name)
    stale = [a for a in link.altnames if a in unwanted] if link is not None else []
    if link is None or not stale:
        return
    try:
        ipr.link("property_del", index=link.index, altname=stale)
    except NetlinkError as e:
        log.warning("could not remove altnames %s of %s: %s", stale, name, e)


def get_link(ipr: Any, name: str) -> Link | None:
    try:
        return _link(ipr.link("get", ifname=name)[0])
    except NetlinkError as e:
        if e.code == 19:  # ENODEV
            return None
        raise


def find_link(ipr: Any, *, mac: str | None = None, alias: str | None = None) -> Link | None:
    """The first link with this MAC, or whose alias (the name it had on the node) matches."""
    for msg in ipr.link("dump"):
        link = _link(msg)
        if (mac and link.mac.lower() == mac.lower()) or (alias and link.alias == alias):
            return link
    return None


def temp_name() -> str:
    """A name no other device has, for the moment between two namespaces."""
    return "nctmp" + secrets.token_hex(5)


def netlink_error(action: str, e: NetlinkError) -> CniError:
    return CniError(Code.INTERNAL, f"{action}: {e.args[1] if len(e.args) > 1 else e}")


def move_in(
    host: Netns, pod: Netns, host_name: str, ifname: str, *, temp: str,
    mac: str | None = None, mtu: int | None = None,
) -> Link:
    """Move `host_name` into `pod` as `ifname`, up, with the MAC and MTU asked for.

    The device crosses under a temporary name, so neither a node device nor a pod device with
    the same name can get in the way; on failure it goes back to the node under its old name,
    up again if it was. Its node name is kept as the link alias, so it can be found and renamed
    back even after the pod renamed it or its namespace was destroyed.
    """
    with host.ipr() as h, pod.ipr() as p:
        link = get_link(h, host_name)
        if link is None:
            raise CniError(Code.INTERNAL, f"device {host_name} not found on the node",
                           "it may be attached to another pod, or renamed")
        if get_link(p, ifname) is not None:
            raise CniError(Code.INVALID_ENV,
                           f"CNI_IFNAME: interface {ifname} already exists in {pod.path}")
        try:
            if link.up:  # a device is renamed only while down
                h.link("set", index=link.index, state="down")
            h.link("set", index=link.index, ifname=temp, ifalias=host_name)
            drop_altnames(h, temp, {host_name, ifname})
            h.link("set", index=link.index, net_ns_fd=pod.fd)
        except NetlinkError as e:
            _restore_name(h, temp, host_name, link.alias, link.up)
            raise netlink_error(f"moving {host_name} into {pod.path}", e) from None
        try:
            moved = get_link(p, temp)
            if moved is None:
                raise CniError(Code.INTERNAL, f"{host_name} vanished while moving into {pod.path}")
            changes: dict[str, Any] = {"ifname": ifname}
            if mtu:
                changes["mtu"] = mtu
            p.link("set", index=moved.index, **changes)
            if mac:
                try:
                    p.link("set", index=moved.index, address=mac)
                except NetlinkError as e:
                    raise netlink_error(f"failed to set netlink MAC address to {mac}", e) \
                        from None
            p.link("set", index=moved.index, state="up")
            final = get_link(p, ifname)
            assert final is not None
            return final
        except (NetlinkError, CniError, AssertionError) as e:
            _move_back(p, h, host, (ifname, temp), temp, host_name, mac=link.mac,
                       up=link.up, alias=link.alias, ours=True)
            if isinstance(e, NetlinkError):
                raise netlink_error(f"configuring {ifname} in {pod.path}", e) from None
            raise


def _restore_name(h: Any, temp: str, host_name: str, alias: str, up: bool) -> None:
    current = get_link(h, temp)
    if current is not None:
        try:
            h.link("set", index=current.index, ifname=host_name, ifalias=alias)
            if up:
                h.link("set", index=current.index, state="up")
        except NetlinkError as e:
            log.warning("could not rename %s back to %s: %s", temp, host_name, e)


def _move_back(
    p: Any, h: Any, host: Netns, names: tuple[str, ...], temp: str, host_name: str, *,
    mac: str | None, mtu: int | None = None, up: bool = False, alias: str = "",
    ours: bool = True,
) -> bool:
    """Move the first of `names` found in the pod back to the node as `host_name`.

    With `ours`, only a link whose alias is `host_name` (set when it was moved in) counts: a
    pod's own interface that happens to have the name is never taken, and one the pod renamed
    is still found by that alias. A node device already named `host_name` is an error that
    leaves the pod's interface as it is (the DEL can be retried once it is gone).
    """
    link = next((lk for n in names if (lk := get_link(p, n)) is not None
                 and (not ours or lk.alias == host_name)), None)
    if link is None and ours:
        link = find_link(p, alias=host_name)
    if link is None:
        return False
    if get_link(h, host_name) is not None:
        raise CniError(Code.INTERNAL, f"cannot return {link.name} to the node as {host_name}: "
                       f"the node has another device named {host_name}",
                       "rename or remove that device; the pod keeps the interface until then")
    p.link("set", index=link.index, state="down")
    changes: dict[str, Any] = {"ifname": temp}
    if mac and mac.lower() != link.mac.lower():
        changes["address"] = mac
    if mtu and mtu != link.mtu:
        changes["mtu"] = mtu
    p.link("set", index=link.index, **changes)
    p.link("set", index=link.index, net_ns_fd=host.fd)
    back = get_link(h, temp)
    if back is not None:
        h.link("set", index=back.index, ifname=host_name, ifalias=alias)
        drop_altnames(h, host_name, {link.name, temp})
        if up:
            h.link("set", index=back.index, state="up")
    return True


def move_out(
    host: Netns, pod: Netns | None, ifname: str, host_name: str, *,
    mac: str | None = None, mtu: int | None = None, up: bool = False, alias: str = "",
    ours: bool = True,
) -> str:
    """Put the pod's `ifname` back on the node as `host_name`, with its old MAC, MTU, alias.

    Idempotent: a device already back (or gone with its namespace) is not an error. Returns
    what happened, for the log. `ours`: see _move_back (False for attachments made by an
    upstream plugin that set no alias).
    """
    temp = temp_name()
    with host.ipr() as h:
        try:
            if pod is not None:
                with pod.ipr() as p:
                    if _move_back(p, h, host, (ifname,), temp, host_name, mac=mac, mtu=mtu,
                                  up=up, alias=alias, ours=ours):
                        return "moved back"
            back = get_link(h, host_name)
            if back is not None:
                if ours and back.alias == host_name and alias != host_name:
                    h.link("set", index=back.index, ifalias=alias)  # our mark goes
                return "already on the node"
            # Returned by the kernel when its namespace went away, under its pod name: the
            # alias still holds the node name.
            stray = find_link(h, alias=host_name)
            if stray is not None:
                h.link("set", index=stray.index, state="down")
                changes: dict[str, Any] = {"ifname": host_name, "ifalias": alias}
                if mac and mac.lower() != stray.mac.lower():
                    changes["address"] = mac
                if mtu and mtu != stray.mtu:
                    changes["mtu"] = mtu
                h.link("set", index=stray.index, **changes)
                drop_altnames(h, host_name, {stray.name})
                if up:
                    h.link("set", index=stray.index, state="up")
                return f"renamed {stray.name} back"
            return "not found"
        except NetlinkError as e:
            raise netlink_error(f"moving {ifname} back to the node as {host_name}", e) from None


def configure_ips(pod: Netns, ifname: str, result: Obj) -> None:
    """Add the result's addresses and routes to `ifname` (CNI's ConfigureIface)."""
    ips = [ip for ip in result.get("ips") or [] if ip.get("interface") in (None, 0)]
    gateways: dict[int, str] = {}
    with pod.ipr() as p:
        link = get_link(p, ifname)
        if link is None:
            raise CniError(Code.INTERNAL, f"{ifname} not found in {pod.path}")
        try:
            for ip in ips:
                iface = ipaddress.ip_interface(ip["address"])
                p.addr("add", index=link.index, address=str(iface.ip),
                       prefixlen=iface.network.prefixlen)
                if ip.get("gateway"):
                    gateways.setdefault(iface.version, ip["gateway"])
            for route in result.get("routes") or []:
                dst = ipaddress.ip_network(route["dst"], strict=False)
                gw = route.get("gw") or gateways.get(dst.version)
                spec: dict[str, Any] = {"dst": str(dst.network_address),
                                        "dst_len": dst.prefixlen, "oif": link.index}
                if dst.version == 6:
                    spec["family"] = 10
                if gw:
                    spec["gateway"] = gw
                if route.get("mtu"):
                    spec["metrics"] = {"attrs": [["RTAX_MTU", route["mtu"]]]}
                if route.get("priority"):
                    spec["priority"] = route["priority"]
                if route.get("table"):
                    spec["table"] = route["table"]
                p.route("add", **spec)
        except NetlinkError as e:
            raise netlink_error(f"configuring addresses on {ifname}", e) from None


def check_link(pod: Netns, ifname: str, mac: str | None, ips: list[Obj],
               routes: list[Obj] | None = None) -> None:
    """CHECK: the interface is in the pod with the MAC, addresses and routes the ADD result
    named (the checks of host-device's cmdCheck)."""
    with pod.ipr() as p:
        link = get_link(p, ifname)
        if link is None:
            raise CniError(Code.INTERNAL, f"Container Interface name in prevResult: {ifname} "
                           f"not found in {pod.path}")
        if mac and link.mac.lower() != mac.lower():
            raise CniError(Code.INTERNAL, f"Interface {ifname} Mac {mac} doesn't match "
                           f"container Mac: {link.mac}")
        have = {
            f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}"
            for a in p.addr("dump", index=link.index)
        }
        for ip in ips:
            iface = ipaddress.ip_interface(ip["address"])
            if f"{iface.ip}/{iface.network.prefixlen}" not in have:
                raise CniError(Code.INTERNAL,
                               f"interface {ifname} lacks address {ip['address']}")
        table: list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str | None]] = []
        for family in (socket.AF_INET, socket.AF_INET6):
            for r in p.route("dump", family=family):
                any_address = "::" if family == socket.AF_INET6 else "0.0.0.0"
                dst = r.get_attr("RTA_DST") or any_address
                net = ipaddress.ip_network(f"{dst}/{r['dst_len']}", strict=False)
                table.append((net, r.get_attr("RTA_GATEWAY")))
        for route in routes or []:
            dst = ipaddress.ip_network(route["dst"], strict=False)
            gw = route.get("gw") if dst.prefixlen else None
            if not any(net == dst and (gw is None or str(have_gw) == gw)
                       for net, have_gw in table):
                raise CniError(Code.INTERNAL, f"Expected Route {route['dst']}"
                               + (f" via {gw}" if gw else "") + " not found in routing table")


def announce(pod: Netns, ifname: str, ips: list[Obj], carrier_wait: float = 0.2) -> None:
    """Tell the pod's neighbours its addresses now live at this MAC: a gratuitous ARP per
    IPv4 address, an unsolicited neighbour advertisement per IPv6 address (an address reused
    by another pod would otherwise reach the old pod's MAC until caches expire). Waits briefly
    for carrier first; failures only cost the speed-up, so they are logged."""
    deadline = time.monotonic() + carrier_wait
    with pod.ipr() as p:
        link = get_link(p, ifname)
        while link is not None and not link.running and time.monotonic() < deadline:
            time.sleep(0.005)
            link = get_link(p, ifname)
    if link is None or len(link.mac.split(":")) != 6:
        return
    mac = bytes.fromhex(link.mac.replace(":", ""))
    for ip in ips:
        address = ipaddress.ip_interface(ip["address"]).ip
        try:
            if address.version == 4:
                arp = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, mac, address.packed,
                                  b"\xff" * 6, address.packed)
                with pod.socket(socket.AF_PACKET, socket.SOCK_DGRAM,
                                socket.htons(ETH_P_ARP)) as s:
                    s.sendto(arp, (ifname, ETH_P_ARP, 0, 1, b"\xff" * 6))
            else:
                na = struct.pack("!BBHI16sBB6s", 136, 0, 0, 0x20000000, address.packed, 2, 1,
                                 mac)
                with pod.socket(socket.AF_INET6, socket.SOCK_RAW,
                                socket.IPPROTO_ICMPV6) as s:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
                    s.sendto(na, ("ff02::1", 0, 0, link.index))
        except OSError as e:
            log.info("announcing %s on %s in %s: %s", address, ifname, pod.path, e)


def enable_notify(pod: Netns, ifname: str) -> None:
    """arp_notify and ndisc_notify (the kernel announces the interface's addresses when its
    link or MAC changes) and optimistic DAD (IPv6 addresses usable at once); best effort, as a
    kernel without IPv6 or optimistic DAD lacks some of the files."""
    for path in (f"/proc/sys/net/ipv4/conf/{ifname}/arp_notify",
                 f"/proc/sys/net/ipv6/conf/{ifname}/ndisc_notify",
                 f"/proc/sys/net/ipv6/conf/{ifname}/optimistic_dad"):
        try:
            pod.write_sysctl(path, "1")
        except OSError as e:
            log.info("setting %s in %s: %s", path, pod.path, e)
