"""The IPPool and CIDRPool controller: one block of each pool per selected node, in the status.

As nv-ipam's ipam-controller: an IPPool's subnet is cut into blocks of perNodeBlockSize addresses
starting after the network address (at it in a /31 or /32); a CIDRPool's CIDR into prefixes of
perNodeNetworkPrefix bits (static allocations first), each with its gateway at gatewayIndex. A
block whose addresses are all excluded (exclusions and perNodeExclusions together) is given to no
node, and a block of one address is never the gateway. Nodes are taken in name order, a node
keeps its block as long as it matches the pool's nodeSelector and the block is still valid for
the spec, and a new node takes the first free block. The node agents allocate pod addresses from
their block without asking the API server again. The status condition Allocated says whether
every selected node has a block; a spec that cannot be carved empties the status, and a node left
without a block gets a NoFreeRanges (NoFreePrefixes) Event.
"""

from __future__ import annotations

import bisect
import ipaddress
import logging
from collections.abc import Callable
from typing import Any

from nicop import logs
from nicop.api.nvipam_rules import (
    InvalidPool,
    expected_gateway,
    gateway_for,
    host_bounds,
    merge_ranges,
    validate_cidrpool,
    validate_ippool,
)
from nicop.kube import selectors
from nicop.kube.client import ApiError
from nicop.kube.conditions import with_condition
from nicop.kube.events import EventRecorder
from nicop.kube.informer import Informer
from nicop.kube.manager import Controller, Manager, Result
from nicop.kube.resources import CIDRPOOL, IPPOOL, NODE, Obj, Resource, key_of

log = logging.getLogger(__name__)

__all__ = ["InvalidPool", "IpamController", "carve_cidrpool", "carve_ippool", "gateway_for"]

ALLOCATED = "Allocated"
"""The pool status condition: True when every selected node has a block."""


class Exclusions:
    """A pool's `exclusions` and `perNodeExclusions`: whether a block is excluded entirely (so no
    node gets it, as nv-ipam), and where the next block that may not be starts."""

    def __init__(self, spec: Obj) -> None:
        ranges = [(int(ipaddress.ip_address(e["startIP"])), int(ipaddress.ip_address(e["endIP"])))
                  for e in spec.get("exclusions") or []]
        self.pool = merge_ranges(ranges)
        self.starts = [lo for lo, _ in self.pool]
        self.per_node = merge_ranges([(int(e.get("startIndex", 0)), int(e.get("endIndex", 0)))
                               for e in spec.get("perNodeExclusions") or []])

    def per_node_cover(self, first: int, last: int) -> bool:
        """perNodeExclusions alone cover indexes first..last of every block."""
        return any(lo <= first and hi >= last for lo, hi in self.per_node)

    def covering(self, start: int, end: int) -> tuple[int, int] | None:
        """The pool exclusion that covers start..end alone, if one does."""
        i = bisect.bisect_right(self.starts, start) - 1
        if i >= 0 and self.pool[i][1] >= end:
            return self.pool[i]
        return None

    def excluded(self, start: int, end: int, base: int) -> bool:
        """Every address of start..end excluded; per-node indexes count from `base`."""
        if self.covering(start, end):
            return True
        i = max(0, bisect.bisect_right(self.starts, start) - 1)
        ranges = [r for r in self.pool[i:bisect.bisect_right(self.starts, end)]
                  if r[1] >= start]
        ranges += [(base + lo, base + hi) for lo, hi in self.per_node]
        merged = merge_ranges([(max(lo, start), min(hi, end)) for lo, hi in ranges
                        if lo <= end and hi >= start])
        return len(merged) == 1 and merged[0] == (start, end)


class Blocks:
    """The blocks of a pool: block i starts at first + i*stride; its usable addresses leave out
    `lead` at the front and `tail` at the end (a CIDRPool prefix's network and broadcast
    addresses). A block is usable when it is not entirely excluded and not the gateway alone."""

    def __init__(self, first: int, count: int, stride: int, exclusions: Exclusions,
                 gateway: int | None, lead: int = 0, tail: int = 0,
                 version: int = 4) -> None:
        self.first, self.stride, self.lead, self.tail = first, stride, lead, tail
        self.exclusions, self.gateway, self.version = exclusions, gateway, version
        self.count = 0 if exclusions.per_node_cover(lead, stride - 1 - tail) else count

    def address(self, index: int) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        value = self.first + index * self.stride
        return ipaddress.IPv4Address(value) if self.version == 4 else ipaddress.IPv6Address(value)

    def index_of(self, start: int) -> int | None:
        offset = start - self.first
        if offset < 0 or offset % self.stride or offset // self.stride >= self.count:
            return None
        return offset // self.stride

    def _span(self, index: int) -> tuple[int, int, int]:
        base = self.first + index * self.stride
        return base + self.lead, base + self.stride - 1 - self.tail, base

    def usable(self, index: int) -> bool:
        start, end, base = self._span(index)
        if self.stride == 1 and start == self.gateway:
            return False
        return not self.exclusions.excluded(start, end, base)

    def next_free(self, index: int, used: set[int | None]) -> int | None:
        """The first usable block not in `used` at or after `index`; jumps over long
        exclusions instead of stepping through them."""
        while index < self.count:
            start, end, base = self._span(index)
            if index in used or (self.stride == 1 and start == self.gateway):
                index += 1
                continue
            cover = self.exclusions.covering(start, end)
            if cover is not None:
                index = max(index + 1, (cover[1] + 1 - self.first) // self.stride)
                continue
            if self.exclusions.excluded(start, end, base):
                index += 1
                continue
            return index
        return None


# ------------------------------------------------------------------ IPPool

def ippool_blocks(spec: Obj) -> Blocks:
    """The blocks of a valid IPPool spec, as nv-ipam cuts them: from the first host address
    (the network address too in a /31 or /32), never reaching the IPv4 broadcast address."""
    net = validate_ippool(spec)
    size = int(spec["perNodeBlockSize"])
    first, last = host_bounds(net)
    gateway = int(ipaddress.ip_address(spec["gateway"])) if spec.get("gateway") else None
    return Blocks(first, (last - first + 1) // size, size, Exclusions(spec), gateway,
                  version=net.version)


def carve_ippool(spec: Obj, existing: list[Obj], nodes: list[str]) -> tuple[list[Obj], list[str]]:
    """(allocations sorted by node, nodes left without a block). A node keeps a block that is
    still one of the spec's and not entirely excluded; new nodes take the first free ones."""
    blocks = ippool_blocks(spec)
    wanted = set(nodes)
    taken: dict[str, int] = {}
    used: set[int | None] = set()
    for alloc in existing:
        node = alloc.get("nodeName")
        try:
            start = int(ipaddress.ip_address(alloc["startIP"]))
            end = int(ipaddress.ip_address(alloc["endIP"]))
        except (KeyError, ValueError):
            continue
        index = blocks.index_of(start)
        if (node in wanted and node not in taken and index is not None and index not in used
                and end == start + blocks.stride - 1 and blocks.usable(index)):
            taken[str(node)] = index
            used.add(index)
    left = []
    cursor: int | None = 0
    for node in sorted(wanted - set(taken)):
        cursor = blocks.next_free(cursor, used) if cursor is not None else None
        if cursor is None:
            left.append(node)
            continue
        taken[node] = cursor
        used.add(cursor)
        cursor += 1
    allocations = []
    for n in sorted(taken):
        begin = blocks.address(taken[n])
        allocations.append({"nodeName": n, "startIP": str(begin),
                            "endIP": str(begin + blocks.stride - 1)})
    return allocations, left


# ------------------------------------------------------------------ CIDRPool

def carve_cidrpool(spec: Obj, existing: list[Obj], nodes: list[str]) -> tuple[list[Obj],
                                                                              list[str]]:
    """(allocations sorted by node, nodes left without a prefix). A prefix whose host addresses
    are all excluded is given to no node, static allocations aside. A node keeps its prefix when
    the gateway the spec gives it changed (gatewayIndex, a static allocation's gateway); the
    status then gets the new gateway."""
    net, length = validate_cidrpool(spec)
    stride = 2 ** (net.max_prefixlen - length)
    sample = ipaddress.ip_network(f"{net.network_address}/{length}")
    lo, hi = host_bounds(sample)
    lead, tail = lo - int(sample.network_address), int(sample.broadcast_address) - hi
    blocks = Blocks(int(net.network_address), net.num_addresses // stride, stride,
                    Exclusions(spec), None, lead=lead, tail=tail, version=net.version)
    statics = {str(ipaddress.ip_network(s["prefix"], strict=False)): s
               for s in spec.get("staticAllocations") or []}
    static_by_node = {s["nodeName"]: p for p, s in statics.items() if s.get("nodeName")}
    wanted = set(nodes)
    allocs: dict[str, Obj] = {}
    used = {blocks.index_of(int(ipaddress.ip_network(p).network_address)) for p in statics}
    for alloc in existing:
        node = alloc.get("nodeName")
        try:
            prefix = ipaddress.ip_network(alloc["prefix"])  # host bits set: not a prefix
        except (KeyError, ValueError, TypeError):
            continue
        key = str(prefix)
        i = blocks.index_of(int(prefix.network_address))
        if (node not in wanted or node in allocs or i is None or prefix.prefixlen != length
                or (key in statics and statics[key].get("nodeName") != node)
                or (node in static_by_node and static_by_node[node] != key)
                or (key not in statics and (i in used or not blocks.usable(i)))):
            continue
        allocs[str(node)] = {"nodeName": node, "prefix": key,
                             "gateway": expected_gateway(spec, str(node), prefix)}
        used.add(i)
    left: list[str] = []
    cursor: int | None = 0
    for node in sorted(wanted - set(allocs)):
        if node in static_by_node:
            key = static_by_node[node]
            allocs[node] = {"nodeName": node, "prefix": key,
                            "gateway": expected_gateway(spec, node, ipaddress.ip_network(key))}
            continue
        cursor = blocks.next_free(cursor, used) if cursor is not None else None
        if cursor is None:
            left.append(node)
            continue
        used.add(cursor)
        free = ipaddress.ip_network((blocks.address(cursor), length))
        allocs[node] = {"nodeName": node, "prefix": str(free),
                        "gateway": expected_gateway(spec, node, free)}
        cursor += 1
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
        self.nodes = manager.informer(NODE)  # labels only; shared with the other controllers
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
                self.controller.queue.add_batched(f"{kind}/{key_of(pool)}")

    async def reconcile(self, key: str) -> Result | None:
        kind, _, pool_key = key.partition("/")
        pool = self.pools[kind].store.get(pool_key)
        if pool is None:
            return None
        res, carve = KINDS[kind]
        spec = pool.get("spec") or {}
        nodes = sorted(n["metadata"]["name"] for n in self.nodes.store.items()
                       if selectors.matches_node_selector(spec.get("nodeSelector"), n))
        status = pool.get("status") or {}
        existing = status.get("allocations") or []
        name = pool["metadata"]["name"]
        try:
            allocations, left = carve(spec, existing, nodes)
        except InvalidPool as e:
            await self._write(res, pool, [], with_condition(
                status.get("conditions") or [], ALLOCATED, False, "InvalidSpec", str(e)))
            await self.recorder.emit(pool, "Warning", "InvalidSpec", str(e))
            log.warning("invalid %s: %s", kind, e, extra=logs.about(kind, name, self.namespace))
            return None
        reason = "NoFreeRanges" if kind == "IPPool" else "NoFreePrefixes"
        if left:
            shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
            message = (f"{len(left)} of {len(nodes)} selected nodes have no block ({shown}): "
                       "the pool has no free block left; enlarge the pool, use smaller blocks, "
                       "or exclude fewer addresses (spec.exclusions, spec.perNodeExclusions)")
        else:
            reason, message = "AllNodesAllocated", f"all {len(nodes)} selected nodes have a block"
        await self._write(res, pool, allocations, with_condition(
            status.get("conditions") or [], ALLOCATED, not left, reason, message))
        for node in left:
            await self.recorder.emit(pool, "Warning", reason,
                                     f"failed to allocate a block on node {node}: the pool has "
                                     f"no free block left ({len(allocations)} nodes have one)")
        return None

    async def _write(self, res: Resource, pool: Obj, allocations: list[Obj],
                     conditions: list[Obj] | None) -> None:
        """Writes the blocks and the Allocated condition when either changed."""
        status = pool.get("status")
        existing = (status or {}).get("allocations") or []
        if status is not None and conditions is None and \
                _comparable(existing) == _comparable(allocations):
            return
        patch: Obj = {"allocations": allocations}
        if conditions is not None:
            patch["conditions"] = conditions
        m = pool["metadata"]
        try:
            await self.client.patch(res, m["name"], {"status": patch},
                                    m.get("namespace"), subresource="status")
        except ApiError as e:  # said on the pool, and tried again later
            await self.recorder.emit(pool, "Warning", "StatusWriteFailed",
                                     f"writing the pool's node blocks failed: {e}")
            raise
        log.info("%d node blocks", len(allocations),
                 extra=logs.about(res.kind, m["name"], m.get("namespace")))
