"""The rules of IPPool and CIDRPool specs, shared by the controller that carves them and the
node agent that allocates from them: address arithmetic, gateways, and what makes a spec or a
node's CIDRPool prefix invalid (nv-ipam's api/v1alpha1 Validate rules, with each problem named
by its field path so that the pool's condition and Event say what to fix).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Obj = dict[str, Any]
INT32_MAX = 2**31 - 1


class InvalidPool(ValueError):
    """A pool spec nothing can be carved from; the message names each field at fault."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def point_to_point(net: Network) -> bool:
    """/31, /32, /127 and /128 networks: every address is a host address."""
    return net.prefixlen >= net.max_prefixlen - 1


def possible_ips(net: Network) -> int:
    """nv-ipam's GetPossibleIPCount: host addresses of a network (no network address, and no
    broadcast address in IPv4), all of a point-to-point or single-address network."""
    if point_to_point(net):
        return net.num_addresses
    return net.num_addresses - (2 if net.version == 4 else 1)


def host_bounds(net: Network) -> tuple[int, int]:
    """First and last host address of a network, as integers."""
    first, last = int(net.network_address), int(net.broadcast_address)
    if point_to_point(net):
        return first, last
    return first + 1, last - (1 if net.version == 4 else 0)


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping or adjacent inclusive ranges joined, sorted."""
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def gateway_for(prefix: Network, index: int | None) -> str:
    """nv-ipam's GetGatewayForSubnet: network + index; index 0 only for /31-/32 (/127-/128)."""
    if index is None:
        return ""
    hosts = possible_ips(prefix)
    if point_to_point(prefix):
        hosts -= 1
    elif index == 0:
        return ""
    if index < 0 or index > hosts:
        return ""
    return str(prefix.network_address + index)


def parse_cidr(value: object) -> Network | None:
    """A CIDR as Go's net.ParseCIDR takes it: address and prefix length both required."""
    if not isinstance(value, str) or "/" not in value:
        return None
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError:
        return None


def parse_ip(value: object) -> Address | None:
    try:
        return ipaddress.ip_address(str(value))
    except ValueError:
        return None


def _host_bits(value: str, net: Network) -> bool:
    return ipaddress.ip_interface(value).ip != net.network_address


def _exclusions(spec: Obj, net: Network | None, problems: list[str]) -> None:
    for i, ex in enumerate(spec.get("exclusions") or []):
        where = f"spec.exclusions[{i}]"
        ends = []
        for key in ("startIP", "endIP"):
            ip = parse_ip(ex.get(key))
            if ip is None:
                problems.append(f"{where}.{key}: {ex.get(key)!r} is not an IP address")
            elif net is not None and ip not in net:
                problems.append(f"{where}.{key}: {ip} is not part of the {net} subnet")
            ends.append(ip)
        if ends[0] is not None and ends[1] is not None and ends[0].version == ends[1].version \
                and int(ends[1]) < int(ends[0]):
            problems.append(f"{where}: endIP {ends[1]} should be equal or greater than startIP "
                            f"{ends[0]}")


def _per_node_exclusions(spec: Obj, size: int, what: str, problems: list[str]) -> None:
    top = min(size - 1, INT32_MAX)
    for i, ex in enumerate(spec.get("perNodeExclusions") or []):
        where = f"spec.perNodeExclusions[{i}]"
        lo, hi = ex.get("startIndex", 0), ex.get("endIndex", 0)
        for key, value in (("startIndex", lo), ("endIndex", hi)):
            if not isinstance(value, int) or value < 0:
                problems.append(f"{where}.{key}: {value!r} must be non-negative")
            elif value > top:
                problems.append(f"{where}.{key}: {value} is outside of the per-node {what} "
                                f"range (max: {top})")
        if isinstance(lo, int) and isinstance(hi, int) and hi < lo:
            problems.append(f"{where}: endIndex {hi} must be greater than or equal to "
                            f"startIndex {lo}")


def _routes(spec: Obj, net: Network | None, gateway_field: str, has_gateway: bool,
            problems: list[str]) -> None:
    routes = spec.get("routes") or []
    default_gw = bool(spec.get("defaultGateway"))
    if not has_gateway:
        if default_gw:
            problems.append(f"spec.defaultGateway: cannot be true if spec.{gateway_field} is "
                            "not set")
        if routes:
            problems.append(f"spec.routes: cannot be set if spec.{gateway_field} is not set")
    for i, route in enumerate(routes):
        where = f"spec.routes[{i}].dst"
        dst = parse_cidr(route.get("dst"))
        if dst is None:
            problems.append(f"{where}: {route.get('dst')!r} is not a subnet in CIDR notation, "
                            "e.g. 10.0.0.0/8")
            continue
        if net is not None and dst.version != net.version:
            problems.append(f"{where}: {dst} is not the same address family (IPv4/IPv6) as "
                            f"{net}")
        if default_gw and dst.prefixlen == 0:
            problems.append(f"{where}: default route {dst} is not allowed if defaultGateway is "
                            "true (the gateway is the default route already)")


VALUES_NEEDED = {"In": "at least one value", "NotIn": "at least one value",
                 "Gt": "exactly one value", "Lt": "exactly one value"}


def _node_selector(spec: Obj, problems: list[str]) -> None:
    selector = spec.get("nodeSelector")
    if selector is None:
        return
    terms = selector.get("nodeSelectorTerms") or []
    if not terms:
        problems.append("spec.nodeSelector.nodeSelectorTerms: must have at least one node "
                        "selector term (leave nodeSelector out to select every node)")
    for t, term in enumerate(terms):
        for kind in ("matchExpressions", "matchFields"):
            for r, req in enumerate(term.get(kind) or []):
                where = f"spec.nodeSelector.nodeSelectorTerms[{t}].{kind}[{r}]"
                op, values = req.get("operator"), req.get("values") or []
                if kind == "matchFields":
                    if req.get("key") != "metadata.name":
                        problems.append(f"{where}.key: {req.get('key')!r} is not a valid field "
                                        "selector key (only metadata.name)")
                    if op not in ("In", "NotIn"):
                        problems.append(f"{where}.operator: {op!r} is not a valid selector "
                                        "operator for a field (In, NotIn)")
                    elif len(values) != 1:
                        problems.append(f"{where}.values: must be only one value when operator "
                                        f"is {op} for a node field selector")
                elif op in ("Exists", "DoesNotExist"):
                    if values:
                        problems.append(f"{where}.values: may not be specified when operator is "
                                        f"{op}")
                elif op in VALUES_NEEDED:
                    if (len(values) != 1) if op in ("Gt", "Lt") else not values:
                        problems.append(f"{where}.values: must be {VALUES_NEEDED[op]} when "
                                        f"operator is {op}")
                else:
                    problems.append(f"{where}.operator: {op!r} is not a valid selector operator")


# ------------------------------------------------------------------ IPPool

def ippool_problems(spec: Obj) -> tuple[Network | None, list[str]]:
    """The subnet (None when unusable) and every problem of an IPPool spec."""
    problems: list[str] = []
    net = parse_cidr(spec.get("subnet"))
    if net is None:
        problems.append(f"spec.subnet: {spec.get('subnet')!r} is not a CIDR")
    size = spec.get("perNodeBlockSize")
    if not isinstance(size, int) or size < 1:
        problems.append(f"spec.perNodeBlockSize: {size!r} must be an integer of at least 1")
        size = None
    elif net is not None and size > possible_ips(net):
        problems.append(f"spec.perNodeBlockSize: {size} is more than the {net} subnet has "
                        f"addresses for ({possible_ips(net)})")
    gateway = spec.get("gateway")
    if gateway:
        gw = parse_ip(gateway)
        if gw is None:
            problems.append(f"spec.gateway: {gateway!r} is not an IP address")
        elif net is not None and gw not in net:
            problems.append(f"spec.gateway: {gw} is not in the subnet {net}")
    _exclusions(spec, net, problems)
    if size is not None:
        _per_node_exclusions(spec, size, "block", problems)
    _node_selector(spec, problems)
    _routes(spec, net, "gateway", bool(gateway), problems)
    return net, problems


def validate_ippool(spec: Obj) -> Network:
    net, problems = ippool_problems(spec)
    if problems or net is None:
        raise InvalidPool(problems)
    return net


# ------------------------------------------------------------------ CIDRPool

def cidrpool_problems(spec: Obj) -> tuple[Network | None, list[str]]:
    """The CIDR (None when unusable) and every problem of a CIDRPool spec."""
    problems: list[str] = []
    cidr = spec.get("cidr")
    net = parse_cidr(cidr)
    if net is None:
        return None, [f"spec.cidr: {cidr!r} is not a CIDR"]
    if _host_bits(str(cidr), net):
        return None, [f"spec.cidr: {cidr} has host bits set, the network is {net}"]
    index = spec.get("gatewayIndex")
    if index is not None and (not isinstance(index, int) or index < 0):
        return None, [f"spec.gatewayIndex: {index!r} must not be negative"]
    length = spec.get("perNodeNetworkPrefix")
    if not isinstance(length, int) or length < 0:
        return None, [f"spec.perNodeNetworkPrefix: {length!r} must not be negative"]
    if length == 0 or not net.prefixlen <= length <= net.max_prefixlen:
        return None, [f"spec.perNodeNetworkPrefix: {length} must be between {net.prefixlen} "
                      f"(the prefix length of spec.cidr) and {net.max_prefixlen}"]
    first = ipaddress.ip_network((net.network_address, length))
    if index is not None and not gateway_for(first, index):
        problems.append(f"spec.gatewayIndex: {index} is outside of the node prefix (a "
                        f"/{length})")
    _exclusions(spec, net, problems)
    _per_node_exclusions(spec, 2 ** (net.max_prefixlen - length), "subnet", problems)
    _static_allocations(spec, net, length, problems)
    _node_selector(spec, problems)
    _routes(spec, net, "gatewayIndex", index is not None, problems)
    return net, problems


def _static_allocations(spec: Obj, net: Network, length: int, problems: list[str]) -> None:
    nodes: dict[str, int] = {}
    prefixes: dict[str, int] = {}
    for i, static in enumerate(spec.get("staticAllocations") or []):
        where = f"spec.staticAllocations[{i}]"
        if static.get("nodeName"):
            nodes[static["nodeName"]] = nodes.get(static["nodeName"], 0) + 1
        value = static.get("prefix")
        prefix = parse_cidr(value)
        if prefix is None:
            problems.append(f"{where}.prefix: {value!r} is not a valid network prefix")
            continue
        if _host_bits(str(value), prefix):
            problems.append(f"{where}.prefix: {value} has host bits set, the network is "
                            f"{prefix}")
            continue
        prefixes[str(prefix)] = prefixes.get(str(prefix), 0) + 1
        if prefix.version != net.version or not prefix.subnet_of(net):  # type: ignore[arg-type]
            problems.append(f"{where}.prefix: {prefix} is not part of the pool cidr {net}")
            continue
        if prefix.prefixlen != length:
            problems.append(f"{where}.prefix: {prefix} does not match "
                            f"spec.perNodeNetworkPrefix ({length})")
            continue
        gw = static.get("gateway")
        if gw:
            address = parse_ip(gw)
            if address is None:
                problems.append(f"{where}.gateway: {gw!r} is not a valid IP")
            elif address not in prefix:
                problems.append(f"{where}.gateway: {gw} is outside of the node prefix {prefix}")
    problems.extend(f"spec.staticAllocations: node {n} has {c} entries, at most one"
                    for n, c in sorted(nodes.items()) if c > 1)
    problems.extend(f"spec.staticAllocations: prefix {p} is given {c} times"
                    for p, c in sorted(prefixes.items()) if c > 1)


def validate_cidrpool(spec: Obj) -> tuple[Network, int]:
    net, problems = cidrpool_problems(spec)
    if problems or net is None:
        raise InvalidPool(problems)
    return net, int(spec["perNodeNetworkPrefix"])


def expected_gateway(spec: Obj, node: str, prefix: Network) -> str:
    """The gateway a node's prefix must have: its static allocation's, else gatewayIndex's."""
    for static in spec.get("staticAllocations") or []:
        if static.get("nodeName") == node and static.get("gateway"):
            return str(static["gateway"])
    return gateway_for(prefix, spec.get("gatewayIndex"))


def cidrpool_allocation_problem(spec: Obj, alloc: Obj, allocations: list[Obj]) -> str:
    """Why a CIDRPool status entry cannot be a node's prefix of this (valid) spec; "" when it
    can (nv-ipam's CIDRPoolAllocation.Validate)."""
    node, value, gw = alloc.get("nodeName") or "", alloc.get("prefix") or "", \
        alloc.get("gateway") or ""
    missing = [f"{k} can't be empty" for k, v in (("nodeName", node), ("prefix", value)) if not v]
    if missing:
        return "; ".join(missing)
    prefix = parse_cidr(value)
    if prefix is None:
        return f"prefix {value!r} is not a valid network prefix"
    if _host_bits(value, prefix):
        return f"prefix {value} has host bits set"
    for static in spec.get("staticAllocations") or []:
        if static.get("nodeName") == node:
            if static.get("prefix") != value:
                return f"prefix {value} doesn't match prefix from static allocation " \
                       f"{static.get('prefix')}"
            break
        if static.get("prefix") == value:
            return f"prefix {value} is statically allocated for node " \
                   f"{static.get('nodeName') or '(none)'}"
    else:
        net = parse_cidr(spec.get("cidr"))
        if net is None or prefix.version != net.version or \
                not prefix.subnet_of(net):  # type: ignore[arg-type]
            return f"prefix {value} is not part of the pool cidr {spec.get('cidr')}"
        if prefix.prefixlen != spec.get("perNodeNetworkPrefix"):
            return f"prefix {value} doesn't match spec.perNodeNetworkPrefix " \
                   f"({spec.get('perNodeNetworkPrefix')})"
    want = expected_gateway(spec, node, prefix)
    if gw != want:
        return f"gateway {gw or '(none)'} doesn't match the expected gateway {want or '(none)'}"
    clashes = [a for a in allocations
               if (gw and a.get("gateway") == gw) or a.get("prefix") == value
               or a.get("nodeName") == node]
    if len(clashes) > 1:
        return f"conflicting allocation found in the pool: {clashes[1]}"
    return ""
