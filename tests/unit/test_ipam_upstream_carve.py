"""Node blocks carved from upstream nv-ipam's own test inputs, with upstream's outcomes.

Every case names the upstream test it comes from (github.com/Mellanox/nvidia-k8s-ipam). Upstream
hands blocks to nodes one at a time in call order; nicop carves all selected nodes at once in name
order, so the node names below sort in upstream's call order.
"""

from __future__ import annotations

import ipaddress
import time
from typing import Any

import pytest

from nicop.operator.ipam import InvalidPool, carve_cidrpool, carve_ippool

NODES = ["node1", "node2", "node3", "node4"]


def ranges(allocations: list[dict[str, str]]) -> dict[str, str]:
    return {a["nodeName"]: f"{a['startIP']}-{a['endIP']}" for a in allocations}


def pool1(**spec: Any) -> dict[str, Any]:
    """getPool1() of pkg/ipam-controller/allocator/allocator_test.go."""
    return {"subnet": "192.168.0.0/24", "perNodeBlockSize": 15, "gateway": "192.168.0.1", **spec}


def pool2(**spec: Any) -> dict[str, Any]:
    """getPool2() of the same file: one address per node, the gateway in the middle."""
    return {"subnet": "172.16.0.0/16", "perNodeBlockSize": 1, "gateway": "172.16.0.3", **spec}


def test_blocks_in_order_and_a_single_address_block_is_never_the_gateway() -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-controller/allocator/allocator_test.go, Describe
    "Allocator", It "Allocate": pool1 gives .1-.15, .16-.30, ...; pool2
    (perNodeBlockSize 1) skips its gateway 172.16.0.3; asked again, every node keeps its
    block."""
    assert ranges(carve_ippool(pool1(), [], NODES)[0]) == {
        "node1": "192.168.0.1-192.168.0.15", "node2": "192.168.0.16-192.168.0.30",
        "node3": "192.168.0.31-192.168.0.45", "node4": "192.168.0.46-192.168.0.60"}
    assert ranges(carve_ippool(pool2(), [], NODES)[0]) == {
        "node1": "172.16.0.1-172.16.0.1", "node2": "172.16.0.2-172.16.0.2",
        "node3": "172.16.0.4-172.16.0.4", "node4": "172.16.0.5-172.16.0.5"}
    for pool in (pool1(), pool2()):
        first, _ = carve_ippool(pool, [], NODES)
        assert carve_ippool(pool, first, NODES)[0] == first


def test_a_block_of_a_node_no_longer_selected_is_given_again() -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-controller/allocator/allocator_test.go, Describe
    "Allocator", It "Allocate with Pool Status containing not selected Node": the first block,
    held by a node the selector no longer picks, goes to node2; node1 keeps its own."""
    stored = [{"nodeName": "not-in-selector", "startIP": "192.168.0.1", "endIP": "192.168.0.15"},
              {"nodeName": "node1", "startIP": "192.168.0.16", "endIP": "192.168.0.30"}]
    assert ranges(carve_ippool(pool1(), stored, ["node1", "node2"])[0]) == {
        "node1": "192.168.0.16-192.168.0.30", "node2": "192.168.0.1-192.168.0.15"}


def test_a_block_stored_for_two_nodes_stays_with_the_first() -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-controller/allocator/allocator_test.go, Describe
    "Allocator", It "Allocate with Pool Status containing duplicate StartIP"."""
    stored = [{"nodeName": "node1", "startIP": "192.168.0.1", "endIP": "192.168.0.15"},
              {"nodeName": "node2", "startIP": "192.168.0.1", "endIP": "192.168.0.15"}]
    assert ranges(carve_ippool(pool1(), stored, ["node1", "node2"])[0]) == {
        "node1": "192.168.0.1-192.168.0.15", "node2": "192.168.0.16-192.168.0.30"}


def test_no_free_ranges() -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-controller/allocator/allocator_test.go, Describe
    "Allocator", Its "No free ranges" and "return NoFreeRanges in case if IP is too
    large"."""
    allocations, left = carve_ippool(pool1(perNodeBlockSize=200), [], ["node1", "node2"])
    assert ranges(allocations) == {"node1": "192.168.0.1-192.168.0.200"} and left == ["node2"]
    top = {"subnet": "255.255.255.0/24", "perNodeBlockSize": 200, "gateway": "255.255.255.1"}
    allocations, left = carve_ippool(top, [], ["node1", "node2"])
    assert ranges(allocations) == {"node1": "255.255.255.1-255.255.255.200"} and left == ["node2"]


def test_a_stored_block_on_the_gateway_is_dropped() -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-controller/allocator/allocator_test.go, Describe
    "Allocator", It "Load single IP range": node2's stored 172.16.0.3 is pool2's
    gateway, so node2 gets a new address; node1 and node3 keep theirs."""
    stored = [{"nodeName": "node1", "startIP": "172.16.0.1", "endIP": "172.16.0.1"},
              {"nodeName": "node2", "startIP": "172.16.0.3", "endIP": "172.16.0.3"},
              {"nodeName": "node3", "startIP": "172.16.0.4", "endIP": "172.16.0.4"}]
    assert ranges(carve_ippool(pool2(), stored, ["node1", "node2", "node3"])[0]) == {
        "node1": "172.16.0.1-172.16.0.1", "node2": "172.16.0.2-172.16.0.2",
        "node3": "172.16.0.4-172.16.0.4"}


@pytest.mark.parametrize(("start", "end", "loaded"), [
    ("192.168.0.16", "192.168.0.30", True),  # valid data
    ("1.1.1.1", "1.1.1.2", False),  # different subnet
    ("<nil>", "192.168.0.30", False),  # no startIP
    ("192.168.0.16", "224.0.0.2", False),  # no endIP (net.IPv4allrouter)
    ("192.168.0.1", "192.168.0.1", False),  # start and end IPs are the same
    ("192.168.1.1", "192.168.1.15", False),  # IPs out of subnet
    ("192.168.0.1", "192.168.0.15", False),  # duplicate range
    ("192.168.0.17", "192.168.0.31", False),  # ip invalid offset
    ("192.168.0.16", "192.168.0.25", False),  # bad IP count
])
def test_which_stored_blocks_a_node_keeps(start: str, end: str, loaded: bool) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-controller/allocator/allocator_test.go, Describe
    "Allocator", It "ConfigureAndLoadAllocations - Data load test", each of its
    cases: node1 holds .1-.15, node2's stored block is kept only when it is still a valid, free
    block of the pool (a missing startIP is Go's "<nil>", a wrong endIP 224.0.0.2)."""
    stored = [{"nodeName": "node1", "startIP": "192.168.0.1", "endIP": "192.168.0.15"},
              {"nodeName": "node2", "startIP": start, "endIP": end}]
    got = ranges(carve_ippool(pool1(), stored, ["node1", "node2"])[0])["node2"]
    assert (got == f"{start}-{end}") is loaded


EXCL = {"subnet": "192.168.0.0/24", "perNodeBlockSize": 10, "gateway": "192.168.0.1"}


def ex(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"startIP": a, "endIP": b} for a, b in pairs]


def idx(*pairs: tuple[int, int]) -> list[dict[str, int]]:
    return [{"startIndex": a, "endIndex": b} for a, b in pairs]


@pytest.mark.parametrize(("case", "spec", "first"), [
    ("partial exclusion within range - range is not excluded",
     {**EXCL, "exclusions": ex(("192.168.0.3", "192.168.0.5"))}, "192.168.0.1-192.168.0.10"),
    ("single exclusion covering entire first range - skips to next range",
     {**EXCL, "exclusions": ex(("192.168.0.1", "192.168.0.10"))}, "192.168.0.11-192.168.0.20"),
    ("exclusion larger than range - skips the range",
     {**EXCL, "exclusions": ex(("192.168.0.0", "192.168.0.15"))}, "192.168.0.11-192.168.0.20"),
    ("multiple exclusions that merge to cover entire range - skips the range",
     {**EXCL, "exclusions": ex(("192.168.0.1", "192.168.0.5"), ("192.168.0.4", "192.168.0.10"))},
     "192.168.0.11-192.168.0.20"),
    ("multiple non-adjacent exclusions not covering entire range - range is not excluded",
     {**EXCL, "exclusions": ex(("192.168.0.1", "192.168.0.3"), ("192.168.0.5", "192.168.0.10"))},
     "192.168.0.1-192.168.0.10"),
    ("exclusion outside of range - range is not excluded",
     {**EXCL, "exclusions": ex(("192.168.0.100", "192.168.0.110"))}, "192.168.0.1-192.168.0.10"),
    ("per-node exclusion covering entire range - no free ranges",
     {**EXCL, "perNodeExclusions": idx((0, 9))}, None),
    ("per-node exclusion partial - range is not excluded",
     {**EXCL, "perNodeExclusions": idx((0, 8))}, "192.168.0.1-192.168.0.10"),
    ("mix of pool-level and per-node exclusions covering entire range - skips the range",
     {**EXCL, "exclusions": ex(("192.168.0.1", "192.168.0.5")), "perNodeExclusions": idx((5, 9))},
     "192.168.0.11-192.168.0.20"),
    ("mix of pool-level and per-node exclusions not covering entire range - range is not "
     "excluded",
     {**EXCL, "exclusions": ex(("192.168.0.1", "192.168.0.3")), "perNodeExclusions": idx((4, 9))},
     "192.168.0.1-192.168.0.10"),
    ("multiple consecutive ranges excluded - skips all excluded ranges",
     {**EXCL, "exclusions": ex(("192.168.0.1", "192.168.0.30"))}, "192.168.0.31-192.168.0.40"),
    ("all ranges excluded - returns no free ranges error",
     {**EXCL, "subnet": "192.168.0.0/16", "exclusions": ex(("192.168.0.0", "192.168.255.255"))},
     None),
    ("ipv6 - single exclusion covering entire first range - skips to next range",
     {"subnet": "2001:db8::/120", "perNodeBlockSize": 10, "gateway": "2001:db8::1",
      "exclusions": ex(("2001:db8::1", "2001:db8::a"))}, "2001:db8::b-2001:db8::14"),
    ("ipv6 - partial exclusion - range is not excluded",
     {"subnet": "2001:db8::/120", "perNodeBlockSize": 10, "gateway": "2001:db8::1",
      "exclusions": ex(("2001:db8::3", "2001:db8::5"))}, "2001:db8::1-2001:db8::a"),
    ("ipv6 - per-node exclusion covering entire range - no free range error",
     {"subnet": "2001:db8::/120", "perNodeBlockSize": 10, "gateway": "2001:db8::1",
      "perNodeExclusions": idx((0, 9))}, None),
    ("ipv6 - multiple exclusions merging to cover range - skips the range",
     {"subnet": "2001:db8::/120", "perNodeBlockSize": 10, "gateway": "2001:db8::1",
      "exclusions": ex(("2001:db8::1", "2001:db8::5"), ("2001:db8::4", "2001:db8::a"))},
     "2001:db8::b-2001:db8::14"),
    ("ipv6 - all ranges excluded - returns no free ranges error",
     {"subnet": "2001:db8::/120", "perNodeBlockSize": 10, "gateway": "2001:db8::1",
      "exclusions": ex(("2001:db8::", "2001:db8::ff"))}, None),
])
def test_blocks_entirely_excluded_are_skipped(case: str, spec: dict[str, Any],
                                               first: str | None) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-controller/allocator/allocator_test.go, Describe
    "Allocator", Context "Allocate with exclusions", the It named `case`."""
    allocations, left = carve_ippool(spec, [], ["node1"])
    assert (ranges(allocations).get("node1"), left) == (first, [] if first else ["node1"]), case


def test_the_block_after_an_excluded_one_goes_to_the_next_node() -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-controller/allocator/allocator_test.go, Describe
    "Allocator", Context "Allocate with exclusions", It "multiple allocations with
    exclusions - skips the excluded range and allocates after it"."""
    spec = {**EXCL, "exclusions": ex(("192.168.0.11", "192.168.0.20"))}
    assert ranges(carve_ippool(spec, [], ["node1", "node2"])[0]) == {
        "node1": "192.168.0.1-192.168.0.10", "node2": "192.168.0.21-192.168.0.30"}


def test_a_stored_block_that_is_entirely_excluded_is_dropped() -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-controller/allocator/allocator_test.go, Describe
    "Allocator", Context "load with exclusions", It "load allocation with entirely
    excluded range is ignored"."""
    spec = {**EXCL, "exclusions": ex(("192.168.0.1", "192.168.0.10"))}
    stored = [{"nodeName": "node1", "startIP": "192.168.0.1", "endIP": "192.168.0.10"}]
    assert ranges(carve_ippool(spec, stored, ["node1"])[0]) == {
        "node1": "192.168.0.11-192.168.0.20"}


def test_5000_nodes_start_after_the_exclusion() -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-controller/allocator/allocator_test.go, Describe
    "Allocator", Context "allocate for 5000 nodes", It "allocates expected ranges":
    10.0.0.0/8, blocks of 10, 10.0.0.1 to
    10.5.255.255 excluded; node i gets 10.5.255.251 + 10*i (the first block that is not entirely
    excluded), and the long exclusion is jumped over, not walked block by block."""
    spec = {"subnet": "10.0.0.0/8", "perNodeBlockSize": 10, "gateway": "10.0.0.1",
            "exclusions": ex(("10.0.0.1", "10.5.255.255"))}
    nodes = [f"node-{i:04d}" for i in range(5000)]
    began = time.monotonic()
    allocations, left = carve_ippool(spec, [], nodes)
    took = time.monotonic() - began
    base = ipaddress.ip_address("10.5.255.251")
    assert left == []
    assert ranges(allocations) == {
        n: f"{base + 10 * i}-{base + 10 * i + 9}" for i, n in enumerate(nodes)}
    assert took < 5, f"carving 5000 nodes took {took:.1f} s"
    again, _ = carve_ippool(spec, allocations[::-1], nodes)
    assert again == allocations, "every node keeps its block"


@pytest.mark.parametrize(("case", "spec", "nodes", "expected", "left"), [
    ("/32 pool - can allocate if no gw", {"subnet": "10.10.10.10/32", "perNodeBlockSize": 1},
     ["node1", "node2"], {"node1": "10.10.10.10-10.10.10.10"}, ["node2"]),
    ("/32 pool - can't allocate if gw set",
     {"subnet": "10.10.10.10/32", "perNodeBlockSize": 1, "gateway": "10.10.10.10"},
     ["node1", "node2"], {}, ["node1", "node2"]),
    ("/31 pool - can allocate 2 ips", {"subnet": "10.10.10.10/31", "perNodeBlockSize": 2},
     ["node1", "node2"], {"node1": "10.10.10.10-10.10.10.11"}, ["node2"]),
    ("/31 pool - can allocate 1 ip for 2 nodes",
     {"subnet": "10.10.10.10/31", "perNodeBlockSize": 1}, ["node1", "node2"],
     {"node1": "10.10.10.10-10.10.10.10", "node2": "10.10.10.11-10.10.10.11"}, []),
])
def test_point_to_point_and_single_address_pools(case: str, spec: dict[str, Any],
                                                 nodes: list[str], expected: dict[str, str],
                                                 left: list[str]) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-controller/allocator/allocator_test.go, Describe
    "Allocator", Context "small pools", the It named `case`: /31 and /32 pools use
    their network address, perNodeBlockSize 1 is valid, and a single-address block is never the
    gateway."""
    allocations, got_left = carve_ippool(spec, [], nodes)
    assert (ranges(allocations), got_left) == (expected, left), case


def ippool_256(**spec: Any) -> dict[str, Any]:
    """getTestIPPool() of pkg/ipam-controller/controllers/ippool/ippool_test.go."""
    return {"subnet": "10.10.0.0/16", "perNodeBlockSize": 256, "gateway": "10.10.0.1", **spec}


@pytest.mark.parametrize(("case", "spec", "expected"), [
    ("should reconcile IPPool", ippool_256(),
     {"node-1": "10.10.0.1-10.10.1.0", "node-2": "10.10.1.1-10.10.2.0"}),
    ("should reconcile IPPool with exclusions - exclude range",
     ippool_256(exclusions=ex(("10.10.0.0", "10.10.0.255"), ("10.10.1.0", "10.10.1.100"))),
     {"node-1": "10.10.1.1-10.10.2.0", "node-2": "10.10.2.1-10.10.3.0"}),
    ("should reconcile IPPool with exclusions - exclude index",
     ippool_256(perNodeExclusions=idx((0, 127))),
     {"node-1": "10.10.0.1-10.10.1.0", "node-2": "10.10.1.1-10.10.2.0"}),
    ("should reconcile IPPool with exclusions - exclude range and index",
     ippool_256(exclusions=ex(("10.10.0.0", "10.10.1.0"), ("10.10.1.1", "10.10.1.128")),
                perNodeExclusions=idx((128, 255))),
     {"node-1": "10.10.2.1-10.10.3.0", "node-2": "10.10.3.1-10.10.4.0"}),
])
def test_ippool_blocks_entirely_excluded_are_skipped(case: str, spec: dict[str, Any],
                                                     expected: dict[str, str]) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-controller/controllers/ippool/ippool_test.go, Describe
    "IPPool controller", the It named `case`: blocks of 256 from 10.10.0.1; one whose
    addresses are all excluded, by exclusions and perNodeExclusions together, goes to no
    node."""
    allocations, left = carve_ippool(spec, [], ["node-1", "node-2"])
    assert (ranges(allocations), left) == (expected, []), case


def test_point_to_point_pool_keeps_stored_blocks() -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-controller/allocator/allocator_test.go, Describe
    "Allocator", Context "small pools", It "/31 pool - load allocations"."""
    spec = {"subnet": "10.10.10.10/31", "perNodeBlockSize": 1}
    stored = [{"nodeName": "node1", "startIP": "10.10.10.10", "endIP": "10.10.10.10"},
              {"nodeName": "node2", "startIP": "10.10.10.11", "endIP": "10.10.10.11"}]
    assert ranges(carve_ippool(spec, stored, ["node1", "node2"])[0]) == {
        "node1": "10.10.10.10-10.10.10.10", "node2": "10.10.10.11-10.10.10.11"}


def test_a_block_larger_than_a_point_to_point_pool_is_refused() -> None:
    """Mellanox/nvidia-k8s-ipam api/v1alpha1/helpers.go GetPossibleIPCount, as ippool_validate.go
    uses it: a /31 holds 2 addresses, a /32 one."""
    with pytest.raises(InvalidPool, match=r"perNodeBlockSize: 3 is more than the 10\.10\.10\."):
        carve_ippool({"subnet": "10.10.10.10/31", "perNodeBlockSize": 3}, [], ["node1"])


def cidrpool(**spec: Any) -> dict[str, Any]:
    """getTestCIDRPool() of pkg/ipam-controller/controllers/cidrpool/cidrpool_test.go."""
    return {"cidr": "10.10.0.0/16", "gatewayIndex": 1, "perNodeNetworkPrefix": 24, **spec}


def prefixes(allocations: list[dict[str, str]]) -> dict[str, str]:
    return {a["nodeName"]: a["prefix"] for a in allocations}


@pytest.mark.parametrize(("case", "spec", "expected"), [
    ("should reconcile CIDRPool", cidrpool(),
     {"node-1": "10.10.0.0/24", "node-2": "10.10.1.0/24"}),
    ("should reconcile CIDRPool with exclusions - exclude range",
     cidrpool(exclusions=ex(("10.10.0.0", "10.10.0.255"), ("10.10.1.0", "10.10.1.100"))),
     {"node-1": "10.10.1.0/24", "node-2": "10.10.2.0/24"}),
    ("should reconcile CIDRPool with exclusions - exclude index",
     cidrpool(perNodeExclusions=idx((0, 127))),
     {"node-1": "10.10.0.0/24", "node-2": "10.10.1.0/24"}),
    ("should reconcile CIDRPool with exclusions - exclude range and index",
     cidrpool(exclusions=ex(("10.10.0.0", "10.10.0.255"), ("10.10.1.0", "10.10.1.127")),
              perNodeExclusions=idx((128, 255))),
     {"node-1": "10.10.2.0/24", "node-2": "10.10.3.0/24"}),
])
def test_cidrpool_prefixes_entirely_excluded_are_skipped(case: str, spec: dict[str, Any],
                                                         expected: dict[str, str]) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-controller/controllers/cidrpool/cidrpool_test.go,
    Describe "CIDRPool controller", the It named `case`."""
    allocations, left = carve_cidrpool(spec, [], ["node-1", "node-2"])
    assert (prefixes(allocations), left) == (expected, []), case


@pytest.mark.parametrize(("case", "spec", "expected"), [
    ("reports exhaustion after a /64-sized excluded suffix",
     {"cidr": "2001:db8::/64", "perNodeNetworkPrefix": 128,
      "exclusions": ex(("2001:db8::1", "2001:db8::ffff:ffff:ffff:ffff"))},
     {"node-1": "2001:db8::/128"}),
    ("allocates the partially excluded boundary prefix",
     {"cidr": "2001:db8::/64", "perNodeNetworkPrefix": 80,
      "exclusions": ex(("2001:db8::", "2001:db8:0:0:abcd::7fff"))},
     {"node-1": "2001:db8:0:0:abcd::/80", "node-2": "2001:db8:0:0:abce::/80"}),
    ("reports exhaustion when per-node exclusions cover every prefix",
     {"cidr": "2001:db8::/64", "perNodeNetworkPrefix": 128, "perNodeExclusions": idx((0, 0))},
     {}),
])
def test_cidrpool_ipv6_exhaustion(case: str, spec: dict[str, Any],
                                  expected: dict[str, str]) -> None:
    """nicop's own cases, at IPv6 scale, of the rule of Mellanox/nvidia-k8s-ipam
    pkg/ipam-controller/allocator/allocator_test.go, Describe "Allocator", Context "Allocate
    with exclusions" (a prefix entirely excluded is given to no node): an exclusion of 2^64
    addresses is jumped over, not walked prefix by prefix, and a prefix excluded only in part is
    given out."""
    allocations, left = carve_cidrpool(spec, [], ["node-1", "node-2"])
    assert prefixes(allocations) == expected, case
    assert left == [n for n in ("node-1", "node-2") if n not in expected]


def test_a_stored_prefix_that_is_entirely_excluded_is_dropped() -> None:
    """The rule of Mellanox/nvidia-k8s-ipam pkg/ipam-controller/allocator/allocator_test.go,
    Context "load with exclusions", It "load allocation with entirely excluded range is
    ignored", on the pool of pkg/ipam-controller/controllers/cidrpool/cidrpool_test.go, It
    "should reconcile CIDRPool with exclusions - exclude range": node-1's stored 10.10.0.0/24
    is excluded."""
    spec = cidrpool(exclusions=ex(("10.10.0.0", "10.10.0.255")))
    stored = [{"nodeName": "node-1", "prefix": "10.10.0.0/24", "gateway": "10.10.0.1"}]
    assert prefixes(carve_cidrpool(spec, stored, ["node-1"])[0]) == {"node-1": "10.10.1.0/24"}


@pytest.mark.parametrize(("case", "cidr", "length", "expected", "all_of_them"), [
    ("Valid - single subnet IPv4", "192.168.0.0/24", 24, ["192.168.0.0/24"], True),
    ("Valid - single subnet IPv6", "2002:0:0:1234::/64", 64, ["2002:0:0:1234::/64"], True),
    ("valid - IPv4", "192.168.4.0/23", 25,
     ["192.168.4.0/25", "192.168.4.128/25", "192.168.5.0/25", "192.168.5.128/25"], True),
    ("valid - IPv6", "2002:0:0:1234::/64", 124,
     ["2002:0:0:1234::/124", "2002:0:0:1234::10/124", "2002:0:0:1234::20/124"], False),
    ("valid - large IPv6 subnet (overflow test)", "::/0", 127, ["::/127", "::2/127", "::4/127"],
     False),
    ("valid - single IP IPv4 subnet", "192.168.0.0/16", 32,
     ["192.168.0.0/32", "192.168.0.1/32", "192.168.0.2/32"], False),
    ("valid - single IP IPv6 subnet", "2002:0:0:1234::/64", 128,
     ["2002:0:0:1234::/128", "2002:0:0:1234::1/128", "2002:0:0:1234::2/128"], False),
    ("valid - single IP IPv4 subnet, point to point network", "192.168.0.0/31", 32,
     ["192.168.0.0/32", "192.168.0.1/32"], True),
])
def test_cidrpool_prefixes_in_order(case: str, cidr: str, length: int, expected: list[str],
                                    all_of_them: bool) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ip/cidr_test.go, Describe "CIDR functions", Context
    "GetSubnetGen", the It named `case`: the prefixes a CIDRPool gives nodes, one after the
    other; where the case lists all of them, one node more gets none."""
    nodes = [f"node{i}" for i in range(len(expected) + (1 if all_of_them else 0))]
    allocations, left = carve_cidrpool({"cidr": cidr, "perNodeNetworkPrefix": length}, [], nodes)
    assert [a["prefix"] for a in allocations] == expected, case
    assert left == nodes[len(expected):]


@pytest.mark.parametrize(("case", "length"), [
    ("Invalid args - prefix is larger then network", 8),
    ("Invalid args - prefix is too small for IPv4", 120),
])
def test_cidrpool_prefix_length_outside_the_cidr(case: str, length: int) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ip/cidr_test.go, Describe "CIDR functions", Context
    "GetSubnetGen", the It named `case`: no prefix of that length comes from 192.168.0.0/16;
    the pool is refused naming the field and its bounds."""
    with pytest.raises(InvalidPool) as e:
        carve_cidrpool({"cidr": "192.168.0.0/16", "perNodeNetworkPrefix": length}, [], ["n"])
    assert str(e.value) == (f"spec.perNodeNetworkPrefix: {length} must be between 16 (the prefix "
                            "length of spec.cidr) and 32")
