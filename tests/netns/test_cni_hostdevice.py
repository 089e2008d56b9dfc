"""The host-device plugin: a node netdev by name, MAC, kernel path or PCI address, and back."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from tests.netns.cni_harness import Node, addresses, links, validate_result

from nicop.cni.netlink import Netns, get_link

pytestmark = pytest.mark.netns


def host_device(**selector: Any) -> dict[str, Any]:
    return {"cniVersion": "1.1.0", "name": "hd-net", "type": "host-device", **selector}


@pytest.mark.parametrize("by", ["device", "hwaddr", "kernelpath", "pciBusID", "deviceID",
                                "runtimeConfig"])
def test_each_way_of_naming_the_device_moves_it_in_and_back(node: Node, by: str) -> None:
    vf = node.vfs[1]
    kernel = "/" + str(node.host.path(f"/sys/bus/pci/devices/{vf.pci}").resolve()
                       .relative_to(node.root.resolve()))
    selector = {
        "device": {"device": vf.netdev},
        "hwaddr": {"hwaddr": vf.mac.upper()},
        "kernelpath": {"kernelpath": kernel},
        "pciBusID": {"pciBusID": vf.pci},
        "deviceID": {"deviceID": vf.pci},
        "runtimeConfig": {"runtimeConfig": {"deviceID": vf.pci}},
    }[by]
    pod = node.pod()
    add = node.cni("host-device", "ADD", host_device(**selector), netns=pod, ifname="eth5")
    assert add.rc == 0, add.out
    validate_result(add.out, "1.1.0")
    assert add.out["interfaces"][0]["name"] == "eth5"
    assert add.out["interfaces"][0]["mac"] == vf.mac
    assert "eth5" in links(pod) and vf.netdev not in links(node.netns)
    assert node.cni("host-device", "DEL", host_device(**selector), netns=pod,
                    ifname="eth5").rc == 0
    assert links(node.netns)[vf.netdev]["address"] == vf.mac
    assert node.cache_files() == []


def test_addresses_from_ipam_and_static_ip_from_cni_args(node: Node) -> None:
    pod = node.pod()
    config = host_device(device=node.vfs[0].netdev,
                         ipam={"type": "nv-ipam", "poolName": "pool1"})
    args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;IP=10.10.9.9"
    add = node.cni("host-device", "ADD", config, netns=pod, args=args)
    assert add.rc == 0, add.out
    assert add.out["ips"][0]["address"] == "10.10.9.9/16"
    assert addresses(pod, "net1") == ["10.10.9.9/16"]
    assert node.cni("host-device", "DEL", config, netns=pod, args=args).rc == 0
    assert node.allocations() == {}


def test_a_device_attached_by_the_upstream_plugin_comes_back(node: Node) -> None:
    """Upstream keeps the node name only as the link alias; DEL finds it there."""
    vf = node.vfs[6]
    pod = node.pod()
    with Netns(node.netns) as host, Netns(pod) as ns, host.ipr() as h:
        link = get_link(h, vf.netdev)
        assert link is not None
        h.link("set", index=link.index, net_ns_fd=ns.fd)
        with ns.ipr() as p:
            moved = get_link(p, vf.netdev)
            assert moved is not None
            p.link("set", index=moved.index, ifname="net1", ifalias=vf.netdev)
    assert node.cni("host-device", "DEL", host_device(device=vf.netdev), netns=pod).rc == 0
    assert vf.netdev in links(node.netns) and "net1" not in links(pod)


def test_a_name_taken_in_the_pod_fails_cleanly(node: Node) -> None:
    pod = node.pod()
    subprocess.run(["ip", "-n", pod.rsplit("/", 1)[1], "link", "add", "net1", "type", "veth",
                    "peer", "name", "other"], check=True)
    call = node.cni("host-device", "ADD", host_device(device=node.vfs[0].netdev), netns=pod)
    assert call.rc == 1
    assert call.out["code"] == 4
    assert call.out["msg"] == f"CNI_IFNAME: interface net1 already exists in {pod}"
    assert node.vfs[0].netdev in links(node.netns)
    assert node.cache_files() == []


def test_a_missing_device_is_named(node: Node) -> None:
    call = node.cni("host-device", "ADD", host_device(device="nosuchdev"), netns=node.pod())
    assert call.rc == 1
    assert call.out["code"] == 100
    assert call.out["msg"] == "device nosuchdev is not on the node"
