"""Upstream's own configs, run the way a runtime runs the plugins, get upstream's outcome.

Each test names the upstream test or doc its input comes from: sriov-cni's configuration
reference, ib-sriov-cni's README and tests, containernetworking/plugins' host-device tests.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from tests.netns.cni_harness import Node, addresses, links, validate_result

from nicop_sim.pf import RecordingRdmaControl

pytestmark = pytest.mark.netns

# ib-sriov-cni pkg/utils/utils_test.go "Valid IPoIB hardware address" and its GUID.
IPOIB_ADDRESS = "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01"
ZERO_IPOIB = "00:00:10:47:fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:00"

# A stand-in for host-local: answers as host-local does for the README's range.
HOST_LOCAL = """#!/bin/sh
echo "$CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME" >> "$(dirname "$0")/host-local.calls"
cat > /dev/null
if [ "$CNI_COMMAND" = ADD ]; then
  echo '{"cniVersion":"0.2.0","ip4":{"ip":"10.56.217.171/24","gateway":"10.56.217.1",
         "routes":[{"dst":"0.0.0.0/0"}]},"dns":{}}'
fi
"""
README_IPAM = {"type": "host-local", "subnet": "10.56.217.0/24", "rangeStart": "10.56.217.171",
               "rangeEnd": "10.56.217.181", "routes": [{"dst": "0.0.0.0/0"}],
               "gateway": "10.56.217.1"}


def install_host_local(node: Node) -> None:
    script = node.bin_dir / "host-local"
    script.write_text(HOST_LOCAL)
    script.chmod(0o755)


def ib_readme(node: Node, vf: int, **changes: Any) -> dict[str, Any]:
    """ib-sriov-cni README "Usage" config, for one of the node's VFs."""
    config = {"cniVersion": "0.3.1", "name": "mynet", "type": "ib-sriov",
              "deviceID": node.vfs[vf].pci, "link_state": "enable", "rdmaIsolation": True,
              "ibKubernetesEnabled": False, "ipam": README_IPAM, **changes}
    return {k: v for k, v in config.items() if v is not None}


def set_vf_address(node: Node, vf: int, address: str) -> None:
    """What the VF's IPoIB netdev reports as its hardware address (sysfs `address`)."""
    node.host.path(f"/sys/class/net/{node.vfs[vf].netdev}/address").write_text(address + "\n")


# ------------------------------------------------------------------ item 13

def test_rdma_isolation_moves_the_rdma_device_into_the_pod(node: Node) -> None:
    """ib-sriov-cni README "Usage" (rdmaIsolation: true) and cmd/ib-sriov-cni/main.go:
    the RDMA subsystem must be exclusive; ADD moves the VF's one RDMA device into the pod's
    namespace (RdmaLinkSetNsFd) and records RdmaNetState; DEL moves it back to the node."""
    install_host_local(node)
    rdma = RecordingRdmaControl(node.root / "pf")
    vf = node.vfs[1]
    device = node.host.rdma_device(vf.pci)
    assert device is not None
    pod = node.pod()
    config = ib_readme(node, 1, runtimeConfig={"infinibandGUID": "02:00:00:00:00:00:00:01"})

    refused = node.cni("ib-sriov", "ADD", config, netns=pod)
    assert refused.rc == 1 and refused.out["code"] == 999
    assert refused.out["msg"].startswith("rdmaIsolation: the node's RDMA subsystem network "
                                         "namespace mode is shared")
    assert vf.netdev in links(node.netns) and node.pf_calls() == []

    rdma.set_netns_mode("exclusive")
    taken = node.pod()  # a pod that already has net1: the ADD fails after the RDMA move
    subprocess.run(["ip", "-n", taken.rsplit("/", 1)[1], "link", "add", "net1", "type",
                    "veth", "peer", "name", "other"], check=True)
    failed = node.cni("ib-sriov", "ADD", config, netns=taken, container_id="c0")
    assert (failed.rc, failed.out["code"]) == (1, 4), failed.out
    assert rdma.namespaces() == {device: ""}, "the failed ADD gave the RDMA device back"
    assert vf.netdev in links(node.netns) and node.cache_files() == []

    add = node.cni("ib-sriov", "ADD", config, netns=pod)
    assert add.rc == 0, add.out
    assert add.out["ips"] == [{"version": "4", "interface": 0, "address": "10.56.217.171/24",
                               "gateway": "10.56.217.1"}]
    assert rdma.namespaces() == {device: pod}
    assert "net1" in links(pod) and addresses(pod, "net1") == ["10.56.217.171/24"]
    cache = json.loads(node.host.path("/var/lib/cni/ib-sriov/c1-net1").read_text())
    assert cache["RdmaNetState"] == {"version": "1.0", "deviceID": vf.pci,
                                     "sandboxRdmaDevName": device,
                                     "containerRdmaDevName": device}

    assert node.cni("ib-sriov", "DEL", config, netns=pod).rc == 0
    assert rdma.namespaces() == {device: ""}
    assert rdma.calls()[-2:] == [f"RdmaLinkSetNsFd {device} {pod}",
                                 f"RdmaLinkSetNsFd {device} host"]
    assert vf.netdev in links(node.netns) and node.cache_files() == []


# ------------------------------------------------------------------ item 14

def test_a_vf_without_a_valid_guid_is_refused_when_none_is_given(node: Node) -> None:
    """ib-sriov-cni pkg/sriov/sriov.go validateVFGuid: without a GUID in the config the
    VF's own (the last 8 bytes of its 20-byte IPoIB address) must be neither empty, all
    zeros (a fresh VF) nor all ones; utils_test.go's "Valid IPoIB hardware address" passes."""
    install_host_local(node)
    config = ib_readme(node, 2, rdmaIsolation=None)
    vf = node.vfs[2]
    for address in (vf.mac, ZERO_IPOIB):
        set_vf_address(node, 2, address)
        pod = node.pod()
        call = node.cni("ib-sriov", "ADD", config, netns=pod)
        assert (call.rc, call.out["code"]) == (1, 999), call.out
        assert call.out["msg"].startswith(f"deviceID: VF {vf.pci} ({vf.netdev}) GUID is not "
                                          "valid")
        assert vf.netdev in links(node.netns) and links(pod).keys() == {"lo"}
        assert node.cache_files() == []

    set_vf_address(node, 2, IPOIB_ADDRESS)
    pod = node.pod()
    add = node.cni("ib-sriov", "ADD", config, netns=pod)
    assert add.rc == 0, add.out
    assert not any("GUID" in c for c in node.pf_calls()), "no GUID set: the VF keeps its own"
    enable, auto = f"LinkSetVfState {node.pf} 2 1", f"LinkSetVfState {node.pf} 2 0"
    assert node.pf_calls() == [enable, auto, enable, auto, enable], \
        "link_state comes first (as upstream); a refused ADD puts it back"
    assert node.cni("ib-sriov", "DEL", config, netns=pod).rc == 0


# ------------------------------------------------------------------ item 15

@pytest.mark.parametrize("version", ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
def test_host_device_takes_a_scalable_function(node: Node, version: str) -> None:
    """containernetworking/plugins host-device_test.go "Works with a valid %s config on
    auxiliary device" (0.3.0 to 1.0.0 there): runtimeConfig.deviceID names an auxiliary device
    (mlx5_core.sf.N) whose net/ directory holds the netdev that moves into the pod; the result
    is expectInterfaces' name, mac and sandbox, nothing more."""
    pf = node.host.pfs()[0]
    aux = node.host.add_sf(pf, 88)
    netdev = node.host.listdir(f"/sys/bus/auxiliary/devices/{aux}/net")[0]
    subprocess.run(["ip", "-n", node.netns_name, "link", "add", netdev, "type", "veth",
                    "peer", "name", "sfpeer"], check=True)
    mac = links(node.netns)[netdev]["address"]
    pod = node.pod()
    conf = {"cniVersion": version, "name": "cni-plugin-host-device-test",
            "type": "host-device", "runtimeConfig": {"deviceID": aux}}
    add = node.cni("host-device", "ADD", conf, netns=pod, ifname="net1")
    assert add.rc == 0, add.out
    if version.startswith("1."):
        validate_result(add.out, version)
    assert add.out["interfaces"] == [{"name": "net1", "mac": mac, "sandbox": pod}]
    assert "net1" in links(pod) and netdev not in links(node.netns)
    assert node.cni("host-device", "DEL", conf, netns=pod, ifname="net1").rc == 0
    assert links(node.netns)[netdev]["address"] == mac and "net1" not in links(pod)


# ------------------------------------------------------------------ item 16

def test_sriov_leaves_the_vf_mtu_as_the_node_set_it(node: Node) -> None:
    """sriov-cni docs/configuration-reference.md's config "with each field filled out", plus
    an `mtu`: sriov-cni has no MTU setting (pkg/sriov/sriov.go SetupVF only records the VF's
    MTU), so the VF keeps the node's 1500 and the 1.0.0 result reports it."""
    vf = node.vfs[3]
    pod = node.pod()
    config = {"cniVersion": "1.0.0", "name": "sriov-dpdk", "type": "sriov", "deviceID": vf.pci,
              "mac": "CA:FE:C0:FF:EE:00", "vlan": 1000, "vlanQoS": 4, "vlanProto": "802.1ad",
              "min_tx_rate": 100, "max_tx_rate": 200, "spoofchk": "off", "trust": "on",
              "link_state": "enable", "mtu": 9000}
    add = node.cni("sriov", "ADD", config, netns=pod)
    assert add.rc == 0, add.out
    validate_result(add.out, "1.0.0")
    assert add.out["interfaces"][0]["mtu"] == 1500
    assert links(pod)["net1"]["mtu"] == 1500
    assert links(pod)["net1"]["address"] == "ca:fe:c0:ff:ee:00"
    assert node.pf_calls() == [
        f"LinkSetVfVlanQosProto {node.pf} 3 1000 4 34984",
        f"LinkSetVfHardwareAddr {node.pf} 3 ca:fe:c0:ff:ee:00",
        f"LinkSetVfRate {node.pf} 3 100 200",
        f"LinkSetVfSpoofchk {node.pf} 3 false",
        f"LinkSetVfTrust {node.pf} 3 true",
        f"LinkSetVfState {node.pf} 3 1",
    ]
    cache = json.loads(node.host.path("/var/lib/cni/sriov/c1-net1").read_text())
    assert cache["MTU"] == 1500, "recorded as upstream does: the VF's own MTU"
    assert node.cni("sriov", "DEL", config, netns=pod).rc == 0
    assert links(node.netns)[vf.netdev]["mtu"] == 1500


# ------------------------------------------------------------------ item 17

def test_a_config_without_cni_version_gets_a_0_1_0_result(node: Node) -> None:
    """sriov-cni pkg/config/config_test.go "Assuming correct config file - existing
    DeviceID" (no cniVersion, host-local IPAM): the Go library takes it for 0.1.0 and prints
    a 0.1.0 result, `ip4` with its routes and no interfaces."""
    install_host_local(node)
    pod = node.pod()
    config = {"name": "mynet", "type": "sriov", "deviceID": node.vfs[4].pci, "vf": 0,
              "ipam": {"type": "host-local", "subnet": "10.55.206.0/26",
                       "routes": [{"dst": "0.0.0.0/0"}], "gateway": "10.55.206.1"}}
    add = node.cni("sriov", "ADD", config, netns=pod)
    assert add.rc == 0, add.out
    assert json.dumps(add.out) == json.dumps({
        "cniVersion": "0.1.0",
        "ip4": {"ip": "10.56.217.171/24", "gateway": "10.56.217.1",
                "routes": [{"dst": "0.0.0.0/0"}]},
        "dns": {}})
    assert addresses(pod, "net1") == ["10.56.217.171/24"]
    assert node.cni("sriov", "DEL", config, netns=pod).rc == 0
    assert (node.bin_dir / "host-local.calls").read_text().splitlines() == [
        "ADD c1 net1", "DEL c1 net1"]
    assert node.cache_files() == []


# ------------------------------------------------------------------ item 18

def test_spoofchk_trust_and_mac_spellings_upstream_accepts(node: Node) -> None:
    """sriov-cni pkg/sriov/sriov.go ApplyVFConfig ("on" is on, any other string off) and
    net.ParseMAC (which it uses for `mac`, so '-' separators work), on the configuration
    reference's example with those fields spelled otherwise."""
    pod = node.pod()
    config = {"cniVersion": "0.3.1", "name": "sriov-dpdk", "type": "sriov",
              "deviceID": node.vfs[5].pci, "mac": "CA-FE-C0-FF-EE-00", "spoofchk": "yes",
              "trust": "true"}
    add = node.cni("sriov", "ADD", config, netns=pod)
    assert add.rc == 0, add.out
    assert links(pod)["net1"]["address"] == "ca:fe:c0:ff:ee:00"
    assert add.out["interfaces"][0]["mac"] == "ca:fe:c0:ff:ee:00"
    assert node.pf_calls() == [f"LinkSetVfHardwareAddr {node.pf} 5 ca:fe:c0:ff:ee:00",
                               f"LinkSetVfSpoofchk {node.pf} 5 false",
                               f"LinkSetVfTrust {node.pf} 5 false"]
    assert node.cni("sriov", "DEL", config, netns=pod).rc == 0
