"""The IPAM controller's arithmetic: which block or prefix each node gets, and keeps."""

from __future__ import annotations

from typing import Any

import pytest

from nicop.kube.selectors import matches_node_selector as node_matches
from nicop.operator.ipam import (
    InvalidPool,
    carve_cidrpool,
    carve_ippool,
    gateway_for,
)

NODES = ["node-1", "node-2", "node-3"]


def ippool(**spec: Any) -> dict[str, Any]:
    return {"subnet": "192.168.0.0/24", "perNodeBlockSize": 50, "gateway": "192.168.0.1",
            **spec}


def blocks(allocations: list[dict[str, str]]) -> dict[str, str]:
    return {a["nodeName"]: f"{a['startIP']}-{a['endIP']}" for a in allocations}


def test_blocks_follow_the_network_address_in_node_order() -> None:
    allocations, left = carve_ippool(ippool(), [], ["node-3", "node-1", "node-2"])
    assert blocks(allocations) == {"node-1": "192.168.0.1-192.168.0.50",
                                   "node-2": "192.168.0.51-192.168.0.100",
                                   "node-3": "192.168.0.101-192.168.0.150"}
    assert left == []


def test_a_node_keeps_its_block_and_a_new_node_fills_the_hole() -> None:
    existing, _ = carve_ippool(ippool(), [], NODES)
    allocations, _ = carve_ippool(ippool(), existing, ["node-1", "node-3", "node-4"])
    assert blocks(allocations) == {"node-1": "192.168.0.1-192.168.0.50",
                                   "node-3": "192.168.0.101-192.168.0.150",
                                   "node-4": "192.168.0.51-192.168.0.100"}


def test_blocks_that_no_longer_fit_the_spec_are_recarved() -> None:
    existing = [{"nodeName": "node-1", "startIP": "192.168.0.7", "endIP": "192.168.0.56"},
                {"nodeName": "node-2", "startIP": "192.168.0.51", "endIP": "192.168.0.100"},
                {"nodeName": "node-3", "startIP": "192.168.0.51", "endIP": "192.168.0.100"}]
    allocations, _ = carve_ippool(ippool(), existing, NODES)
    assert blocks(allocations) == {"node-1": "192.168.0.1-192.168.0.50",
                                   "node-2": "192.168.0.51-192.168.0.100",
                                   "node-3": "192.168.0.101-192.168.0.150"}


def test_the_broadcast_address_is_never_in_a_block() -> None:
    allocations, left = carve_ippool(ippool(perNodeBlockSize=127), [], NODES)
    assert blocks(allocations) == {"node-1": "192.168.0.1-192.168.0.127",
                                   "node-2": "192.168.0.128-192.168.0.254"}
    assert left == ["node-3"]
    allocations, left = carve_ippool(ippool(perNodeBlockSize=128), [], NODES)
    assert blocks(allocations) == {"node-1": "192.168.0.1-192.168.0.128"}
    assert left == ["node-2", "node-3"]


def test_ipv6_pool() -> None:
    allocations, _ = carve_ippool({"subnet": "fd00::/64", "perNodeBlockSize": 1000}, [], NODES)
    assert blocks(allocations)["node-2"] == "fd00::3e9-fd00::7d0"


@pytest.mark.parametrize(("spec", "message"), [
    (ippool(subnet="10.0.0.0/33"), "spec.subnet: '10.0.0.0/33' is not a CIDR"),
    (ippool(perNodeBlockSize=0), "spec.perNodeBlockSize: 0 must be an integer of at least 1"),
    (ippool(perNodeBlockSize=300), "spec.perNodeBlockSize: 300 is more than the "
                                   "192.168.0.0/24 subnet has addresses for (254)"),
    (ippool(gateway="10.0.0.1"), "spec.gateway: 10.0.0.1 is not in the subnet 192.168.0.0/24"),
    (ippool(exclusions=[{"startIP": "192.168.0.9", "endIP": "192.168.0.2"}]),
     "spec.exclusions[0]: endIP 192.168.0.2 should be equal or greater than startIP "
     "192.168.0.9"),
    (ippool(perNodeExclusions=[{"startIndex": 10, "endIndex": 50}]),
     "spec.perNodeExclusions[0].endIndex: 50 is outside of the per-node block range (max: 49)"),
])
def test_invalid_ippools_name_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidPool) as e:
        carve_ippool(spec, [], NODES)
    assert str(e.value) == message


def cidrpool(**spec: Any) -> dict[str, Any]:
    return {"cidr": "10.10.0.0/16", "perNodeNetworkPrefix": 24, "gatewayIndex": 1, **spec}


def test_prefixes_static_allocations_and_gateways() -> None:
    spec = cidrpool(staticAllocations=[{"nodeName": "node-2", "prefix": "10.10.9.0/24"},
                                       {"prefix": "10.10.0.0/24"}])
    allocations, _ = carve_cidrpool(spec, [], NODES)
    assert allocations == [
        {"nodeName": "node-1", "prefix": "10.10.1.0/24", "gateway": "10.10.1.1"},
        {"nodeName": "node-2", "prefix": "10.10.9.0/24", "gateway": "10.10.9.1"},
        {"nodeName": "node-3", "prefix": "10.10.2.0/24", "gateway": "10.10.2.1"},
    ]
    again, _ = carve_cidrpool(spec, allocations[::-1], NODES)
    assert again == allocations


def test_a_full_cidrpool_leaves_nodes_out() -> None:
    allocations, left = carve_cidrpool(cidrpool(cidr="10.10.0.0/23"), [], NODES)
    assert [a["nodeName"] for a in allocations] == ["node-1", "node-2"] and left == ["node-3"]


def test_gateway_index_rules() -> None:
    import ipaddress

    net = ipaddress.ip_network
    assert gateway_for(net("192.168.1.0/24"), 1) == "192.168.1.1"
    assert gateway_for(net("192.168.1.0/24"), 0) == ""
    assert gateway_for(net("192.168.1.0/24"), 255) == ""
    assert gateway_for(net("192.168.1.2/31"), 0) == "192.168.1.2"
    assert gateway_for(net("192.168.1.0/24"), None) == ""


def test_invalid_cidrpool() -> None:
    with pytest.raises(InvalidPool, match=r"spec.perNodeNetworkPrefix: 8 must be between 16 "):
        carve_cidrpool(cidrpool(perNodeNetworkPrefix=8), [], NODES)
    with pytest.raises(InvalidPool, match=r"staticAllocations\[0\].prefix: 10.11.0.0/24 is not "
                                          r"part of the pool cidr 10.10.0.0/16"):
        carve_cidrpool(cidrpool(staticAllocations=[{"prefix": "10.11.0.0/24"}]), [], NODES)


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def selector(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeSelectorTerms": list(terms)}


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": op, "values": list(values)}]}


def test_node_selector_semantics() -> None:
    gpu = node("n1", gpu="true", cores="64")
    cpu = node("n2", cores="8")
    assert node_matches(None, cpu)
    assert node_matches(selector(expr("gpu", "In", "true")), gpu)
    assert not node_matches(selector(expr("gpu", "In", "true")), cpu)
    assert node_matches(selector(expr("gpu", "NotIn", "true")), cpu)
    assert node_matches(selector(expr("gpu", "DoesNotExist")), cpu)
    assert node_matches(selector(expr("cores", "Gt", "16")), gpu)
    assert not node_matches(selector(expr("cores", "Lt", "16")), gpu)
    assert node_matches(selector(expr("gpu", "Exists"), expr("cores", "Lt", "16")), cpu)
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}
    assert node_matches(selector(by_name), cpu) and not node_matches(selector(by_name), gpu)
    assert not node_matches(selector({}), gpu), "an empty term matches no node"
