"""nv-ipam allocation on one node: which address a pod gets, and when it gets none."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nicop.cni.ipam import Ipam
from nicop.cni.pools import FilePools, KubePools, node_pool_config
from nicop.cni.spec import CniError, Request, parse_request
from nicop.cni.store import Store
from nicop.node.host import Host

POOLS = {
    "v4": {"subnet": "10.0.0.0/24", "startIP": "10.0.0.1", "endIP": "10.0.0.8",
           "gateway": "10.0.0.1", "exclusions": [{"startIP": "10.0.0.3", "endIP": "10.0.0.4"}],
           "routes": [{"dst": "10.100.0.0/16"}], "defaultGateway": True},
    "v6": {"subnet": "fd00::/120", "startIP": "fd00::10", "endIP": "fd00::1f",
           "gateway": "fd00::1"},
    "tiny": {"subnet": "10.9.0.0/30"},
}


@pytest.fixture
def ipam(tmp_path: Path) -> Iterator[Ipam]:
    (tmp_path / "pools.json").write_text(json.dumps(POOLS))
    ipam = Ipam(Store(Host(tmp_path)), FilePools(tmp_path / "pools.json"))
    yield ipam
    ipam.store.close()


def request(command: str = "ADD", cid: str = "c1", ifname: str = "net1", pool: str = "v4",
            cni_args: str = "", name: str = "net-a", **extra: Any) -> Request:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/x",
           "CNI_PATH": "/opt/cni/bin", "CNI_IFNAME": ifname,
           "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p-" + cid + cni_args}
    config = {"cniVersion": "1.1.0", "name": name,
              "ipam": {"type": "nv-ipam", "poolName": pool}, **extra}
    return parse_request("nv-ipam", env, json.dumps(config).encode())


def addresses(ipam: Ipam, *cids: str, **kw: Any) -> list[str]:
    return [ipam.allocate(request(cid=c, **kw))["ips"][0]["address"] for c in cids]


def test_the_block_is_used_round_robin_around_gateway_and_exclusions(ipam: Ipam) -> None:
    assert addresses(ipam, "a", "b", "c") == ["10.0.0.2/24", "10.0.0.5/24", "10.0.0.6/24"]
    ipam.release(request("DEL", cid="a"))
    assert addresses(ipam, "d", "e", "f") == ["10.0.0.7/24", "10.0.0.8/24", "10.0.0.2/24"]
    with pytest.raises(CniError) as e:
        addresses(ipam, "g")
    assert e.value.code == 101
    assert e.value.msg == "no free addresses in pool v4 on this node (10.0.0.1-10.0.0.8, " \
                          "5 allocated)"


def test_result_has_gateway_routes_and_default_route(ipam: Ipam) -> None:
    result = ipam.allocate(request())
    assert result["ips"] == [{"address": "10.0.0.2/24", "gateway": "10.0.0.1"}]
    assert result["routes"] == [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"},
                                {"dst": "10.100.0.0/16", "gw": "10.0.0.1"}]


def test_a_repeated_add_gets_the_same_address(ipam: Ipam) -> None:
    assert addresses(ipam, "a") == addresses(ipam, "a") == ["10.0.0.2/24"]
    assert ipam.usage()["v4"] == {"allocated": 1, "size": 5}


def test_dual_stack(ipam: Ipam) -> None:
    result = ipam.allocate(request(pool="v4,v6"))
    assert [ip["address"] for ip in result["ips"]] == ["10.0.0.2/24", "fd00::10/120"]
    ipam.release(request("DEL", pool="v4,v6"))
    assert ipam.store.snapshot() == {"v4": [], "v6": []}


def test_static_addresses_in_the_priority_nv_ipam_gives_them(ipam: Ipam) -> None:
    by_args = ipam.allocate(request(cid="a", cni_args=";IP=10.0.0.200"))
    assert by_args["ips"][0]["address"] == "10.0.0.200/24"
    by_runtime = ipam.allocate(request(cid="b", cni_args=";IP=10.0.0.201",
                                       runtimeConfig={"ips": ["10.0.0.202/24"]}))
    assert by_runtime["ips"][0]["address"] == "10.0.0.202/24"
    with pytest.raises(CniError) as e:
        ipam.allocate(request(cid="c", cni_args=";IP=10.0.0.200"))
    assert (e.value.code, e.value.msg) == (100, "10.0.0.200 is already allocated in pool v4")


def test_gateway_and_index_requests(ipam: Ipam) -> None:
    gw = ipam.allocate(request(cid="a", args={"cni": {"allocateDefaultGateway": True}}))
    assert gw["ips"][0]["address"] == "10.0.0.1/24"
    indexed = ipam.allocate(request(cid="b", args={"cni": {"allocateIPWithIndex": 5}}))
    assert indexed["ips"][0]["address"] == "10.0.0.6/24"


def test_gc_frees_only_this_networks_stale_attachments(ipam: Ipam) -> None:
    addresses(ipam, "a", "b")
    addresses(ipam, "c", name="net-b")
    gc = request("GC", **{"cni.dev/valid-attachments": [{"containerID": "b", "ifname": "net1"}]})
    assert ipam.collect(gc) == 1
    assert sorted(r.container_id for r in ipam.store.snapshot()["v4"]) == ["b", "c"]


def test_unknown_pool_names_the_field(ipam: Ipam) -> None:
    with pytest.raises(CniError) as e:
        ipam.allocate(request(pool="nope"))
    assert e.value.code == 7 and e.value.msg.startswith("ipam.poolName: unknown ippool 'nope'")


def test_a_point_to_point_pool_hands_out_both_hosts(ipam: Ipam) -> None:
    assert addresses(ipam, "a", "b", pool="tiny") == ["10.9.0.1/30", "10.9.0.2/30"]


def ippool(status: list[dict[str, str]] | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "pool1", "namespace": "ns"},
            "spec": {"subnet": "192.168.0.0/16", "perNodeBlockSize": 100,
                     "gateway": "192.168.0.1", **spec},
            **({"status": {"allocations": status}} if status is not None else {})}


def test_the_nodes_block_from_an_ippool_status() -> None:
    pool = ippool([{"nodeName": "node-2", "startIP": "192.168.0.101", "endIP": "192.168.0.200"}],
                  perNodeExclusions=[{"startIndex": 0, "endIndex": 9}],
                  exclusions=[{"startIP": "192.168.0.150", "endIP": "192.168.0.250"}],
                  routes=[{"dst": "10.0.0.0/8"}])
    assert node_pool_config("ippool", pool, "node-1") is None
    cfg = node_pool_config("ippool", pool, "node-2")
    assert cfg is not None
    assert (str(cfg.start), str(cfg.end), str(cfg.gateway)) == (
        "192.168.0.101", "192.168.0.200", "192.168.0.1")
    assert cfg.size() == 100 - 10 - 51
    assert cfg.result_routes() == [{"dst": "10.0.0.0/8", "gw": "192.168.0.1"}]


def test_the_nodes_prefix_from_a_cidrpool_status() -> None:
    pool = {"metadata": {"name": "c"}, "spec": {"cidr": "10.10.0.0/16", "perNodeNetworkPrefix": 24,
                                                 "gatewayIndex": 1},
            "status": {"allocations": [{"nodeName": "n1", "prefix": "10.10.3.0/24",
                                        "gateway": "10.10.3.1"}]}}
    cfg = node_pool_config("cidrpool", pool, "n1")
    assert cfg is not None
    assert (str(cfg.start), str(cfg.end), cfg.size()) == ("10.10.3.1", "10.10.3.254", 253)


def test_kube_pools_explain_a_missing_pool_or_block() -> None:
    class FakeManager:
        def informer(self, res: Any, namespace: str | None = None) -> Any:
            from nicop.kube.informer import Informer
            return Informer(None, res, namespace)  # type: ignore[arg-type]

    pools = KubePools(FakeManager(), "ns", "node-1")  # type: ignore[arg-type]
    with pytest.raises(CniError) as e:
        pools.lookup("ippool", "pool1")
    assert e.value.code == 11  # not loaded yet
    for informer in pools.informers.values():
        informer.synced.set()
    pools._handler("ippool")("ADDED", ippool(), None)
    with pytest.raises(CniError) as e:
        pools.lookup("ippool", "pool1")
    assert (e.value.code, e.value.msg) == (11, "IPPool ns/pool1 has no block for node node-1 yet")
    with pytest.raises(CniError) as e:
        pools.lookup("cidrpool", "pool1")
    assert (e.value.code, e.value.msg) == (
        7, "ipam.poolName: no CIDRPool named 'pool1' in namespace ns")
    pools._handler("ippool")("MODIFIED", ippool(
        [{"nodeName": "node-1", "startIP": "192.168.0.1", "endIP": "192.168.0.100"}]), None)
    assert str(pools.lookup("ippool", "pool1").end) == "192.168.0.100"


@pytest.mark.parametrize(("broken", "says"), [
    ('{"v4": {"subnet": "10.0.', "Unterminated string"),
    ('{"v4": {"subnet": "not-a-subnet"}}', "does not appear to be an IPv4 or IPv6 network"),
    ('["v4"]', "has no attribute 'items'"),
    (None, "pools file"),
])
def test_a_broken_pools_file_is_logged_and_the_last_good_pools_serve(
        ipam: Ipam, tmp_path: Path, caplog: pytest.LogCaptureFixture, broken: str | None,
        says: str) -> None:
    """Truncated, of the wrong type, or gone: addresses still come from the last good pools,
    the log says why the file was not taken, and a fixed file is taken again."""
    path = tmp_path / "pools.json"
    assert addresses(ipam, "a") == ["10.0.0.2/24"]
    if broken is None:
        path.unlink()
    else:
        path.write_text(broken)
    assert addresses(ipam, "b") == ["10.0.0.5/24"]
    assert any(says in r.getMessage() and "keeping the last good pools ['tiny', 'v4', 'v6']"
               in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    path.write_text(json.dumps({"v4": {"subnet": "10.0.0.0/24", "startIP": "10.0.0.20"}}))
    assert addresses(ipam, "c", pool="v4") == ["10.0.0.20/24"]
    with pytest.raises(CniError, match="unknown ippool 'tiny'"):
        addresses(ipam, "d", pool="tiny")
