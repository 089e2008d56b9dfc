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

from nicop.api.nvipam_rules import (
    cidrpool_allocation_problem,
    cidrpool_problems,
    host_bounds,
    merge_ranges,
    parse_cidr,
    parse_ip,
)
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


class UnusableBlock(ValueError):
    """A node's block that cannot be allocated from; the message says why and what to fix."""


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
    """Address ranges (as integers, inclusive) never handed out, in the order nv-ipam lists
    them for the node; they may overlap."""
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
        for lo, hi in merge_ranges(self.exclusions):
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
        """The node's pool config as nv-ipam records it with each reservation and as the
        pool's last_pool_config in the store (its pool.Pool in Go's JSON)."""
        version = self.subnet.version

        def ip(value: int) -> str:
            return str(ipaddress.IPv4Address(value) if version == 4
                       else ipaddress.IPv6Address(value))

        return json.dumps({
            "subnet": str(self.subnet), "startIP": str(self.start), "endIP": str(self.end),
            "gateway": str(self.gateway or ""),
            "exclusions": [{"startIP": ip(lo), "endIP": ip(hi)} for lo, hi in self.exclusions],
            "routes": [{"dst": r} for r in self.routes],
            "defaultGateway": self.default_gateway,
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


def host_range(net: Network) -> tuple[Address, Address]:
    """First and last usable address of a network (all of a /31, /32, /127, /128)."""
    first, last = host_bounds(net)
    kind = type(net.network_address)  # an int alone does not say IPv4 or IPv6
    return kind(first), kind(last)


def _ranges(spec: Obj) -> list[tuple[int, int]]:
    """A spec's `exclusions` as integers, skipping what does not parse (the controller reports
    those)."""
    out = []
    for ex in spec.get("exclusions") or []:
        lo, hi = parse_ip(ex.get("startIP")), parse_ip(ex.get("endIP"))
        if lo is not None and hi is not None:
            out.append((int(lo), int(hi)))
    return out


def _index_ranges(spec: Obj, base: int, bounds: tuple[int, int]) -> list[tuple[int, int]]:
    """`perNodeExclusions` as addresses counted from `base`, clamped to `bounds`; a range
    entirely outside them is left out (nv-ipam's ExcludeIndexRangeToExcludeRange and
    ClampExcludeRanges)."""
    out = []
    for ex in spec.get("perNodeExclusions") or []:
        lo, hi = base + int(ex.get("startIndex", 0)), base + int(ex.get("endIndex", 0))
        if lo > bounds[1] or hi < bounds[0]:
            continue
        out.append((max(lo, bounds[0]), min(hi, bounds[1])))
    return out


def _routes(spec: Obj) -> tuple[str, ...]:
    """The pool's route destinations; one that is not a CIDR makes the block unusable (nv-ipam
    fails the ADD on it), so it is refused before any address is taken."""
    routes = []
    for i, route in enumerate(spec.get("routes") or []):
        if parse_cidr(route.get("dst")) is None:
            raise UnusableBlock(f"spec.routes[{i}].dst: {route.get('dst')!r} is not a subnet in "
                                "CIDR notation, e.g. 10.0.0.0/8")
        routes.append(str(route["dst"]))
    return tuple(routes)


def _check_range(subnet: Network, start: Address, end: Address) -> None:
    """nv-ipam's Range rules: both ends in the subnet, the start not after the end."""
    for key, ip in (("startIP", start), ("endIP", end)):
        if ip.version != subnet.version or ip not in subnet:
            raise UnusableBlock(f"{key} {ip} is not in the subnet {subnet}")
    if int(start) > int(end):
        raise UnusableBlock(f"startIP {start} is after endIP {end}")


def node_pool_config(kind: str, pool: Obj, node: str) -> PoolConfig | None:
    """This node's share of an IPPool or CIDRPool object, None while it has no block. A block
    that cannot be used (a status entry that does not fit the spec, a CIDRPool spec that is
    invalid) raises UnusableBlock: nv-ipam's node agent ignores such a pool too."""
    spec = pool.get("spec") or {}
    name = pool["metadata"]["name"]
    allocations = (pool.get("status") or {}).get("allocations") or []
    alloc = next((a for a in allocations if a.get("nodeName") == node), None)
    if alloc is None:
        return None
    if kind == "ippool":
        subnet = parse_cidr(spec.get("subnet"))
        start, end = parse_ip(alloc.get("startIP")), parse_ip(alloc.get("endIP"))
        if subnet is None or start is None or end is None:
            raise UnusableBlock(f"block {alloc.get('startIP')}-{alloc.get('endIP')} of subnet "
                                f"{spec.get('subnet')} does not parse")
        gateway = parse_ip(spec["gateway"]) if spec.get("gateway") else None
        _check_range(subnet, start, end)
        exclusions = _ranges(spec) + _index_ranges(spec, int(start), (int(start), int(end)))
    else:
        _, problems = cidrpool_problems(spec)
        if problems:
            raise UnusableBlock("the spec is invalid: " + "; ".join(problems))
        problem = cidrpool_allocation_problem(spec, alloc, allocations)
        if problem:
            raise UnusableBlock(f"the status entry of node {node} does not fit the spec: "
                                f"{problem}")
        subnet = ipaddress.ip_network(alloc["prefix"])
        start, end = host_range(subnet)
        gateway = parse_ip(alloc["gateway"]) if alloc.get("gateway") else None
        first, last = int(start), int(end)
        exclusions = [(lo if lo >= int(subnet.network_address) else first,
                       hi if hi <= int(subnet.broadcast_address) else last)
                      for lo, hi in _ranges(spec) if lo <= last and hi >= first]
        exclusions += _index_ranges(spec, int(subnet.network_address),
                                    (int(subnet.network_address), last))
    return PoolConfig(
        name=name, kind=kind, subnet=subnet, start=start, end=end, gateway=gateway,
        exclusions=tuple(exclusions), routes=_routes(spec),
        default_gateway=bool(spec.get("defaultGateway")),
    )


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
            try:
                _check_range(subnet, start, end)
                routes = _routes(p)
            except UnusableBlock as e:
                raise ValueError(f"pool {name}: {e}") from None
            pools[name] = PoolConfig(
                name=name, kind=p.get("poolType", "ippool"), subnet=subnet, start=start,
                end=end,
                gateway=ipaddress.ip_address(p["gateway"]) if p.get("gateway") else None,
                exclusions=tuple(_ranges(p) + _index_ranges(p, int(start),
                                                            (int(start), int(end)))),
                routes=routes, default_gateway=bool(p.get("defaultGateway")),
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
        self._configs: dict[tuple[str, str], PoolConfig | str | None] = {}
        """A pool's config for this node; None while it has no block, the reason when its
        block cannot be used."""
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
                try:
                    configs[key] = node_pool_config(kind, obj, self.node)
                except UnusableBlock as e:
                    log.warning("%s %s/%s: node %s cannot use its block: %s",
                                POOL_TYPES[kind].kind, self.namespace, key[1], self.node, e)
                    configs[key] = str(e)
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
        what = f"{POOL_TYPES[kind].kind} {self.namespace}/{name}"
        if pool is None:
            raise CniError(
                Code.TRY_AGAIN_LATER, f"{what} has no block for node {self.node} yet",
                "the node must match the pool's nodeSelector and the pool must have a free "
                "block; nicop operator writes the blocks into the pool's status",
            )
        if isinstance(pool, str):
            raise CniError(Code.TRY_AGAIN_LATER, f"{what} cannot be used on node {self.node}: "
                           f"{pool}", "fix the pool's spec; nicop operator rewrites the "
                           "blocks in its status (kubectl describe shows its Allocated "
                           "condition)")
        return pool

    def known(self) -> dict[str, PoolConfig]:
        return {name: cfg for (_, name), cfg in self._configs.items()
                if isinstance(cfg, PoolConfig)}
