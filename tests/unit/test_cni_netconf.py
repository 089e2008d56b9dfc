"""Malformed calls get the CNI error code the spec defines and a message naming what to fix."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.netns.cni_harness import validate_error

from nicop.cni.daemon import CniDaemon, DaemonOptions
from nicop_sim.hardware import SimulatedHost
from nicop_sim.pf import RecordingRdmaControl, RecordingVfControl

VF = "0000:3b:00.2"
ENV = {
    "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/none",
    "CNI_IFNAME": "net1", "CNI_PATH": "/opt/cni/bin",
    "CNI_ARGS": "IgnoreUnknown=true;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p1;K8S_POD_UID=u1",
}
SRIOV = {"cniVersion": "1.0.0", "name": "net-a", "type": "sriov", "deviceID": VF,
         "ipam": {"type": "nv-ipam", "poolName": "pool1"}}
HOSTDEV = {"cniVersion": "1.1.0", "name": "hd", "type": "host-device"}
IB = {"cniVersion": "1.0.0", "name": "ib", "type": "ib-sriov", "deviceID": VF}


@pytest.fixture(scope="module")
def daemon() -> Iterator[CniDaemon]:
    root = Path(tempfile.mkdtemp(prefix="cniconf-", dir="/tmp"))
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs(host.pfs()[0], 2)
    (root / "pools.json").write_text(json.dumps(
        {"pool1": {"subnet": "10.1.0.0/24", "gateway": "10.1.0.1"}}))
    d = CniDaemon(DaemonOptions(host_root=root, vfs=RecordingVfControl(root / "pf"),
                                rdma=RecordingRdmaControl(root / "pf"),
                                pools_file=root / "pools.json"))
    yield d
    asyncio.run(d.close())
    shutil.rmtree(root)


def with_(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = {**base, **changes}
    return {k: v for k, v in out.items() if v is not None}


# (case, plugin, env changes, stdin, code, message)
CASES: list[tuple[str, str, dict[str, str], Any, int, str]] = [
    ("stdin is not JSON", "sriov", {}, b"{not json", 6,
     "decoding the network configuration: Expecting property name enclosed in double quotes: "
     "line 1 column 2 (char 1)"),
    ("config is a list", "sriov", {}, b"[1]", 6,
     "the network configuration must be a JSON object"),
    ("unknown cniVersion", "sriov", {}, with_(SRIOV, cniVersion="2.0.0"), 1,
     "incompatible CNI versions"),
    ("no network name", "sriov", {}, with_(SRIOV, name=None), 7, "missing network name"),
    ("network name with a space", "sriov", {}, with_(SRIOV, name="net a"), 7,
     "invalid characters found in network name"),
    ("no CNI_PATH", "sriov", {"CNI_PATH": ""}, SRIOV, 4,
     "required env variables [CNI_PATH] missing"),
    ("no deviceID", "sriov", {}, with_(SRIOV, deviceID=None), 7,
     "deviceID: required: the VF's PCI address, which Multus adds from the pod's device-plugin "
     "resource (check the network's k8s.v1.cni.cncf.io/resourceName annotation and the pod's "
     "resource request)"),
    ("deviceID not a PCI address", "sriov", {}, with_(SRIOV, deviceID="3b:00.2x"), 7,
     "deviceID: '3b:00.2x' is not a PCI address such as 0000:3b:00.2"),
    ("deviceID absent", "sriov", {}, with_(SRIOV, deviceID="0000:99:00.1"), 7,
     "deviceID: no PCI device 0000:99:00.1 on this node"),
    ("vlan out of range", "sriov", {}, with_(SRIOV, vlan=4095), 7,
     "vlan: 4095 invalid: value must be in the range 0-4094"),
    ("vlan a string", "sriov", {}, with_(SRIOV, vlan="100"), 7,
     "vlan: '100' must be an integer"),
    ("vlanQoS out of range", "sriov", {}, with_(SRIOV, vlan=10, vlanQoS=8), 7,
     "vlanQoS: 8 invalid: value must be in the range 0-7"),
    ("vlanQoS without vlan", "sriov", {}, with_(SRIOV, vlanQoS=2), 7,
     "vlanQoS: requires vlan"),
    ("vlanQoS with vlan 0", "sriov", {}, with_(SRIOV, vlan=0, vlanQoS=2), 7,
     "vlanQoS: vlan id must be configured to set vlan QoS to a non-zero value"),
    ("unknown vlanProto", "sriov", {}, with_(SRIOV, vlan=5, vlanProto="802.1x"), 7,
     "vlanProto: '802.1x' invalid: value must be 802.1q or 802.1ad"),
    ("802.1ad with vlan 0", "sriov", {}, with_(SRIOV, vlan=0, vlanProto="802.1ad"), 7,
     "vlanProto: vlan id must be configured to set vlan proto 802.1ad"),
    ("bad mac", "sriov", {}, with_(SRIOV, mac="02:00:00:00:00"), 7,
     "mac: '02:00:00:00:00' is not a MAC address such as 02:00:00:00:00:01"),
    ("bad runtimeConfig mac", "sriov", {}, with_(SRIOV, runtimeConfig={"mac": "x"}), 7,
     "runtimeConfig.mac: 'x' is not a MAC address such as 02:00:00:00:00:01"),
    ("bad CNI_ARGS MAC", "sriov", {"CNI_ARGS": "IgnoreUnknown=1;MAC=zz"}, SRIOV, 7,
     "CNI_ARGS MAC: 'zz' is not a MAC address such as 02:00:00:00:00:01"),
    ("spoofchk a boolean", "sriov", {}, with_(SRIOV, spoofchk=True), 7,
     "spoofchk: True invalid: value must be \"on\" or \"off\""),
    ("link_state up", "sriov", {}, with_(SRIOV, link_state="up"), 7,
     "link_state: 'up' invalid: value must be auto, enable or disable"),
    ("negative rate", "sriov", {}, with_(SRIOV, min_tx_rate=-1), 7,
     "min_tx_rate: -1 invalid: value must be in the range >= 0"),
    ("max below min", "sriov", {}, with_(SRIOV, min_tx_rate=100, max_tx_rate=50), 7,
     "max_tx_rate: 50 is below min_tx_rate 100 (0 means unlimited)"),
    ("unknown pool", "sriov", {}, with_(SRIOV, ipam={"type": "nv-ipam", "poolName": "nope"}), 7,
     "ipam.poolName: unknown ippool 'nope' (pools file {root}/pools.json has ['pool1'])"),
    ("three pools", "sriov", {}, with_(SRIOV, ipam={"type": "nv-ipam", "poolName": "a,b,c"}),
     7, "ipam.poolName: 3 pools given; at most two (one IPv4, one IPv6)"),
    ("empty pool name", "sriov", {}, with_(SRIOV, ipam={"type": "nv-ipam", "poolName": "a,"}),
     7, "ipam.poolName: 'a,' has an empty pool name"),
    ("unknown poolType", "sriov", {},
     with_(SRIOV, ipam={"type": "nv-ipam", "poolName": "pool1", "poolType": "subnet"}), 7,
     "ipam.poolType: unsupported poolType 'subnet', supported values: ippool, cidrpool"),
    ("ipam without type", "sriov", {}, with_(SRIOV, ipam={"poolName": "pool1"}), 7,
     "ipam.type: missing (nv-ipam, host-local, static, ...)"),
    ("IPAM binary not found", "sriov", {}, with_(SRIOV, ipam={"type": "host-local"}), 7,
     "ipam.type: IPAM plugin 'host-local' not found in CNI_PATH /opt/cni/bin"),
    ("static IP outside the pool", "sriov", {"CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAME=p;"
                                             "K8S_POD_NAMESPACE=n;IP=10.9.9.9"}, SRIOV, 7,
     "not all requested static IPs can be allocated from the ranges available on the node, "
     "ip 10.9.9.9 has no matching Pool"),
    ("negative allocateIPWithIndex", "sriov", {},
     with_(SRIOV, args={"cni": {"allocateIPWithIndex": -1}}), 7,
     "args.cni.allocateIPWithIndex: allocateIPWithIndex can't be negative (-1)"),
    ("no pod name for nv-ipam", "nv-ipam", {"CNI_ARGS": "K8S_POD_NAMESPACE=default"}, SRIOV, 4,
     "CNI_ARGS: K8S_POD_NAME is not provided by container runtime"),
    ("no CNI_NETNS on ADD", "sriov", {"CNI_NETNS": ""}, SRIOV, 4,
     "required env variables [CNI_NETNS] missing"),
    ("no CNI_COMMAND", "sriov", {"CNI_COMMAND": ""}, SRIOV, 4,
     "required env variables [CNI_COMMAND] missing"),
    ("unknown CNI_COMMAND", "sriov", {"CNI_COMMAND": "UP"}, SRIOV, 4,
     "CNI_COMMAND: unknown command 'UP'"),
    ("interface name too long", "sriov", {"CNI_IFNAME": "a-very-long-name0"}, SRIOV, 4,
     "CNI_IFNAME: interface name 'a-very-long-name0' is too long"),
    ("interface name with slash", "sriov", {"CNI_IFNAME": "net/1"}, SRIOV, 4,
     "CNI_IFNAME: interface name 'net/1' contains / or : or whitespace"),
    ("container ID with spaces", "sriov", {"CNI_CONTAINERID": "a b"}, SRIOV, 4,
     "CNI_CONTAINERID: invalid characters in containerID"),
    ("CNI_ARGS without =", "sriov", {"CNI_ARGS": "foo"}, SRIOV, 4,
     "CNI_ARGS: invalid pair 'foo'"),
    ("unknown CNI_ARGS", "sriov", {"CNI_ARGS": "FOO=1"}, SRIOV, 4,
     "CNI_ARGS: unknown args ['FOO']"),
    ("namespace that does not exist", "sriov", {"CNI_NETNS": "/run/netns/none"}, SRIOV, 4,
     "CNI_NETNS: network namespace /run/netns/none does not exist"),
    ("CHECK in 0.3.1", "sriov", {"CNI_COMMAND": "CHECK"}, with_(SRIOV, cniVersion="0.3.1"), 1,
     "config version 0.3.1 does not allow CHECK"),
    ("GC in 1.0.0", "sriov", {"CNI_COMMAND": "GC"}, SRIOV, 1,
     "config version 1.0.0 does not allow GC"),
    ("host-device without a device", "host-device", {}, HOSTDEV, 7,
     'device: specify either "device", "hwaddr", "kernelpath" or "pciBusID"'),
    ("kernelpath outside /sys/devices", "host-device", {}, with_(HOSTDEV, kernelpath="/tmp/x"),
     7, "kernelpath: kernel device path '/tmp/x' must be absolute and begin with /sys/devices/"),
    ("bad hwaddr", "host-device", {}, with_(HOSTDEV, hwaddr="nope"), 7,
     "hwaddr: 'nope' is not a MAC address such as 02:00:00:00:00:01"),
    ("bad GUID", "ib-sriov", {}, with_(IB, runtimeConfig={"infinibandGUID": "00:11"}), 7,
     "runtimeConfig.infinibandGUID: '00:11' is not a GUID such as 02:00:00:00:00:00:00:01"),
    ("all-zero GUID", "ib-sriov", {}, with_(IB, args={"cni": {"guid": "00:00:00:00:00:00:00:00"}}),
     7, "args.cni.guid: the all-zero GUID is not a valid GUID"),
    ("ib-kubernetes without GUID", "ib-sriov", {},
     with_(IB, ibKubernetesEnabled=True, args={"cni": {"mellanox.infiniband.app": "configured"}}),
     7, "args.cni.guid: required when ibKubernetesEnabled is true (ib-kubernetes assigns it)"),
    ("rdmaIsolation in shared mode", "ib-sriov", {}, with_(IB, rdmaIsolation=True), 999,
     "rdmaIsolation: the node's RDMA subsystem network namespace mode is shared, "
     "rdmaIsolation needs exclusive"),
    ("dhcp on InfiniBand", "ib-sriov", {}, with_(IB, ipam={"type": "dhcp"}), 7,
     "ipam.type: dhcp is not supported with InfiniBand"),
]


@pytest.mark.parametrize(("case", "plugin", "env", "stdin", "code", "message"), CASES,
                         ids=[c[0] for c in CASES])
def test_malformed_call(daemon: CniDaemon, case: str, plugin: str, env: dict[str, str],
                        stdin: Any, code: int, message: str) -> None:
    data = stdin if isinstance(stdin, bytes) else json.dumps(stdin).encode()
    rc, out = daemon.handle(plugin, {**ENV, **env}, data)
    assert rc == 1
    error = json.loads(out)
    version = stdin.get("cniVersion") if isinstance(stdin, dict) else None
    validate_error(error, version if version in ("0.3.1", "1.0.0", "1.1.0") else "1.1.0")
    assert (error["code"], error["msg"]) == (code, message.format(root=daemon.host.root))


def test_the_table_is_long_enough() -> None:
    assert len(CASES) >= 15


def test_version_and_unknown_plugin(daemon: CniDaemon) -> None:
    rc, out = daemon.handle("sriov", {"CNI_COMMAND": "VERSION"}, b'{"cniVersion":"1.0.0"}')
    assert (rc, json.loads(out)) == (0, {"cniVersion": "1.0.0", "supportedVersions": [
        "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]})
    rc, out = daemon.handle("macvlan", ENV, json.dumps(SRIOV).encode())
    assert rc == 1 and json.loads(out)["msg"] == "nicop cni-daemon has no plugin 'macvlan'"


def test_del_of_an_unknown_attachment_succeeds(daemon: CniDaemon) -> None:
    """DEL must succeed for what was never added (the runtime retries DEL until it does)."""
    for plugin in ("sriov", "ib-sriov", "host-device", "nv-ipam"):
        rc, out = daemon.handle(plugin, {**ENV, "CNI_COMMAND": "DEL", "CNI_NETNS": ""},
                                json.dumps(SRIOV).encode())
        assert (rc, out) == (0, b""), (plugin, out)
