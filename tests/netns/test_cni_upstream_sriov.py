"""sriov-cni's own test cases, run against nicop's `sriov` the way a runtime runs it.

Every test names the upstream file and Describe/It (or integration test function) it follows:
k8snetworkplumbingwg/sriov-cni pkg/config/config_test.go, pkg/sriov/sriov_test.go,
pkg/utils/utils_test.go, pkg/utils/pci_allocator_test.go, pkg/utils/packet_test.go and
test/integration/test_sriov_cni.sh, test_concurrent.sh. Where upstream mocks netlink, the
VF is a veth stand-in in the node's namespace and the PF's VF table the recording stand-in, and
the test asserts what a user sees: the printed result, the error, the links and the PF's VF.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import subprocess
import threading
from typing import Any

import pytest
from tests.eventually import eventually
from tests.netns.cni_harness import CniCall, Node, addresses, links

from nicop.cni.netlink import Netns
from nicop_sim.pf import RecordingVfControl

pytestmark = pytest.mark.netns

VERSIONS = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
# test/integration/test_utils/test-ipam-cni: what the integration suite's IPAM answers.
TEST_IPAM_RESULT = {"cniVersion": "0.3.1", "interfaces": [{"name": "net1"}],
                    "ips": [{"name": "net1", "address": "192.0.2.1/24"}]}
ZERO_MAC = "00:00:00:00:00:00"


def integration_conf(node: Node, vf: int = 0, version: str = "0.3.1",
                     **extra: Any) -> dict[str, Any]:
    """test_sriov_cni.sh's CNI_INPUT (logFile and logLevel are read and not used by nicop)."""
    return {"type": "sriov", "cniVersion": version, "name": "sriov-network",
            "ipam": {"type": "test-ipam-cni"}, "deviceID": node.vfs[vf].pci, **extra}


def vlan_calls(node: Node) -> list[str]:
    return [c for c in node.pf_calls() if c.startswith("LinkSetVfVlanQosProto")]


def ns_name(path: str) -> str:
    return path.rsplit("/", 1)[1]


# ------------------------------------------------------------------ results per cniVersion

@pytest.mark.parametrize("version", VERSIONS)
def test_the_result_has_the_fields_sriov_cni_prints(node: Node, version: str) -> None:
    """test/integration/test_sriov_cni.sh test_macaddress (mac 60:00:00:00:00:E1, the suite's
    test-ipam-cni) with each cniVersion. pkg/cnicommands/cni.go CmdAdd prints interfaces
    [{name, mac, mtu, sandbox}] (no pciID), the IPAM's ips with interface 0, and the IPAM's dns;
    containernetworking/cni pkg/types/100/types_test.go "correctly encodes a 1.1.0 Result" and
    pkg/types/040/types_test.go "correctly encodes a 0.3.x Result" give the shapes: 1.x keys
    sorted, mtu kept, empty dns left out; 0.x without mtu, with ips[].version and dns {}."""
    node.ipam_stand_in("test-ipam-cni", TEST_IPAM_RESULT)
    pod = node.pod()
    add = node.cni("sriov", "ADD", integration_conf(node, 0, version, mac="60:00:00:00:00:E1"),
                   netns=pod)
    assert add.rc == 0, add.out
    if version.startswith("1."):
        expected: dict[str, Any] = {
            "cniVersion": version,
            "interfaces": [{"mac": "60:00:00:00:00:e1", "mtu": 1500, "name": "net1",
                            "sandbox": pod}],
            "ips": [{"address": "192.0.2.1/24", "interface": 0}]}
    else:
        expected = {
            "cniVersion": version,
            "interfaces": [{"name": "net1", "mac": "60:00:00:00:00:e1", "sandbox": pod}],
            "ips": [{"version": "4", "interface": 0, "address": "192.0.2.1/24"}],
            "dns": {}}
    assert json.dumps(add.out) == json.dumps(expected), "fields, and their order"
    assert links(pod)["net1"]["address"] == "60:00:00:00:00:e1"
    assert addresses(pod, "net1") == ["192.0.2.1/24"]
    assert node.cni("sriov", "DEL", integration_conf(node, 0, version), netns=pod).rc == 0
    assert node.vfs[0].netdev in links(node.netns)


@pytest.mark.parametrize("version", ["0.4.0", "1.0.0"])
def test_without_ipam_the_result_names_the_interface_only(node: Node, version: str) -> None:
    """pkg/cnicommands/cni.go CmdAdd without `ipam`: the result is the interface alone;
    a 1.0.0 result leaves the empty dns out (pkg/types/100 Result.MarshalJSON), 0.4.0 writes it
    (pkg/types/040 has no such rule)."""
    pod = node.pod()
    config = {"cniVersion": version, "name": "sriov-network", "type": "sriov",
              "deviceID": node.vfs[1].pci}
    add = node.cni("sriov", "ADD", config, netns=pod)
    assert add.rc == 0, add.out
    mac = node.vfs[1].mac
    if version == "1.0.0":
        assert add.out == {"cniVersion": "1.0.0", "interfaces": [
            {"mac": mac, "mtu": 1500, "name": "net1", "sandbox": pod}]}
    else:
        assert add.out == {"cniVersion": "0.4.0", "interfaces": [
            {"name": "net1", "mac": mac, "sandbox": pod}], "dns": {}}


def test_the_ipam_dns_is_printed_and_the_netconf_dns_is_not(node: Node) -> None:
    """pkg/cnicommands/cni.go CmdAdd replaces its result with the IPAM's (newResult), so the
    dns printed is the IPAM plugin's; a `dns` in the netconf is only cached."""
    node.ipam_stand_in("test-ipam-cni", {**TEST_IPAM_RESULT,
                                         "dns": {"nameservers": ["192.0.2.53"]}})
    pod = node.pod()
    config = integration_conf(node, 2, "1.0.0", dns={"nameservers": ["10.0.0.10"]})
    add = node.cni("sriov", "ADD", config, netns=pod)
    assert add.rc == 0, add.out
    assert add.out["dns"] == {"nameservers": ["192.0.2.53"]}
    assert node.cache("sriov")["dns"] == {"nameservers": ["10.0.0.10"]}


@pytest.mark.parametrize(("admin", "mac", "shown"), [
    ("aa:f3:8d:65:1b:d4", None, "aa:f3:8d:65:1b:d4"),
    (ZERO_MAC, None, None),
    ("aa:f3:8d:65:1b:d4", "60:00:00:00:00:01", "60:00:00:00:00:01"),
])
def test_a_dpdk_vf_reports_its_admin_mac_and_the_pf_mtu(
    node: Node, admin: str, mac: str | None, shown: str | None
) -> None:
    """pkg/config/config_test.go GetMacAddressForResult: "Should return the AdminMAC mac
    address if the user didn't request and the the driver is DPDK", "Should return empty string
    if ... adminMac is 0", "Should return the mac address requested by the user"; and
    pkg/sriov/sriov_test.go ApplyVFConfig "Return MTU from PF": a VF on vfio-pci has no netdev,
    so its MTU is the PF's (9000 here). IPAM still runs; nothing is configured in the pod."""
    node.ipam_stand_in("test-ipam-cni", TEST_IPAM_RESULT)
    vf = node.vfs[3]
    node.host.bind_driver(vf.pci, "vfio-pci")
    node.host.path(f"/sys/class/net/{node.pf}/mtu").write_text("9000\n")
    node.set_vf_state(3, mac=admin)
    pod = node.pod()
    config = integration_conf(node, 3, "1.0.0", **({"mac": mac} if mac else {}))
    add = node.cni("sriov", "ADD", config, netns=pod)
    assert add.rc == 0, add.out
    iface = {"mtu": 9000, "name": "net1", "sandbox": pod, **({"mac": shown} if shown else {})}
    assert add.out["interfaces"] == [dict(sorted(iface.items()))]
    assert add.out["ips"] == [{"address": "192.0.2.1/24", "interface": 0}]
    assert list(links(pod)) == ["lo"], "a DPDK VF has nothing to move"
    assert node.cache("sriov")["MTU"] == 9000
    assert node.cni("sriov", "DEL", config, netns=pod).rc == 0
    assert node.vf_state(3)["mac"] == admin, "the admin MAC is the VF's again"
    assert node.cache_files() == []


# ------------------------------------------------------------------ the cache

def test_the_cache_holds_the_netconf_with_upstreams_defaults(node: Node) -> None:
    """pkg/config/config.go LoadConf fills vlanQoS 0 and vlanProto "802.1q" once a vlan is
    set (config_test.go "default values for vlan, qos and proto"); CmdAdd takes the MAC from
    CNI_ARGS, then runtimeConfig.mac, lowercased; pkg/sriov/sriov_test.go FillOriginalVfInfo
    "Saves the current VF state" and SetupVF "Assuming existing interface" (the effective MAC
    saved); pkg/utils/utils_test.go SaveNetConf "should save all the netConf struct to the cache
    file without dns". What DEL needs, readable by sriov-cni's Go NetConf."""
    vf = node.vfs[4]
    pod = node.pod()
    config = {"cniVersion": "1.0.0", "name": "sriov-network", "type": "sriov",
              "deviceID": vf.pci, "vlan": 100, "mac": "02:00:00:00:00:01",
              "runtimeConfig": {"mac": "CA:FE:C0:FF:EE:01"}, "dns": {}}
    args = "IgnoreUnknown=true;K8S_POD_NAME=p;MAC=02:00:00:00:00:02"
    assert node.cni("sriov", "ADD", config, netns=pod, args=args).rc == 0
    cache = node.cache("sriov")
    assert {k: cache[k] for k in ("deviceID", "Master", "VFID", "MAC", "MTU", "vlan", "vlanQoS",
                                  "vlanProto", "min_tx_rate", "max_tx_rate")} == {
        "deviceID": vf.pci, "Master": node.pf, "VFID": 4, "MAC": "ca:fe:c0:ff:ee:01",
        "MTU": 1500, "vlan": 100, "vlanQoS": 0, "vlanProto": "802.1q", "min_tx_rate": None,
        "max_tx_rate": None}
    assert {"HostIFName": vf.netdev, "SpoofChk": True, "Trust": False, "AdminMAC": ZERO_MAC,
            "EffectiveMAC": vf.mac, "Vlan": 0, "VlanQoS": 0, "VlanProto": 0x8100,
            "MinTxRate": 0, "MaxTxRate": 0, "LinkState": 0,
            "MTU": 1500}.items() <= cache["OrigVfState"].items()
    assert not {"dns", "mac", "runtimeConfig"} & set(cache), "as the Go NetConf writes it"
    assert links(pod)["net1"]["address"] == "ca:fe:c0:ff:ee:01"


def test_a_netconf_dns_is_cached(node: Node) -> None:
    """pkg/utils/utils_test.go SaveNetConf "should save all the netConf struct to the cache
    file with dns"."""
    config = {"cniVersion": "1.0.0", "name": "sriov-network", "type": "sriov",
              "deviceID": node.vfs[5].pci, "dns": {"domain": "bla"}}
    assert node.cni("sriov", "ADD", config, netns=node.pod()).rc == 0
    assert node.cache("sriov")["dns"] == {"domain": "bla"}


# ------------------------------------------------------------------ ApplyVFConfig / ResetVFConfig

def test_no_optional_parameters_touch_nothing_but_the_admin_mac_on_del(node: Node) -> None:
    """pkg/sriov/sriov_test.go ApplyVFConfig "should not call functions to configure the VF
    when config has no optional parameters", and ResetVFConfig "Restores the original
    administrative MAC address even if conf.MAC is empty": DEL puts back the admin MAC the VF
    had (a driver may change it together with the VF's own MAC)."""
    node.set_vf_state(2, mac="aa:f3:8d:65:1b:d4")
    pod = node.pod()
    config = {"cniVersion": "1.0.0", "name": "n", "type": "sriov", "deviceID": node.vfs[2].pci}
    assert node.cni("sriov", "ADD", config, netns=pod).rc == 0
    assert node.pf_calls() == []
    node.set_vf_state(2, mac="02:11:11:11:11:11")  # what the driver did meanwhile
    assert node.cni("sriov", "DEL", config, netns=pod).rc == 0
    assert node.pf_calls() == [f"LinkSetVfHardwareAddr {node.pf} 2 aa:f3:8d:65:1b:d4"]
    assert node.vf_state(2)["mac"] == "aa:f3:8d:65:1b:d4"


def test_optional_parameters_are_applied_in_sriov_cnis_order(node: Node) -> None:
    """pkg/sriov/sriov_test.go ApplyVFConfig "should call functions to configure the VF when
    config has optional parameters": vlan 100 qos 0 802.1q, MAC aa:f3:8d:65:1b:d4, min/max
    rate 1000/4000, spoofchk and trust on, link_state enable, in that order."""
    config = {"cniVersion": "1.0.0", "name": "n", "type": "sriov", "deviceID": node.vfs[1].pci,
              "vlan": 100, "vlanQoS": 0, "vlanProto": "802.1q", "mac": "aa:f3:8d:65:1b:d4",
              "max_tx_rate": 4000, "min_tx_rate": 1000, "spoofchk": "on", "trust": "on",
              "link_state": "enable"}
    assert node.cni("sriov", "ADD", config, netns=node.pod()).rc == 0
    pf = node.pf
    assert node.pf_calls() == [
        f"LinkSetVfVlanQosProto {pf} 1 100 0 33024",
        f"LinkSetVfHardwareAddr {pf} 1 aa:f3:8d:65:1b:d4",
        f"LinkSetVfRate {pf} 1 1000 4000", f"LinkSetVfSpoofchk {pf} 1 true",
        f"LinkSetVfTrust {pf} 1 true", f"LinkSetVfState {pf} 1 1"]


def test_an_unset_rate_is_unlimited(node: Node) -> None:
    """pkg/sriov/sriov.go ApplyVFConfig: with only max_tx_rate given, min_tx_rate is 0 (no
    limit), whatever the VF had."""
    node.set_vf_state(6, min_tx_rate=50)
    config = {"cniVersion": "1.0.0", "name": "n", "type": "sriov", "deviceID": node.vfs[6].pci,
              "max_tx_rate": 200}
    pod = node.pod()
    assert node.cni("sriov", "ADD", config, netns=pod).rc == 0
    assert node.pf_calls() == [f"LinkSetVfRate {node.pf} 6 0 200"]
    assert node.cni("sriov", "DEL", config, netns=pod).rc == 0
    assert (node.vf_state(6)["min_tx_rate"], node.vf_state(6)["max_tx_rate"]) == (50, 0)


def test_del_restores_the_original_vf_configuration(node: Node) -> None:
    """pkg/sriov/sriov_test.go "Checking ResetVFConfig function - restore config with user
    params" "Restores original VF configurations": the VF had vlan 1 qos 1, spoof checking off,
    admin MAC aa:f3:8d:65:1b:d4 and link state disable; the pod's config changed all of them;
    DEL puts each back, in sriov-cni's order."""
    original = {"mac": "aa:f3:8d:65:1b:d4", "vlan": 1, "qos": 1, "spoofchk": False,
                "trust": False, "min_tx_rate": 0, "max_tx_rate": 0, "link_state": 2}
    node.set_vf_state(0, **original)
    pod = node.pod()
    config = {"cniVersion": "1.0.0", "name": "n", "type": "sriov", "deviceID": node.vfs[0].pci,
              "mac": "d2:fc:22:a7:0d:e8", "vlan": 6, "vlanQoS": 3, "spoofchk": "on",
              "max_tx_rate": 4000, "min_tx_rate": 1000, "trust": "on", "link_state": "enable"}
    assert node.cni("sriov", "ADD", config, netns=pod).rc == 0
    assert node.vf_state(0)["vlan"] == 6
    added = len(node.pf_calls())
    assert node.cni("sriov", "DEL", config, netns=pod).rc == 0
    pf = node.pf
    assert node.pf_calls()[added:] == [
        f"LinkSetVfVlanQosProto {pf} 0 1 1 33024", f"LinkSetVfSpoofchk {pf} 0 false",
        f"LinkSetVfHardwareAddr {pf} 0 aa:f3:8d:65:1b:d4", f"LinkSetVfTrust {pf} 0 false",
        f"LinkSetVfRate {pf} 0 0 0", f"LinkSetVfState {pf} 0 2"]
    assert original.items() <= node.vf_state(0).items()


def test_integration_vlan_is_set_and_cleared(node: Node) -> None:
    """test/integration/test_sriov_cni.sh test_vlan: "LinkSetVfVlanQosProto enp175s0f1 0 1234 0
    33024" on ADD, "... 0 0 0 33024" on DEL, and the VF back on the node."""
    node.ipam_stand_in("test-ipam-cni", TEST_IPAM_RESULT)
    pod = node.pod()
    config = integration_conf(node, 0, vlan=1234, mac="60:00:00:00:00:E1")
    assert node.cni("sriov", "ADD", config, netns=pod).rc == 0
    assert vlan_calls(node) == [f"LinkSetVfVlanQosProto {node.pf} 0 1234 0 33024"]
    assert node.cni("sriov", "DEL", config, netns=pod).rc == 0
    assert vlan_calls(node)[1:] == [f"LinkSetVfVlanQosProto {node.pf} 0 0 0 33024"]
    assert node.vfs[0].netdev in links(node.netns)


class StickyMacPf(RecordingVfControl):
    """A PF whose VF ignores admin MAC changes (the PF still reports the old one)."""

    def set_mac(self, pf: str, vf: int, mac: str) -> None:
        state = self.get(pf, vf)
        super().set_mac(pf, vf, mac)
        self._record(pf, vf, "Ignored", mac=state.mac)


def test_an_admin_mac_the_vf_does_not_keep_fails_the_add(node: Node) -> None:
    """pkg/utils/utils_test.go SetVFHardwareMAC "assuming calling function fails": the PF is
    asked again after setting the admin MAC; if it reports another MAC (after sriov-cni's 20
    tries), the ADD fails with "hardware mac address is different from requested one" and the VF
    stays on the node."""
    assert node.daemon is not None and node.daemon.daemon is not None
    node.daemon.daemon.ctx.vfs = StickyMacPf(node.root / "pf")
    vf = node.vfs[7]
    pod = node.pod()
    config = {"cniVersion": "1.0.0", "name": "n", "type": "sriov", "deviceID": vf.pci,
              "mac": "60:00:00:00:00:01"}
    add = node.cni("sriov", "ADD", config, netns=pod)
    assert (add.rc, add.out["code"]) == (1, 999)
    assert add.out["msg"] == ("failed to set MAC address to 60:00:00:00:00:01: hardware mac "
                              "address is different from requested one")
    assert vf.netdev in links(node.netns) and list(links(pod)) == ["lo"]
    assert node.cache_files() == []


# ------------------------------------------------------------------ SetupVF / ReleaseVF

def test_release_restores_the_effective_mac_and_mtu_the_pod_changed(node: Node) -> None:
    """pkg/sriov/sriov_test.go ReleaseVF "Assuming existing interface" and "Restores Effective
    MAC address when present in cached state" (no MAC in the config), SetupVF "Return MTU from
    PF" (the result's mtu is the VF's), and test/integration/test_sriov_cni.sh test_mtu_reset:
    the VF has MTU 3333, an application sets 4444 and another MAC in the pod; after DEL the VF
    is back with its MTU and MAC."""
    vf = node.vfs[5]
    subprocess.run(["ip", "-n", node.netns_name, "link", "set", vf.netdev, "mtu", "3333"],
                   check=True)
    pod = node.pod()
    config = {"cniVersion": "1.0.0", "name": "n", "type": "sriov", "deviceID": vf.pci}
    add = node.cni("sriov", "ADD", config, netns=pod)
    assert add.rc == 0, add.out
    assert add.out["interfaces"][0]["mtu"] == 3333 and links(pod)["net1"]["mtu"] == 3333
    subprocess.run(["ip", "-n", ns_name(pod), "link", "set", "net1", "mtu", "4444", "address",
                    "02:99:99:99:99:99"], check=True)
    assert node.cni("sriov", "DEL", config, netns=pod).rc == 0
    back = links(node.netns)[vf.netdev]
    assert (back["mtu"], back["address"]) == (3333, vf.mac)


def upstream_cache(node: Node, vf: int, netns: str) -> dict[str, Any]:
    """A cache file as sriov-cni v2 writes it (Go field names, null pointers), for a VF its
    ADD moved into `netns` as net1, its state read from a PF that reported nothing."""
    return {"cniVersion": "1.0.0", "name": "sriov-network", "type": "sriov", "ipam": {},
            "OrigVfState": {"HostIFName": node.vfs[vf].netdev, "SpoofChk": False,
                            "Trust": False, "AdminMAC": "", "EffectiveMAC": "", "Vlan": 0,
                            "VlanQoS": 0, "VlanProto": 0, "MinTxRate": 0, "MaxTxRate": 0,
                            "LinkState": 0, "MTU": 0},
            "Master": node.pf, "MAC": "", "MTU": None, "vlan": None, "vlanQoS": None,
            "vlanProto": None, "deviceID": node.vfs[vf].pci, "VFID": vf, "min_tx_rate": None,
            "max_tx_rate": None, "runtimeConfig": {}}


def move_as_upstream(node: Node, vf: int, pod: str, mac: str | None = None) -> None:
    """What upstream's ADD leaves: the VF in the pod as net1, no alias, maybe another MAC."""
    name = node.vfs[vf].netdev
    subprocess.run(["ip", "-n", node.netns_name, "link", "set", name, "netns", ns_name(pod)],
                   check=True)
    change = ["address", mac] if mac else []
    subprocess.run(["ip", "-n", ns_name(pod), "link", "set", name, "name", "net1", *change],
                   check=True)


def test_a_cache_without_saved_state_restores_nothing_of_it(node: Node) -> None:
    """pkg/sriov/sriov_test.go ReleaseVF "Should not restore Effective MAC address when
    EffectiveMAC is not in cached state" and ResetVFConfig "Does not change VF config if it
    wasnt requested to be changed in netconf": an attachment sriov-cni made (its cache, no
    alias on the link) comes back under its node name, with the MAC it has, and the PF is not
    touched."""
    pod = node.pod()
    move_as_upstream(node, 3, pod, mac="02:33:33:33:33:33")
    node.host.path("/var/lib/cni/sriov/pci").mkdir(parents=True, exist_ok=True)
    node.host.path("/var/lib/cni/sriov/c1-net1").write_text(json.dumps(
        upstream_cache(node, 3, pod)))
    node.host.path(f"/var/lib/cni/sriov/pci/{node.vfs[3].pci}").write_text(pod)
    config = {"cniVersion": "1.0.0", "name": "sriov-network", "type": "sriov",
              "deviceID": node.vfs[3].pci}
    assert node.cni("sriov", "DEL", config, netns=pod).rc == 0
    assert links(node.netns)[node.vfs[3].netdev]["address"] == "02:33:33:33:33:33"
    assert node.pf_calls() == []
    assert node.cache_files() == [] and list(links(pod)) == ["lo"]


def test_a_vf_netdev_missing_from_the_node_is_named(node: Node) -> None:
    """pkg/sriov/sriov_test.go SetupVF "returns error when LinkByName fails": sysfs names a
    netdev the node's namespace does not have (another pod holds it, or it was renamed)."""
    vf = node.vfs[6]
    subprocess.run(["ip", "-n", node.netns_name, "link", "del", vf.netdev], check=True)
    config = {"cniVersion": "1.0.0", "name": "n", "type": "sriov", "deviceID": vf.pci,
              "vlan": 5}
    add = node.cni("sriov", "ADD", config, netns=node.pod())
    assert (add.rc, add.out["code"]) == (1, 100)
    assert add.out["msg"] == f"device {vf.netdev} ({vf.pci}) is not on the node"
    assert node.pf_calls() == [] and node.cache_files() == []


def test_a_vf_that_cannot_change_namespace_is_put_back(node: Node) -> None:
    """pkg/sriov/sriov_test.go SetupVF "LinkSetNsFd fails link not moved to targetNetNS": the
    move fails (here a device the kernel keeps in its namespace), the ADD fails naming it, the
    device keeps its node name and state, and the VF settings made for the pod are undone."""
    vf = node.vfs[4]
    ns = node.netns_name
    subprocess.run(["ip", "-n", ns, "link", "del", vf.netdev], check=True)
    subprocess.run(["ip", "-n", ns, "link", "add", vf.netdev, "type", "bridge"], check=True)
    subprocess.run(["ip", "-n", ns, "link", "set", vf.netdev, "up"], check=True)
    pod = node.pod()
    config = {"cniVersion": "1.0.0", "name": "n", "type": "sriov", "deviceID": vf.pci,
              "vlan": 7, "mac": "02:00:00:00:07:07"}
    add = node.cni("sriov", "ADD", config, netns=pod)
    assert (add.rc, add.out["code"]) == (1, 999)
    assert add.out["msg"].startswith(f"moving {vf.netdev} into {pod}: ")
    on_node = links(node.netns)[vf.netdev]
    assert "UP" in on_node["flags"] and "ifalias" not in on_node
    assert list(links(pod)) == ["lo"] and node.cache_files() == []
    assert (node.vf_state(4)["vlan"], node.vf_state(4)["mac"]) == (0, ZERO_MAC)


def test_a_multicast_mac_is_refused_before_anything_changes(node: Node) -> None:
    """pkg/sriov/sriov_test.go SetupVF "Setting VF's MAC address failed": sriov-cni learns
    that a MAC cannot be set when the kernel refuses it in the pod, after the PF was changed.
    nicop refuses a MAC no VF can take (multicast, all zeros, not 6 bytes) as a config error,
    before the VF is touched."""
    vf = node.vfs[2]
    for mac in ("01:00:5e:00:00:01", ZERO_MAC):
        config = {"cniVersion": "1.0.0", "name": "n", "type": "sriov", "deviceID": vf.pci,
                  "mac": mac}
        add = node.cni("sriov", "ADD", config, netns=node.pod())
        assert (add.rc, add.out["code"]) == (1, 7)
        assert add.out["msg"] == (f"mac: {mac} is not a unicast Ethernet MAC address such as "
                                  "02:00:00:00:00:01")
    assert node.pf_calls() == [] and vf.netdev in links(node.netns)


def test_a_stale_altname_does_not_block_the_pods_name(node: Node) -> None:
    """pkg/sriov/sriov_test.go SetupVF "Remove altName" (and sriov-cni issue 445): kernels
    that keep a device's old name as an alternative name leave a VF with the altname `net1`
    after a pod; renaming it to net1 again would fail with "file exists". The VF is attached
    and given back without such leftovers."""
    vf = node.vfs[1]
    subprocess.run(["ip", "-n", node.netns_name, "link", "property", "add", "dev", vf.netdev,
                    "altname", "net1"], check=True)
    pod = node.pod()
    config = {"cniVersion": "1.0.0", "name": "n", "type": "sriov", "deviceID": vf.pci}
    add = node.cni("sriov", "ADD", config, netns=pod)
    assert add.rc == 0, add.out
    assert links(pod)["net1"].get("altnames", []) == []
    assert node.cni("sriov", "DEL", config, netns=pod).rc == 0
    assert links(node.netns)[vf.netdev].get("altnames", []) == []


def receive_arp(sock: socket.socket, timeout: float = 10) -> tuple[int, str, str]:
    """(operation, sender MAC, sender IP) of the next ARP frame on a packet socket."""
    ready, _, _ = select.select([sock], [], [], timeout)
    assert ready, "no ARP frame arrived"
    frame = sock.recv(2048)
    op, sha, spa = struct.unpack("!6x H 6s 4s", frame[14:32])
    return op, ":".join(f"{b:02x}" for b in sha), socket.inet_ntoa(spa)


def test_the_pods_addresses_are_announced(node: Node) -> None:
    """pkg/utils/packet_test.go WaitForCarrier "should wait until the link has IFF_UP flag"
    and pkg/cnicommands/cni.go (AnnounceIPs after IPAM): once the address is configured the
    plugin waits briefly for carrier and sends a gratuitous ARP, so neighbours that knew the
    address at another pod's MAC update their caches; pkg/sriov/sriov_test.go SetupVF mocks
    EnableArpAndNdiscNotify and EnableOptimisticDad, which set arp_notify, ndisc_notify and
    optimistic_dad on the pod's interface."""
    node.ipam_stand_in("test-ipam-cni", TEST_IPAM_RESULT)
    vf = node.vfs[6]
    subprocess.run(["ip", "-n", node.netns_name, "link", "set", f"peer{vf.index}", "up"],
                   check=True)
    with Netns(node.netns) as host:
        sock = host.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
    with sock:
        sock.bind((f"peer{vf.index}", 0x0806))
        pod = node.pod()
        add = node.cni("sriov", "ADD", integration_conf(node, 6, "1.0.0",
                                                        mac="60:00:00:00:00:66"), netns=pod)
        assert add.rc == 0, add.out
        assert receive_arp(sock) == (1, "60:00:00:00:00:66", "192.0.2.1")
    for key in ("ipv4.conf.net1.arp_notify", "ipv6.conf.net1.ndisc_notify"):
        out = subprocess.run(["ip", "netns", "exec", ns_name(pod), "sysctl", "-n",
                              f"net.{key}"], check=True, capture_output=True, text=True)
        assert out.stdout.strip() == "1", key


# ------------------------------------------------------------------ pci allocator

def test_a_vf_allocated_to_a_live_namespace_is_refused(node: Node) -> None:
    """pkg/config/config_test.go "Assuming device is allocated" and
    pkg/utils/pci_allocator_test.go "Assuming is allocated and namespace exist": the pci file
    names a namespace that exists, so the ADD fails with "pci address ... is already allocated"
    and leaves the VF alone."""
    vf = node.vfs[0]
    holder = node.pod()
    node.host.path("/var/lib/cni/sriov/pci").mkdir(parents=True, exist_ok=True)
    node.host.path(f"/var/lib/cni/sriov/pci/{vf.pci}").write_text(holder)
    config = {"cniVersion": "1.0.0", "name": "n", "type": "sriov", "deviceID": vf.pci}
    add = node.cni("sriov", "ADD", config, netns=node.pod())
    assert (add.rc, add.out["code"]) == (1, 100)
    assert add.out["msg"] == f"deviceID: pci address {vf.pci} is already allocated"
    assert vf.netdev in links(node.netns) and node.pf_calls() == []


def test_a_vf_allocated_to_a_namespace_that_is_gone_is_free(node: Node) -> None:
    """pkg/utils/pci_allocator_test.go "Assuming is allocated and namespace doesn't exist" and
    "Assuming is not allocated": a pci file naming a namespace that no longer exists (its pod
    died with the node) does not hold the VF."""
    vf = node.vfs[1]
    node.host.path("/var/lib/cni/sriov/pci").mkdir(parents=True, exist_ok=True)
    node.host.path(f"/var/lib/cni/sriov/pci/{vf.pci}").write_text("/run/netns/gone-long-ago")
    pod = node.pod()
    config = {"cniVersion": "1.0.0", "name": "n", "type": "sriov", "deviceID": vf.pci}
    assert node.cni("sriov", "ADD", config, netns=pod).rc == 0
    assert node.host.read(f"/var/lib/cni/sriov/pci/{vf.pci}") == pod


# ------------------------------------------------------------------ concurrency

def lock_waiters(node: Node, key: str) -> int:
    """How many calls hold or wait for the daemon's lock on `key` (a VF's PCI address)."""
    assert node.daemon is not None and node.daemon.daemon is not None
    entry = node.daemon.daemon.ctx.locks._locks.get(key)
    return entry[1] if entry else 0


def in_thread(call: Any) -> tuple[threading.Thread, list[CniCall]]:
    out: list[CniCall] = []
    thread = threading.Thread(target=lambda: out.append(call()))
    thread.start()
    return thread, out


def test_a_second_add_for_a_vf_being_attached_waits_and_is_refused(node: Node) -> None:
    """test/integration/test_concurrent.sh test_concurrent_add_calls: while an ADD is slow in
    IPAM, an ADD of another pod for the same VF waits for the VF's lock, then fails with "pci
    address ... is already allocated"."""
    ipam = node.ipam_stand_in("test-ipam-cni", TEST_IPAM_RESULT)
    ipam.hold("ADD")
    vf = node.vfs[0]
    first_pod, second_pod = node.pod(), node.pod()
    config = integration_conf(node, 0)
    first, first_out = in_thread(lambda: node.cni("sriov", "ADD", config, netns=first_pod,
                                                  container_id="container_1"))
    ipam.wait_held("ADD")
    second, second_out = in_thread(lambda: node.cni("sriov", "ADD", config, netns=second_pod,
                                                    container_id="container_2"))
    eventually(lambda: lock_waiters(node, vf.pci) == 2, 30, "the second ADD to wait for the VF",
               every=0.01)
    ipam.release("ADD")
    first.join(60)
    second.join(60)
    assert first_out[0].rc == 0, first_out[0].out
    assert (second_out[0].rc, second_out[0].out["code"]) == (1, 100)
    assert "pci address 0000:3b:00.1 is already allocated" in second_out[0].out["msg"]
    assert "net1" in links(first_pod) and "net1" not in links(second_pod)


def test_a_slow_del_finishes_before_the_next_pod_takes_the_vf(node: Node) -> None:
    """test/integration/test_concurrent.sh test_long_running_ipam: a DEL is slow in IPAM; the
    kubelet gives up, moves the VF back and deletes the namespace; a new pod's ADD for the
    VF waits until the DEL has reset it, so the new pod's VLAN is the one that stays."""
    ipam = node.ipam_stand_in("test-ipam-cni", TEST_IPAM_RESULT)
    vf = node.vfs[0]
    old_pod = node.pod("container_1-" + node.name)
    old = integration_conf(node, 0, vlan=0)
    assert node.cni("sriov", "ADD", old, netns=old_pod, container_id="container_1").rc == 0
    ipam.hold("DEL")
    deleting, del_out = in_thread(lambda: node.cni("sriov", "DEL", old, netns=old_pod,
                                                   container_id="container_1"))
    ipam.wait_held("DEL")
    subprocess.run(["ip", "-n", ns_name(old_pod), "link", "set", "net1", "netns",
                    node.netns_name, "name", vf.netdev], check=True)
    node.namespaces.names.remove(ns_name(old_pod))
    subprocess.run(["ip", "netns", "del", ns_name(old_pod)], check=True)
    new_pod = node.pod()
    new = integration_conf(node, 0, vlan=1234)
    adding, add_out = in_thread(lambda: node.cni("sriov", "ADD", new, netns=new_pod,
                                                 container_id="container_2"))
    eventually(lambda: lock_waiters(node, vf.pci) == 2, 30, "the new ADD to wait for the VF",
               every=0.01)
    ipam.release("DEL")
    deleting.join(60)
    adding.join(60)
    assert del_out[0].rc == 0 and add_out[0].rc == 0, (del_out[0].out, add_out[0].out)
    pf = node.pf
    assert vlan_calls(node) == [f"LinkSetVfVlanQosProto {pf} 0 0 0 33024",
                                f"LinkSetVfVlanQosProto {pf} 0 0 0 33024",
                                f"LinkSetVfVlanQosProto {pf} 0 1234 0 33024"]
    assert node.vf_state(0)["vlan"] == 1234 and "net1" in links(new_pod)


# ------------------------------------------------------------------ DEL and CHECK edge cases

def test_del_after_the_namespace_is_gone_returns_the_vf_under_its_name(node: Node) -> None:
    """pkg/cnicommands/cni.go CmdDel: "if provided path does not exist (e.x. when node was
    restarted) plugin should silently return with success after releasing IPAM resources".
    sriov-cni then leaves the VF as the kernel returned it, named after the pod's interface;
    nicop finds it by the mark it left and gives it its name and MAC back (and resets the PF
    settings, as upstream)."""
    ipam = node.ipam_stand_in("test-ipam-cni", TEST_IPAM_RESULT)
    vf = node.vfs[2]
    pod = node.pod()
    config = integration_conf(node, 2, "1.0.0", mac="60:00:00:00:00:22", vlan=22)
    assert node.cni("sriov", "ADD", config, netns=pod).rc == 0
    # The kernel returns a physical device to the node's namespace when the pod's goes away.
    subprocess.run(["ip", "-n", ns_name(pod), "link", "set", "net1", "netns", node.netns_name],
                   check=True)
    node.namespaces.names.remove(ns_name(pod))
    subprocess.run(["ip", "netns", "del", ns_name(pod)], check=True)
    assert node.cni("sriov", "DEL", config, netns=pod).rc == 0
    back = links(node.netns)
    assert "net1" not in back and back[vf.netdev]["address"] == vf.mac
    assert node.vf_state(2)["vlan"] == 0 and ipam.calls() == ["ADD c1 net1", "DEL c1 net1"]
    assert node.cache_files() == []


def test_a_vf_the_kubelet_already_moved_back_loses_its_mark(node: Node) -> None:
    """test/integration/test_concurrent.sh test_long_running_ipam, the kubelet's step: the VF
    was moved back to the node under its name before DEL ran. DEL succeeds and the VF carries
    no trace of the pod (the alias nicop set while it was there is cleared)."""
    vf = node.vfs[5]
    pod = node.pod()
    config = {"cniVersion": "1.0.0", "name": "n", "type": "sriov", "deviceID": vf.pci}
    assert node.cni("sriov", "ADD", config, netns=pod).rc == 0
    subprocess.run(["ip", "-n", ns_name(pod), "link", "set", "net1", "netns", node.netns_name,
                    "name", vf.netdev], check=True)
    assert links(node.netns)[vf.netdev].get("ifalias") == vf.netdev
    assert node.cni("sriov", "DEL", config, netns=pod).rc == 0
    assert "ifalias" not in links(node.netns)[vf.netdev] and node.cache_files() == []


def test_a_link_renamed_inside_the_pod_fails_check_and_still_comes_back(node: Node) -> None:
    """pkg/sriov/sriov.go ReleaseVF looks the VF up by the pod's interface name only, so a pod
    that renamed it makes sriov-cni's DEL fail for ever. nicop's CHECK reports the missing
    interface, and its DEL finds the VF by the mark it left and returns it."""
    vf = node.vfs[3]
    pod = node.pod()
    config = {"cniVersion": "1.0.0", "name": "n", "type": "sriov", "deviceID": vf.pci}
    add = node.cni("sriov", "ADD", config, netns=pod)
    subprocess.run(["ip", "-n", ns_name(pod), "link", "set", "net1", "name", "eth9"],
                   check=True)
    check = node.cni("sriov", "CHECK", {**config, "prevResult": add.out}, netns=pod)
    assert (check.rc, check.out["code"]) == (1, 999)
    assert check.out["msg"] == f"Container Interface name in prevResult: net1 not found in {pod}"
    assert node.cni("sriov", "DEL", config, netns=pod).rc == 0
    assert list(links(pod)) == ["lo"] and vf.netdev in links(node.netns)


def test_check_and_del_without_the_attachment(node: Node) -> None:
    """pkg/cnicommands/cni.go CmdDel: a missing cache is success (kubelet would otherwise
    retry DEL for ever), DEL twice too; nicop still runs IPAM DEL, which frees an address an
    ADD that died before caching took. CmdCheck returns nil; nicop's CHECK with a prevResult
    compares, and says the attachment is not on this node, or the namespace is gone."""
    ipam = node.ipam_stand_in("test-ipam-cni", TEST_IPAM_RESULT)
    pod = node.pod()
    config = integration_conf(node, 4, "1.0.0")
    assert node.cni("sriov", "DEL", config, netns=pod).rc == 0
    assert ipam.calls() == ["DEL c1 net1"]
    add = node.cni("sriov", "ADD", config, netns=pod)
    prev = {**config, "prevResult": add.out}
    assert node.cni("sriov", "CHECK", prev, netns=pod).rc == 0
    for _ in range(2):
        assert node.cni("sriov", "DEL", config, netns=pod).rc == 0
    check = node.cni("sriov", "CHECK", prev, netns=pod)
    assert (check.rc, check.out["code"]) == (1, 999)
    assert check.out["msg"] == "no attachment of container c1 interface net1 on this node"
    gone = node.cni("sriov", "CHECK", prev, netns="/run/netns/no-such-pod")
    assert (gone.rc, gone.out["code"]) == (1, 4)

