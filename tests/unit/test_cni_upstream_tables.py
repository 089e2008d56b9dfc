"""The table cases of the upstream plugins' unit tests that a config or a call alone decides.

Each case names its upstream file and It/Entry: k8snetworkplumbingwg/sriov-cni pkg/config,
pkg/utils; k8snetworkplumbingwg/ib-sriov-cni pkg/config, pkg/sriov, cmd/thin_entrypoint;
containernetworking/cni pkg/types (args_test.go, 100/types_test.go, 040/types_test.go). A config
upstream accepts gets as far as the pod's namespace, which does not exist here (error 4 naming
CNI_NETNS); one it refuses gets error 7 naming the field (nicop's message, upstream's meaning).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nicop.cni import spec
from nicop.cni.daemon import CniDaemon, DaemonOptions
from nicop.cni.install import PLUGINS, install, shim_script
from nicop_sim.hardware import SimulatedHost
from nicop_sim.pf import RecordingRdmaControl, RecordingVfControl

ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/no-such-pod",
       "CNI_IFNAME": "net1", "CNI_PATH": "/opt/cni/bin",
       "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p1"}
VF = "0000:3b:00.2"
PF = "0000:3b:00.0"
REACHED_THE_POD = (4, "CNI_NETNS: network namespace /run/netns/no-such-pod does not exist")


@pytest.fixture(scope="module")
def daemon() -> Iterator[CniDaemon]:
    root = Path(tempfile.mkdtemp(prefix="cnitab-", dir="/tmp"))
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs(host.pfs()[0], 3)
    host.bind_driver("0000:3b:00.4", None)  # a VF without driver: no netdev, not DPDK
    (root / "pools.json").write_text(json.dumps({"pool1": {"subnet": "10.1.0.0/24"}}))
    d = CniDaemon(DaemonOptions(host_root=root, vfs=RecordingVfControl(root / "pf"),
                                rdma=RecordingRdmaControl(root / "pf"),
                                pools_file=root / "pools.json"))
    yield d
    asyncio.run(d.close())
    shutil.rmtree(root)


def outcome(daemon: CniDaemon, plugin: str, config: dict[str, Any] | bytes,
            **env: str) -> tuple[int, str]:
    data = config if isinstance(config, bytes) else json.dumps(config).encode()
    rc, out = daemon.handle(plugin, {**ENV, **env}, data)
    assert rc == 1, out
    error = json.loads(out)
    return error["code"], error["msg"]


def sriov(**extra: Any) -> dict[str, Any]:
    """sriov-cni pkg/config/config_test.go's netconf ("vf": 0 is a key sriov-cni ignores)."""
    config = {"name": "mynet", "type": "sriov", "deviceID": VF, "vf": 0, **extra}
    return {k: v for k, v in config.items() if v is not None}


# ------------------------------------------------------------------ sriov-cni pkg/config

# config_test.go DescribeTable "Vlan ID, QoS and Proto" (vlan, qos, proto, failure), with the
# field and reason nicop names.
VLAN_TABLE = [
    ("valid vlan ID", 100, None, None, None),
    ("invalid vlan ID", 5000, None, None, "vlan: 5000 invalid: value must be in the range 0-4094"),
    ("vlan ID equal to zero and non-zero QoS set", 0, 1, None,
     "vlanQoS: vlan id must be configured to set vlan QoS to a non-zero value"),
    ("vlan ID equal to zero and 802.1ad Proto set", 0, None, "802.1ad",
     "vlanProto: vlan id must be configured to set vlan proto 802.1ad"),
    ("invalid QoS", 100, 10, None, "vlanQoS: 10 invalid: value must be in the range 0-7"),
    ("invalid Proto", 100, None, "802",
     "vlanProto: '802' invalid: value must be 802.1q or 802.1ad"),
    ("valid 802.1q Proto", 100, None, "802.1Q", None),
    ("valid 802.1ad Proto", 100, None, "802.1ad", None),
    ("no vlan ID and non-zero QoS set", None, 1, None, "vlanQoS: requires vlan"),
    ("no vlan ID and 802.1ad Proto set", None, None, "802.1ad", "vlanProto: requires vlan"),
    ("default values for vlan, qos and proto", 0, 0, "802.1Q", None),
]


@pytest.mark.parametrize(("entry", "vlan", "qos", "proto", "problem"), VLAN_TABLE,
                         ids=[e[0] for e in VLAN_TABLE])
def test_sriov_vlan_qos_and_proto(daemon: CniDaemon, entry: str, vlan: int | None,
                                  qos: int | None, proto: str | None,
                                  problem: str | None) -> None:
    """sriov-cni pkg/config/config_test.go "Vlan ID, QoS and Proto", Entry `entry`."""
    got = outcome(daemon, "sriov", sriov(vlan=vlan, vlanQoS=qos, vlanProto=proto))
    assert got == ((7, problem) if problem else REACHED_THE_POD)


@pytest.mark.parametrize(("case", "config", "expected"), [
    ("Assuming correct config file - existing DeviceID",
     sriov(ipam={"type": "nv-ipam", "poolName": "pool1"}), REACHED_THE_POD),
    ("Assuming incorrect config file - not existing DeviceID", sriov(deviceID="0000:3b:06.3"),
     (7, "deviceID: no PCI device 0000:3b:06.3 on this node")),
    # Checking getVfInfo function "Assuming not existing PF": a function without physfn.
    ("Assuming not existing PF", sriov(deviceID=PF),
     (7, f"deviceID: {PF} is not a VF (no physfn): failed to get VF information; sriov takes "
         "SR-IOV virtual functions, host-device any other device")),
])
def test_sriov_load_conf(daemon: CniDaemon, case: str, config: dict[str, Any],
                         expected: tuple[int, str]) -> None:
    """sriov-cni pkg/config/config_test.go "Checking LoadConf function" / "Checking getVfInfo
    function", It `case`."""
    assert outcome(daemon, "sriov", config) == expected


def test_sriov_broken_json(daemon: CniDaemon) -> None:
    """sriov-cni and ib-sriov-cni pkg/config/config_test.go "Assuming incorrect config file -
    broken json" (a missing comma after "name"): error 6, decoding failure."""
    broken = b'{\n"name": "mynet"\n"type": "sriov", "deviceID": "0000:3b:00.2"}'
    for plugin in ("sriov", "ib-sriov"):
        code, msg = outcome(daemon, plugin, broken)
        assert code == 6 and msg.startswith("decoding the network configuration: Expecting ','")


def test_a_vf_without_netdev_or_dpdk_driver(daemon: CniDaemon) -> None:
    """sriov-cni pkg/config/config.go LoadConf ("the VF ... does not have a interface name or a
    dpdk driver") and pkg/utils/utils_test.go "Checking GetVFLinkName function" "Assuming not
    existing vf": a VF bound to no driver has no netdev to move."""
    assert outcome(daemon, "sriov", sriov(deviceID="0000:3b:00.4")) == (
        7, "deviceID: 0000:3b:00.4 has no network device (driver none); is it a VF bound to its "
           "kernel driver?")


# Rates and VLANs: sriov-cni passes any integer to netlink (a negative rate becomes a huge
# unsigned one, min above max is refused by the driver, after the VF was changed); nicop refuses
# them as config errors first, and 0 stays "unlimited".
RATE_TABLE = [
    ("negative min_tx_rate", {"min_tx_rate": -1},
     "min_tx_rate: -1 invalid: value must be in the range >= 0"),
    ("negative max_tx_rate", {"max_tx_rate": -100},
     "max_tx_rate: -100 invalid: value must be in the range >= 0"),
    ("min above max", {"min_tx_rate": 1000, "max_tx_rate": 100},
     "max_tx_rate: 100 is below min_tx_rate 1000 (0 means unlimited)"),
    ("a rate as a string", {"max_tx_rate": "100"}, "max_tx_rate: '100' must be an integer"),
    ("a rate with a fraction", {"min_tx_rate": 1.5}, "min_tx_rate: 1.5 must be an integer"),
    ("min with an unlimited max", {"min_tx_rate": 100, "max_tx_rate": 0}, None),
    ("max alone", {"max_tx_rate": 4000}, None),
    ("min equal to max", {"min_tx_rate": 1000, "max_tx_rate": 1000}, None),
    ("negative vlan", {"vlan": -1}, "vlan: -1 invalid: value must be in the range 0-4094"),
    ("vlanQoS 0 without vlan", {"vlanQoS": 0}, "vlanQoS: requires vlan"),
    ("vlanProto 802.1q without vlan", {"vlanProto": "802.1q"}, "vlanProto: requires vlan"),
    ("vlanProto in capitals", {"vlan": 10, "vlanProto": "802.1AD"}, None),
]


@pytest.mark.parametrize(("case", "fields", "problem"), RATE_TABLE,
                         ids=[c[0] for c in RATE_TABLE])
def test_sriov_rate_and_vlan_validation(daemon: CniDaemon, case: str, fields: dict[str, Any],
                                        problem: str | None) -> None:
    """sriov-cni pkg/sriov/sriov.go ApplyVFConfig (rates, "0 means no rate limiting") and
    pkg/config/config.go LoadConf (vlan, vlanQoS, vlanProto need a vlan, proto lowercased)."""
    got = outcome(daemon, "sriov", sriov(**fields))
    assert got == ((7, problem) if problem else REACHED_THE_POD)


@pytest.mark.parametrize("mac", ["01:00:5e:00:00:01", "00:00:00:00:00:00",
                                 "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01"])
def test_a_mac_no_vf_can_take_is_refused(daemon: CniDaemon, mac: str) -> None:
    """sriov-cni pkg/sriov/sriov_test.go SetupVF "Setting VF's MAC address failed" (upstream
    finds out in the pod, after changing the VF): multicast, all-zero and 20-byte addresses
    are refused up front, whether from `mac`, CNI_ARGS MAC or runtimeConfig.mac."""
    message = "is not a unicast Ethernet MAC address such as 02:00:00:00:00:01"
    assert outcome(daemon, "sriov", sriov(mac=mac)) == (7, f"mac: {mac} {message}")
    assert outcome(daemon, "sriov", sriov(), CNI_ARGS=f"IgnoreUnknown=1;MAC={mac}") == (
        7, f"CNI_ARGS MAC: {mac} {message}")
    assert outcome(daemon, "sriov", sriov(runtimeConfig={"mac": mac})) == (
        7, f"runtimeConfig.mac: {mac} {message}")


# ------------------------------------------------------------------ CNI_ARGS

# containernetworking/cni pkg/types/args_test.go "LoadArgs" and "UnmarshallableBool
# UnmarshalText", as sriov-cni's CmdAdd applies them (its args: IgnoreUnknown, MAC); nicop knows
# the Kubernetes keys, IP and GATEWAY too, in every plugin.
ARGS_TABLE = [
    ("When no arguments are passed", "", None),
    ("When unknown arguments are passed and ignored", "IgnoreUnknown=True;Unk=nown", None),
    ("When unknown arguments are passed and not ignored", "Unk=nown",
     "CNI_ARGS: unknown args ['Unk']"),
    ("When unknown arguments are passed and explicitly not ignored",
     "IgnoreUnknown=0, Unk=nown", "CNI_ARGS: invalid pair 'IgnoreUnknown=0, Unk=nown'"),
    ("IgnoreUnknown=0 and an unknown key", "IgnoreUnknown=0;Unk=nown",
     "CNI_ARGS: unknown args ['Unk']"),
    ("When known arguments are passed", "IgnoreUnknown=1", None),
    ("parse to true: True", "IgnoreUnknown=True", None),
    ("parse to true: true", "IgnoreUnknown=true", None),
    ("parse to false: False", "IgnoreUnknown=False", None),
    ("parse to false: 0", "IgnoreUnknown=0", None),
    ("When passed an invalid value", "IgnoreUnknown=invalid",
     "CNI_ARGS: error parsing value of pair 'IgnoreUnknown=invalid': boolean unmarshal error: "
     "invalid input invalid"),
    ("a pair without =", "IgnoreUnknown=1;foo", "CNI_ARGS: invalid pair 'foo'"),
    ("a pair with two =", "IgnoreUnknown=1;IP=a=b", "CNI_ARGS: invalid pair 'IP=a=b'"),
    ("keys are matched exactly", "ignoreunknown=1;Unk=nown",
     "CNI_ARGS: unknown args ['Unk', 'ignoreunknown']"),
    ("MAC (sriov-cni's envArgs)", "MAC=60:00:00:00:00:01", None),
    ("the Kubernetes keys without IgnoreUnknown",
     "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=x;K8S_POD_UID=u", None),
    ("IP and GATEWAY (static addresses)", "IP=10.0.0.0;GATEWAY=10.0.0.1", None),
    ("empty pairs are skipped", "IgnoreUnknown=1;;K8S_POD_NAME=p;", None),
]


@pytest.mark.parametrize(("case", "args", "problem"), ARGS_TABLE, ids=[c[0] for c in ARGS_TABLE])
def test_cni_args(daemon: CniDaemon, case: str, args: str, problem: str | None) -> None:
    """containernetworking/cni pkg/types/args_test.go `case`: a malformed pair, an unknown key
    without IgnoreUnknown and an IgnoreUnknown that is not a boolean are error 4 (invalid
    environment) before the plugin runs."""
    got = outcome(daemon, "sriov", sriov(), CNI_ARGS=args)
    assert got == ((4, problem) if problem else REACHED_THE_POD)


def test_cni_args_are_checked_by_every_plugin(daemon: CniDaemon) -> None:
    """containernetworking/plugins host-device.go and ib-sriov-cni main.go never read CNI_ARGS
    (their IPAM plugin may); nicop checks them the same way for every plugin, so an unknown key
    needs IgnoreUnknown everywhere."""
    configs = {"host-device": {"name": "n", "type": "host-device", "device": "eth9"},
               "ib-sriov": {"name": "n", "type": "ib-sriov", "deviceID": VF}}
    for plugin, config in configs.items():
        assert outcome(daemon, plugin, config, CNI_ARGS="Unk=nown") == (
            4, "CNI_ARGS: unknown args ['Unk']"), plugin


# ------------------------------------------------------------------ ib-sriov-cni

IB = {"name": "mynet", "type": "ib-sriov", "deviceID": VF, "vf": 0}


@pytest.mark.parametrize(("case", "guid", "problem"), [
    ("ApplyVFConfig with invalid GUID - wrong characters", "invalid GUID",
     "'invalid GUID' is not a GUID such as 02:00:00:00:00:00:00:01"),
    ("ApplyVFConfig with invalid GUID - wrong length", "00:11:22:33:44:55:66",
     "'00:11:22:33:44:55:66' is not a GUID such as 02:00:00:00:00:00:00:01"),
    ("ApplyVFConfig with invalid GUID - all zeros guid", "00:00:00:00:00:00:00:00",
     "the all-zero GUID is not a valid GUID"),
    ("ApplyVFConfig with invalid GUID - invalid guid address", "00:AF-3B-0123:21:3322",
     "'00:AF-3B-0123:21:3322' is not a GUID such as 02:00:00:00:00:00:00:01"),
])
def test_ib_sriov_guid_validation(daemon: CniDaemon, case: str, guid: str,
                                  problem: str) -> None:
    """ib-sriov-cni pkg/sriov/sriov_test.go `case`: refused before the VF is touched, from
    runtimeConfig.infinibandGUID and from args.cni.guid alike."""
    assert outcome(daemon, "ib-sriov", {**IB, "runtimeConfig": {"infinibandGUID": guid}}) == (
        7, f"runtimeConfig.infinibandGUID: {problem}")
    assert outcome(daemon, "ib-sriov", {**IB, "args": {"cni": {"guid": guid}}}) == (
        7, f"args.cni.guid: {problem}")


@pytest.mark.parametrize(("case", "config", "expected"), [
    ("Assuming correct config file - existing DeviceID",
     {**IB, "ipam": {"type": "nv-ipam", "poolName": "pool1"}}, REACHED_THE_POD),
    ("Assuming not existing PF", {**IB, "deviceID": "0000:3b:07.0"},
     (7, "deviceID: no PCI device 0000:3b:07.0 on this node")),
    ("Assuming VFIO VF device / vfioPciMode on a kernel driver", {**IB, "vfioPciMode": True},
     (7, f"vfioPciMode: vfioPciMode is enabled but device {VF} is not bound to vfio-pci driver "
         "(driver mlx5_core)")),
    ("Assuming PF device (no physfn)", {**IB, "deviceID": PF},
     (7, f"deviceID: PF device {PF} requires vfioPciMode to be enabled")),
    ("link_state", {**IB, "link_state": "up"},
     (7, "link_state: 'up' invalid: value must be auto, enable or disable")),
])
def test_ib_sriov_load_conf(daemon: CniDaemon, case: str, config: dict[str, Any],
                            expected: tuple[int, str]) -> None:
    """ib-sriov-cni pkg/config/config_test.go ("Checking LoadConf function", "Checking
    getVfInfo function") and pkg/utils/utils_test.go IsVirtualFunction / IsVfioPciDevice with
    cmd/ib-sriov-cni/main.go's checks, `case`."""
    assert outcome(daemon, "ib-sriov", config) == expected


def test_install_as_the_thin_entrypoint(tmp_path: Path) -> None:
    """ib-sriov-cni cmd/thin_entrypoint/main_test.go "copyBinary": "should succeed with valid
    paths" and "should handle file permissions correctly" (an executable 0755 in the CNI bin
    dir, written atomically); "should fail with missing CNI bin directory" is where nicop
    differs: it creates the directory; "should fail when IB SR-IOV binary file is a directory"
    (verifyPaths, "is not a regular file"): a directory where a plugin goes is an error."""
    bin_dir = tmp_path / "opt/cni/bin"
    install(bin_dir, "/run/nicop/cni.sock", "/usr/bin/python3")
    for name in PLUGINS:
        assert (bin_dir / name).stat().st_mode & 0o777 == 0o755
        assert (bin_dir / name).read_text() == shim_script("/usr/bin/python3")
    blocked = tmp_path / "blocked"
    (blocked / "ib-sriov").mkdir(parents=True)
    with pytest.raises(IsADirectoryError, match="ib-sriov exists and is not a regular file"):
        install(blocked, "/run/nicop/cni.sock", "/usr/bin/python3", ("ib-sriov",))
    assert sorted(p.name for p in blocked.iterdir()) == ["ib-sriov"], "nothing half-written"


# ------------------------------------------------------------------ result types

def go_test_result() -> dict[str, Any]:
    """containernetworking/cni pkg/types/100/types_test.go testResult(): every field set."""
    return {"interfaces": [{"name": "eth0", "mac": "00:11:22:33:44:55", "mtu": 1500,
                            "sandbox": "/proc/3553/ns/net", "pciID": "8086:9a01",
                            "socketPath": "/path/to/vhost/fd"}],
            "ips": [{"interface": 0, "address": "1.2.3.30/24", "gateway": "1.2.3.1"},
                    {"interface": 0, "address": "abcd:1234:ffff::cdde/64",
                     "gateway": "abcd:1234:ffff::1"}],
            "routes": [{"dst": "15.5.6.0/24", "gw": "15.5.6.8"},
                       {"dst": "1111:dddd::/80", "gw": "1111:dddd::aaaa"}],
            "dns": {"nameservers": ["1.2.3.4", "1::cafe"], "domain": "acompany.com",
                    "search": ["somedomain.com", "otherdomain.net"], "options": ["foo", "bar"]}}


DNS = {"nameservers": ["1.2.3.4", "1::cafe"], "domain": "acompany.com",
       "search": ["somedomain.com", "otherdomain.net"], "options": ["foo", "bar"]}


def test_a_1_1_0_result_as_the_go_library_encodes_it() -> None:
    """containernetworking/cni pkg/types/100/types_test.go "correctly encodes a 1.1.0 Result"
    and "correctly converts a 1.0.0 Result to 1.1.0" (the same but for cniVersion)."""
    for version in ("1.1.0", "1.0.0"):
        assert spec.render_result(go_test_result(), version) == {
            "cniVersion": version, "dns": DNS,
            "interfaces": [{"mac": "00:11:22:33:44:55", "mtu": 1500, "name": "eth0",
                            "pciID": "8086:9a01", "sandbox": "/proc/3553/ns/net",
                            "socketPath": "/path/to/vhost/fd"}],
            "ips": [{"address": "1.2.3.30/24", "gateway": "1.2.3.1", "interface": 0},
                    {"address": "abcd:1234:ffff::cdde/64", "gateway": "abcd:1234:ffff::1",
                     "interface": 0}],
            "routes": [{"dst": "15.5.6.0/24", "gw": "15.5.6.8"},
                       {"dst": "1111:dddd::/80", "gw": "1111:dddd::aaaa"}]}


@pytest.mark.parametrize("version", ["0.3.0", "0.3.1", "0.4.0"])
def test_a_0_4_0_result_as_the_go_library_encodes_it(version: str) -> None:
    """containernetworking/cni pkg/types/100/types_test.go "correctly encodes a 0.4.0 Result"
    and pkg/types/040/types_test.go "correctly encodes a 0.3.x Result": interfaces lose mtu,
    pciID and socketPath, each ip gets its version."""
    assert spec.render_result(go_test_result(), version) == {
        "cniVersion": version,
        "interfaces": [{"name": "eth0", "mac": "00:11:22:33:44:55",
                        "sandbox": "/proc/3553/ns/net"}],
        "ips": [{"version": "4", "interface": 0, "address": "1.2.3.30/24",
                 "gateway": "1.2.3.1"},
                {"version": "6", "interface": 0, "address": "abcd:1234:ffff::cdde/64",
                 "gateway": "abcd:1234:ffff::1"}],
        "routes": [{"dst": "15.5.6.0/24", "gw": "15.5.6.8"},
                   {"dst": "1111:dddd::/80", "gw": "1111:dddd::aaaa"}],
        "dns": DNS}


def test_a_0_1_0_result_as_the_go_library_encodes_it() -> None:
    """containernetworking/cni pkg/types/100/types_test.go "correctly encodes a 0.1.0 Result"
    (and 040/types_test.go's): the first address per family, each with its family's routes."""
    assert spec.render_result(go_test_result(), "0.1.0") == {
        "cniVersion": "0.1.0",
        "ip4": {"ip": "1.2.3.30/24", "gateway": "1.2.3.1",
                "routes": [{"dst": "15.5.6.0/24", "gw": "15.5.6.8"}]},
        "ip6": {"ip": "abcd:1234:ffff::cdde/64", "gateway": "abcd:1234:ffff::1",
                "routes": [{"dst": "1111:dddd::/80", "gw": "1111:dddd::aaaa"}]},
        "dns": DNS}


def test_interface_index_zero_and_missing() -> None:
    """containernetworking/cni pkg/types/100/types_test.go "correctly marshals and unmarshals
    interface index 0" and "correctly marshals a missing interface index" (and 040's)."""
    result = {"ips": [{"interface": 0, "address": "10.1.2.3/24"}, {"address": "10.1.2.4/24"}]}
    assert spec.render_result(result, "1.0.0")["ips"] == [
        {"address": "10.1.2.3/24", "interface": 0}, {"address": "10.1.2.4/24"}]
    assert spec.render_result(result, "0.4.0")["ips"] == [
        {"version": "4", "interface": 0, "address": "10.1.2.3/24"},
        {"version": "4", "address": "10.1.2.4/24"}]
    assert spec.parse_result(spec.render_result(result, "1.1.0"))["ips"] == result["ips"]


def test_an_address_that_is_not_a_string_is_a_decoding_error() -> None:
    """containernetworking/cni pkg/types/100/types_test.go "when unmarshalling json fails"
    "returns an error" (`{"address": 5}`)."""
    with pytest.raises(spec.CniError) as e:
        spec.parse_result({"cniVersion": "1.0.0", "ips": [{"address": 5}]})
    assert e.value.code == 6


# ------------------------------------------------------------------ logging

def test_every_call_is_logged_by_the_daemon_not_to_log_file(
    daemon: CniDaemon, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """sriov-cni pkg/logging/logging_test.go "log argument prepender" "should log cniName,
    netns, containerID and ifName", and "log files": sriov-cni logs to stderr or the netconf's
    `logFile` at `logLevel`. nicop's plugins run in the CNI daemon, which logs every call (the
    plugin, command, containerID, ifname, netns and outcome) in its own log; `logFile` and
    `logLevel` are accepted and not used, so no file appears."""
    log_file = tmp_path / "sriov.log"
    config = sriov(logFile=str(log_file), logLevel="debug")
    with caplog.at_level("INFO", logger="nicop.cni.daemon"):
        assert outcome(daemon, "sriov", config) == REACHED_THE_POD
    line = next(r.getMessage() for r in caplog.records if r.name == "nicop.cni.daemon")
    assert line.startswith("sriov ADD c1/net1 netns /run/netns/no-such-pod: ")
    assert '"code": 4' in line
    assert not log_file.exists()
