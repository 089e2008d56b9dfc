"""A node's view of IPPools and CIDRPools on upstream's own cases: the block, gateway,
exclusions and routes the node allocates with, as the store records them (nv-ipam's pool
config snapshot), and when the node refuses a pool.

Every case names the upstream test it comes from in Mellanox/nvidia-k8s-ipam. Upstream's node
controllers run against envtest; here the node's informer handler is given the objects the API
server would send (tests/integration/test_ipam_pools.py runs the node against the real one).
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest

from nicop.api.nvipam_rules import gateway_for, possible_ips
from nicop.cni.pools import KubePools, UnusableBlock, node_pool_config
from nicop.cni.spec import CniError, Code
from nicop.kube.informer import Informer

NODE = "test-node"


def ippool(block: tuple[str, str], subnet: str = "192.168.0.0/24", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "test-pool", "namespace": "test-ns"},
            "spec": {"subnet": subnet, "perNodeBlockSize": 100, **spec},
            "status": {"allocations": [{"nodeName": NODE, "startIP": block[0],
                                        "endIP": block[1]}]}}


def cidrpool(allocation: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "test-pool", "namespace": "test-ns"},
            "spec": {"cidr": "192.168.0.0/16", "perNodeNetworkPrefix": 24, **spec},
            "status": {"allocations": [{"nodeName": NODE, **allocation}]}}


def snapshot(kind: str, pool: dict[str, Any]) -> dict[str, Any]:
    cfg = node_pool_config(kind, pool, NODE)
    assert cfg is not None
    return dict(json.loads(cfg.snapshot()))


def ranges(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"startIP": a, "endIP": b} for a, b in pairs]


def idx(*pairs: tuple[int, int]) -> list[dict[str, int]]:
    return [{"startIndex": a, "endIndex": b} for a, b in pairs]


# ------------------------------------------------------------------ IPPool per-node exclusions

@pytest.mark.parametrize(("case", "exclusions", "block", "expected"), [
    ("empty exclusions", [], ("192.168.0.1", "192.168.0.100"), []),
    ("single range", idx((0, 10)), ("192.168.0.1", "192.168.0.100"),
     ranges(("192.168.0.1", "192.168.0.11"))),
    ("multiple ranges", idx((0, 10), (50, 60)), ("192.168.0.1", "192.168.0.100"),
     ranges(("192.168.0.1", "192.168.0.11"), ("192.168.0.51", "192.168.0.61"))),
    ("range at the end of allocation", idx((90, 99)), ("192.168.0.1", "192.168.0.100"),
     ranges(("192.168.0.91", "192.168.0.100"))),
    ("range exceeds allocation - should be clamped", idx((90, 200)),
     ("192.168.0.1", "192.168.0.100"), ranges(("192.168.0.91", "192.168.0.100"))),
    ("range completely outside allocation - should be skipped", idx((200, 300)),
     ("192.168.0.1", "192.168.0.100"), []),
    ("IPv6 addresses", idx((0, 5), (250, 255)), ("2001:db8::1", "2001:db8::100"),
     ranges(("2001:db8::1", "2001:db8::6"), ("2001:db8::fb", "2001:db8::100"))),
    ("single IP exclusion (start equals end)", idx((5, 5)), ("192.168.0.1", "192.168.0.100"),
     ranges(("192.168.0.6", "192.168.0.6"))),
])
def test_ippool_per_node_exclusions(case: str, exclusions: list[dict[str, int]],
                                    block: tuple[str, str],
                                    expected: list[dict[str, str]]) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/controllers/ippool/ippool_test.go, Describe
    "IPPool", DescribeTable "buildPerNodeExclusions", the Entry named `case` (with api/v1alpha1
    helpers_test.go's ExcludeIndexRangeToExcludeRange and ClampExcludeRanges, which it uses):
    perNodeExclusions count from the node's startIP and are clamped to its block; the store
    records them in nv-ipam's pool config."""
    subnet = "2001:db8::/64" if ":" in block[0] else "192.168.0.0/24"
    got = snapshot("ippool", ippool(block, subnet, perNodeBlockSize=256,
                                    perNodeExclusions=exclusions))
    assert got["exclusions"] == expected, case


@pytest.mark.parametrize(("case", "block"), [
    ("invalid start IP", ("invalid", "192.168.0.100")),
    ("invalid end IP", ("192.168.0.1", "invalid")),
])
def test_a_block_that_does_not_parse_is_refused(case: str, block: tuple[str, str]) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/controllers/ippool/ippool_test.go, Describe
    "IPPool", DescribeTable "buildPerNodeExclusions", Entry `case`: no exclusions come of it,
    and the node does not use such a block at all."""
    with pytest.raises(UnusableBlock, match="does not parse"):
        node_pool_config("ippool", ippool(block, perNodeExclusions=idx((0, 10))), NODE)


# ------------------------------------------------------------------ CIDRPool exclusions

@pytest.mark.parametrize(("case", "exclusions", "prefix", "expected"), [
    ("empty exclusions", [], "192.168.0.0/24", []),
    ("single range - from subnet start", idx((0, 10)), "192.168.0.0/24",
     ranges(("192.168.0.0", "192.168.0.10"))),
    ("exclude first IP after network address", idx((1, 1)), "192.168.0.0/24",
     ranges(("192.168.0.1", "192.168.0.1"))),
    ("multiple ranges", idx((0, 10), (200, 210)), "192.168.0.0/24",
     ranges(("192.168.0.0", "192.168.0.10"), ("192.168.0.200", "192.168.0.210"))),
    ("range exceeds allocation - should be clamped", idx((250, 255)), "192.168.0.0/24",
     ranges(("192.168.0.250", "192.168.0.254"))),
    ("IPv6 - single range from subnet start", idx((0, 5)), "2001:db8::/120",
     ranges(("2001:db8::", "2001:db8::5"))),
    ("consistent with gatewayIndex: index 1 = first IP", idx((1, 11)), "192.168.0.0/24",
     ranges(("192.168.0.1", "192.168.0.11"))),
])
def test_cidrpool_per_node_exclusions(case: str, exclusions: list[dict[str, int]], prefix: str,
                                      expected: list[dict[str, str]]) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/controllers/cidrpool/cidrpool_test.go, Describe
    "CIDRPool", DescribeTable "buildPerNodeExclusions", the Entry named `case`: indexes count
    from the prefix's network address, as gatewayIndex does, and stop at its last host (the
    entry past the prefix is clamped at 255 here: see the test below for 300)."""
    cidr, length = ("2001:db8::/64", 120) if ":" in prefix else ("192.168.0.0/16", 24)
    got = snapshot("cidrpool", cidrpool({"prefix": prefix}, cidr=cidr,
                                        perNodeNetworkPrefix=length,
                                        perNodeExclusions=exclusions))
    assert got["exclusions"] == expected, case


def test_cidrpool_per_node_exclusions_past_the_prefix() -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/controllers/cidrpool/cidrpool_test.go, Describe
    "CIDRPool", DescribeTable "buildPerNodeExclusions", Entries "range exceeds allocation -
    should be clamped" (250-300) and "range completely outside allocation - should be skipped"
    (300-400) of a /24: the node's controller validates the pool first (cidrpool.go Reconcile)
    and ignores it, since such indexes are not of a /24 (api/v1alpha1
    validatePerNodeExclusions); so does nicop's node, saying why."""
    for exclusions in (idx((250, 300)), idx((300, 400))):
        with pytest.raises(UnusableBlock) as e:
            node_pool_config("cidrpool", cidrpool({"prefix": "192.168.0.0/24"},
                                                  perNodeExclusions=exclusions), NODE)
        assert str(e.value).startswith("the spec is invalid: spec.perNodeExclusions[0]")
        assert "is outside of the per-node subnet range (max: 255)" in str(e.value)


@pytest.mark.parametrize(("case", "exclusions", "prefix", "expected"), [
    ("start and end are part of the subnet",
     ranges(("192.168.0.10", "192.168.0.20"), ("192.168.0.30", "192.168.0.40")),
     "192.168.0.0/24",
     ranges(("192.168.0.10", "192.168.0.20"), ("192.168.0.30", "192.168.0.40"))),
    ("start and end are out of the subnet",
     ranges(("192.168.100.10", "192.168.100.20"), ("192.168.0.30", "192.168.0.40")),
     "192.168.0.0/24", ranges(("192.168.0.30", "192.168.0.40"))),
    ("start is out of the subnet", ranges(("192.168.0.30", "192.168.1.40")), "192.168.1.0/24",
     ranges(("192.168.1.1", "192.168.1.40"))),
    ("end is out of the subnet", ranges(("192.168.1.30", "192.168.2.40")), "192.168.1.0/24",
     ranges(("192.168.1.30", "192.168.1.254"))),
    ("(nicop) spanning the whole prefix", ranges(("192.168.0.30", "192.168.2.40")),
     "192.168.1.0/24", ranges(("192.168.1.1", "192.168.1.254"))),
])
def test_cidrpool_exclusions_for_the_nodes_prefix(case: str, exclusions: list[dict[str, str]],
                                                  prefix: str,
                                                  expected: list[dict[str, str]]) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/controllers/cidrpool/cidrpool_test.go, Describe
    "CIDRPool", DescribeTable "buildExclusions", the Entry named `case`: the pool's exclusions
    cut to the node's prefix. nv-ipam drops an exclusion with neither end in the prefix, also
    one that spans it whole (and then hands out its addresses, e.g. from a static allocation);
    nicop keeps that one, cut to the prefix."""
    got = snapshot("cidrpool", cidrpool({"prefix": prefix}, exclusions=exclusions))
    assert got["exclusions"] == expected, case


# ------------------------------------------------------------------ Context "Controller tests"

def test_cidrpool_config_of_the_node() -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/controllers/cidrpool/cidrpool_test.go, Describe
    "CIDRPool", Context "Controller tests", It "Valid pool config": the pool config the node
    uses and records, byte for byte as nv-ipam's (Go's json.Marshal of its pool.Pool)."""
    pool = cidrpool({"gateway": "10.10.10.1", "prefix": "10.10.10.0/24"}, cidr="10.10.0.0/16",
                    gatewayIndex=1, exclusions=ranges(("10.10.33.10", "10.10.33.20"),
                                                      ("10.10.10.10", "10.10.10.20")),
                    defaultGateway=True, routes=[{"dst": "5.5.5.5/32"}])
    cfg = node_pool_config("cidrpool", pool, NODE)
    assert cfg is not None and cfg.snapshot() == (
        '{"subnet":"10.10.10.0/24","startIP":"10.10.10.1","endIP":"10.10.10.254",'
        '"gateway":"10.10.10.1","exclusions":[{"startIP":"10.10.10.10","endIP":"10.10.10.20"}],'
        '"routes":[{"dst":"5.5.5.5/32"}],"defaultGateway":true}')
    assert cfg.key == "cidrpool/test-pool"


def test_cidrpool_config_of_a_single_address_prefix() -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/controllers/cidrpool/cidrpool_test.go, Describe
    "CIDRPool", Context "Controller tests", It "Valid pool config /32 cidr"."""
    pool = cidrpool({"prefix": "10.10.10.12/32"}, cidr="10.10.10.0/24", perNodeNetworkPrefix=32)
    cfg = node_pool_config("cidrpool", pool, NODE)
    assert cfg is not None and cfg.snapshot() == (
        '{"subnet":"10.10.10.12/32","startIP":"10.10.10.12","endIP":"10.10.10.12",'
        '"gateway":"","exclusions":[],"routes":[],"defaultGateway":false}')


def kube_pools() -> KubePools:
    class Manager:
        def informer(self, res: Any, namespace: str | None = None) -> Informer:
            return Informer(None, res, namespace)  # type: ignore[arg-type]

    kube = KubePools(Manager(), "test-ns", NODE)  # type: ignore[arg-type]
    for informer in kube.informers.values():
        informer.synced.set()
    return kube


def test_a_cidrpool_spec_change_the_status_does_not_follow_yet() -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/controllers/cidrpool/cidrpool_test.go, Describe
    "CIDRPool", Context "Controller tests", It "Update Valid config with invalid": gatewayIndex
    changed to 10 while the node's prefix still has gateway 10.10.10.1. The node does not use
    the pool until the controller has written the new gateway (error 11, saying why); nor a pool
    whose spec is invalid."""
    kube = kube_pools()
    changed = kube._handler("cidrpool")
    pool = cidrpool({"gateway": "10.10.10.1", "prefix": "10.10.10.0/24"}, cidr="10.10.0.0/16",
                    gatewayIndex=1)
    changed("ADDED", pool, None)
    assert str(kube.lookup("cidrpool", "test-pool").gateway) == "10.10.10.1"
    pool["spec"]["gatewayIndex"] = 10
    changed("MODIFIED", pool, None)
    with pytest.raises(CniError) as e:
        kube.lookup("cidrpool", "test-pool")
    assert (e.value.code, e.value.msg) == (Code.TRY_AGAIN_LATER, (
        "CIDRPool test-ns/test-pool cannot be used on node test-node: the status entry of node "
        "test-node does not fit the spec: gateway 10.10.10.1 doesn't match the expected gateway "
        "10.10.10.10"))
    assert kube.known() == {}
    pool["status"]["allocations"][0]["gateway"] = "10.10.10.10"
    changed("MODIFIED", pool, None)
    assert str(kube.lookup("cidrpool", "test-pool").gateway) == "10.10.10.10"
    pool["spec"]["perNodeNetworkPrefix"] = 99
    changed("MODIFIED", pool, None)
    with pytest.raises(CniError, match=r"the spec is invalid: spec\.perNodeNetworkPrefix: 99 "):
        kube.lookup("cidrpool", "test-pool")


@pytest.mark.parametrize(("case", "allocation", "says"), [
    ("node not specified", {"nodeName": "", "prefix": "192.168.4.0/24"}, None),
    ("conflict with static allocation - range mismatch",
     {"prefix": "192.168.33.0/24", "gateway": "192.168.33.100"},
     "prefix 192.168.33.0/24 doesn't match prefix from static allocation 192.168.1.0/24"),
    ("gateway mismatch", {"prefix": "192.168.5.0/24"},
     "gateway (none) doesn't match the expected gateway 192.168.5.100"),
    ("prefix has host bits set", {"prefix": "192.168.5.1/24", "gateway": "192.168.5.100"},
     "prefix 192.168.5.1/24 has host bits set"),
    ("wrong prefix size", {"prefix": "192.168.5.0/26", "gateway": "192.168.5.100"},
     "prefix 192.168.5.0/26 doesn't match spec.perNodeNetworkPrefix (24)"),
    ("wrong prefix", {"prefix": "10.10.5.0/24", "gateway": "10.10.5.100"},
     "prefix 10.10.5.0/24 is not part of the pool cidr 192.168.0.0/16"),
])
def test_the_node_refuses_a_status_entry_that_does_not_fit(case: str, allocation: dict[str, str],
                                                           says: str | None) -> None:
    """Mellanox/nvidia-k8s-ipam api/v1alpha1/cidrpool_test.go, Describe "CIDRPoolAllocation",
    Context "Invalid", the It named `case`, as the node agent applies it
    (pkg/ipam-node/controllers/cidrpool/cidrpool.go ignores a pool whose entry for the node does
    not validate). The spec is the Describe's: gatewayIndex 100, node1's static prefix
    192.168.1.0/24 with gateway 192.168.1.10."""
    node = allocation.get("nodeName", NODE if "static" not in case else "node1")
    pool = cidrpool({**allocation, "nodeName": node}, gatewayIndex=100, staticAllocations=[
        {"nodeName": "node1", "prefix": "192.168.1.0/24", "gateway": "192.168.1.10"},
        {"nodeName": "node2", "prefix": "192.168.2.0/24"}])
    if says is None:  # an entry without node name is no entry of this node
        assert node_pool_config("cidrpool", pool, NODE) is None
        return
    with pytest.raises(UnusableBlock) as e:
        node_pool_config("cidrpool", pool, node)
    assert str(e.value) == f"the status entry of node {node} does not fit the spec: {says}"


def test_pools_come_and_go() -> None:
    """Mellanox/nvidia-k8s-ipam pkg/pool/manager_test.go, Describe "Manager", It "Update pool
    data", with pkg/ipam-node/controllers/ippool/ippool.go: a pool is known once its status
    has a block for the node, and unknown again when it is deleted."""
    kube = kube_pools()
    changed = kube._handler("ippool")
    with pytest.raises(CniError, match="no IPPool named 'test-pool' in namespace test-ns"):
        kube.lookup("ippool", "test-pool")
    pool = ippool(("192.168.0.2", "192.168.0.254"), "192.168.0.0/16", gateway="192.168.0.1")
    changed("ADDED", pool, None)
    assert list(kube.known()) == ["test-pool"]
    assert str(kube.lookup("ippool", "test-pool").end) == "192.168.0.254"
    changed("DELETED", pool, None)
    assert kube.known() == {}
    with pytest.raises(CniError, match="no IPPool named 'test-pool'"):
        kube.lookup("ippool", "test-pool")


# ------------------------------------------------------------------ api/v1alpha1 helpers

@pytest.mark.parametrize(("case", "subnet", "index", "gateway"), [
    ("ipv4 - start range", "192.168.1.0/24", 1, "192.168.1.1"),
    ("ipv4 - mid range", "192.168.1.0/24", 33, "192.168.1.33"),
    ("ipv4 - end range", "192.168.1.0/24", 254, "192.168.1.254"),
    ("ipv4 - out of range, can't use index 0", "192.168.1.0/24", 0, ""),
    ("ipv4 - out of range, too big", "192.168.1.0/24", 255, ""),
    ("ipv4 - single IP", "192.168.1.100/32", 0, "192.168.1.100"),
    ("ipv4 - single IP, out of range", "192.168.1.100/32", 1, ""),
    ("ipv4 - point to point, can use index 0", "192.168.1.0/31", 0, "192.168.1.0"),
    ("ipv4 - point to point, can use index 1", "192.168.1.0/31", 1, "192.168.1.1"),
    ("ipv4 - point to point, out of range", "192.168.1.0/31", 2, ""),
    ("ipv6 - start range", "2001:db8:3333:4444::0/120", 1, "2001:db8:3333:4444::1"),
    ("ipv6 - mid range", "2001:db8:3333:4444::0/120", 10, "2001:db8:3333:4444::a"),
    ("ipv6 - end range", "2001:db8:3333:4444::0/120", 255, "2001:db8:3333:4444::ff"),
    ("ipv6 - out of range, can't use index 0", "2001:db8:3333:4444::0/120", 0, ""),
    ("ipv6 - out of range, too big", "2001:db8:3333:4444::0/120", 256, ""),
    ("ipv6 - point to point, can use index 0", "2001:db8:3333:4444::0/127", 0,
     "2001:db8:3333:4444::"),
    ("ipv6 - point to point, can use index 1", "2001:db8:3333:4444::0/127", 1,
     "2001:db8:3333:4444::1"),
    ("ipv6 - point to point, out of range", "2001:db8:3333:4444::0/127", 2, ""),
])
def test_gateway_of_a_prefix(case: str, subnet: str, index: int, gateway: str) -> None:
    """Mellanox/nvidia-k8s-ipam api/v1alpha1/helpers_test.go, Describe "Helpers", DescribeTable
    "GetGatewayForSubnet", the Entry named `case`: the gateway a CIDRPool's gatewayIndex gives
    a node's prefix ("" is none, and makes the index invalid)."""
    assert gateway_for(ipaddress.ip_network(subnet, strict=False), index) == gateway, case


@pytest.mark.parametrize(("case", "subnet", "count"), [
    ("ipv4 /24", "192.168.0.0/24", 254),
    ("ipv4 /25", "192.168.0.0/25", 126),
    ("ipv4 /16", "192.168.0.0/16", 65534),
    ("ipv4 /31", "192.20.20.0/31", 2),
    ("ipv4 /32", "10.10.10.10/32", 1),
    ("ipv6 /124", "2001:db8:85a3::8a2e:370:7334/120", 255),
    ("ipv6 /96", "2001:db8:85a3::8a2e:370:7334/96", 4294967295),
    ("ipv6 /127", "2001:db8:85a3::8a2e:370:7334/127", 2),
    ("ipv6 /128", "2001:db8:85a3::8a2e:370:7334/128", 1),
])
def test_host_addresses_of_a_subnet(case: str, subnet: str, count: int) -> None:
    """Mellanox/nvidia-k8s-ipam api/v1alpha1/helpers_test.go, Describe "Helpers", DescribeTable
    "GetPossibleIPCount", the Entry named `case`: the most perNodeBlockSize may be."""
    assert possible_ips(ipaddress.ip_network(subnet, strict=False)) == count, case
