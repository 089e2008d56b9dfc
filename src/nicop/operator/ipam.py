"""The IPPool and CIDRPool controller: one block of each pool per selected node, in the status.

As nv-ipam's ipam-controller: an IPPool's subnet is cut into blocks of perNodeBlockSize addresses
starting after the network address; a CIDRPool's CIDR into prefixes of perNodeNetworkPrefix bits
(static allocations first), each with its gateway at gatewayIndex. Nodes are taken in name order,
a node keeps its block as long as it matches the pool's nodeSelector and the block is still valid
for the spec, and a new node takes the first free block. The node agents allocate pod addresses
from their block without asking the API server again. A spec that cannot be carved empties the
status and says why in an Event; a node left without a block gets a NoFreeRanges Event.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Iterator
from typing import Any

from nicop import logs
from nicop.kube.client import ApiError
from nicop.kube.events import EventRecorder
from nicop.kube.informer import Informer
from nicop.kube.manager import Controller, Manager, Result
from nicop.kube.resources import CIDRPOOL, IPPOOL, NODE, Obj, Resource, key_of
from nicop.kube.scheduling import node_matches

log = logging.getLogger(__name__)


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class InvalidPool(ValueError):
    """A pool spec nothing can be carved from; the message names the field."""


# ------------------------------------------------------------------ IPPool

def _network(field: str, value: object) -> Network:
    try:
        return ipaddress.ip_network(str(value), strict=False)
    except ValueError:
        raise InvalidPool(f"{field}: {value!r} is not a CIDR") from None


def _address(field: str, value: object) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(str(value))
    except ValueError:
        raise InvalidPool(f"{field}: {value!r} is not an IP address") from None


def _last_usable(net: Network) -> int:
    """The highest address a block may use: the broadcast address is never handed out."""
    return int(net.broadcast_address) - (1 if net.version == 4 else 0)


def validate_ippool(spec: Obj) -> Network:
    net = _network("spec.subnet", spec.get("subnet"))
    size = spec.get("perNodeBlockSize")
    if not isinstance(size, int) or size < 2:
        raise InvalidPool(f"spec.perNodeBlockSize: {size!r} must be an integer of at least 2")
    if size > _last_usable(net) - int(net.network_address):
        raise InvalidPool(f"spec.perNodeBlockSize: {size} is more than the {net} subnet has "
                          "addresses for")
    if spec.get("gateway") and _address("spec.gateway", spec["gateway"]) not in net:
        raise InvalidPool(f"spec.gateway: {spec['gateway']} is not in the subnet {net}")
    for i, ex in enumerate(spec.get("exclusions") or []):
        start = _address(f"spec.exclusions[{i}].startIP", ex.get("startIP"))
        end = _address(f"spec.exclusions[{i}].endIP", ex.get("endIP"))
        if start not in net or end not in net or int(start) > int(end):
            raise InvalidPool(f"spec.exclusions[{i}]: {start}-{end} must be a range inside "
                              f"{net}")
    for i, ex in enumerate(spec.get("perNodeExclusions") or []):
        lo, hi = ex.get("startIndex", 0), ex.get("endIndex", 0)
        if not 0 <= lo <= hi < size:
            raise InvalidPool(f"spec.perNodeExclusions[{i}]: {lo}-{hi} must be indexes "
                              f"0..{size - 1} of a block, start <= end")
    return net


def carve_ippool(spec: Obj, existing: list[Obj], nodes: list[str]) -> tuple[list[Obj], list[str]]:
    """(allocations sorted by node, nodes left without a block)."""
    net = validate_ippool(spec)
    size = int(spec["perNodeBlockSize"])
    base, limit = int(net.network_address) + 1, _last_usable(net)
    wanted = set(nodes)
    blocks: dict[str, int] = {}
    used: set[int] = set()
    for alloc in existing:
        node = alloc.get("nodeName")
        try:
            start = int(ipaddress.ip_address(alloc["startIP"]))
            end = int(ipaddress.ip_address(alloc["endIP"]))
        except (KeyError, ValueError):
            continue
        if (node in wanted and node not in blocks and start >= base and (start - base) % size == 0
                and end == start + size - 1 and end <= limit and start not in used):
            blocks[node] = start
            used.add(start)
    left = []
    index = 0
    for node in sorted(wanted - set(blocks)):
        while base + index * size in used:
            index += 1
        start = base + index * size
        if start + size - 1 > limit:
            left.append(node)
            continue
        blocks[node] = start
        used.add(start)
    ip = ipaddress.ip_address
    allocations = [
        {"nodeName": n, "startIP": str(ip(blocks[n])), "endIP": str(ip(blocks[n] + size - 1))}
        for n in sorted(blocks)
    ]
    return allocations, left


# ------------------------------------------------------------------ CIDRPool

def gateway_for(prefix: Network, index: int | None) -> str:
    """nv-ipam's GetGatewayForSubnet: network + index; index 0 only for /31-/32 (/127-/128)."""
    if index is None:
        return ""
    point_to_point = prefix.prefixlen >= prefix.max_prefixlen - 1
    hosts = prefix.num_addresses if point_to_point else (
        prefix.num_addresses - (2 if prefix.version == 4 else 1))
    if point_to_point:
        hosts -= 1
    elif index == 0:
        return ""
    if index < 0 or index > hosts:
        return ""
    return str(prefix.network_address + index)


def validate_cidrpool(spec: Obj) -> tuple[Network, int]:
    net = _network("spec.cidr", spec.get("cidr"))
    length = spec.get("perNodeNetworkPrefix")
    if not isinstance(length, int) or not net.prefixlen <= length <= net.max_prefixlen:
        raise InvalidPool(f"spec.perNodeNetworkPrefix: {length!r} must be between "
                          f"{net.prefixlen} and {net.max_prefixlen}")
    index = spec.get("gatewayIndex")
    if index is not None:
        sample = ipaddress.ip_network(f"{net.network_address}/{length}")
        if not gateway_for(sample, index):
            raise InvalidPool(f"spec.gatewayIndex: {index} is not an address of a /{length}")
    seen_nodes: set[str] = set()
    seen_prefixes: set[str] = set()
    for i, static in enumerate(spec.get("staticAllocations") or []):
        prefix = _network(f"spec.staticAllocations[{i}].prefix", static.get("prefix"))
        if not prefix.subnet_of(net) or prefix.prefixlen != length:  # type: ignore[arg-type]
            raise InvalidPool(f"spec.staticAllocations[{i}].prefix: {prefix} must be a /{length} "
                              f"inside {net}")
        if str(prefix) in seen_prefixes:
            raise InvalidPool(f"spec.staticAllocations[{i}].prefix: {prefix} is given twice")
        seen_prefixes.add(str(prefix))
        node = static.get("nodeName")
        if node:
            if node in seen_nodes:
                raise InvalidPool(f"spec.staticAllocations[{i}].nodeName: {node} has two "
                                  "prefixes")
            seen_nodes.add(node)
        gw = static.get("gateway")
        if gw and _address(f"spec.staticAllocations[{i}].gateway", gw) not in prefix:
            raise InvalidPool(f"spec.staticAllocations[{i}].gateway: {gw} is not in {prefix}")
    return net, length


def carve_cidrpool(spec: Obj, existing: list[Obj], nodes: list[str]) -> tuple[list[Obj],
                                                                              list[str]]:
    net, length = validate_cidrpool(spec)
    index = spec.get("gatewayIndex")
    statics = {str(ipaddress.ip_network(s["prefix"], strict=False)): s
               for s in spec.get("staticAllocations") or []}
    static_by_node = {s["nodeName"]: p for p, s in statics.items() if s.get("nodeName")}
    wanted = set(nodes)
    allocs: dict[str, Obj] = {}
    used: set[str] = set()
    for alloc in existing:
        node = alloc.get("nodeName")
        try:
            prefix = ipaddress.ip_network(alloc["prefix"], strict=False)
        except (KeyError, ValueError):
            continue
        key = str(prefix)
        if (node not in wanted or node in allocs or key in used
                or not prefix.subnet_of(net) or prefix.prefixlen != length  # type: ignore[arg-type]
                or (key in statics and statics[key].get("nodeName") != node)
                or (node in static_by_node and static_by_node[node] != key)):
            continue
        allocs[node] = {"nodeName": node, "prefix": key,
                        "gateway": alloc.get("gateway") or gateway_for(prefix, index)}
        used.add(key)
    generator: Iterator[Network] = iter(net.subnets(new_prefix=length))
    left: list[str] = []
    for node in sorted(wanted - set(allocs)):
        if node in static_by_node:
            key = static_by_node[node]
            gw = statics[key].get("gateway") or gateway_for(ipaddress.ip_network(key), index)
            allocs[node] = {"nodeName": node, "prefix": key, "gateway": gw}
            used.add(key)
            continue
        free = next((p for p in generator if str(p) not in used and str(p) not in statics),
                    None)
        if free is None:
            left.append(node)
            continue
        allocs[node] = {"nodeName": node, "prefix": str(free),
                        "gateway": gateway_for(free, index)}
        used.add(str(free))
    out = []
    for node in sorted(allocs):
        a = dict(allocs[node])
        if not a["gateway"]:
            del a["gateway"]
        out.append(a)
    return out, left


# ------------------------------------------------------------------ controller

KINDS: dict[str, tuple[Resource, Any]] = {
    "IPPool": (IPPOOL, carve_ippool),
    "CIDRPool": (CIDRPOOL, carve_cidrpool),
}


def _comparable(allocations: list[Obj]) -> list[tuple[tuple[str, Any], ...]]:
    return sorted(tuple(sorted((k, v) for k, v in a.items() if v)) for a in allocations)


class IpamController:
    """Keeps every IPPool's and CIDRPool's per-node blocks in its status."""

    def __init__(self, manager: Manager, namespace: str) -> None:
        self.client = manager.client
        self.namespace = namespace
        self.recorder = EventRecorder(manager.client)
        self.pools: dict[str, Informer] = {
            kind: manager.informer(res, namespace) for kind, (res, _) in KINDS.items()
        }
        self.nodes = manager.informer(NODE, metadata_only=True)
        self.controller = manager.add(Controller("nv-ipam-pools", self.reconcile))
        for kind, informer in self.pools.items():
            informer.on_change(self._pool_changed(kind))
        self.nodes.on_change(self._node_changed)

    def _pool_changed(self, kind: str) -> Callable[[str, Obj, Obj | None], None]:
        def changed(event: str, obj: Obj, old: Obj | None) -> None:
            self.controller.queue.add(f"{kind}/{key_of(obj)}")
        return changed

    def _node_changed(self, event: str, node: Obj, old: Obj | None) -> None:
        if event == "MODIFIED" and old is not None and \
                (node["metadata"].get("labels") or {}) == (old["metadata"].get("labels") or {}):
            return
        for kind, informer in self.pools.items():
            for pool in informer.store.items():
                self.controller.queue.add(f"{kind}/{key_of(pool)}")

    async def reconcile(self, key: str) -> Result | None:
        kind, _, pool_key = key.partition("/")
        pool = self.pools[kind].store.get(pool_key)
        if pool is None:
            return None
        res, carve = KINDS[kind]
        spec = pool.get("spec") or {}
        nodes = sorted(n["metadata"]["name"] for n in self.nodes.store.items()
                       if node_matches(spec.get("nodeSelector"), n))
        existing = (pool.get("status") or {}).get("allocations") or []
        name = pool["metadata"]["name"]
        try:
            allocations, left = carve(spec, existing, nodes)
        except InvalidPool as e:
            await self._write(res, pool, existing, [])
            await self.recorder.emit(pool, "Warning", "InvalidSpec", str(e))
            log.warning("invalid %s: %s", kind, e, extra=logs.about(kind, name, self.namespace))
            return None
        await self._write(res, pool, existing, allocations)
        for node in left:
            reason = "NoFreeRanges" if kind == "IPPool" else "NoFreePrefixes"
            await self.recorder.emit(pool, "Warning", reason,
                                     f"failed to allocate a block on node {node}: the pool has "
                                     f"no free block left ({len(allocations)} nodes have one)")
        return None

    async def _write(self, res: Resource, pool: Obj, existing: list[Obj],
                     allocations: list[Obj]) -> None:
        status = pool.get("status")
        if status is not None and _comparable(existing) == _comparable(allocations):
            return
        m = pool["metadata"]
        try:
            await self.client.patch(res, m["name"], {"status": {"allocations": allocations}},
                                    m.get("namespace"), subresource="status")
        except ApiError as e:  # said on the pool, and tried again later
            await self.recorder.emit(pool, "Warning", "StatusWriteFailed",
                                     f"writing the pool's node blocks failed: {e}")
            raise
        log.info("%d node blocks", len(allocations),
                 extra=logs.about(res.kind, m["name"], m.get("namespace")))
