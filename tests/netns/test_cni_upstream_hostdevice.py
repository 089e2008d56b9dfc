"""containernetworking/plugins' host-device tests, run against nicop's `host-device`.

Every test names its It in plugins/main/host-device/host-device_test.go ("base
functionality", run there for cniVersion 0.3.0, 0.3.1, 0.4.0 and 1.0.0; 1.1.0 is added here).
The host device is a veth in the node's namespace, as upstream uses a dummy link; the `static`
IPAM plugin is a stand-in answering as static does for the test's address.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from typing import Any

import pytest
from tests.netns.cni_harness import Node, addresses, links

pytestmark = pytest.mark.netns

VERSIONS = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
STATIC = {"type": "static", "addresses": [{"address": "10.10.0.1/24", "gateway": "10.10.0.254"}]}
STATIC_RESULT = {"cniVersion": "1.0.0", "ips": [{"address": "10.10.0.1/24",
                                                "gateway": "10.10.0.254"}], "dns": {}}


def has_check(version: str) -> bool:
    return version not in ("0.3.0", "0.3.1")


def host_link(node: Node, name: str | None = None) -> tuple[str, str]:
    """A link in the node's namespace, up, as upstream's dummy; returns (name, MAC)."""
    name = name or f"dummy-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "-n", node.netns_name, "link", "add", name, "type", "veth", "peer",
                    "name", f"p{uuid.uuid4().hex[:8]}"], check=True)
    subprocess.run(["ip", "-n", node.netns_name, "link", "set", name, "up"], check=True)
    return name, links(node.netns)[name]["address"]


def conf(version: str, **extra: Any) -> dict[str, Any]:
    return {"cniVersion": version, "name": "cni-plugin-host-device-test", "type": "host-device",
            **extra}


def expected_interfaces(version: str, name: str, mac: str | None, sandbox: str) -> Any:
    """host-device_test.go expectInterfaces / expectDpdkInterfaceIP: exactly name, mac (not
    for DPDK) and sandbox, in the field order the version's Go type writes."""
    iface = {"name": name, **({"mac": mac} if mac else {}), "sandbox": sandbox}
    return [dict(sorted(iface.items()))] if version.startswith("1.") else [iface]


def check_config(version: str, config: dict[str, Any], result: Any) -> dict[str, Any]:
    """host-device_test.go buildOneConfig("testConfig", ver, n, resI): the runtime's CHECK
    config, with the ADD's result as prevResult."""
    return {**config, "name": "testConfig", "cniVersion": version, "prevResult": result}


def ns_name(path: str) -> str:
    return path.rsplit("/", 1)[1]


@pytest.mark.parametrize("version", VERSIONS)
def test_works_with_a_valid_config_without_ipam(node: Node, version: str) -> None:
    """host-device_test.go "[%s] works with a valid config without IPAM" (both Its of that
    name: the second adds CHECK for versions that have it): the device moves into the pod as
    eth0, up, with its MAC; the result lists it; DEL gives it back under its name (and, unlike
    upstream, which leaves it down, up as it was)."""
    name, mac = host_link(node)
    pod = node.pod()
    config = conf(version, device=name)
    if version == "1.1.0":
        assert node.cni("host-device", "STATUS", config).rc == 0
    add = node.cni("host-device", "ADD", config, netns=pod, ifname="eth0", container_id="dummy")
    assert add.rc == 0, add.out
    expected: dict[str, Any] = {"cniVersion": version,
                                "interfaces": expected_interfaces(version, "eth0", mac, pod)}
    if not version.startswith("1."):
        expected["dns"] = {}
    assert json.dumps(add.out) == json.dumps(expected)
    in_pod = links(pod)["eth0"]
    assert in_pod["address"] == mac and "UP" in in_pod["flags"]
    assert name not in links(node.netns)
    if has_check(version):
        check = node.cni("host-device", "CHECK", check_config(version, config, add.out),
                         netns=pod, ifname="eth0", container_id="dummy")
        assert (check.rc, check.out) == (0, None)
    assert node.cni("host-device", "DEL", config, netns=pod, ifname="eth0",
                    container_id="dummy").rc == 0
    assert "eth0" not in links(pod)
    assert "UP" in links(node.netns)[name]["flags"], "up again, as it was (upstream: down)"


@pytest.mark.parametrize("version", VERSIONS)
def test_del_is_idempotent_when_the_node_has_a_device_of_that_name(
    node: Node, version: str
) -> None:
    """host-device_test.go "[%s] ensures CmdDel is idempotent" and "Test idempotence of CmdDel
    with %s config": while the node has another device with the moved device's name, DEL fails
    and the pod's eth0 stays as it was (up, same MAC); once that device is gone, DEL succeeds
    and the device is back."""
    name, mac = host_link(node)
    pod = node.pod()
    config = conf(version, device=name)
    assert node.cni("host-device", "ADD", config, netns=pod, ifname="eth0").rc == 0
    conflict, _ = host_link(node, name)
    failed = node.cni("host-device", "DEL", config, netns=pod, ifname="eth0")
    assert (failed.rc, failed.out["code"]) == (1, 999)
    assert failed.out["msg"] == (f"cannot return eth0 to the node as {name}: the node has "
                                 f"another device named {name}")
    in_pod = links(pod)["eth0"]
    assert in_pod["address"] == mac and "UP" in in_pod["flags"]
    subprocess.run(["ip", "-n", node.netns_name, "link", "del", conflict], check=True)
    assert node.cni("host-device", "DEL", config, netns=pod, ifname="eth0").rc == 0
    assert links(node.netns)[name]["address"] == mac and "eth0" not in links(pod)


@pytest.mark.parametrize("version", VERSIONS)
def test_works_with_a_valid_config_with_ipam(node: Node, version: str) -> None:
    """host-device_test.go "Works with a valid %s config with IPAM" (both Its; the second with
    CHECK): static IPAM's address lands on the pod's eth0; host-device.go cmdAdd prints the
    interface, the IPAM's addresses (interface 0) and the netconf's dns."""
    ipam = node.ipam_stand_in("static", STATIC_RESULT)
    name, mac = host_link(node)
    pod = node.pod()
    config = conf(version, ipam=STATIC, device=name, dns={"nameservers": ["10.10.0.53"]})
    add = node.cni("host-device", "ADD", config, netns=pod, ifname="eth0", container_id="dummy")
    assert add.rc == 0, add.out
    if version.startswith("1."):
        expected: dict[str, Any] = {
            "cniVersion": version, "dns": {"nameservers": ["10.10.0.53"]},
            "interfaces": expected_interfaces(version, "eth0", mac, pod),
            "ips": [{"address": "10.10.0.1/24", "gateway": "10.10.0.254", "interface": 0}]}
    else:
        expected = {
            "cniVersion": version, "interfaces": expected_interfaces(version, "eth0", mac, pod),
            "ips": [{"version": "4", "interface": 0, "address": "10.10.0.1/24",
                     "gateway": "10.10.0.254"}],
            "dns": {"nameservers": ["10.10.0.53"]}}
    assert json.dumps(add.out) == json.dumps(expected)
    assert addresses(pod, "eth0") == ["10.10.0.1/24"] and "UP" in links(pod)["eth0"]["flags"]
    if has_check(version):
        check = node.cni("host-device", "CHECK", check_config(version, config, add.out),
                         netns=pod, ifname="eth0", container_id="dummy")
        assert (check.rc, check.out) == (0, None)
    assert node.cni("host-device", "DEL", config, netns=pod, ifname="eth0",
                    container_id="dummy").rc == 0
    assert name in links(node.netns)
    calls = ["ADD dummy eth0", *(["CHECK dummy eth0"] if has_check(version) else []),
             "DEL dummy eth0"]
    assert ipam.calls() == calls


@pytest.mark.parametrize("version", VERSIONS)
def test_works_on_a_dpdk_device_with_ipam(node: Node, version: str) -> None:
    """host-device_test.go "Works with a valid %s config on a DPDK device with IPAM" (both Its;
    the second with CHECK): a function bound to vfio-pci has no netdev; the result names the
    pod's interface without MAC and carries the IPAM's address; nothing moves."""
    node.ipam_stand_in("static", STATIC_RESULT)
    vf = node.vfs[2]
    node.host.bind_driver(vf.pci, "vfio-pci")
    pod = node.pod()
    config = conf(version, ipam=STATIC, pciBusID=vf.pci)
    add = node.cni("host-device", "ADD", config, netns=pod, ifname="eth0", container_id="dummy")
    assert add.rc == 0, add.out
    assert add.out["interfaces"] == expected_interfaces(version, "eth0", None, pod)
    assert [ip["address"] for ip in add.out["ips"]] == ["10.10.0.1/24"]
    assert list(links(pod)) == ["lo"]
    if has_check(version):
        check = node.cni("host-device", "CHECK", check_config(version, config, add.out),
                         netns=pod, ifname="eth0", container_id="dummy")
        assert (check.rc, check.out) == (0, None)
    assert node.cni("host-device", "DEL", config, netns=pod, ifname="eth0",
                    container_id="dummy").rc == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_a_pod_interface_with_the_host_devices_name_is_left_alone(
    node: Node, version: str
) -> None:
    """host-device_test.go "Test CmdAdd/Del when additioinal interface alreay exists in
    container ns with same name. %s config": the node's eth0 goes into a pod that has its own
    eth0, as net1; DEL returns the node's eth0 and leaves the pod's, up."""
    _, mac = host_link(node, "eth0")
    pod = node.pod()
    subprocess.run(["ip", "-n", ns_name(pod), "link", "add", "eth0", "type", "veth", "peer",
                    "name", "eth0peer"], check=True)
    subprocess.run(["ip", "-n", ns_name(pod), "link", "set", "eth0", "up"], check=True)
    pods_own = links(pod)["eth0"]["address"]
    config = conf(version, device="eth0")
    add = node.cni("host-device", "ADD", config, netns=pod, ifname="net1")
    assert add.rc == 0, add.out
    assert add.out["interfaces"] == expected_interfaces(version, "net1", mac, pod)
    assert links(pod)["net1"]["address"] == mac
    assert node.cni("host-device", "DEL", config, netns=pod, ifname="net1").rc == 0
    in_pod = links(pod)["eth0"]
    assert in_pod["address"] == pods_own and "UP" in in_pod["flags"]
    assert links(node.netns)["eth0"]["address"] == mac


def test_check_reports_what_differs_from_the_add_result(node: Node) -> None:
    """host-device.go cmdCheck and validateCniContainerInterface: the prevResult's sandbox must
    be the call's netns, the interface must be there with the MAC the result names, and the
    result's routes must be in the pod's table; each failure says which."""
    node.ipam_stand_in("static", {**STATIC_RESULT, "routes": [{"dst": "10.99.0.0/16"}]})
    name, mac = host_link(node)
    pod = node.pod()
    config = conf("1.0.0", ipam=STATIC, device=name)
    add = node.cni("host-device", "ADD", config, netns=pod)
    assert add.rc == 0, add.out

    def check(result: dict[str, Any]) -> Any:
        call = node.cni("host-device", "CHECK", {**config, "prevResult": result}, netns=pod)
        return (call.rc, call.out["msg"] if call.out else None)

    assert check(add.out) == (0, None)
    other = {**add.out, "interfaces": [{**add.out["interfaces"][0], "sandbox": "/run/netns/x"}]}
    assert check(other) == (1, f"Sandbox in prevResult /run/netns/x doesn't match configured "
                               f"netns: {pod}")
    wrong_mac = {**add.out, "interfaces": [{**add.out["interfaces"][0],
                                            "mac": "02:00:00:00:00:99"}]}
    assert check(wrong_mac) == (1, f"Interface net1 Mac 02:00:00:00:00:99 doesn't match "
                                   f"container Mac: {mac}")
    subprocess.run(["ip", "-n", ns_name(pod), "route", "del", "10.99.0.0/16"], check=True)
    assert check(add.out) == (1, "Expected Route 10.99.0.0/16 not found in routing table")


def test_check_of_an_attachment_the_upstream_plugin_made(node: Node) -> None:
    """host-device.go cmdCheck works from the netconf and prevResult alone; a device the
    upstream plugin moved (its node name in the alias, no nicop cache) passes CHECK."""
    name, mac = host_link(node)
    pod = node.pod()
    subprocess.run(["ip", "-n", node.netns_name, "link", "set", name, "netns", ns_name(pod)],
                   check=True)
    subprocess.run(["ip", "-n", ns_name(pod), "link", "set", name, "name", "net1", "alias",
                    name, "up"], check=True)
    prev = {"cniVersion": "1.0.0", "interfaces": [{"name": "net1", "mac": mac,
                                                   "sandbox": pod}]}
    config = conf("1.0.0", device=name)
    check = node.cni("host-device", "CHECK", {**config, "prevResult": prev}, netns=pod)
    assert (check.rc, check.out) == (0, None)
    assert node.cni("host-device", "DEL", config, netns=pod).rc == 0
    assert name in links(node.netns)


def test_del_after_the_namespace_is_gone(node: Node) -> None:
    """host-device.go cmdDel opens CNI_NETNS first and fails when it is gone (the node
    rebooted, the runtime lost the sandbox), so the kubelet retries for ever and the device
    keeps the pod's interface name. nicop's DEL succeeds and the device the kernel returned to
    the node gets its name back."""
    name, mac = host_link(node)
    pod = node.pod()
    config = conf("1.0.0", device=name)
    assert node.cni("host-device", "ADD", config, netns=pod, ifname="eth0").rc == 0
    subprocess.run(["ip", "-n", ns_name(pod), "link", "set", "eth0", "netns", node.netns_name],
                   check=True)
    node.namespaces.names.remove(ns_name(pod))
    subprocess.run(["ip", "netns", "del", ns_name(pod)], check=True)
    assert node.cni("host-device", "DEL", config, netns=pod, ifname="eth0").rc == 0
    on_node = links(node.netns)
    assert "eth0" not in on_node and on_node[name]["address"] == mac
    assert node.cache_files() == []
