"""The node side of nv-ipam on upstream's own inputs: what an ADD answers, what the store holds.

Every case names the upstream test, code or doc it comes from (github.com/Mellanox/nvidia-k8s-ipam).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nicop.cni.ipam import Ipam
from nicop.cni.pools import FilePools
from nicop.cni.spec import CniError, Request, parse_request
from nicop.cni.store import Reservation, Store
from nicop.node.host import Host

CONF_DIR = "/etc/cni/net.d/nv-ipam.d"

POOLS = {
    # getPoolConfigs() of pkg/ipam-node/handlers/handlers_test.go
    "pool1": {"subnet": "192.168.0.0/16", "startIP": "192.168.0.2", "endIP": "192.168.0.254",
              "gateway": "192.168.0.1"},
    "pool2": {"subnet": "10.100.0.0/16", "startIP": "10.100.0.2", "endIP": "10.100.0.254",
              "gateway": "10.100.0.1"},
    # routes of "Valid - routes" in api/v1alpha1/ippool_test.go, each given twice
    "routed": {"subnet": "192.168.0.0/16", "startIP": "192.168.0.2", "endIP": "192.168.0.254",
               "gateway": "192.168.0.1", "defaultGateway": True,
               "routes": [{"dst": "10.7.1.0/24"}, {"dst": "5.5.0.0/16"}, {"dst": "10.7.1.0/24"},
                          {"dst": "5.5.0.0/16"}]},
    # node blocks carved by allocator_test.go "/31 pool - can allocate 1 ip for 2 nodes" (node2)
    # and "/32 pool - can allocate if no gw" (node1)
    "p2p": {"subnet": "10.10.10.10/31", "startIP": "10.10.10.11", "endIP": "10.10.10.11"},
    "single": {"subnet": "10.10.10.10/32", "startIP": "10.10.10.10", "endIP": "10.10.10.10"},
    # a CIDRPool prefix of a node (cidrpool_test.go's 10.10.0.0/16 with gatewayIndex 1)
    "cidr1": {"poolType": "cidrpool", "subnet": "10.10.3.0/24", "gateway": "10.10.3.1"},
}


@pytest.fixture
def ipam(tmp_path: Path) -> Iterator[Ipam]:
    (tmp_path / "pools.json").write_text(json.dumps(POOLS))
    ipam = Ipam(Store(Host(tmp_path)), FilePools(tmp_path / "pools.json"))
    yield ipam
    ipam.store.close()


def request(command: str = "ADD", cid: str = "id1", ifname: str = "net0",
            ipam: dict[str, Any] | None = None, cni_args: str = "",
            **extra: Any) -> Request:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/x",
           "CNI_IFNAME": ifname, "CNI_PATH": "/opt/cni/bin",
           "CNI_ARGS": "K8S_POD_NAME=test-pod;K8S_POD_NAMESPACE=default" + cni_args}
    config: dict[str, Any] = {"cniVersion": "1.0.0", "name": "my-net", **extra}
    if ipam is not None:
        config["ipam"] = {"type": "nv-ipam", **ipam}
    return parse_request("nv-ipam", env, json.dumps(config).encode())


def add(ipam: Ipam, pool: str = "pool1", **kw: Any) -> dict[str, Any]:
    return ipam.allocate(request(ipam={"poolName": pool, **kw.pop("conf", {})}, **kw))


# ------------------------------------------------------------------ store key (item 3)

def test_cidrpool_reservations_are_kept_under_nv_ipams_key(ipam: Ipam) -> None:
    """pkg/common/pool_key.go GetPoolKey: an IPPool under its name, a CIDRPool under
    "cidrpool/<name>". A node moved from nv-ipam keeps the address its pod holds: it is not
    handed out again, CHECK finds it, and DEL frees it."""
    held = Reservation("pod-from-nv-ipam", "net0", "10.10.3.2", pod_name="old",
                       pod_namespace="default")
    with ipam.store.transaction():
        ipam.store.reserve("cidrpool/cidr1", held)
    ipam.store.pools["cidrpool/cidr1"].last_reserved_ip = "10.10.3.254"
    cidr = {"poolType": "cidrpool"}
    got = add(ipam, "cidr1", cid="new-pod", conf=cidr)
    assert got["ips"] == [{"address": "10.10.3.3/24", "gateway": "10.10.3.1"}]
    ipam.is_allocated(request("CHECK", cid="pod-from-nv-ipam", ipam={"poolName": "cidr1", **cidr}))
    ipam.release(request("DEL", cid="pod-from-nv-ipam", ipam={"poolName": "cidr1", **cidr}))
    data = json.loads(ipam.store.path.read_text())
    assert sorted(data["pools"]) == ["cidrpool/cidr1"]
    assert list(data["pools"]["cidrpool/cidr1"]["entries"]) == ["new-pod_net0"]
    assert "cidrpool/cidr1" in ipam.usage(), "usage is reported under the same key"


# ------------------------------------------------------------------ small pools (2)

def test_point_to_point_and_single_address_blocks_hand_out_their_address(ipam: Ipam) -> None:
    """allocator_test.go, Context "small pools": the blocks a node gets from a /31 and a /32
    pool with perNodeBlockSize 1 are used whole, network address included; no gateway."""
    assert add(ipam, "p2p")["ips"] == [{"address": "10.10.10.11/31"}]
    assert add(ipam, "single")["ips"] == [{"address": "10.10.10.10/32"}]
    with pytest.raises(CniError, match="no free addresses in pool single"):
        add(ipam, "single", cid="id2")


# ------------------------------------------------------------------ allocateDefaultGateway (4)

def test_the_gateway_as_address_comes_without_gateway_and_routes(ipam: Ipam) -> None:
    """pkg/ipam-node/handlers/allocate.go: with allocate_default_gateway the result's Gateway is
    cleared, and getRoutes returns no route without a gateway."""
    got = add(ipam, "routed", args={"cni": {"allocateDefaultGateway": True}})
    assert got["ips"] == [{"address": "192.168.0.1/16"}]
    assert got["routes"] == []


# ------------------------------------------------------------------ routes (5)

def test_routes_are_sorted_and_given_once(ipam: Ipam) -> None:
    """handlers/allocate.go getRoutes + sortAndDedupIPNets on the routes of api/v1alpha1
    ippool_test.go "Valid - routes" (each listed twice) with defaultGateway: the default route
    first, then by address, each once; a pool with repeated routes never fails an ADD."""
    got = add(ipam, "routed")
    assert got["routes"] == [{"dst": "0.0.0.0/0", "gw": "192.168.0.1"},
                             {"dst": "5.5.0.0/16", "gw": "192.168.0.1"},
                             {"dst": "10.7.1.0/24", "gw": "192.168.0.1"}]


# ------------------------------------------------------------------ static IPs (6)

def test_allocate_static_ip(ipam: Ipam) -> None:
    """handlers_test.go "Allocate static IP": pool1, requested 192.168.0.2."""
    got = add(ipam, "pool1", cni_args=";IP=192.168.0.2")
    assert got["ips"] == [{"address": "192.168.0.2/16", "gateway": "192.168.0.1"}]


def test_a_static_ip_outside_every_requested_pool_fails_the_add(ipam: Ipam) -> None:
    """handlers_test.go "Allocate failed: static IP was not allocated": pool1 only, requested
    10.10.10.10; nothing stays allocated."""
    with pytest.raises(CniError) as e:
        add(ipam, "pool1", cni_args=";IP=10.10.10.10")
    assert e.value.msg == ("not all requested static IPs can be allocated from the ranges "
                           "available on the node, ip 10.10.10.10 has no matching Pool")
    assert "pool1 (192.168.0.0/16)" in e.value.details
    with pytest.raises(CniError, match=r"ip 10\.10\.10\.10 has no matching Pool"):
        add(ipam, "pool1,pool2", runtimeConfig={"ips": ["192.168.0.7", "10.10.10.10"]})
    assert ipam.store.snapshot().get("pool1", []) == []


def test_a_static_ip_does_not_move_the_round_robin_pointer(ipam: Ipam) -> None:
    """pkg/ipam-node/allocator/allocator.go allocateStaticIP: "for static allocations we don't
    want to change lastReservedIP"."""
    assert add(ipam, cid="a")["ips"][0]["address"] == "192.168.0.2/16"
    assert add(ipam, cid="b", cni_args=";IP=192.168.0.100")["ips"][0]["address"] == \
        "192.168.0.100/16"
    assert ipam.store.last_reserved("pool1") == "192.168.0.2"
    assert add(ipam, cid="c")["ips"][0]["address"] == "192.168.0.3/16"


# ------------------------------------------------------------------ ADD twice, config (7)

def test_a_second_add_for_the_same_container_and_interface_is_refused(ipam: Ipam) -> None:
    """handlers_test.go "Allocation failed: already allocated" with allocate.go's message: the
    store refuses a second reservation for id1/net0 (here made for another pod); the first one
    stays. The same pod's ADD again (a retry after the daemon died mid-ADD) gets the same
    addresses back, where nv-ipam refuses it too."""
    first = add(ipam, "pool1,pool2")
    with pytest.raises(CniError) as e:
        add(ipam, "pool1,pool2", cni_args=";K8S_POD_NAME=other-pod")
    assert e.value.msg == 'allocation already exist in the pool "pool1", poolType "ippool"'
    assert "holds 192.168.0.2 for pod default/test-pod" in e.value.details
    assert [r.ip_address for r in ipam.store.snapshot()["pool1"]] == ["192.168.0.2"]
    assert first["ips"][1] == {"address": "10.100.0.2/16", "gateway": "10.100.0.1"}
    assert add(ipam, "pool1,pool2") == first
