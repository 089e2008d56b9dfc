"""IPPool and CIDRPool validation on upstream's own cases: which specs the controller carves, and
which it refuses with every field at fault named (the pool's Allocated condition and Event
carry that message).

Every case names the upstream test it comes from in Mellanox/nvidia-k8s-ipam (api/v1alpha1,
where upstream's webhook and controller share these rules). nicop's CRDs let the API server
refuse part of them before any controller sees the object (`api` below);
tests/integration/test_crds_validation.py holds those, this file the controller's rules, which
also cover objects stored before nicop's CRDs were installed.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from nicop.api.nvipam_rules import (
    InvalidPool,
    cidrpool_allocation_problem,
    cidrpool_problems,
    ippool_problems,
    merge_ranges,
)
from nicop.operator.ipam import carve_cidrpool, carve_ippool

SELECTOR = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "foo.bar",
                                                           "operator": "Exists"}]}]}
BAD_SELECTOR = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "foo.bar",
                                                               "operator": "unknown"}]}]}


def ex(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"startIP": a, "endIP": b} for a, b in pairs]


def idx(*pairs: tuple[int, int]) -> list[dict[str, int]]:
    return [{"startIndex": a, "endIndex": b} for a, b in pairs]


def check(problems: list[str], fields: list[str]) -> None:
    """No problem when `fields` is empty; else each field is named by a problem."""
    if not fields:
        assert problems == []
        return
    assert problems, f"expected problems naming {fields}"
    for f in fields:
        assert any(p.startswith(f) for p in problems), (f, problems)


# ------------------------------------------------------------------ IPPool, Describe "Validate"

V4 = {"subnet": "192.168.0.0/16", "perNodeBlockSize": 128}
V6 = {"subnet": "2001:db8:3333:4444::0/64"}


IPPOOL_CASES: list[tuple[str, dict[str, Any], list[str], str | None]] = [
    ("Valid", {**V4, "exclusions": ex(("192.168.0.100", "192.168.0.110")),
               "gateway": "192.168.0.1", "nodeSelector": SELECTOR}, [], None),
    ("Valid - ipv6", {**V6, "perNodeBlockSize": 1000, "gateway": "2001:db8:3333:4444::1",
                      "exclusions": ex(("2001:db8:3333:4444::3", "2001:db8:3333:4444::4"))},
     [], None),
    ("Valid - no NodeSelector", {**V4, "gateway": "192.168.0.1"}, [], None),
    ("Valid - no Gateway", V4, [], None),
    ("Empty object", {}, ["spec.subnet", "spec.perNodeBlockSize"], "spec.subnet"),
    ("Invalid - perNodeBlockSize is too large",
     {"subnet": "192.168.0.0/24", "perNodeBlockSize": 300, "gateway": "192.168.0.1"},
     ["spec.perNodeBlockSize"], None),
    ("Invalid - exclusions not part of the subnet",
     {"subnet": "192.168.0.0/24", "perNodeBlockSize": 10,
      "exclusions": ex(("10.10.10.10", "10.10.10.20"))},
     ["spec.exclusions[0].startIP", "spec.exclusions[0].endIP"], None),
    ("Invalid - gateway outside of the subnet", {**V4, "gateway": "10.0.0.1"}, ["spec.gateway"],
     None),
    ("Invalid - invalid NodeSelector", {**V4, "gateway": "192.168.0.1",
                                        "nodeSelector": BAD_SELECTOR},
     ["spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].operator"],
     "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].operator"),
    ("Invalid - no Gateway, defaultGateway true", {**V4, "defaultGateway": True},
     ["spec.defaultGateway"], None),
    ("Valid - routes", {**V4, "gateway": "192.168.0.1",
                        "routes": [{"dst": "5.5.0.0/16"}, {"dst": "10.7.1.0/24"}]}, [], None),
    ("Invalid - routes without Gateway", {**V4, "routes": [{"dst": "5.5.0.0/16"}]},
     ["spec.routes"], None),
    ("Invalid - routes not CIDR", {**V4, "routes": [{"dst": "5.5.0.0"}]},
     ["spec.routes", "spec.routes[0].dst"], "spec.routes[0].dst"),
    ("Invalid - routes not same address family",
     {**V4, "routes": [{"dst": "2001:db8:3333:4444::0/64"}]}, ["spec.routes[0].dst"], None),
    ("Invalid - default routes with defaultGateway true - IPv6",
     {**V6, "perNodeBlockSize": 128, "defaultGateway": True, "routes": [{"dst": "::/0"}]},
     ["spec.routes[0].dst"], None),
    ("Invalid - default routes with defaultGateway true - IPv4",
     {**V4, "defaultGateway": True, "routes": [{"dst": "0.0.0.0/0"}]}, ["spec.routes[0].dst"],
     None),
    ("Valid - PerNodeExclusions", {**V4, "perNodeExclusions": idx((0, 10), (100, 127))}, [],
     None),
    ("Valid - PerNodeExclusions single index", {**V4, "perNodeExclusions": idx((5, 5))}, [],
     None),
    ("Valid - PerNodeExclusions max index", {**V4, "perNodeExclusions": idx((120, 127))}, [],
     None),
    ("Invalid - PerNodeExclusions negative startIndex",
     {**V4, "perNodeExclusions": idx((-5, 20))}, ["spec.perNodeExclusions[0].startIndex"],
     "spec.perNodeExclusions[0].startIndex"),
    ("Invalid - PerNodeExclusions negative endIndex", {**V4, "perNodeExclusions": idx((5, -1))},
     ["spec.perNodeExclusions[0].endIndex"], "spec.perNodeExclusions[0].endIndex"),
    ("Invalid - PerNodeExclusions startIndex greater than endIndex",
     {**V4, "perNodeExclusions": idx((25, 24))}, ["spec.perNodeExclusions[0]"],
     "spec.perNodeExclusions[0]"),
    ("Invalid - PerNodeExclusions startIndex outside block range",
     {**V4, "perNodeExclusions": idx((128, 130))}, ["spec.perNodeExclusions[0].startIndex"],
     None),
    ("Invalid - PerNodeExclusions endIndex outside block range",
     {**V4, "perNodeExclusions": idx((120, 200))}, ["spec.perNodeExclusions[0].endIndex"],
     None),
    ("Valid - PerNodeExclusions IPv6",
     {**V6, "perNodeBlockSize": 256, "perNodeExclusions": idx((0, 10), (250, 255))}, [], None),
    ("Invalid - PerNodeExclusions IPv6 outside range",
     {**V6, "perNodeBlockSize": 256, "perNodeExclusions": idx((0, 300))},
     ["spec.perNodeExclusions[0].endIndex"], None),
]
"""(It, spec, fields the controller names, field the API server names first or None)."""


@pytest.mark.parametrize(("case", "spec", "fields", "api"), IPPOOL_CASES)
def test_ippool_rules(case: str, spec: dict[str, Any], fields: list[str],
                    api: str | None) -> None:
    """Mellanox/nvidia-k8s-ipam api/v1alpha1/ippool_test.go, Describe "Validate", the It named
    `case`: a valid spec is carved; an invalid one is refused naming each field at fault (with
    `api`, nicop's CRD refuses it already, naming that field)."""
    _, problems = ippool_problems(spec)
    check(problems, fields)
    if not fields:
        carve_ippool(spec, [], ["node-1"])
    else:
        with pytest.raises(InvalidPool):
            carve_ippool(spec, [], ["node-1"])


def test_ippool_problems_name_field_and_value() -> None:
    """The messages behind the fields of Mellanox/nvidia-k8s-ipam api/v1alpha1/ippool_test.go,
    Describe "Validate" (and validate_exclusions.go, validate_routes.go): what is wrong and the
    value, every problem at once."""
    spec = {"subnet": "192.168.0.0/16", "perNodeBlockSize": 128, "defaultGateway": True,
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "2001:db8::/64"}],
            "exclusions": ex(("10.10.10.10", "192.168.0.20")),
            "perNodeExclusions": idx((128, 130))}
    with pytest.raises(InvalidPool) as e:
        carve_ippool(spec, [], ["node-1"])
    assert e.value.problems == [
        "spec.exclusions[0].startIP: 10.10.10.10 is not part of the 192.168.0.0/16 subnet",
        "spec.perNodeExclusions[0].startIndex: 128 is outside of the per-node block range "
        "(max: 127)",
        "spec.perNodeExclusions[0].endIndex: 130 is outside of the per-node block range "
        "(max: 127)",
        "spec.defaultGateway: cannot be true if spec.gateway is not set",
        "spec.routes: cannot be set if spec.gateway is not set",
        "spec.routes[0].dst: default route 0.0.0.0/0 is not allowed if defaultGateway is true "
        "(the gateway is the default route already)",
        "spec.routes[1].dst: 2001:db8::/64 is not the same address family (IPv4/IPv6) as "
        "192.168.0.0/16",
    ]
    assert str(e.value) == "; ".join(e.value.problems)


# ------------------------------------------------------------------ CIDRPool, Describe "CIDRPool"

C4 = {"cidr": "192.168.0.0/16", "perNodeNetworkPrefix": 24}


CIDRPOOL_CASES: list[tuple[str, dict[str, Any], list[str], str | None]] = [
    ("Valid IPv4 pool", {**C4, "gatewayIndex": 100, "nodeSelector": SELECTOR,
                         "exclusions": ex(("192.168.0.10", "192.168.0.20"),
                                          ("192.168.0.25", "192.168.0.25")),
                         "staticAllocations": [
                             {"nodeName": "node1", "prefix": "192.168.5.0/24",
                              "gateway": "192.168.5.10"},
                             {"nodeName": "node2", "prefix": "192.168.6.0/24"},
                             {"prefix": "192.168.7.0/24"}]}, [], None),
    ("Valid IPv6 pool", {"cidr": "fdf8:6aef:d1fe::/48", "perNodeNetworkPrefix": 120,
                         "gatewayIndex": 5, "nodeSelector": SELECTOR,
                         "exclusions": ex(("fdf8:6aef:d1fe::5", "fdf8:6aef:d1fe::5")),
                         "staticAllocations": [{"nodeName": "node1",
                                                "prefix": "fdf8:6aef:d1fe::/120",
                                                "gateway": "fdf8:6aef:d1fe::15"}]}, [], None),
    ("Invalid - no gatewayIndex, defaultGateway true",
     {"cidr": "fdf8:6aef:d1fe::/48", "perNodeNetworkPrefix": 120, "defaultGateway": True},
     ["spec.defaultGateway"], None),
    ("Valid - routes", {**C4, "gatewayIndex": 100,
                        "routes": [{"dst": "5.5.0.0/16"}, {"dst": "10.7.1.0/24"}]}, [], None),
    ("Invalid - routes not CIDR", {**C4, "gatewayIndex": 100, "routes": [{"dst": "5.5.0.0"}]},
     ["spec.routes[0].dst"], "spec.routes[0].dst"),
    ("Invalid - routes without GatewayIndex", {**C4, "routes": [{"dst": "5.5.0.0"}]},
     ["spec.routes"], "spec.routes[0].dst"),
    ("Invalid - routes not same address family",
     {**C4, "routes": [{"dst": "2001:db8:3333:4444::0/64"}]}, ["spec.routes"], None),
    ("PerNodeExclusions - IPv6 large subnet (ippool_test.go)",
     {"cidr": "fdf8:6aef:d1fe::/48", "perNodeNetworkPrefix": 64,
      "perNodeExclusions": idx((0, 10), (250, 255))}, [], None),
    ("PerNodeExclusions - IPv6", {"cidr": "fdf8:6aef:d1fe::/48", "perNodeNetworkPrefix": 120,
                                  "perNodeExclusions": idx((0, 10), (250, 255))}, [], None),
    ("PerNodeExclusions - IPv6 invalid",
     {"cidr": "fdf8:6aef:d1fe::/48", "perNodeNetworkPrefix": 120,
      "perNodeExclusions": idx((0, 300))}, ["spec.perNodeExclusions[0].endIndex"], None),
]


@pytest.mark.parametrize(("case", "spec", "fields", "api"), CIDRPOOL_CASES)
def test_cidrpool_rules(case: str, spec: dict[str, Any], fields: list[str],
                       api: str | None) -> None:
    """Mellanox/nvidia-k8s-ipam api/v1alpha1/cidrpool_test.go, Describe "CIDRPool", the It named
    `case` (one from ippool_test.go, Describe "Validate"): a valid spec is carved, an invalid
    one refused naming the field (with `api`, nicop's CRD refuses it already, naming that
    field)."""
    _, problems = cidrpool_problems(spec)
    check(problems, fields)
    if not fields:
        carve_cidrpool(spec, [], ["node-1"])


CIDRPOOL_TABLES: list[tuple[str, str, dict[str, Any], list[str], str | None]] = [
    ("CIDR", "empty", {"cidr": "", "perNodeNetworkPrefix": 30}, ["spec.cidr"], "spec.cidr"),
    ("CIDR", "invalid value", {"cidr": "aaaa", "perNodeNetworkPrefix": 30}, ["spec.cidr"],
    "spec.cidr"),
    ("CIDR", "/32", {"cidr": "192.168.1.1/32", "perNodeNetworkPrefix": 32}, [], None),
    ("CIDR", "/128", {"cidr": "2001:db8:3333:4444::0/128", "perNodeNetworkPrefix": 128}, [],
     None),
    ("CIDR", "valid ipv4", {"cidr": "192.168.1.0/24", "perNodeNetworkPrefix": 30}, [], None),
    ("CIDR", "valid ipv6", {"cidr": "2001:db8:3333:4444::0/64", "perNodeNetworkPrefix": 120}, [],
     None),
    ("PerNodeNetworkPrefix", "not set", {**C4, "perNodeNetworkPrefix": 0},
     ["spec.perNodeNetworkPrefix"], None),
    ("PerNodeNetworkPrefix", "negative", {**C4, "perNodeNetworkPrefix": -10},
     ["spec.perNodeNetworkPrefix"], None),
    ("PerNodeNetworkPrefix", "larger than CIDR", {**C4, "perNodeNetworkPrefix": 8},
     ["spec.perNodeNetworkPrefix"], None),
    ("PerNodeNetworkPrefix", "32 for IPv4 pool", {**C4, "perNodeNetworkPrefix": 32}, [], None),
    ("PerNodeNetworkPrefix", "128 for IPv6 pool",
     {"cidr": "2001:db8:3333:4444::0/64", "perNodeNetworkPrefix": 128}, [], None),
    ("PerNodeNetworkPrefix", "match CIDR prefix size - ipv4", {**C4, "perNodeNetworkPrefix": 16},
     [], None),
    ("PerNodeNetworkPrefix", "match CIDR prefix size - ipv6",
     {"cidr": "2001:db8:3333:4444::0/64", "perNodeNetworkPrefix": 64}, [], None),
    ("NodeSelector", "not set", C4, [], None),
    ("NodeSelector", "valid", {**C4, "nodeSelector": SELECTOR}, [], None),
    ("NodeSelector", "unknown operation", {**C4, "nodeSelector": BAD_SELECTOR},
     ["spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].operator"],
     "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].operator"),
    ("GatewayIndex", "negative", {**C4, "gatewayIndex": -10}, ["spec.gatewayIndex"], None),
    ("GatewayIndex", "too large", {**C4, "gatewayIndex": 255}, ["spec.gatewayIndex"], None),
    ("GatewayIndex", "index 1 is valid for point to point", {**C4, "gatewayIndex": 1}, [], None),
    ("GatewayIndex", "index 2 is valid for point to point", {**C4, "gatewayIndex": 2}, [], None),
    ("Exclusions", "valid", {**C4, "exclusions": ex(("192.168.0.10", "192.168.0.20"))}, [],
     None),
    ("Exclusions", "startIP not set", {**C4, "exclusions": [{"endIP": "192.168.0.20"}]},
     ["spec.exclusions[0].startIP"], "spec.exclusions[0].startIP"),
    ("Exclusions", "endIP not set", {**C4, "exclusions": [{"startIP": "192.168.0.10"}]},
     ["spec.exclusions[0].endIP"], "spec.exclusions[0].endIP"),
    ("Exclusions", "not IPs", {**C4, "exclusions": ex(("aaa", "bb"), ("192.168.0.25", "ccc"))},
     ["spec.exclusions[0].startIP", "spec.exclusions[0].endIP", "spec.exclusions[1].endIP"],
     "spec.exclusions[1].endIP"),
    ("Exclusions", "startIP is greater then endIP",
     {**C4, "exclusions": ex(("192.168.0.25", "192.168.0.24"))}, ["spec.exclusions[0]"], None),
    ("Exclusions", "doesn't belong to cidr",
     {**C4, "exclusions": ex(("10.10.33.25", "10.10.33.33"))}, ["spec.exclusions[0]"], None),
    ("PerNodeExclusions", "valid - range", {**C4, "perNodeExclusions": idx((10, 20))}, [], None),
    ("PerNodeExclusions", "valid - single index", {**C4, "perNodeExclusions": idx((5, 5))}, [],
     None),
    ("PerNodeExclusions", "valid - index 0", {**C4, "perNodeExclusions": idx((0, 10))}, [],
     None),
    ("PerNodeExclusions", "valid - max index for /24 (255)",
     {**C4, "perNodeExclusions": idx((250, 255))}, [], None),
    ("PerNodeExclusions", "valid - multiple ranges",
     {**C4, "perNodeExclusions": idx((0, 10), (100, 110))}, [], None),
    ("PerNodeExclusions", "negative startIndex", {**C4, "perNodeExclusions": idx((-5, 20))},
     ["spec.perNodeExclusions[0].startIndex"], "spec.perNodeExclusions[0].startIndex"),
    ("PerNodeExclusions", "negative endIndex", {**C4, "perNodeExclusions": idx((5, -1))},
     ["spec.perNodeExclusions[0].endIndex"], "spec.perNodeExclusions[0].endIndex"),
    ("PerNodeExclusions", "startIndex greater than endIndex",
     {**C4, "perNodeExclusions": idx((25, 24))}, ["spec.perNodeExclusions[0]"],
     "spec.perNodeExclusions[0]"),
    ("PerNodeExclusions", "startIndex outside subnet range",
     {**C4, "perNodeExclusions": idx((256, 260))}, ["spec.perNodeExclusions[0].startIndex"],
     None),
    ("PerNodeExclusions", "endIndex outside subnet range",
     {**C4, "perNodeExclusions": idx((250, 300))}, ["spec.perNodeExclusions[0].endIndex"],
     None),
    ("PerNodeExclusions", "multiple errors in one entry",
     {**C4, "perNodeExclusions": idx((-5, -1))},
     ["spec.perNodeExclusions[0].startIndex", "spec.perNodeExclusions[0].endIndex"],
     "spec.perNodeExclusions[0].endIndex"),
    ("PerNodeExclusions", "multiple entries with errors",
     {**C4, "perNodeExclusions": idx((-5, 20), (300, 400))},
     ["spec.perNodeExclusions[0]", "spec.perNodeExclusions[1]"],
     "spec.perNodeExclusions[0].startIndex"),
    ("StaticAllocations", "valid", {**C4, "staticAllocations": [
        {"prefix": "192.168.0.0/24", "gateway": "192.168.0.1", "nodeName": "node1"}]}, [], None),
    ("StaticAllocations", "valid - no gateway", {**C4, "staticAllocations": [
        {"prefix": "192.168.0.0/24", "nodeName": "node1"}]}, [], None),
    ("StaticAllocations", "valid - no node name", {**C4, "staticAllocations": [
        {"prefix": "192.168.0.0/24"}]}, [], None),
    ("StaticAllocations", "not a prefix", {**C4, "staticAllocations": [
        {"prefix": "192.168.0.0"}]}, ["spec.staticAllocations[0].prefix"],
        "spec.staticAllocations[0].prefix"),
    ("StaticAllocations", "wrong prefix size", {**C4, "staticAllocations": [
        {"prefix": "192.168.0.0/31"}]}, ["spec.staticAllocations[0].prefix"], None),
    ("StaticAllocations", "prefix is not part of the cidr", {**C4, "staticAllocations": [
        {"prefix": "10.10.10.0/24"}]}, ["spec.staticAllocations[0].prefix"], None),
    ("StaticAllocations", "gateway is not an IP", {**C4, "staticAllocations": [
        {"prefix": "192.168.0.0/24", "gateway": "foo"}]}, ["spec.staticAllocations[0].gateway"],
     "spec.staticAllocations[0].gateway"),
    ("StaticAllocations", "gateway is not in the allocated prefix", {**C4, "staticAllocations": [
        {"prefix": "192.168.0.0/24", "gateway": "192.168.1.1"}]},
     ["spec.staticAllocations[0].gateway"], None),
    ("StaticAllocations", "duplicate node names", {**C4, "staticAllocations": [
        {"nodeName": "nodeA", "prefix": "192.168.0.0/24"},
        {"nodeName": "nodeA", "prefix": "192.168.1.0/24"}]}, ["spec.staticAllocations"], None),
    ("StaticAllocations", "duplicate prefixes", {**C4, "staticAllocations": [
        {"nodeName": "nodeA", "prefix": "192.168.1.0/24"},
        {"nodeName": "nodeB", "prefix": "192.168.1.0/24"}]}, ["spec.staticAllocations"], None),
]


@pytest.mark.parametrize(("table", "case", "spec", "fields", "api"), CIDRPOOL_TABLES)
def test_cidrpool_tables(table: str, case: str, spec: dict[str, Any], fields: list[str],
                         api: str | None) -> None:
    """Mellanox/nvidia-k8s-ipam api/v1alpha1/cidrpool_test.go, Describe "CIDRPool",
    DescribeTable `table`, the Entry named `case` (with `api`, nicop's CRD refuses it
    already)."""
    _, problems = cidrpool_problems(spec)
    check(problems, fields)
    if not fields:
        allocations, _ = carve_cidrpool(spec, [], ["node-1"])
        assert allocations, f"{table} {case}: a valid pool gives the node a prefix"


def test_a_cidr_with_host_bits_is_refused() -> None:
    """Mellanox/nvidia-k8s-ipam api/v1alpha1/cidrpool_validate.go validateCIDR ("network prefix
    has host bits set"), which the API server's isCIDR lets pass: the message gives the
    network to write instead."""
    with pytest.raises(InvalidPool) as e:
        carve_cidrpool({"cidr": "192.168.1.1/24", "perNodeNetworkPrefix": 28}, [], ["n"])
    assert str(e.value) == "spec.cidr: 192.168.1.1/24 has host bits set, the network is " \
                           "192.168.1.0/24"


# ------------------------------------------------------------------ Describe "CIDRPoolAllocation"

def allocation_pool() -> dict[str, Any]:
    """The CIDRPool of the Describe's BeforeEach."""
    return {"cidr": "192.168.0.0/16", "perNodeNetworkPrefix": 24, "gatewayIndex": 100,
            "staticAllocations": [
                {"nodeName": "node1", "prefix": "192.168.1.0/24", "gateway": "192.168.1.10"},
                {"nodeName": "node2", "prefix": "192.168.2.0/24"}]}


STATUS = [{"nodeName": "node3", "prefix": "192.168.3.0/24", "gateway": "192.168.3.100"}]


@pytest.mark.parametrize(("context", "case", "allocation", "says"), [
    ("Valid", "new", {"nodeName": "node4", "prefix": "192.168.4.0/24",
                      "gateway": "192.168.4.100"}, ""),
    ("Valid", "exist in status", STATUS[0], ""),
    ("Invalid", "node not specified", {"prefix": "192.168.4.0/24", "gateway": "192.168.4.100"},
     "nodeName can't be empty"),
    ("Invalid", "empty", {}, "nodeName can't be empty; prefix can't be empty"),
    ("Invalid", "conflict with static allocation - range mismatch",
     {"nodeName": "node1", "prefix": "192.168.33.0/24", "gateway": "192.168.33.100"},
     "prefix 192.168.33.0/24 doesn't match prefix from static allocation 192.168.1.0/24"),
    ("Invalid", "conflict with static allocation - prefix allocated for different node",
     {"nodeName": "node1", "prefix": "192.168.2.0/24", "gateway": "192.168.2.100"},
     "prefix 192.168.2.0/24 doesn't match prefix from static allocation 192.168.1.0/24"),
    ("Invalid", "conflict with static allocation - gateway mismatch",
     {"nodeName": "node2", "prefix": "192.168.2.0/24"},
     "gateway (none) doesn't match the expected gateway 192.168.2.100"),
    ("Invalid", "conflict with static allocation - dynamic gw instead of static",
     {"nodeName": "node1", "prefix": "192.168.1.0/24", "gateway": "192.168.1.100"},
     "gateway 192.168.1.100 doesn't match the expected gateway 192.168.1.10"),
    ("Invalid", "gateway mismatch", {"nodeName": "node5", "prefix": "192.168.5.0/24"},
     "gateway (none) doesn't match the expected gateway 192.168.5.100"),
    ("Invalid", "prefix has host bits set",
     {"nodeName": "node5", "prefix": "192.168.5.1/24", "gateway": "192.168.5.100"},
     "prefix 192.168.5.1/24 has host bits set"),
    ("Invalid", "wrong prefix size",
     {"nodeName": "node5", "prefix": "192.168.5.0/26", "gateway": "192.168.5.100"},
     "prefix 192.168.5.0/26 doesn't match spec.perNodeNetworkPrefix (24)"),
    ("Invalid", "wrong prefix",
     {"nodeName": "node5", "prefix": "10.10.5.0/24", "gateway": "10.10.5.100"},
     "prefix 10.10.5.0/24 is not part of the pool cidr 192.168.0.0/16"),
])
def test_cidrpool_allocation_rules(context: str, case: str, allocation: dict[str, str],
                                   says: str) -> None:
    """Mellanox/nvidia-k8s-ipam api/v1alpha1/cidrpool_test.go, Describe "CIDRPoolAllocation",
    Context `context`, the It named `case`: whether a status entry can be a node's prefix
    (the node agent ignores the pool otherwise)."""
    assert cidrpool_allocation_problem(allocation_pool(), allocation, STATUS) == says, case


def test_cidrpool_allocation_without_gateway_and_conflicts() -> None:
    """Mellanox/nvidia-k8s-ipam api/v1alpha1/cidrpool_test.go, Describe "CIDRPoolAllocation",
    Its "Valid - no gateway" (no gatewayIndex: no gateway expected) and "conflicting
    allocation" (node4 also holds node3's prefix in the status)."""
    spec = {**allocation_pool(), "gatewayIndex": None}
    assert cidrpool_allocation_problem(
        spec, {"nodeName": "node3", "prefix": "192.168.3.0/24"}, STATUS) == ""
    status = [*STATUS, {"nodeName": "node4", "prefix": "192.168.3.0/24"}]
    assert cidrpool_allocation_problem(allocation_pool(), STATUS[0], status).startswith(
        "conflicting allocation found in the pool: {'nodeName': 'node4'")


def test_a_node_keeps_its_prefix_when_the_gateway_index_changes() -> None:
    """The controller's use of Mellanox/nvidia-k8s-ipam api/v1alpha1/cidrpool_test.go, Describe
    "CIDRPoolAllocation", It "gateway mismatch": nv-ipam's controller drops such an entry and
    gives the node the first free prefix again (which may be another one); nicop keeps every
    node's prefix and writes the gateway the spec gives it now."""
    spec = {"cidr": "10.10.0.0/16", "perNodeNetworkPrefix": 24, "gatewayIndex": 10}
    old = [{"nodeName": "node-1", "prefix": "10.10.7.0/24", "gateway": "10.10.7.1"},
           {"nodeName": "node-2", "prefix": "10.10.3.0/24", "gateway": "10.10.3.1"}]
    allocations, _ = carve_cidrpool(spec, old, ["node-1", "node-2"])
    assert allocations == [
        {"nodeName": "node-1", "prefix": "10.10.7.0/24", "gateway": "10.10.7.10"},
        {"nodeName": "node-2", "prefix": "10.10.3.0/24", "gateway": "10.10.3.10"}]


# ------------------------------------------------------------------ helpers_test.go

def ip_ranges(*pairs: tuple[str, str]) -> list[tuple[int, int]]:
    return [(int(ipaddress.ip_address(a)), int(ipaddress.ip_address(b))) for a, b in pairs]


@pytest.mark.parametrize(("case", "given", "merged"), [
    ("empty input", [], []),
    ("ipv4 - single range", [("192.168.1.10", "192.168.1.20")], [("192.168.1.10", "192.168.1.20")]),
    ("ipv4 - duplicate range", [("192.168.1.10", "192.168.1.20")] * 2,
     [("192.168.1.10", "192.168.1.20")]),
    ("ipv4 - non-overlapping ranges",
     [("192.168.1.10", "192.168.1.20"), ("192.168.1.50", "192.168.1.60"),
      ("192.168.1.100", "192.168.1.110")],
     [("192.168.1.10", "192.168.1.20"), ("192.168.1.50", "192.168.1.60"),
      ("192.168.1.100", "192.168.1.110")]),
    ("ipv4 - non-overlapping ranges unsorted",
     [("192.168.1.100", "192.168.1.110"), ("192.168.1.10", "192.168.1.20"),
      ("192.168.1.50", "192.168.1.60")],
     [("192.168.1.10", "192.168.1.20"), ("192.168.1.50", "192.168.1.60"),
      ("192.168.1.100", "192.168.1.110")]),
    ("ipv4 - two overlapping ranges",
     [("192.168.1.10", "192.168.1.30"), ("192.168.1.20", "192.168.1.40")],
     [("192.168.1.10", "192.168.1.40")]),
    ("ipv4 - adjacent ranges merged",
     [("192.168.1.10", "192.168.1.20"), ("192.168.1.21", "192.168.1.30")],
     [("192.168.1.10", "192.168.1.30")]),
    ("ipv4 - touching ranges merged",
     [("192.168.1.10", "192.168.1.20"), ("192.168.1.20", "192.168.1.30")],
     [("192.168.1.10", "192.168.1.30")]),
    ("ipv4 - range contained within another",
     [("192.168.1.30", "192.168.1.50"), ("192.168.1.10", "192.168.1.100")],
     [("192.168.1.10", "192.168.1.100")]),
    ("ipv4 - multiple overlapping ranges",
     [("192.168.1.10", "192.168.1.30"), ("192.168.1.25", "192.168.1.50"),
      ("192.168.1.45", "192.168.1.70")], [("192.168.1.10", "192.168.1.70")]),
    ("ipv4 - complex scenario",
     [("192.168.1.10", "192.168.1.20"), ("192.168.1.21", "192.168.1.30"),
      ("192.168.1.100", "192.168.1.110"), ("192.168.1.200", "192.168.1.220"),
      ("192.168.1.210", "192.168.1.250")],
     [("192.168.1.10", "192.168.1.30"), ("192.168.1.100", "192.168.1.110"),
      ("192.168.1.200", "192.168.1.250")]),
    ("ipv4 - all ranges merge into one",
     [("192.168.1.1", "192.168.1.50"), ("192.168.1.40", "192.168.1.100"),
      ("192.168.1.90", "192.168.1.150"), ("192.168.1.140", "192.168.1.200")],
     [("192.168.1.1", "192.168.1.200")]),
    ("ipv6 - single range", [("2001:db8::10", "2001:db8::20")], [("2001:db8::10", "2001:db8::20")]),
    ("ipv6 - non-overlapping ranges", [("2001:db8::10", "2001:db8::20"),
                                       ("2001:db8::50", "2001:db8::60")],
     [("2001:db8::10", "2001:db8::20"), ("2001:db8::50", "2001:db8::60")]),
    ("ipv6 - two overlapping ranges", [("2001:db8::10", "2001:db8::30"),
                                       ("2001:db8::20", "2001:db8::40")],
     [("2001:db8::10", "2001:db8::40")]),
    ("ipv6 - touching ranges merged", [("2001:db8::10", "2001:db8::20"),
                                       ("2001:db8::20", "2001:db8::30")],
     [("2001:db8::10", "2001:db8::30")]),
    ("ipv6 - adjacent ranges merged", [("2001:db8::10", "2001:db8::20"),
                                       ("2001:db8::21", "2001:db8::30"),
                                       ("2001:db8::31", "2001:db8::40")],
     [("2001:db8::10", "2001:db8::40")]),
    ("ipv6 - range contained within another", [("2001:db8::10", "2001:db8::100"),
                                               ("2001:db8::30", "2001:db8::50")],
     [("2001:db8::10", "2001:db8::100")]),
    ("ipv6 - complex scenario",
     [("2001:db8::10", "2001:db8::20"), ("2001:db8::15", "2001:db8::30"),
      ("2001:db8::100", "2001:db8::110"), ("2001:db8::200", "2001:db8::220"),
      ("2001:db8::210", "2001:db8::250")],
     [("2001:db8::10", "2001:db8::30"), ("2001:db8::100", "2001:db8::110"),
      ("2001:db8::200", "2001:db8::250")]),
    ("ipv6 - unsorted input", [("2001:db8::100", "2001:db8::110"),
                               ("2001:db8::10", "2001:db8::20")],
     [("2001:db8::10", "2001:db8::20"), ("2001:db8::100", "2001:db8::110")]),
])
def test_exclusions_are_merged_before_blocks_are_judged(
        case: str, given: list[tuple[str, str]], merged: list[tuple[str, str]]) -> None:
    """Mellanox/nvidia-k8s-ipam api/v1alpha1/helpers_test.go, Describe "Helpers", DescribeTable
    "MergeExcludeRanges", the Entry named `case`: the exclusions the controller joins before
    asking whether a block is excluded whole (its entries with unparsable addresses cannot
    reach it: the API server and the pool's validation refuse those)."""
    assert merge_ranges(ip_ranges(*given)) == ip_ranges(*merged), case
