"""nv-ipam's node allocator on upstream's own inputs: which address an ADD gets from a node's
block, round-robin after the last one given, around the gateway and the exclusions.

Every case names the upstream test it comes from in Mellanox/nvidia-k8s-ipam. Upstream's
allocator takes a set of ranges, but its node agent always gives it one range per pool
(pkg/ipam-node/handlers/allocate.go newRangeSetAndDependenciesForPoolCfg), so the cases that
need several ranges in one pool have no counterpart here; where a case's first range stands on its
own, that part is kept.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nicop.cni.ipam import Ipam
from nicop.cni.pools import FilePools
from nicop.cni.spec import CniError, Code, parse_request
from nicop.cni.store import PoolEntries, Reservation, Store
from nicop.node.host import Host

Make = Callable[..., Ipam]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Make]:
    """An Ipam on a fresh node whose pools file holds pool `p` as given."""
    made: list[Ipam] = []

    def build(**pool: Any) -> Ipam:
        root = tmp_path / f"node{len(made)}"
        root.mkdir()
        (root / "pools.json").write_text(json.dumps({"p": pool}))
        ipam = Ipam(Store(Host(root)), FilePools(root / "pools.json"))
        made.append(ipam)
        return ipam

    yield build
    for ipam in made:
        ipam.store.close()


def add(ipam: Ipam, cid: str, cni_args: str = "", **extra: Any) -> str:
    """The address an ADD of container `cid` gets from pool p (without its prefix length)."""
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid, "CNI_NETNS": "/x", "CNI_IFNAME": "eth0",
           "CNI_PATH": "/opt/cni/bin",
           "CNI_ARGS": "K8S_POD_NAME=pod-" + cid + ";K8S_POD_NAMESPACE=default" + cni_args}
    config = {"cniVersion": "1.0.0", "name": "net", "ipam": {"type": "nv-ipam", "poolName": "p"},
              **extra}
    result = ipam.allocate(parse_request("nv-ipam", env, json.dumps(config).encode()))
    return str(result["ips"][0]["address"]).split("/")[0]


def delete(ipam: Ipam, cid: str) -> None:
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": cid, "CNI_IFNAME": "eth0",
           "CNI_PATH": "/opt/cni/bin",
           "CNI_ARGS": "K8S_POD_NAME=pod-" + cid + ";K8S_POD_NAMESPACE=default"}
    config = {"cniVersion": "1.0.0", "name": "net", "ipam": {"type": "nv-ipam", "poolName": "p"}}
    ipam.release(parse_request("nv-ipam", env, json.dumps(config).encode()))


def hold(ipam: Ipam, *addresses: str, last: str | None = None) -> None:
    """Reservations of other containers (each moving the round-robin pointer, as nv-ipam's
    store does), then the pointer set to `last` ("" for none) unless it is None."""
    with ipam.store.transaction():
        for i, ip in enumerate(addresses):
            ipam.store.reserve("p", Reservation(f"held{i}", "net1", ip))
        if last is not None:
            ipam.store.pools.setdefault("p", PoolEntries("p")).last_reserved_ip = last


def exhausted(ipam: Ipam, cid: str = "last") -> str:
    with pytest.raises(CniError) as e:
        add(ipam, cid)
    assert e.value.code == Code.NO_FREE_ADDRESSES
    return e.value.msg


# ------------------------------------------------------------------ Context "RangeIter"

def test_loop_from_the_beginning(make: Make) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/allocator_test.go, Describe "allocator",
    Context "RangeIter", It "should loop correctly from the beginning": 192.168.1.0/29 with
    gateway .1 gives .2 to .6, then nothing."""
    ipam = make(subnet="192.168.1.0/29", gateway="192.168.1.1")
    assert [add(ipam, c) for c in "12345"] == [f"192.168.1.{i}" for i in range(2, 7)]
    assert exhausted(ipam, "6") == ("no free addresses in pool p on this node "
                                    "(192.168.1.1-192.168.1.6, 5 allocated)")


def test_loop_from_the_end(make: Make) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/allocator_test.go, Describe "allocator",
    Context "RangeIter", It "should loop correctly from the end": after .6 comes .2."""
    ipam = make(subnet="192.168.1.0/29", gateway="192.168.1.1")
    hold(ipam, "192.168.1.6")
    assert [add(ipam, "1"), add(ipam, "2")] == ["192.168.1.2", "192.168.1.3"]


def test_loop_from_the_middle(make: Make) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/allocator_test.go, Describe "allocator",
    Context "RangeIter", It "should loop correctly from the middle": .3 reserved and released,
    the next five are .4, .5, .6, .2, .3, then nothing."""
    ipam = make(subnet="192.168.1.0/29", gateway="192.168.1.1")
    hold(ipam, "192.168.1.3")
    with ipam.store.transaction():
        ipam.store.release("p", "held0", "net1")
    assert [add(ipam, c) for c in "01234"] == ["192.168.1.4", "192.168.1.5", "192.168.1.6",
                                               "192.168.1.2", "192.168.1.3"]
    exhausted(ipam, "5")


# ------------------------------------------------------------------ Context "when has free ip"

@pytest.mark.parametrize(("case", "subnet", "held", "last", "expected"), [
    ("fresh start", "10.0.0.0/29", [], None, "10.0.0.2"),
    ("fresh start", "2001:db8:1::0/64", [], None, "2001:db8:1::2"),
    ("fresh start", "10.0.0.0/30", [], None, "10.0.0.2"),
    ("fresh start", "10.0.0.0/29", ["10.0.0.2"], None, "10.0.0.3"),
    ("next ip of last reserved ip", "10.0.0.0/29", [], "10.0.0.5", "10.0.0.6"),
    ("next ip of last reserved ip", "10.0.0.0/29", ["10.0.0.4", "10.0.0.5"], "10.0.0.3",
     "10.0.0.6"),
    ("round-robin to the beginning", "10.0.0.0/29", ["10.0.0.6"], "10.0.0.5", "10.0.0.2"),
    ("lastIP is out of range", "10.0.0.0/29", ["10.0.0.2"], "10.0.0.128", "10.0.0.3"),
    ("subnet is completely full except for lastip", "10.0.0.0/29",
     ["10.0.0.2", "10.0.0.4", "10.0.0.5", "10.0.0.6"], "10.0.0.3", "10.0.0.3"),
    ("Already allocated", "10.0.2.0/30", ["10.0.2.1"], "10.33.33.1", "10.0.2.2"),
    ("IP overflow", "255.255.255.0/24", [], "255.255.255.255", "255.255.255.2"),
])
def test_round_robin(make: Make, case: str, subnet: str, held: list[str], last: str | None,
                     expected: str) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/allocator_test.go, Describe "allocator",
    Context "when has free ip", It "should allocate ips in round robin", the case commented
    `case` (the gateway is the subnet's first address; the three cases with several subnets in one
    allocator have no counterpart)."""
    net = ipaddress.ip_network(subnet)
    ipam = make(subnet=subnet, gateway=str(net.network_address + 1))
    hold(ipam, *held, last=last or "")
    assert add(ipam, "ID") == expected, case


def test_the_broadcast_address_is_never_given(make: Make) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/allocator_test.go, Describe "allocator",
    Context "when has free ip", It "should not allocate the broadcast address"."""
    ipam = make(subnet="192.168.1.0/29", gateway="192.168.1.1")
    assert [add(ipam, f"ID{i}") for i in range(2, 7)] == [f"192.168.1.{i}" for i in range(2, 7)]
    exhausted(ipam, "ID8")


def test_a_released_address_is_not_given_again_at_once(make: Make) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/allocator_test.go, Describe "allocator",
    Context "when has free ip", It "should allocate in a round-robin fashion": the same
    container after a DEL gets the next address, not the one it had."""
    ipam = make(subnet="192.168.1.0/29", gateway="192.168.1.1")
    assert add(ipam, "ID") == "192.168.1.2"
    delete(ipam, "ID")
    assert add(ipam, "ID") == "192.168.1.3"


@pytest.mark.parametrize(("subnet", "held"), [
    ("10.0.0.0/30", ["10.0.0.2"]),
    ("10.0.0.0/29", ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]),
])
def test_out_of_addresses(make: Make, subnet: str, held: list[str]) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/allocator_test.go, Describe "allocator",
    Context "when out of ips", It "returns a meaningful error" (its single-subnet cases): error
    101 saying the pool, its block and how many addresses are held; nothing is stored."""
    net = ipaddress.ip_network(subnet)
    ipam = make(subnet=subnet, gateway=str(net.network_address + 1))
    hold(ipam, *held)
    first, last = net.network_address + 1, net.broadcast_address - 1
    assert exhausted(ipam) == (f"no free addresses in pool p on this node ({first}-{last}, "
                               f"{len(held)} allocated)")
    assert {r.container_id for r in ipam.store.snapshot()["p"]} == {
        f"held{i}" for i in range(len(held))}


def test_a_block_starting_at_the_network_address(make: Make) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/allocator_test.go, Describe "allocator",
    Context "when no lastReservedIP", It "should use the first IP of the first range as startIP
    after Next": a block 192.168.1.0-192.168.1.3 of a /30 without gateway starts at .0."""
    ipam = make(subnet="192.168.1.0/30", startIP="192.168.1.0", endIP="192.168.1.3")
    assert [add(ipam, c) for c in "0123"] == [f"192.168.1.{i}" for i in range(4)]


def test_no_gateway(make: Make) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/allocator_test.go, Describe "allocator",
    Context "no gateway", It "should use the first IP of the range" (its first range): a /30
    without gateway gives .1 and .2."""
    ipam = make(subnet="192.168.1.0/30")
    assert [add(ipam, "0"), add(ipam, "1")] == ["192.168.1.1", "192.168.1.2"]
    exhausted(ipam)


def test_point_to_point(make: Make) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/allocator_test.go, Describe "allocator",
    Context "point to point ranges", It "should allocate two IPs"."""
    ipam = make(subnet="192.168.1.0/31")
    assert [add(ipam, "0"), add(ipam, "1")] == ["192.168.1.0", "192.168.1.1"]


@pytest.mark.parametrize(("case", "pool", "address"), [
    ("/32 network", {"subnet": "192.168.1.10/32"}, "192.168.1.10"),
    ("/24 network", {"subnet": "192.168.1.0/24", "startIP": "192.168.1.100",
                     "endIP": "192.168.1.100"}, "192.168.1.100"),
])
def test_single_address_blocks(make: Make, case: str, pool: dict[str, str],
                               address: str) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/allocator_test.go, Describe "allocator",
    Context "single ip ranges", It `case`: one address, then "no free addresses"."""
    ipam = make(**pool)
    assert add(ipam, "0") == address, case
    assert exhausted(ipam, "1").startswith("no free addresses in pool p")


def test_exclusions_are_skipped(make: Make) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/allocator_test.go, Describe "allocator",
    Context "IP address exclusion", It "should exclude IPs": 192.168.0.0/29, .2-.3 and .5
    excluded, gives .1, .4, .6."""
    ipam = make(subnet="192.168.0.0/29", exclusions=[
        {"startIP": "192.168.0.2", "endIP": "192.168.0.3"},
        {"startIP": "192.168.0.5", "endIP": "192.168.0.5"}])
    assert [add(ipam, c) for c in "012"] == ["192.168.0.1", "192.168.0.4", "192.168.0.6"]
    exhausted(ipam)


def test_a_static_ip_may_be_excluded_but_not_taken_twice(make: Make) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/allocator_test.go, Describe "allocator",
    Context "Static IP allocation", It "should allocate IP": exclusions do not apply to a
    requested address (192.168.0.33 here), which comes with the subnet's mask and the pool's
    gateway; asked again by another container it is refused."""
    ipam = make(subnet="192.168.0.0/24", gateway="192.168.0.10",
                exclusions=[{"startIP": "192.168.0.33", "endIP": "192.168.0.33"}])
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "0", "CNI_NETNS": "/x", "CNI_IFNAME": "eth0",
           "CNI_PATH": "/opt/cni/bin",
           "CNI_ARGS": "K8S_POD_NAME=a;K8S_POD_NAMESPACE=default;IP=192.168.0.33"}
    config = json.dumps({"cniVersion": "1.0.0", "name": "net",
                         "ipam": {"type": "nv-ipam", "poolName": "p"}}).encode()
    result = ipam.allocate(parse_request("nv-ipam", env, config))
    assert result["ips"] == [{"address": "192.168.0.33/24", "gateway": "192.168.0.10"}]
    env = {**env, "CNI_CONTAINERID": "1", "CNI_ARGS": env["CNI_ARGS"].replace("=a;", "=b;")}
    with pytest.raises(CniError) as e:
        ipam.allocate(parse_request("nv-ipam", env, config))
    assert (e.value.code, e.value.msg) == (100, "192.168.0.33 is already allocated in pool p")


def test_a_static_ip_outside_the_subnet_is_refused(make: Make) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/allocator_test.go, Describe "allocator",
    Context "Static IP allocation", It "should fail if static IP is not in the allocator's
    subnet" (through the node agent, nv-ipam's handler says which address has no pool)."""
    ipam = make(subnet="192.168.0.0/24", gateway="192.168.0.10")
    with pytest.raises(CniError) as e:
        add(ipam, "0", ";IP=10.10.10.10")
    assert e.value.msg.endswith("ip 10.10.10.10 has no matching Pool")
    assert ipam.store.snapshot() == {}


# ------------------------------------------------------------------ range_test.go

@pytest.mark.parametrize(("case", "subnet", "first", "last"), [
    ("should generate sane defaults for ipv4 with a clean prefix", "192.0.2.0/24", "192.0.2.1",
     "192.0.2.254"),
    ("should generate sane defaults for a smaller ipv4 subnet", "192.0.2.0/25", "192.0.2.1",
     "192.0.2.126"),
    ("should generate sane defaults for a /31 ipv4 subnet", "192.0.2.0/31", "192.0.2.0",
     "192.0.2.1"),
    ("should generate sane defaults for a /32 ipv4 subnet", "192.0.2.10/32", "192.0.2.10",
     "192.0.2.10"),
    ("should generate sane defaults for ipv6 with a clean prefix", "2001:DB8:1::/64",
     "2001:db8:1::1", "2001:db8:1:0:ffff:ffff:ffff:ffff"),
    ("should generate sane defaults for /127 ipv6 prefix", "2001:DB8:1::/127", "2001:db8:1::",
     "2001:db8:1::1"),
    ("should generate sane defaults for /128 ipv6 prefix", "2001:DB8:1::10/128",
     "2001:db8:1::10", "2001:db8:1::10"),
])
def test_a_pool_without_start_and_end_uses_the_subnets_hosts(make: Make, case: str, subnet: str,
                                                             first: str, last: str) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/range_test.go, Describe "IP ranges", It
    `case` (and pkg/ip/cidr_test.go, Context "LastIP"): a pool given only its subnet hands out
    its host addresses, all of a /31, /32, /127 or /128; the first ADD gets the first of them
    and the node's size counts them all."""
    ipam = make(subnet=subnet)
    pool = ipam.pools.lookup("ippool", "p")
    assert (str(pool.start), str(pool.end)) == (first, last), case
    assert add(ipam, "0") == first
    assert ipam.usage()["p"]["size"] == int(ipaddress.ip_address(last)) - int(
        ipaddress.ip_address(first)) + 1


@pytest.mark.parametrize(("case", "subnet", "first"), [
    ("should reject ipv4 subnet using a masked address", "192.0.2.12/24", "192.0.2.1"),
    ("should reject ipv6 subnet using a masked address", "2001:DB8:1::24:19ff:fee1:c44a/64",
     "2001:db8:1::1"),
    ("should reject ipv6 prefix with host bit set", "2001:DB8:24:19ff::/63", "2001:db8:24:19fe::1"),
    ("should reject ipv4 network with host bit set", "192.168.127.0/23", "192.168.126.1"),
])
def test_a_subnet_with_host_bits_is_taken_as_its_network(make: Make, case: str, subnet: str,
                                                         first: str) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/range_test.go, Describe "IP ranges", It
    `case`: the allocator itself refuses such a subnet, but nv-ipam's node agent never hands it
    one (pkg/ipam-node/handlers/allocate.go parses the pool's subnet with net.ParseCIDR, which
    keeps the network: 192.0.2.0 for "192.0.2.12/24"), and neither does nicop."""
    assert add(make(subnet=subnet), "0") == first, case


@pytest.mark.parametrize(("case", "pool", "says"), [
    ("should reject invalid RangeStart and RangeEnd specifications",
     {"subnet": "192.0.2.0/24", "startIP": "192.0.3.0"},
     "startIP 192.0.3.0 is not in the subnet 192.0.2.0/24"),
    ("should reject invalid RangeStart and RangeEnd specifications",
     {"subnet": "192.0.2.0/24", "endIP": "192.0.4.0"},
     "endIP 192.0.4.0 is not in the subnet 192.0.2.0/24"),
    ("should reject invalid RangeStart and RangeEnd specifications",
     {"subnet": "192.0.2.0/24", "startIP": "192.0.2.50", "endIP": "192.0.2.40"},
     "startIP 192.0.2.50 is after endIP 192.0.2.40"),
    ("should reject invalid RangeStart and RangeEnd for point to point networks",
     {"subnet": "192.0.2.2/31", "startIP": "192.0.2.1"},
     "startIP 192.0.2.1 is not in the subnet 192.0.2.2/31"),
    ("should reject invalid RangeStart and RangeEnd for point to point networks",
     {"subnet": "192.0.2.2/31", "endIP": "192.0.2.4"},
     "endIP 192.0.2.4 is not in the subnet 192.0.2.2/31"),
    ("should reject invalid RangeStart and RangeEnd for point to point networks",
     {"subnet": "192.0.2.2/31", "startIP": "192.0.2.3", "endIP": "192.0.2.2"},
     "startIP 192.0.2.3 is after endIP 192.0.2.2"),
    ("should reject invalid RangeStart and RangeEnd for single IP networks",
     {"subnet": "192.0.2.2/32", "startIP": "192.0.2.1"},
     "startIP 192.0.2.1 is not in the subnet 192.0.2.2/32"),
    ("should reject invalid RangeStart and RangeEnd for single IP networks",
     {"subnet": "192.0.2.2/32", "endIP": "192.0.2.3"},
     "endIP 192.0.2.3 is not in the subnet 192.0.2.2/32"),
    ("should reject invalid RangeStart and RangeEnd for single IP networks",
     {"subnet": "192.0.2.2/32", "startIP": "192.0.2.3", "endIP": "192.0.2.2"},
     "startIP 192.0.2.3 is not in the subnet 192.0.2.2/32"),
])
def test_a_range_outside_its_subnet_is_refused(make: Make, caplog: pytest.LogCaptureFixture,
                                               case: str, pool: dict[str, str],
                                               says: str) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/range_test.go, Describe "IP ranges", It
    `case`: such a pool is not used; the daemon's log says why and an ADD names the pool as
    unknown."""
    ipam = make(**pool)
    with pytest.raises(CniError, match="unknown ippool 'p'"):
        add(ipam, "0")
    assert f"pool p: {says}" in caplog.text, case


@pytest.mark.parametrize(("case", "pool", "given"), [
    ("should parse all fields correctly",
     {"subnet": "192.0.2.0/24", "startIP": "192.0.2.40", "endIP": "192.0.2.50",
      "gateway": "192.0.2.254"}, [f"192.0.2.{i}" for i in range(40, 51)]),
    ("should accept v4 IPs in range and reject IPs out of range",
     {"subnet": "192.0.2.0/24", "startIP": "192.0.2.40", "endIP": "192.0.2.50",
      "gateway": "192.0.2.254"}, [f"192.0.2.{i}" for i in range(40, 51)]),
    ("should parse /31 and /127 correctly",
     {"subnet": "192.0.2.2/31", "startIP": "192.0.2.2", "endIP": "192.0.2.3",
      "gateway": "192.0.2.3"}, ["192.0.2.2"]),
    ("should parse /31 and /127 correctly",
     {"subnet": "2001:DB8:1::4/127", "startIP": "2001:DB8:1::4", "endIP": "2001:DB8:1::5",
      "gateway": "2001:DB8:1::4"}, ["2001:db8:1::5"]),
    ("Should parse /32 and /128 correctly",
     {"subnet": "192.0.2.2/32", "startIP": "192.0.2.2", "endIP": "192.0.2.2",
      "gateway": "192.0.2.2"}, []),
    ("Should parse /32 and /128 correctly",
     {"subnet": "2001:DB8:1::4/128", "startIP": "2001:DB8:1::4", "endIP": "2001:DB8:1::4",
      "gateway": "2001:DB8:1::4"}, []),
    ("Should handle single IP range in a large subnet correctly",
     {"subnet": "192.0.2.0/24", "startIP": "192.0.2.10", "endIP": "192.0.2.10",
      "gateway": "192.0.2.1"}, ["192.0.2.10"]),
    ("/31 network Contains", {"subnet": "192.0.2.2/31"}, ["192.0.2.2", "192.0.2.3"]),
    ("/127 network Contains", {"subnet": "2001:DB8:1::2/127"}, ["2001:db8:1::2",
                                                                 "2001:db8:1::3"]),
    ("should accept v6 IPs in range and reject IPs out of range",
     {"subnet": "2001:DB8:1::/64", "startIP": "2001:db8:1::40", "endIP": "2001:db8:1::50"},
     [f"2001:db8:1::{i:x}" for i in range(0x40, 0x51)]),
])
def test_exactly_the_range_is_handed_out(make: Make, case: str, pool: dict[str, str],
                                         given: list[str]) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/range_test.go, Describe "IP ranges", It
    `case`: every address of the range and no other, the gateway left out (a single-address
    range that is the gateway gives none)."""
    ipam = make(**pool)
    assert [add(ipam, str(i)) for i in range(len(given))] == given, case
    exhausted(ipam)


@pytest.mark.parametrize(("case", "exclusions", "given"), [
    ("Identical", [(3, 6), (3, 6)], [1, 2, 7, 8, 9, 10, 11, 12]),
    ("Containing", [(2, 10), (4, 6)], [1, 11, 12]),
    ("same subnet, overlapping start + end", [(1, 6), (6, 10)], [11, 12]),
    ("same subnet, non overlapping start + end", [(1, 6), (7, 10)], [11, 12]),
])
def test_overlapping_exclusions_exclude_their_union(make: Make, case: str,
                                                    exclusions: list[tuple[int, int]],
                                                    given: list[int]) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/range_test.go, Describe "IP ranges",
    DescribeTable "Detecting overlap", Entry `case`, and range_set_test.go, Describe "range
    sets", It "should discover overlaps within a set", as a pool's exclusions: nv-ipam's node
    puts a pool's exclusions into one such set, so exclusions that overlap make it fail every ADD
    of the pool ("invalid config for pool"). The API accepts them (api/v1alpha1
    validate_exclusions.go: "there is no need to validate that ranges have no overlaps"), and
    nicop hands out every address outside their union."""
    ipam = make(subnet="10.0.0.0/24", startIP="10.0.0.1", endIP="10.0.0.12",
                exclusions=[{"startIP": f"10.0.0.{a}", "endIP": f"10.0.0.{b}"}
                            for a, b in exclusions])
    assert [add(ipam, str(i)) for i in range(len(given))] == [f"10.0.0.{i}" for i in given], case
    exhausted(ipam)
