"""The node's share of each pool: which addresses this node may hand out, and with what routes.

`node_pool_config` turns an IPPool or CIDRPool and the block the controller wrote into its
status for this node into a `PoolConfig`. The daemon gets pools from the API (`KubePools`,
kept current by informers) or, on a node without a cluster, from a JSON file (`FilePools`,
`{"<pool>": {"subnet", "startIP", "endIP", "gateway", ...}}`, nv-ipam's per-node format).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from nicop.cni.spec import CniError, Code, Obj, config_error
from nicop.cni.store import pool_key
from nicop.kube.informer import Informer
from nicop.kube.manager import Manager
from nicop.kube.resources import CIDRPOOL, IPPOOL
from nicop.node.watched import WatchedFile

log = logging.getLogger(__name__)

POOL_TYPES = {"ippool": IPPOOL, "cidrpool": CIDRPOOL}

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class PoolConfig:
    """The addresses one node hands out from one pool."""

    name: str
    kind: str
    subnet: Network
    start: Address
    end: Address
    gateway: Address | None = None
    exclusions: tuple[tuple[int, int], ...] = ()
    """Address ranges (as integers, inclusive) never handed out."""
    routes: tuple[str, ...] = ()
    default_gateway: bool = False

    @property
    def key(self) -> str:
        """The pool's key in the node store (nv-ipam's: `cidrpool/<name>` for a CIDRPool)."""
        return pool_key(self.kind, self.name)

    def excluded(self, value: int) -> bool:
        return any(lo <= value <= hi for lo, hi in self.exclusions)

    def size(self) -> int:
        """How many addresses the node can hand out (the block minus gateway and exclusions)."""
        start, end = int(self.start), int(self.end)
        taken = 0
        for lo, hi in _merge(self.exclusions):
            lo, hi = max(lo, start), min(hi, end)
            if lo <= hi:
                taken += hi - lo + 1
        if self.gateway is not None and start <= int(self.gateway) <= end \
                and not self.excluded(int(self.gateway)):
            taken += 1
        return max(0, end - start + 1 - taken)

    def result_routes(self) -> list[Obj]:
        """Routes through the pool's gateway, none without one; each destination once, in
        nv-ipam's order (getRoutes, sortAndDedupIPNets)."""
        if self.gateway is None:
            return []
        nets = [ipaddress.ip_network(r, strict=False) for r in self.routes]
        if self.default_gateway:
            nets.append(DEFAULT_ROUTE[self.subnet.version])
        return [{"dst": str(n), "gw": str(self.gateway)} for n in sort_routes(nets)]

    def snapshot(self) -> str:
        """The config as nv-ipam records it with each reservation."""
        return json.dumps({
            "name": self.name, "subnet": str(self.subnet), "startIP": str(self.start),
            "endIP": str(self.end), "gateway": str(self.gateway or ""),
        }, separators=(",", ":"))


DEFAULT_ROUTE: dict[int, Network] = {4: ipaddress.IPv4Network("0.0.0.0/0"),
                                     6: ipaddress.IPv6Network("::/0")}


def _route_order(a: Network, b: Network) -> int:
    """nv-ipam's route comparison: by the address bytes as Go holds them, then by the mask. Go
    holds a parsed IPv4 route in 4 bytes but its IPv4 default route in 16 (::ffff:0.0.0.0),
    which puts the default route first."""
    if a.network_address == b.network_address:
        return (a.prefixlen > b.prefixlen) - (a.prefixlen < b.prefixlen)

    def raw(n: Network) -> bytes:
        if n.version == 4 and n == DEFAULT_ROUTE[4]:
            return bytes(10) + b"\xff\xff" + bytes(4)
        return n.network_address.packed
    ra, rb = raw(a), raw(b)
    return (ra > rb) - (ra < rb)


def sort_routes(nets: list[Network]) -> list[Network]:
    """Routes sorted and with duplicates dropped, as nv-ipam returns them."""
    out: list[Network] = []
    for n in sorted(nets, key=functools.cmp_to_key(_route_order)):
        if not out or out[-1] != n:
            out.append(n)
    return out


def _merge(ranges: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def host_range(net: Network) -> tuple[Address, Address]:
    """First and last usable address of a network (all of a /31, /32, /127, /128)."""
    if net.num_addresses <= 2:
        return net[0], net[-1]
    last = net[-2] if net.version == 4 else net[-1]
    return net[1], last


def _exclusions(spec: Obj, base: int, block: tuple[int, int]) -> tuple[tuple[int, int], ...]:
    out = []
    for ex in spec.get("exclusions") or []:
        try:
            out.append((int(ipaddress.ip_address(ex["startIP"])),
                        int(ipaddress.ip_address(ex["endIP"]))))
        except (KeyError, ValueError):
            continue
    for ex in spec.get("perNodeExclusions") or []:
        lo, hi = base + int(ex.get("startIndex", 0)), base + int(ex.get("endIndex", 0))
        out.append((max(lo, block[0]), min(hi, block[1])))
    return tuple(out)


def node_pool_config(kind: str, pool: Obj, node: str) -> PoolConfig | None:
    """This node's share of an IPPool or CIDRPool object, None while it has no block."""
    spec = pool.get("spec") or {}
    name = pool["metadata"]["name"]
    routes = tuple(r["dst"] for r in spec.get("routes") or [] if r.get("dst"))
    default_gw = bool(spec.get("defaultGateway"))
    for alloc in (pool.get("status") or {}).get("allocations") or []:
        if alloc.get("nodeName") != node:
            continue
        try:
            if kind == "ippool":
                subnet = ipaddress.ip_network(spec["subnet"], strict=False)
                start = ipaddress.ip_address(alloc["startIP"])
                end = ipaddress.ip_address(alloc["endIP"])
                gateway = ipaddress.ip_address(spec["gateway"]) if spec.get("gateway") else None
                base = int(start)
            else:
                subnet = ipaddress.ip_network(alloc["prefix"], strict=False)
                start, end = host_range(subnet)
                gw = alloc.get("gateway")
                gateway = ipaddress.ip_address(gw) if gw else None
                base = int(subnet.network_address)
        except (KeyError, ValueError) as e:
            log.warning("%s %s: unusable block for node %s: %s", kind, name, node, e)
            return None
        return PoolConfig(
            name=name, kind=kind, subnet=subnet, start=start, end=end, gateway=gateway,
            exclusions=_exclusions(spec, base, (int(start), int(end))), routes=routes,
            default_gateway=default_gw,
        )
    return None


class PoolSource(Protocol):
    def lookup(self, kind: str, name: str) -> PoolConfig:
        """The node's config of pool `name`, or a CniError saying why there is none."""
        ...

    def known(self) -> dict[str, PoolConfig]:
        """Every pool this node has a block of, by name."""
        ...


class FilePools:
    """Pools from a JSON file, reread when it changes (nodes without a cluster, tests). A file
    that goes, or cannot be read or used, is logged and the last good pools stay."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._file = WatchedFile(self.path)
        self._pools: dict[str, PoolConfig] = {}
        self._lock = threading.Lock()

    def _reload(self) -> None:
        if not self._file.changed():
            return
        try:
            self._pools = self._read()
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            log.error("pools file %s cannot be used, keeping the last good pools %s: %s",
                      self.path, sorted(self._pools), e)

    def _read(self) -> dict[str, PoolConfig]:
        data = json.loads(self.path.read_text())
        pools = {}
        for name, p in data.items():
            subnet = ipaddress.ip_network(p["subnet"], strict=False)
            first, last = host_range(subnet)
            start = ipaddress.ip_address(p.get("startIP") or first)
            end = ipaddress.ip_address(p.get("endIP") or last)
            pools[name] = PoolConfig(
                name=name, kind=p.get("poolType", "ippool"), subnet=subnet, start=start,
                end=end,
                gateway=ipaddress.ip_address(p["gateway"]) if p.get("gateway") else None,
                exclusions=_exclusions(p, int(start), (int(start), int(end))),
                routes=tuple(r["dst"] for r in p.get("routes") or []),
                default_gateway=bool(p.get("defaultGateway")),
            )
        return pools

    def lookup(self, kind: str, name: str) -> PoolConfig:
        with self._lock:
            self._reload()
            pool = self._pools.get(name)
        if pool is None or pool.kind != kind:
            raise config_error("ipam.poolName", f"unknown {kind} {name!r} (pools file {self.path} "
                               f"has {sorted(self._pools)})")
        return pool

    def known(self) -> dict[str, PoolConfig]:
        with self._lock:
            self._reload()
            return dict(self._pools)


class KubePools:
    """IPPools and CIDRPools of one namespace, as this node sees them, kept by informers.

    Informer handlers run on the daemon's event loop; CNI requests read from worker threads.
    Each change replaces the whole dict, so readers never see a half-updated view.
    """

    def __init__(self, manager: Manager, namespace: str, node: str) -> None:
        self.namespace = namespace
        self.node = node
        self._configs: dict[tuple[str, str], PoolConfig | None] = {}
        self.informers: dict[str, Informer] = {}
        for kind, res in POOL_TYPES.items():
            informer = manager.informer(res, namespace)
            informer.on_change(self._handler(kind))
            self.informers[kind] = informer

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers.values())

    async def wait_synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.informers.values()))

    def _handler(self, kind: str) -> Any:
        def changed(event: str, obj: Obj, old: Obj | None) -> None:
            configs = dict(self._configs)
            key = (kind, obj["metadata"]["name"])
            if event == "DELETED":
                configs.pop(key, None)
            else:
                configs[key] = node_pool_config(kind, obj, self.node)
            self._configs = configs
        return changed

    def lookup(self, kind: str, name: str) -> PoolConfig:
        configs = self._configs
        if (kind, name) not in configs:
            if not self.synced:
                raise CniError(Code.TRY_AGAIN_LATER, "nicop cni-daemon is still loading pools "
                               "from the API server")
            res = POOL_TYPES[kind]
            raise config_error("ipam.poolName", f"no {res.kind} named {name!r} in namespace "
                               f"{self.namespace}")
        pool = configs[(kind, name)]
        if pool is None:
            raise CniError(
                Code.TRY_AGAIN_LATER,
                f"{POOL_TYPES[kind].kind} {self.namespace}/{name} has no block for node "
                f"{self.node} yet",
                "the node must match the pool's nodeSelector and the pool must have a free "
                "block; nicop operator writes the blocks into the pool's status",
            )
        return pool

    def known(self) -> dict[str, PoolConfig]:
        return {name: cfg for (_, name), cfg in self._configs.items() if cfg is not None}
