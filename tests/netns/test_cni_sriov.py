"""The sriov and ib-sriov plugins moving (veth stand-ins for) VFs into pod namespaces and back."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from tests.netns.cni_harness import (
    Node,
    addresses,
    links,
    routes,
    validate_error,
    validate_result,
)

pytestmark = pytest.mark.netns


def sriov(node: Node, vf: int = 0, version: str = "1.0.0", **extra: Any) -> dict[str, Any]:
    return {"cniVersion": version, "name": "sriov-net", "type": "sriov",
            "deviceID": node.vfs[vf].pci,
            "ipam": {"type": "nv-ipam", "poolName": "pool1"}, **extra}


@pytest.mark.parametrize("version", ["1.0.0", "1.1.0"])
def test_add_moves_the_vf_into_the_pod_with_name_mac_ip_and_routes(
    node: Node, version: str
) -> None:
    vf = node.vfs[2]
    pod = node.pod()
    config = sriov(node, 2, version, vlan=100, vlanQoS=3, mac="02:aa:bb:cc:dd:01",
                   spoofchk="off", trust="on", link_state="enable", min_tx_rate=10,
                   max_tx_rate=1000)
    call = node.cni("sriov", "ADD", config, netns=pod, ifname="net1")
    assert call.rc == 0, call.out
    validate_result(call.out, version)
    iface = call.out["interfaces"][0]
    assert iface["name"] == "net1" and iface["sandbox"] == pod
    assert iface["mac"] == "02:aa:bb:cc:dd:01"
    assert iface.get("mtu") == 1500 and "pciID" not in iface, "as sriov-cni prints it"
    assert call.out["ips"] == [{"interface": 0, "address": "10.10.1.1/16",
                                "gateway": "10.10.0.1"}]
    assert call.out["routes"] == [{"dst": "10.200.0.0/16", "gw": "10.10.0.1"}]

    in_pod = links(pod)["net1"]
    assert in_pod["address"] == "02:aa:bb:cc:dd:01" and in_pod["mtu"] == 1500
    assert "UP" in in_pod["flags"]
    assert addresses(pod, "net1") == ["10.10.1.1/16"]
    assert {"dst": "10.200.0.0/16", "gateway": "10.10.0.1"}.items() <= next(
        r for r in routes(pod) if r["dst"] == "10.200.0.0/16").items()
    assert vf.netdev not in links(node.netns), "the VF left the node's namespace"
    assert node.pf_calls() == [
        f"LinkSetVfVlanQosProto {node.pf} 2 100 3 33024",
        f"LinkSetVfHardwareAddr {node.pf} 2 02:aa:bb:cc:dd:01",
        f"LinkSetVfRate {node.pf} 2 10 1000",
        f"LinkSetVfSpoofchk {node.pf} 2 false",
        f"LinkSetVfTrust {node.pf} 2 true",
        f"LinkSetVfState {node.pf} 2 1",
    ]

    delete = node.cni("sriov", "DEL", config, netns=pod, ifname="net1")
    assert delete.rc == 0, delete.out
    back = links(node.netns)[vf.netdev]
    assert back["address"] == vf.mac and back["mtu"] == 1500
    assert "ifalias" not in back
    assert "net1" not in links(pod)
    assert node.pf_calls()[6:] == [
        f"LinkSetVfVlanQosProto {node.pf} 2 0 0 33024",
        f"LinkSetVfSpoofchk {node.pf} 2 true",
        f"LinkSetVfHardwareAddr {node.pf} 2 00:00:00:00:00:00",
        f"LinkSetVfTrust {node.pf} 2 false",
        f"LinkSetVfRate {node.pf} 2 0 0",
        f"LinkSetVfState {node.pf} 2 0",
    ]
    assert node.cache_files() == [] and node.allocations() == {}
    again = node.cni("sriov", "DEL", config, netns=pod, ifname="net1")
    assert (again.rc, again.out) == (0, None), "DEL is idempotent"


def test_cache_and_pci_file_are_sriov_cnis(node: Node) -> None:
    """The files DEL needs, where and as upstream sriov-cni writes them."""
    pod = node.pod()
    vf = node.vfs[0]
    assert node.cni("sriov", "ADD", sriov(node, vlan=7), netns=pod, container_id="abc").rc == 0
    cache = json.loads(node.host.path("/var/lib/cni/sriov/abc-net1").read_text())
    assert cache["deviceID"] == vf.pci and cache["Master"] == node.pf and cache["VFID"] == 0
    assert cache["OrigVfState"]["HostIFName"] == vf.netdev
    assert cache["OrigVfState"]["EffectiveMAC"] == vf.mac
    assert node.host.read(f"/var/lib/cni/sriov/pci/{vf.pci}") == pod
    assert node.cni("sriov", "DEL", sriov(node), netns=pod, container_id="abc").rc == 0
    assert node.cache_files() == []


def test_a_vf_in_use_is_refused_and_left_alone(node: Node) -> None:
    first, second = node.pod(), node.pod()
    assert node.cni("sriov", "ADD", sriov(node), netns=first, container_id="a").rc == 0
    call = node.cni("sriov", "ADD", sriov(node), netns=second, container_id="b", pod="pod2")
    assert call.rc == 1
    validate_error(call.out, "1.0.0")
    assert call.out["code"] == 100
    assert call.out["msg"] == f"deviceID: pci address {node.vfs[0].pci} is already allocated"
    assert "net1" in links(first) and "net1" not in links(second)
    assert len(node.allocations()) == 1, "the refused ADD holds no address"


def test_two_adds_racing_for_one_vf_one_wins(node: Node) -> None:
    pods = [node.pod() for _ in range(2)]
    with ThreadPoolExecutor(2) as pool:
        calls = list(pool.map(
            lambda i: node.cni("sriov", "ADD", sriov(node, 1), netns=pods[i],
                               container_id=f"race{i}", pod=f"pod{i}"), range(2)))
    assert sorted(c.rc for c in calls) == [0, 1]
    loser = next(c for c in calls if c.rc == 1)
    assert loser.out["code"] == 100
    assert sum("net1" in links(p) for p in pods) == 1


def test_del_without_netns_still_returns_the_vf(node: Node) -> None:
    """A runtime that lost the pod's namespace path (CNI_NETNS empty) may still DEL."""
    pod = node.pod()
    vf = node.vfs[3]
    assert node.cni("sriov", "ADD", sriov(node, 3, mac="02:00:00:00:00:33"), netns=pod).rc == 0
    assert node.cni("sriov", "DEL", sriov(node, 3), netns="").rc == 0
    assert links(node.netns)[vf.netdev]["address"] == vf.mac
    assert node.cache_files() == [] and node.allocations() == {}


def test_check_confirms_what_add_did(node: Node) -> None:
    pod = node.pod()
    config = sriov(node, version="1.1.0")
    add = node.cni("sriov", "ADD", config, netns=pod)
    check = node.cni("sriov", "CHECK", {**config, "prevResult": add.out}, netns=pod)
    assert (check.rc, check.out) == (0, None)
    wrong = {**add.out, "ips": [{"address": "10.99.0.9/16", "interface": 0}]}
    check = node.cni("sriov", "CHECK", {**config, "prevResult": wrong}, netns=pod)
    assert check.rc == 1 and "lacks address 10.99.0.9/16" in check.out["msg"]


def test_gc_releases_attachments_the_runtime_no_longer_has(node: Node) -> None:
    pods = [node.pod() for _ in range(3)]
    for i, pod in enumerate(pods):
        assert node.cni("sriov", "ADD", sriov(node, i, "1.1.0"), netns=pod,
                        container_id=f"gc{i}", pod=f"pod{i}").rc == 0
    config = {**sriov(node, 0, "1.1.0"),
              "cni.dev/valid-attachments": [{"containerID": "gc1", "ifname": "net1"}]}
    del config["deviceID"]
    call = node.cni("sriov", "GC", config)
    assert (call.rc, call.out) == (0, None)
    assert [("net1" in links(p)) for p in pods] == [False, True, False]
    assert list(node.allocations()) == ["pool1/gc1_net1"]
    assert node.vfs[0].netdev in links(node.netns) and node.vfs[2].netdev in links(node.netns)


def test_ib_sriov_sets_the_guid_and_restores_it(node: Node) -> None:
    pod = node.pod()
    config = {"cniVersion": "1.0.0", "name": "ib-net", "type": "ib-sriov",
              "deviceID": node.vfs[4].pci, "runtimeConfig": {"infinibandGUID":
                                                             "02:00:00:00:00:00:00:04"},
              "ipam": {"type": "nv-ipam", "poolName": "pool1"}}
    call = node.cni("ib-sriov", "ADD", config, netns=pod)
    assert call.rc == 0, call.out
    validate_result(call.out, "1.0.0")
    assert node.pf_calls() == [f"LinkSetVfNodeGUID {node.pf} 4 02:00:00:00:00:00:00:04",
                               f"LinkSetVfPortGUID {node.pf} 4 02:00:00:00:00:00:00:04"]
    assert node.cni("ib-sriov", "DEL", config, netns=pod).rc == 0
    assert node.pf_calls()[2:] == [f"LinkSetVfNodeGUID {node.pf} 4 ff:ff:ff:ff:ff:ff:ff:ff",
                                   f"LinkSetVfPortGUID {node.pf} 4 ff:ff:ff:ff:ff:ff:ff:ff"]
    assert node.vfs[4].netdev in links(node.netns)


def test_ib_sriov_guid_from_cni_args(node: Node) -> None:
    pod = node.pod()
    config = {"cniVersion": "1.0.0", "name": "ib-net", "type": "ib-sriov",
              "deviceID": node.vfs[5].pci, "args": {"cni": {"guid": "02:00:00:00:00:00:00:05"}}}
    call = node.cni("ib-sriov", "ADD", config, netns=pod)
    assert call.rc == 0, call.out
    assert node.pf_calls()[0].endswith("5 02:00:00:00:00:00:00:05")


def test_without_daemon_the_plugin_says_so(node: Node) -> None:
    assert node.daemon is not None
    node.daemon.stop()
    node.daemon = None
    call = node.cni("sriov", "ADD", sriov(node), netns=node.pod())
    assert call.rc == 1
    validate_error(call.out, "1.0.0")
    assert call.out["code"] == 11
    assert call.out["msg"] == "nicop cni-daemon is not running on this node (sriov needs it)"
    version = node.cni("sriov", "VERSION", {"cniVersion": "1.1.0"})
    assert version.rc == 0 and version.out["supportedVersions"][-2:] == ["1.0.0", "1.1.0"]


FAKE_IPAM = """#!/bin/sh
echo "$CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME" >> "$(dirname "$0")/fake-ipam.calls"
cat > /dev/null
if [ "$CNI_COMMAND" = ADD ]; then
  echo '{"cniVersion":"1.0.0","ips":[{"address":"172.16.5.9/24","gateway":"172.16.5.1"}],
         "routes":[{"dst":"0.0.0.0/0"}],"dns":{"nameservers":["172.16.5.53"]}}'
fi
"""


def test_other_ipam_types_run_from_cni_path(node: Node) -> None:
    script = node.bin_dir / "fake-ipam"
    script.write_text(FAKE_IPAM)
    script.chmod(0o755)
    calls = node.bin_dir / "fake-ipam.calls"
    pod = node.pod()
    config = {**sriov(node, 5), "ipam": {"type": "fake-ipam"}}
    add = node.cni("sriov", "ADD", config, netns=pod)
    assert add.rc == 0, add.out
    assert add.out["ips"] == [{"interface": 0, "address": "172.16.5.9/24",
                               "gateway": "172.16.5.1"}]
    assert add.out["dns"] == {"nameservers": ["172.16.5.53"]}
    assert addresses(pod, "net1") == ["172.16.5.9/24"]
    default = next(r for r in routes(pod) if r["dst"] == "default")
    assert default["gateway"] == "172.16.5.1", "a route without gw goes via the IP's gateway"
    # GC of an attachment the runtime forgot replays the cached config's IPAM DEL.
    gc = {**config, "cniVersion": "1.1.0", "cni.dev/valid-attachments": []}
    assert node.cni("sriov", "GC", gc).rc == 0
    assert calls.read_text().splitlines() == ["ADD c1 net1", "DEL c1 net1"]
    assert node.vfs[5].netdev in links(node.netns)
