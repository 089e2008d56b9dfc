"""The node side of nv-ipam on upstream's own inputs: what an ADD, CHECK and DEL answer and what
the store holds afterwards, for the cases of nv-ipam's node handlers.

Every case names the upstream test, code or doc it comes from in Mellanox/nvidia-k8s-ipam. The
handler cases that cancel a gRPC call's context have no counterpart: nicop's nv-ipam has no gRPC
hop between the executable and the daemon.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nicop.cni.ipam import Ipam
from nicop.cni.pools import FilePools, KubePools
from nicop.cni.spec import CniError, Code, Request, parse_request
from nicop.cni.store import Reservation, Store
from nicop.kube.informer import Informer
from nicop.node.host import Host

POOLS = {
    # getPoolConfigs() of pkg/ipam-node/handlers/handlers_test.go
    "pool1": {"subnet": "192.168.0.0/16", "startIP": "192.168.0.2", "endIP": "192.168.0.254",
              "gateway": "192.168.0.1"},
    "pool2": {"subnet": "10.100.0.0/16", "startIP": "10.100.0.1", "endIP": "10.100.0.254",
              "gateway": "10.100.0.5", "defaultGateway": True, "routes": [{"dst": "5.5.0.0/16"}]},
    # pool1 of handlers_test.go "Allocate duplicate static routes"
    "dup-routes": {"subnet": "192.168.0.0/16", "startIP": "192.168.0.2", "endIP": "192.168.0.254",
                   "gateway": "192.168.0.1", "defaultGateway": True,
                   "routes": [{"dst": "5.5.0.0/16"}, {"dst": "5.5.0.0/16"},
                              {"dst": "0.0.0.0/0"}]},
    # routes of "Valid - routes" in api/v1alpha1/ippool_test.go, each given twice
    "routed": {"subnet": "192.168.0.0/16", "startIP": "192.168.0.2", "endIP": "192.168.0.254",
               "gateway": "192.168.0.1", "defaultGateway": True,
               "routes": [{"dst": "10.7.1.0/24"}, {"dst": "5.5.0.0/16"}, {"dst": "10.7.1.0/24"},
                          {"dst": "5.5.0.0/16"}]},
    # a pool whose node block holds a single address, used up by pool2's exhaustion case
    "full": {"subnet": "10.200.0.0/24", "startIP": "10.200.0.7", "endIP": "10.200.0.7"},
    # node blocks carved by allocator_test.go "/31 pool - can allocate 1 ip for 2 nodes" (node2)
    # and "/32 pool - can allocate if no gw" (node1)
    "p2p": {"subnet": "10.10.10.10/31", "startIP": "10.10.10.11", "endIP": "10.10.10.11"},
    "single": {"subnet": "10.10.10.10/32", "startIP": "10.10.10.10", "endIP": "10.10.10.10"},
    # a CIDRPool prefix of a node (cidrpool_test.go's 10.10.0.0/16 with gatewayIndex 1)
    "cidr1": {"poolType": "cidrpool", "subnet": "10.10.3.0/24", "gateway": "10.10.3.1"},
}
UID = "aaf0a0fc-9869-41ef-9214-48599f85b4fa"


@pytest.fixture
def ipam(tmp_path: Path) -> Iterator[Ipam]:
    (tmp_path / "pools.json").write_text(json.dumps(POOLS))
    ipam = Ipam(Store(Host(tmp_path)), FilePools(tmp_path / "pools.json"))
    yield ipam
    ipam.store.close()


def request(command: str = "ADD", cid: str = "id1", ifname: str = "net0",
            ipam: dict[str, Any] | None = None, cni_args: str = "",
            **extra: Any) -> Request:
    """getValidIPAMParams() of handlers_test.go as a CNI call: container id1, interface net0,
    pod default/test-pod with its UID, device 0000:d8:00.1."""
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/x",
           "CNI_IFNAME": ifname, "CNI_PATH": "/opt/cni/bin",
           "CNI_ARGS": f"K8S_POD_NAME=test-pod;K8S_POD_NAMESPACE=default;K8S_POD_UID={UID}"
           + cni_args}
    config: dict[str, Any] = {"cniVersion": "1.0.0", "name": "my-net",
                              "deviceID": "0000:d8:00.1", **extra}
    if ipam is not None:
        config["ipam"] = {"type": "nv-ipam", **ipam}
    return parse_request("nv-ipam", env, json.dumps(config).encode())


def add(ipam: Ipam, pool: str = "pool1,pool2", **kw: Any) -> dict[str, Any]:
    return ipam.allocate(request(ipam={"poolName": pool, **kw.pop("conf", {})}, **kw))


def held(ipam: Ipam, pool: str) -> list[str]:
    """The addresses the store file holds in `pool`, as a restarted daemon would read them."""
    if not ipam.store.path.exists():
        return []
    data = json.loads(ipam.store.path.read_text())
    entries = (data["pools"].get(pool) or {}).get("entries") or {}
    return sorted(e["ip_address"] for e in entries.values())


@pytest.fixture
def unwritable(ipam: Ipam) -> Iterator[Path]:
    """The store's next write fails as on a full or broken disk: a directory stands where the
    daemon writes the new file before renaming it over the old one."""
    path = ipam.store.path
    blocker = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    blocker.mkdir()
    yield blocker
    if blocker.exists():
        blocker.rmdir()


# ------------------------------------------------------------------ Allocate

def test_allocate_from_two_pools(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/handlers_test.go, Describe "Handlers", It
    "Allocate succeed": pool1 gives 192.168.0.2/16 with its gateway and no route; pool2 (block
    from 10.100.0.1, gateway 10.100.0.5, defaultGateway, route 5.5.0.0/16) its first address
    with two routes through its gateway. The store holds both with the pod's metadata and the
    pool config as nv-ipam records it (pkg/pool/manager.go Pool.String)."""
    got = add(ipam)
    assert got["ips"] == [{"address": "192.168.0.2/16", "gateway": "192.168.0.1"},
                          {"address": "10.100.0.1/16", "gateway": "10.100.0.5"}]
    assert got["routes"] == [{"dst": "0.0.0.0/0", "gw": "10.100.0.5"},
                             {"dst": "5.5.0.0/16", "gw": "10.100.0.5"}]
    data = json.loads(ipam.store.path.read_text())["pools"]["pool2"]
    meta = data["entries"]["id1_net0"]["metadata"]
    assert (meta["pod_name"], meta["pod_namespace"], meta["pod_uuid"], meta["device_id"]) == (
        "test-pod", "default", UID, "0000:d8:00.1")
    assert meta["pool_config_snapshot"] == data["last_pool_config"] == (
        '{"subnet":"10.100.0.0/16","startIP":"10.100.0.1","endIP":"10.100.0.254",'
        '"gateway":"10.100.0.5","exclusions":[],"routes":[{"dst":"5.5.0.0/16"}],'
        '"defaultGateway":true}')
    assert data["last_reserved_ip"] == "10.100.0.1"


def test_allocate_static_ip(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/handlers_test.go, Describe "Handlers", It
    "Allocate static IP": pool1, requested 192.168.0.2."""
    got = add(ipam, "pool1", cni_args=";IP=192.168.0.2")
    assert got["ips"] == [{"address": "192.168.0.2/16", "gateway": "192.168.0.1"}]


def test_allocate_ip_with_index(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/handlers_test.go, Describe "Handlers", It
    "Allocate IP with index": index 5 of pool1's block 192.168.0.2-254 is 192.168.0.7; it does
    not move the round-robin pointer, as a requested address does not."""
    got = add(ipam, "pool1", args={"cni": {"allocateIPWithIndex": 5}})
    assert got["ips"] == [{"address": "192.168.0.7/16", "gateway": "192.168.0.1"}]
    assert add(ipam, "pool1", cid="id2")["ips"][0]["address"] == "192.168.0.2/16"


def test_duplicate_routes_are_given_once(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/handlers_test.go, Describe "Handlers", It
    "Allocate duplicate static routes": 5.5.0.0/16 twice and 0.0.0.0/0 beside defaultGateway
    make two routes."""
    got = add(ipam, "dup-routes", cni_args=";IP=192.168.0.2")
    assert got["routes"] == [{"dst": "0.0.0.0/0", "gw": "192.168.0.1"},
                             {"dst": "5.5.0.0/16", "gw": "192.168.0.1"}]


def test_routes_are_sorted_and_given_once(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/allocate.go getRoutes and
    sortAndDedupIPNets on the routes of api/v1alpha1/ippool_test.go, Describe "Validate", It
    "Valid - routes" (each listed twice) with defaultGateway: the default route first, then by
    address, each once."""
    got = add(ipam, "routed")
    assert got["routes"] == [{"dst": "0.0.0.0/0", "gw": "192.168.0.1"},
                             {"dst": "5.5.0.0/16", "gw": "192.168.0.1"},
                             {"dst": "10.7.1.0/24", "gw": "192.168.0.1"}]


def test_a_static_ip_outside_every_requested_pool_fails_the_add(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/handlers_test.go, Describe "Handlers", It
    "Allocate failed: static IP was not allocated": pool1 only, requested 10.10.10.10; nothing
    stays allocated. Two addresses in one pool fail alike: nv-ipam takes the first address per
    pool and then finds the second one not allocated."""
    with pytest.raises(CniError) as e:
        add(ipam, "pool1", cni_args=";IP=10.10.10.10")
    assert e.value.msg == ("not all requested static IPs can be allocated from the ranges "
                           "available on the node, ip 10.10.10.10 has no matching Pool")
    assert "pool1 (192.168.0.0/16)" in e.value.details
    with pytest.raises(CniError, match=r"ip 10\.10\.10\.10 has no matching Pool"):
        add(ipam, runtimeConfig={"ips": ["192.168.0.7", "10.10.10.10"]})
    with pytest.raises(CniError, match=r"ip 192\.168\.0\.8 has no matching Pool"):
        add(ipam, runtimeConfig={"ips": ["192.168.0.7", "192.168.0.8"]})
    assert held(ipam, "pool1") == held(ipam, "pool2") == []


def test_an_index_outside_the_block_is_refused(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/handlers_test.go, Describe "Handlers", It
    "Allocate failed: IP with index out of range": index 253 of 192.168.0.2-254."""
    with pytest.raises(CniError) as e:
        add(ipam, "pool1", args={"cni": {"allocateIPWithIndex": 253}})
    assert (e.value.code, e.value.msg) == (7, (
        'args.cni.allocateIPWithIndex: requested IP index "253" is outside of the given chunk '
        "192.168.0.2-192.168.0.254 of pool pool1"))


def test_an_index_on_the_gateway_is_refused(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/handlers_test.go, Describe "Handlers", It
    "Allocate failed: IP with index is the gateway": index 4 of pool2 is 10.100.0.5."""
    with pytest.raises(CniError) as e:
        add(ipam, "pool2", args={"cni": {"allocateIPWithIndex": 4}})
    assert e.value.msg == ('args.cni.allocateIPWithIndex: requested IP index "4" is the actual '
                           "gateway 10.100.0.5 of pool pool2, use allocateDefaultGateway instead")


def test_an_index_on_an_excluded_or_held_address_is_refused(tmp_path: Path) -> None:
    """The checks of Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/allocate.go
    allocateInPool for allocateIPWithIndex, past the gateway and the block's end: nv-ipam hands
    the address out as a static one even when the pool excludes it (allocator.go
    allocateStaticIP ignores exclusions); nicop refuses an excluded index, naming it. An
    address another container holds is refused by both."""
    (tmp_path / "pools.json").write_text(json.dumps({"pool1": {
        **POOLS["pool1"], "exclusions": [{"startIP": "192.168.0.5", "endIP": "192.168.0.6"}],
        "perNodeExclusions": [{"startIndex": 10, "endIndex": 10}]}}))
    ipam = Ipam(Store(Host(tmp_path)), FilePools(tmp_path / "pools.json"))
    try:
        for index, ip in ((3, "192.168.0.5"), (10, "192.168.0.12")):
            with pytest.raises(CniError) as e:
                add(ipam, "pool1", args={"cni": {"allocateIPWithIndex": index}})
            assert (e.value.code, e.value.msg) == (7, (
                f'args.cni.allocateIPWithIndex: requested IP index "{index}" is {ip}, which '
                "pool pool1 excludes (spec.exclusions or spec.perNodeExclusions); choose "
                "another index"))
        add(ipam, "pool1", args={"cni": {"allocateIPWithIndex": 2}})
        with pytest.raises(CniError) as e:
            add(ipam, "pool1", cid="id2", args={"cni": {"allocateIPWithIndex": 2}})
        assert (e.value.code, e.value.msg) == (100, (
            'requested IP 192.168.0.4 (index 2) is already reserved in the pool "pool1", '
            'poolType "ippool"'))
        assert held(ipam, "pool1") == ["192.168.0.4"]
    finally:
        ipam.store.close()


def test_allocation_from_an_unknown_pool(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/handlers_test.go, Describe "Handlers", It
    "Allocation failed: unknown pool"."""
    with pytest.raises(CniError) as e:
        add(ipam, "pool1,nope")
    assert (e.value.code, e.value.msg) == (7, "ipam.poolName: unknown ippool 'nope' (pools file "
                                              f"{ipam.pools.path} has {sorted(POOLS)})")  # type: ignore[attr-defined]
    assert held(ipam, "pool1") == []


def test_one_exhausted_pool_fails_the_add_with_nothing_held(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/handlers_test.go, Describe "Handlers", It
    "Allocation failed: pool2 has no free IPs": pool1 had an address for the call, but the
    store keeps nothing of it, and pool1's round-robin pointer has not moved."""
    add(ipam, "full", cid="other")
    with pytest.raises(CniError) as e:
        add(ipam, "pool1,full")
    assert e.value.code == Code.NO_FREE_ADDRESSES
    assert held(ipam, "pool1") == [] and ipam.store.last_reserved("pool1") == ""
    assert add(ipam, "pool1", cid="id3")["ips"][0]["address"] == "192.168.0.2/16"


def test_a_second_add_for_the_same_container_and_interface(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/handlers_test.go, Describe "Handlers", It
    "Allocation failed: already allocated", with allocate.go's message: a second reservation for
    id1/net0 by another pod is refused and the first one stays. The same pod's ADD again (a
    runtime retrying after the daemon died mid-ADD, as error 11 invites) gets the same
    addresses back, where nv-ipam refuses it too; no second address is taken."""
    first = add(ipam)
    with pytest.raises(CniError) as e:
        add(ipam, cni_args=";K8S_POD_NAME=other-pod")
    assert e.value.msg == 'allocation already exist in the pool "pool1", poolType "ippool"'
    assert "holds 192.168.0.2 for pod default/test-pod" in e.value.details
    assert add(ipam) == first
    assert held(ipam, "pool1") == ["192.168.0.2"] and held(ipam, "pool2") == ["10.100.0.1"]


def test_a_store_that_cannot_be_written_fails_the_add_and_keeps_nothing(
        ipam: Ipam, unwritable: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/handlers_test.go, Describe "Handlers", It
    "Allocation failed: failed to commit": error 5 naming the store; the addresses are not
    held, so the runtime's retry gets the very same ones."""
    with pytest.raises(CniError) as e:
        add(ipam)
    assert e.value.code == Code.IO_FAILURE
    assert e.value.msg.startswith(f"cannot write the allocation store {ipam.store.path}: ")
    assert ipam.store.snapshot() == {}
    unwritable.rmdir()
    assert [ip["address"] for ip in add(ipam)["ips"]] == ["192.168.0.2/16", "10.100.0.1/16"]


def kube_pools(*pools: dict[str, Any]) -> KubePools:
    """The node's view of IPPools the API server sent (the informers' handler, fed directly)."""
    class Manager:
        def informer(self, res: Any, namespace: str | None = None) -> Informer:
            return Informer(None, res, namespace)  # type: ignore[arg-type]

    kube = KubePools(Manager(), "ns", "node-1")  # type: ignore[arg-type]
    for informer in kube.informers.values():
        informer.synced.set()
    for pool in pools:
        kube._handler("ippool")("ADDED", pool, None)
    return kube


def ippool(name: str, block: tuple[str, str], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns"},
            "spec": {"subnet": "192.168.0.0/16", "perNodeBlockSize": 253, **spec},
            "status": {"allocations": [{"nodeName": "node-1", "startIP": block[0],
                                        "endIP": block[1]}]}}


@pytest.mark.parametrize(("case", "pool", "says"), [
    ("Allocation failed: bad pool config",
     ippool("pool1", ("192.168.0.254", "192.168.0.2"), gateway="192.168.0.1"),
     "startIP 192.168.0.254 is after endIP 192.168.0.2"),
    ("Allocation failed: bad static route",
     ippool("pool1", ("192.168.0.2", "192.168.0.254"), gateway="192.168.0.1",
            routes=[{"dst": "foo"}]),
     "spec.routes[0].dst: 'foo' is not a subnet in CIDR notation, e.g. 10.0.0.0/8"),
])
def test_a_block_that_cannot_be_used_fails_the_add(tmp_path: Path, case: str,
                                                   pool: dict[str, Any], says: str) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/handlers_test.go, Describe "Handlers", It
    `case` (and pkg/cni/plugin/plugin_test.go, Context "CmdAdd()", It "executes failed - non
    cidr route", a route without prefix length): the ADD fails naming the pool, the node and
    what is wrong, before any address is taken."""
    ipam = Ipam(Store(Host(tmp_path)), kube_pools(pool))
    try:
        with pytest.raises(CniError) as e:
            add(ipam, "pool1")
        assert (e.value.code, e.value.msg) == (
            Code.TRY_AGAIN_LATER, f"IPPool ns/pool1 cannot be used on node node-1: {says}"), case
        assert ipam.store.snapshot() == {}
    finally:
        ipam.store.close()


def test_a_route_without_prefix_length_is_refused(tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/plugin/plugin_test.go, Describe "plugin tests", Context
    "CmdAdd()", It "executes failed - non cidr route": nv-ipam reads a route as Go's
    net.ParseCIDR does, so "5.5.0.0" is no route (Python would take it as a /32)."""
    ipam = Ipam(Store(Host(tmp_path)), kube_pools(ippool(
        "pool1", ("192.168.0.2", "192.168.0.254"), gateway="192.168.0.1",
        routes=[{"dst": "5.5.0.0"}])))
    try:
        with pytest.raises(CniError, match=r"spec\.routes\[0\]\.dst: '5\.5\.0\.0' is not a "):
            add(ipam, "pool1")
    finally:
        ipam.store.close()


# ------------------------------------------------------------------ allocateDefaultGateway

def test_the_gateway_as_address_comes_without_gateway_and_routes(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/allocate.go allocateInPool: with
    allocate_default_gateway the result's Gateway is cleared, and getRoutes returns no route
    without a gateway."""
    got = add(ipam, "routed", args={"cni": {"allocateDefaultGateway": True}})
    assert got["ips"] == [{"address": "192.168.0.1/16"}]
    assert got["routes"] == []


def test_the_gateway_of_a_pool_without_one(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/allocate.go allocateInPool: "pool
    without gateway can't be used with allocate_default_gateway feature"."""
    with pytest.raises(CniError) as e:
        add(ipam, "p2p", args={"cni": {"allocateDefaultGateway": True}})
    assert e.value.msg == ('args.cni.allocateDefaultGateway: pool without gateway can\'t be used '
                           'with allocateDefaultGateway, pool "p2p", poolType "ippool"')


# ------------------------------------------------------------------ IsAllocated, Deallocate

def test_is_allocated(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/handlers_test.go, Describe "Handlers", Its
    "IsAllocated succeed" and "IsAllocated failed: no reservation" (isallocated.go's
    message)."""
    with pytest.raises(CniError) as e:
        ipam.is_allocated(request("CHECK", ipam={"poolName": "pool1,pool2"}))
    assert e.value.msg == 'reservation for pool "pool1", poolType "ippool" not found'
    add(ipam)
    ipam.is_allocated(request("CHECK", ipam={"poolName": "pool1,pool2"}))


def test_deallocate(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/handlers_test.go, Describe "Handlers", It
    "Deallocate succeed": both pools' addresses are freed; a second DEL succeeds too."""
    add(ipam)
    for _ in range(2):
        ipam.release(request("DEL", ipam={"poolName": "pool1,pool2"}))
        assert held(ipam, "pool1") == held(ipam, "pool2") == []


def test_a_store_that_cannot_be_written_fails_the_del_and_keeps_the_addresses(
        ipam: Ipam, tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/handlers/handlers_test.go, Describe "Handlers", It
    "Deallocate failed: failed to commit": error 5; the addresses stay held (nothing half
    released), and the runtime's retried DEL frees them."""
    add(ipam)
    path = ipam.store.path
    blocker = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    blocker.mkdir()
    with pytest.raises(CniError) as e:
        ipam.release(request("DEL", ipam={"poolName": "pool1,pool2"}))
    assert e.value.code == Code.IO_FAILURE
    assert [r.ip_address for r in ipam.store.snapshot()["pool1"]] == ["192.168.0.2"]
    blocker.rmdir()
    ipam.release(request("DEL", ipam={"poolName": "pool1,pool2"}))
    assert held(ipam, "pool1") == held(ipam, "pool2") == []


# ------------------------------------------------------------------ store keys, small blocks

def test_cidrpool_reservations_are_kept_under_nv_ipams_key(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/common/pool_key.go GetPoolKey: an IPPool under its name, a
    CIDRPool under "cidrpool/<name>". A node moved from nv-ipam keeps the address its pod holds:
    it is not handed out again, CHECK finds it, and DEL frees it."""
    old = Reservation("pod-from-nv-ipam", "net0", "10.10.3.2", pod_name="old",
                      pod_namespace="default")
    with ipam.store.transaction():
        ipam.store.reserve("cidrpool/cidr1", old)
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


def test_point_to_point_and_single_address_blocks_hand_out_their_address(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-controller/allocator/allocator_test.go, Describe
    "Allocator", Context "small pools": the blocks a node gets from a /31 and a /32 pool with
    perNodeBlockSize 1 are used whole, network address included; no gateway."""
    assert add(ipam, "p2p")["ips"] == [{"address": "10.10.10.11/31"}]
    assert add(ipam, "single")["ips"] == [{"address": "10.10.10.10/32"}]
    with pytest.raises(CniError, match="no free addresses in pool single"):
        add(ipam, "single", cid="id2")


def test_a_static_ip_does_not_move_the_round_robin_pointer(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/allocator/allocator.go allocateStaticIP: "for
    static allocations we don't want to change lastReservedIP"."""
    assert add(ipam, "pool1", cid="a")["ips"][0]["address"] == "192.168.0.2/16"
    assert add(ipam, "pool1", cid="b", cni_args=";IP=192.168.0.100")["ips"][0]["address"] == \
        "192.168.0.100/16"
    assert ipam.store.last_reserved("pool1") == "192.168.0.2"
    assert add(ipam, "pool1", cid="c")["ips"][0]["address"] == "192.168.0.3/16"
