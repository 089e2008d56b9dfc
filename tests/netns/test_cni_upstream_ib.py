"""ib-sriov-cni's own test cases, run against nicop's `ib-sriov` the way a runtime runs it.

Every test names the upstream file and Describe/It it follows: k8snetworkplumbingwg/ib-sriov-cni
pkg/sriov/sriov_test.go, pkg/types/types_test.go, pkg/utils/utils_test.go,
pkg/config/config_test.go and cmd/ib-sriov-cni/main.go. The VF is a veth stand-in whose sysfs
`address` is an IPoIB address; the PF's VF table is the recording stand-in.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from tests.netns.cni_harness import Node, links

from nicop.cni.spec import CniError, Code
from nicop_sim.pf import RecordingRdmaControl, RecordingVfControl

pytestmark = pytest.mark.netns

VERSIONS = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
HOST_GUID = "11:22:33:00:00:aa:bb:cc"
GUID = "01:23:45:67:89:ab:cd:ef"
IPAM_RESULT = {"cniVersion": "1.0.0", "ips": [{"address": "10.55.206.46/26",
                                              "gateway": "10.55.206.1"}],
               "routes": [{"dst": "0.0.0.0/0"}], "dns": {}}


def ipoib(guid: str) -> str:
    """The 20-byte hardware address of an IPoIB netdev whose port GUID is `guid`."""
    return "00:00:04:a5:fe:80:00:00:00:00:00:00:" + guid


def set_address(node: Node, vf: int, address: str) -> None:
    node.host.path(f"/sys/class/net/{node.vfs[vf].netdev}/address").write_text(address + "\n")


def conf(node: Node, vf: int, version: str = "1.0.0", **extra: Any) -> dict[str, Any]:
    """config_test.go "Assuming correct config file - existing DeviceID", for one VF."""
    config = {"name": "mynet", "type": "ib-sriov", "cniVersion": version,
              "deviceID": node.vfs[vf].pci, "vf": 0, **extra}
    return {k: v for k, v in config.items() if v is not None}


def guid_calls(node: Node) -> list[str]:
    return [c for c in node.pf_calls() if "GUID" in c]


def ns_name(path: str) -> str:
    return path.rsplit("/", 1)[1]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_result_names_the_interface_and_its_sandbox(node: Node, version: str) -> None:
    """cmd/ib-sriov-cni/main.go cmdAdd: the result's interface has its name and sandbox only
    (no mac, no mtu), the IPAM's addresses point at it; printed in the config's version as
    containernetworking/cni's pkg/types/100 and 040 types_test.go show."""
    ipam = node.ipam_stand_in("host-local", IPAM_RESULT)
    set_address(node, 0, ipoib(HOST_GUID))
    pod = node.pod()
    config = conf(node, 0, version, ipam={"type": "host-local", "subnet": "10.55.206.0/26"})
    add = node.cni("ib-sriov", "ADD", config, netns=pod)
    assert add.rc == 0, add.out
    if version.startswith("1."):
        expected: dict[str, Any] = {
            "cniVersion": version, "interfaces": [{"name": "net1", "sandbox": pod}],
            "ips": [{"address": "10.55.206.46/26", "gateway": "10.55.206.1", "interface": 0}],
            "routes": [{"dst": "0.0.0.0/0"}]}
    else:
        expected = {
            "cniVersion": version, "interfaces": [{"name": "net1", "sandbox": pod}],
            "ips": [{"version": "4", "interface": 0, "address": "10.55.206.46/26",
                     "gateway": "10.55.206.1"}],
            "routes": [{"dst": "0.0.0.0/0"}], "dns": {}}
    assert json.dumps(add.out) == json.dumps(expected)
    assert node.cni("ib-sriov", "DEL", config, netns=pod).rc == 0
    assert ipam.calls() == ["ADD c1 net1", "DEL c1 net1"]


def test_a_valid_guid_is_set_and_the_vfs_own_restored(node: Node) -> None:
    """pkg/sriov/sriov_test.go ApplyVFConfig "ApplyVFConfig with valid GUID": the VF's current
    GUID (the end of its IPoIB address) is saved as HostIFGUID, the new one set as node and port
    GUID; ResetVFConfig "ResetVFConfig with valid GUID" sets the saved one again on DEL."""
    set_address(node, 1, ipoib(HOST_GUID))
    pod = node.pod()
    config = conf(node, 1, runtimeConfig={"infinibandGUID": GUID})
    assert node.cni("ib-sriov", "ADD", config, netns=pod).rc == 0
    assert node.cache("ib-sriov")["HostIFGUID"] == HOST_GUID
    assert guid_calls(node) == [f"LinkSetVfNodeGUID {node.pf} 1 {GUID}",
                                f"LinkSetVfPortGUID {node.pf} 1 {GUID}"]
    assert node.cni("ib-sriov", "DEL", config, netns=pod).rc == 0
    assert guid_calls(node)[2:] == [f"LinkSetVfNodeGUID {node.pf} 1 {HOST_GUID}",
                                    f"LinkSetVfPortGUID {node.pf} 1 {HOST_GUID}"]
    assert node.vf_state(1)["node_guid"] == HOST_GUID


def test_a_vf_whose_guid_was_all_zeros_gets_all_ones(node: Node) -> None:
    """pkg/sriov/sriov_test.go ResetVFConfig "ResetVFConfig with GUID all zeros": a fresh VF's
    GUID is all zeros, which is not a valid GUID to set; DEL sets FF:FF:FF:FF:FF:FF:FF:FF."""
    set_address(node, 2, ipoib("00:00:00:00:00:00:00:00"))
    pod = node.pod()
    config = conf(node, 2, runtimeConfig={"infinibandGUID": GUID})
    assert node.cni("ib-sriov", "ADD", config, netns=pod).rc == 0
    assert node.cni("ib-sriov", "DEL", config, netns=pod).rc == 0
    assert node.vf_state(2)["node_guid"] == "ff:ff:ff:ff:ff:ff:ff:ff"


@pytest.mark.parametrize(("guid", "ok"), [
    ("00:00:00:00:00:00:00:00", False),
    ("ff:ff:ff:ff:ff:ff:ff:ff", False),
    (HOST_GUID, True),
])
def test_without_a_guid_the_vf_must_have_a_valid_one(node: Node, guid: str, ok: bool) -> None:
    """pkg/sriov/sriov_test.go ApplyVFConfig "without GUID, VF's GUID all zeroes", "... all
    'F's" (refused) and "... VF's GUID is configured" (accepted: nothing saved, nothing set,
    and ResetVFConfig "ResetVFConfig without GUID" restores nothing)."""
    set_address(node, 3, ipoib(guid))
    pod = node.pod()
    config = conf(node, 3)
    add = node.cni("ib-sriov", "ADD", config, netns=pod)
    if not ok:
        assert (add.rc, add.out["code"]) == (1, 999)
        assert add.out["msg"] == (f"deviceID: VF {node.vfs[3].pci} ({node.vfs[3].netdev}) GUID "
                                  f"is not valid ({guid})")
        assert node.vfs[3].netdev in links(node.netns) and node.cache_files() == []
        return
    assert add.rc == 0, add.out
    assert node.cache("ib-sriov")["HostIFGUID"] == ""
    assert node.cni("ib-sriov", "DEL", config, netns=pod).rc == 0
    assert guid_calls(node) == []


def test_the_vf_netdev_missing_from_the_node_is_named(node: Node) -> None:
    """pkg/sriov/sriov_test.go ApplyVFConfig "check guid - failed to get vf link" and SetupVF
    "Assuming non existing interface"."""
    vf = node.vfs[4]
    subprocess.run(["ip", "-n", node.netns_name, "link", "del", vf.netdev], check=True)
    add = node.cni("ib-sriov", "ADD", conf(node, 4, runtimeConfig={"infinibandGUID": GUID}),
                   netns=node.pod())
    assert (add.rc, add.out["code"]) == (1, 100)
    assert add.out["msg"] == f"device {vf.netdev} ({vf.pci}) is not on the node"
    assert node.pf_calls() == []


class FailingGuidPf(RecordingVfControl):
    def set_guid(self, pf: str, vf: int, guid: str) -> None:
        raise CniError(Code.INTERNAL, f"setting the node GUID of VF {vf} on {pf}: Operation "
                       "not supported")


def test_a_guid_the_pf_refuses_fails_the_add(node: Node) -> None:
    """pkg/sriov/sriov_test.go ApplyVFConfig "check guid - failed to set node guid" (and
    "failed to set port guid"): the PF's error is the ADD's, the VF stays on the node with the
    link state it had."""
    assert node.daemon is not None and node.daemon.daemon is not None
    node.daemon.daemon.ctx.vfs = FailingGuidPf(node.root / "pf")
    set_address(node, 5, ipoib(HOST_GUID))
    pod = node.pod()
    add = node.cni("ib-sriov", "ADD", conf(node, 5, link_state="enable",
                                           runtimeConfig={"infinibandGUID": GUID}), netns=pod)
    assert (add.rc, add.out["code"]) == (1, 999)
    assert add.out["msg"] == f"setting the node GUID of VF 5 on {node.pf}: Operation not supported"
    assert node.vfs[5].netdev in links(node.netns) and list(links(pod)) == ["lo"]
    assert node.vf_state(5)["link_state"] == 0


def test_a_failed_rebind_fails_the_add(node: Node) -> None:
    """pkg/sriov/sriov_test.go ApplyVFConfig "check guid - failed to rebind after set guid": a
    GUID applies when the VF's driver probes it again; when the kernel refuses the unbind (here
    the node's `unbind` attribute cannot be written) the ADD fails naming the VF and the
    driver, and the VF stays on the node."""
    vf = node.vfs[6]
    drivers = node.host.path("/sys/bus/pci/drivers/mlx5_core")
    (drivers / "unbind").mkdir()
    set_address(node, 6, ipoib(HOST_GUID))
    pod = node.pod()
    add = node.cni("ib-sriov", "ADD", conf(node, 6, runtimeConfig={"infinibandGUID": GUID}),
                   netns=pod)
    assert (add.rc, add.out["code"]) == (1, 999)
    assert add.out["msg"] == f"rebinding {vf.pci} to mlx5_core to apply its GUID: Is a directory"
    assert vf.netdev in links(node.netns) and list(links(pod)) == ["lo"]
    assert node.cache_files() == []


def test_a_vfio_vf_gets_its_guid_and_nothing_else(node: Node) -> None:
    """pkg/sriov/sriov_test.go ApplyVFConfig "with valid GUID and VfioPciMode VF (no network
    interface)": HostIFGUID is FF:FF:FF:FF:FF:FF:FF:FF (there is no netdev to read one from);
    cmd/ib-sriov-cni/main.go handleVfioPciDetection turns vfioPciMode on for a VF bound to
    vfio-pci, and such a VF gets no netdev setup and no IPAM; DEL sets the all-ones GUID."""
    ipam = node.ipam_stand_in("host-local", IPAM_RESULT)
    vf = node.vfs[7]
    node.host.bind_driver(vf.pci, "vfio-pci")
    pod = node.pod()
    config = conf(node, 7, "1.1.0", ipam={"type": "host-local"},
                  runtimeConfig={"infinibandGUID": GUID})
    add = node.cni("ib-sriov", "ADD", config, netns=pod)
    assert add.rc == 0, add.out
    assert add.out == {"cniVersion": "1.1.0", "interfaces": [{"name": "net1", "sandbox": pod}]}
    cache = node.cache("ib-sriov")
    assert (cache["HostIFGUID"], cache["vfioPciMode"], cache["HostIFNames"]) == (
        "FF:FF:FF:FF:FF:FF:FF:FF", True, "")
    assert node.cni("ib-sriov", "DEL", config, netns=pod).rc == 0
    assert guid_calls(node)[2:] == [f"LinkSetVfNodeGUID {node.pf} 7 ff:ff:ff:ff:ff:ff:ff:ff",
                                    f"LinkSetVfPortGUID {node.pf} 7 ff:ff:ff:ff:ff:ff:ff:ff"]
    assert ipam.calls() == [] and node.cache_files() == []


def test_a_pf_only_in_vfio_mode(node: Node) -> None:
    """pkg/utils/utils_test.go IsVirtualFunction "Assuming PF device (no physfn)" and
    IsVfioPciDevice "Assuming PF device bound to mlx5_core driver" / "Assuming device bound to
    vfio-pci driver", with cmd/ib-sriov-cni/main.go cmdAdd: a PF is taken only bound to
    vfio-pci ("PF device ... requires vfioPciMode to be enabled"), and then just recorded."""
    pf = node.host.pfs()[0]
    config = {"cniVersion": "1.0.0", "name": "mynet", "type": "ib-sriov", "deviceID": pf}
    refused = node.cni("ib-sriov", "ADD", config, netns=node.pod())
    assert (refused.rc, refused.out["code"]) == (1, 7)
    assert refused.out["msg"] == f"deviceID: PF device {pf} requires vfioPciMode to be enabled"
    node.host.bind_driver(pf, "vfio-pci")
    pod = node.pod()
    add = node.cni("ib-sriov", "ADD", config, netns=pod)
    assert add.rc == 0, add.out
    assert add.out["interfaces"] == [{"name": "net1", "sandbox": pod}]
    assert node.cni("ib-sriov", "DEL", config, netns=pod).rc == 0
    assert node.pf_calls() == [] and node.cache_files() == []


def test_vfio_mode_asked_for_a_vf_on_its_kernel_driver_is_refused(node: Node) -> None:
    """cmd/ib-sriov-cni/main.go handleVfioPciDetection and pkg/utils/utils_test.go
    IsVfioPciDevice "Assuming VF device bound to mlx5_core driver"."""
    vf = node.vfs[0]
    add = node.cni("ib-sriov", "ADD", conf(node, 0, vfioPciMode=True), netns=node.pod())
    assert (add.rc, add.out["code"]) == (1, 7)
    assert add.out["msg"] == (f"vfioPciMode: vfioPciMode is enabled but device {vf.pci} is not "
                              "bound to vfio-pci driver (driver mlx5_core)")


def test_a_vf_that_cannot_change_namespace_is_put_back(node: Node) -> None:
    """pkg/sriov/sriov_test.go SetupVF "Assuming failed to move interface": the ADD fails, the
    VF keeps its node name, and its GUID and link state are what they were."""
    vf = node.vfs[1]
    ns = node.netns_name
    subprocess.run(["ip", "-n", ns, "link", "del", vf.netdev], check=True)
    subprocess.run(["ip", "-n", ns, "link", "add", vf.netdev, "type", "bridge"], check=True)
    set_address(node, 1, ipoib(HOST_GUID))
    pod = node.pod()
    add = node.cni("ib-sriov", "ADD", conf(node, 1, link_state="enable",
                                           runtimeConfig={"infinibandGUID": GUID}), netns=pod)
    assert (add.rc, add.out["code"]) == (1, 999)
    assert add.out["msg"].startswith(f"moving {vf.netdev} into {pod}: ")
    assert vf.netdev in links(node.netns) and node.cache_files() == []
    assert (node.vf_state(1)["node_guid"], node.vf_state(1)["link_state"]) == (HOST_GUID, 0)


def test_a_stale_altname_does_not_block_the_pods_name(node: Node) -> None:
    """pkg/sriov/sriov_test.go SetupVF "Remove altName"."""
    vf = node.vfs[2]
    set_address(node, 2, ipoib(HOST_GUID))
    subprocess.run(["ip", "-n", node.netns_name, "link", "property", "add", "dev", vf.netdev,
                    "altname", "net1"], check=True)
    pod = node.pod()
    add = node.cni("ib-sriov", "ADD", conf(node, 2), netns=pod)
    assert add.rc == 0, add.out
    assert links(pod)["net1"].get("altnames", []) == []


def test_del_when_the_pods_interface_is_gone_succeeds(node: Node) -> None:
    """pkg/sriov/sriov_test.go ReleaseVF "Assuming non existing interface": ib-sriov-cni's DEL
    fails when the pod's interface is not there, and the kubelet retries it for ever. nicop's
    DEL is idempotent (CNI spec: DEL is best effort): the attachment is released."""
    set_address(node, 3, ipoib(HOST_GUID))
    pod = node.pod()
    config = conf(node, 3, runtimeConfig={"infinibandGUID": GUID})
    assert node.cni("ib-sriov", "ADD", config, netns=pod).rc == 0
    subprocess.run(["ip", "-n", ns_name(pod), "link", "del", "net1"], check=True)
    assert node.cni("ib-sriov", "DEL", config, netns=pod).rc == 0
    assert node.cache_files() == [] and node.vf_state(3)["node_guid"] == HOST_GUID


def test_the_cache_holds_ib_sriov_cnis_netconf(node: Node) -> None:
    """pkg/types/types_test.go "Should marshal all fields correctly including upstream DNS
    logic" and "Should fix the configuration save issue from broken version": Master,
    deviceID, VFID, HostIFNames, HostIFGUID, ContIFNames, pkey, link_state, rdmaIsolation,
    RdmaNetState, runtimeConfig... as ib-sriov-cni's Go NetConf names them; "Should omit empty
    DNS field per upstream PluginConf logic"."""
    RecordingRdmaControl(node.root / "pf").set_netns_mode("exclusive")
    vf = node.vfs[4]
    set_address(node, 4, ipoib(HOST_GUID))
    device = node.host.rdma_device(vf.pci)
    pod = node.pod()
    config = conf(node, 4, pkey="0x8001", link_state="enable", rdmaIsolation=True,
                  args={"cni": {"guid": GUID}}, dns={})
    assert node.cni("ib-sriov", "ADD", config, netns=pod).rc == 0
    cache = node.cache("ib-sriov")
    assert {k: cache.get(k) for k in ("Master", "deviceID", "VFID", "HostIFNames", "HostIFGUID",
                                      "ContIFNames", "pkey", "link_state", "rdmaIsolation",
                                      "args")} == {
        "Master": node.pf, "deviceID": vf.pci, "VFID": 4, "HostIFNames": vf.netdev,
        "HostIFGUID": HOST_GUID, "ContIFNames": "net1", "pkey": "0x8001",
        "link_state": "enable", "rdmaIsolation": True, "args": {"cni": {"guid": GUID}}}
    assert cache["RdmaNetState"] == {"version": "1.0", "deviceID": vf.pci,
                                     "sandboxRdmaDevName": device,
                                     "containerRdmaDevName": device}
    assert "dns" not in cache


def test_del_of_an_attachment_ib_sriov_cni_made(node: Node) -> None:
    """pkg/types/types_test.go "Should properly round-trip marshal and unmarshal": a cache file
    as ib-sriov-cni writes it (HostIFNames, HostIFGUID, no alias on the link) is enough for
    nicop's DEL: the VF comes back under its node name and gets its GUID back."""
    vf = node.vfs[5]
    pod = node.pod()
    subprocess.run(["ip", "-n", node.netns_name, "link", "set", vf.netdev, "netns", ns_name(pod)],
                   check=True)
    subprocess.run(["ip", "-n", ns_name(pod), "link", "set", vf.netdev, "name", "net1"],
                   check=True)
    node.host.path("/var/lib/cni/ib-sriov").mkdir(parents=True, exist_ok=True)
    node.host.path("/var/lib/cni/ib-sriov/c1-net1").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "mynet", "type": "ib-sriov", "ipam": {},
        "Master": node.pf, "deviceID": vf.pci, "VFID": 5, "HostIFNames": vf.netdev,
        "HostIFGUID": HOST_GUID, "ContIFNames": "net1", "pkey": "", "link_state": "enable",
        "RdmaNetState": {"version": "", "deviceID": "", "sandboxRdmaDevName": "",
                         "containerRdmaDevName": ""},
        "runtimeConfig": {"infinibandGUID": GUID}, "args": {"cni": None}}))
    assert node.cni("ib-sriov", "DEL", conf(node, 5), netns=pod).rc == 0
    assert vf.netdev in links(node.netns) and list(links(pod)) == ["lo"]
    assert guid_calls(node) == [f"LinkSetVfNodeGUID {node.pf} 5 {HOST_GUID}",
                                f"LinkSetVfPortGUID {node.pf} 5 {HOST_GUID}"]
    assert node.cache_files() == []


def test_an_invalid_guid_in_the_cache_is_not_programmed(node: Node) -> None:
    """pkg/sriov/sriov_test.go ResetVFConfig "ResetVFConfig with invalid GUID": ib-sriov-cni's
    DEL fails (and is retried for ever) on a HostIFGUID that is not a GUID. nicop's DEL gives
    the VF back and leaves the GUID alone (logging it)."""
    vf = node.vfs[6]
    pod = node.pod()
    set_address(node, 6, ipoib(HOST_GUID))
    config = conf(node, 6, runtimeConfig={"infinibandGUID": GUID})
    assert node.cni("ib-sriov", "ADD", config, netns=pod).rc == 0
    path = node.host.path("/var/lib/cni/ib-sriov/c1-net1")
    path.write_text(json.dumps({**json.loads(path.read_text()), "HostIFGUID": "12312-123:434"}))
    assert node.cni("ib-sriov", "DEL", config, netns=pod).rc == 0
    assert len(guid_calls(node)) == 2, "only the ADD's"
    assert vf.netdev in links(node.netns) and node.cache_files() == []


def test_del_after_the_namespace_is_gone_restores_name_and_guid(node: Node) -> None:
    """cmd/ib-sriov-cni/main.go cmdDel returns success without touching the VF when the
    namespace is gone (NSPathNotExistErr), leaving it under the pod's interface name with the
    pod's GUID. nicop gives the VF the kernel returned its node name and GUID back."""
    vf = node.vfs[7]
    set_address(node, 7, ipoib(HOST_GUID))
    pod = node.pod()
    config = conf(node, 7, runtimeConfig={"infinibandGUID": GUID})
    assert node.cni("ib-sriov", "ADD", config, netns=pod).rc == 0
    subprocess.run(["ip", "-n", ns_name(pod), "link", "set", "net1", "netns", node.netns_name],
                   check=True)
    node.namespaces.names.remove(ns_name(pod))
    subprocess.run(["ip", "netns", "del", ns_name(pod)], check=True)
    assert node.cni("ib-sriov", "DEL", config, netns=pod).rc == 0
    on_node = links(node.netns)
    assert vf.netdev in on_node and "net1" not in on_node
    assert node.vf_state(7)["node_guid"] == HOST_GUID and node.cache_files() == []
