"""Calls taken from the upstream plugins' own tests and docs get the upstream outcome.

Upstream: containernetworking/cni (skel, result types), sriov-cni, ib-sriov-cni and
containernetworking/plugins' host-device. Each test names the upstream test or doc it follows.
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

from nicop.api.networks_annotation import normalize_mac
from nicop.cni import shim, spec
from nicop.cni.daemon import CniDaemon, DaemonOptions
from nicop_sim.hardware import SimulatedHost
from nicop_sim.pf import RecordingRdmaControl, RecordingVfControl

# skel_test.go's BeforeEach environment ("dispatching to the correct callback").
SKEL_ENV = {
    "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "some-container-id", "CNI_NETNS": "/some/netns/path",
    "CNI_IFNAME": "eth0", "CNI_PATH": "/some/cni/path",
}
VF = "0000:3b:00.2"


@pytest.fixture(scope="module")
def daemon() -> Iterator[CniDaemon]:
    root = Path(tempfile.mkdtemp(prefix="cniup-", dir="/tmp"))
    host = SimulatedHost.build(root, "cx6dx")
    host.set_numvfs(host.pfs()[0], 2)
    (root / "pools.json").write_text(json.dumps({"pool1": {"subnet": "10.1.0.0/24"}}))
    d = CniDaemon(DaemonOptions(host_root=root, vfs=RecordingVfControl(root / "pf"),
                                rdma=RecordingRdmaControl(root / "pf"),
                                pools_file=root / "pools.json"))
    yield d
    asyncio.run(d.close())
    shutil.rmtree(root)


def call(daemon: CniDaemon, plugin: str, config: dict[str, Any] | bytes,
         **env: str) -> tuple[int, Any]:
    data = config if isinstance(config, bytes) else json.dumps(config).encode()
    rc, out = daemon.handle(plugin, {**SKEL_ENV, **env}, data)
    return rc, json.loads(out) if out.strip() else None


# ------------------------------------------------------------------ item 17: the protocol

def test_version_lists_every_version_the_go_library_supports(daemon: CniDaemon) -> None:
    """containernetworking/cni pkg/version/version.go `All` (0.1.0 ... 1.1.0), which every
    upstream plugin passes to skel.PluginMainFuncs; the shim answers VERSION without the
    daemon and must say the same."""
    rc, out = call(daemon, "sriov", b'{"cniVersion":"0.2.0"}', CNI_COMMAND="VERSION")
    assert rc == 0
    assert out == {"cniVersion": "0.2.0", "supportedVersions": [
        "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}
    assert tuple(out["supportedVersions"]) == shim.SUPPORTED


def test_a_config_without_name_is_error_7(daemon: CniDaemon) -> None:
    """skel.go validateConfig, fed skel_test.go's stdin `{ "some": "config" }`: "missing
    network name", ErrInvalidNetworkConfig (7), before the plugin runs."""
    for plugin in ("sriov", "ib-sriov", "host-device", "nv-ipam"):
        rc, out = call(daemon, plugin, b'{ "some": "config" }')
        assert (rc, out["code"], out["msg"]) == (1, 7, "missing network name"), plugin


def test_a_missing_cni_path_is_error_4(daemon: CniDaemon) -> None:
    """skel_test.go "required / optional env vars": Entry("path", "CNI_PATH", true) for ADD
    and DEL; skel.go reports it as ErrInvalidEnvironmentVariables (4)."""
    config = {"cniVersion": "1.0.0", "name": "skel-test", "type": "sriov", "deviceID": VF}
    for command in ("ADD", "DEL", "CHECK"):
        env = {k: v for k, v in SKEL_ENV.items() if k != "CNI_PATH"}
        rc, out = daemon.handle("sriov", {**env, "CNI_COMMAND": command},
                                json.dumps(config).encode())
        error = json.loads(out)
        assert (rc, error["code"], error["msg"]) == (
            1, 4, "required env variables [CNI_PATH] missing"), command


def test_old_and_missing_cni_versions_are_accepted(daemon: CniDaemon) -> None:
    """sriov-cni pkg/config/config_test.go "Assuming correct config file - existing
    DeviceID" has no cniVersion; the Go ConfigDecoder takes it for 0.1.0, which version.All
    accepts. 0.1.0 and 0.2.0 configs get as far as the plugin (here: the pod namespace
    skel_test.go names does not exist) instead of "incompatible CNI versions"."""
    upstream = {"name": "mynet", "type": "sriov", "deviceID": VF, "vf": 0}
    for version in (None, "0.1.0", "0.2.0"):
        config = upstream if version is None else {**upstream, "cniVersion": version}
        rc, out = call(daemon, "sriov", config)
        assert (rc, out["code"]) == (1, 4), out
        assert out["msg"] == "CNI_NETNS: network namespace /some/netns/path does not exist"


# A host-local result as containernetworking/plugins' host-local README shows it (address,
# gateway, a default route), with a second, IPv6 address and a route per family.
RESULT = {"interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:01", "mtu": 9000,
                          "sandbox": "/var/run/netns/blue", "pciID": VF}],
          "ips": [{"address": "10.55.206.46/26", "gateway": "10.55.206.1", "interface": 0},
                  {"address": "fd00::46/64", "gateway": "fd00::1", "interface": 0}],
          "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0", "gw": "fd00::1"}],
          "dns": {}}


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_old_results_take_the_old_shape(version: str) -> None:
    """containernetworking/cni pkg/types/020/types.go (ip4/ip6 with their routes, no
    interfaces) and the converter from 1.0.0 results, which keeps the first address of each
    family; convert.go takes an empty version for 0.1.0."""
    assert json.dumps(spec.render_result(RESULT, version)) == json.dumps({
        "cniVersion": version,
        "ip4": {"ip": "10.55.206.46/26", "gateway": "10.55.206.1",
                "routes": [{"dst": "0.0.0.0/0"}]},
        "ip6": {"ip": "fd00::46/64", "gateway": "fd00::1",
                "routes": [{"dst": "::/0", "gw": "fd00::1"}]},
        "dns": {}})
    with pytest.raises(spec.CniError, match="cannot convert: no valid IP addresses"):
        spec.render_result({**RESULT, "ips": []}, version)
    back = spec.parse_result(spec.render_result(RESULT, version))
    assert [ip["address"] for ip in back["ips"]] == ["10.55.206.46/26", "fd00::46/64"]


def test_a_1_0_0_result_keeps_the_interface_mtu() -> None:
    """containernetworking/cni pkg/types/100/types.go: 1.0.0 and 1.1.0 results are one Go
    type whose Interface has `mtu`, `socketPath` and `pciID`; sriov-cni fills `mtu` with the
    VF's MTU and prints the result in the config's version, 1.0.0 in its docs' examples."""
    out = spec.render_result(RESULT, "1.0.0")
    assert out["interfaces"] == [{"name": "eth0", "mac": "02:00:00:00:00:01", "mtu": 9000,
                                  "sandbox": "/var/run/netns/blue", "pciID": VF}]
    assert "mtu" not in spec.render_result(RESULT, "0.4.0")["interfaces"][0]


def test_check_without_prev_result_as_upstream(daemon: CniDaemon) -> None:
    """sriov-cni and ib-sriov-cni cmdCheck return nil (CHECK always succeeds);
    host-device.go cmdCheck fails with "Required prevResult missing" (a plain error: 999).
    The config is host-device_test.go's "cni-plugin-host-device-test"."""
    for plugin, extra in (("sriov", {"deviceID": VF}), ("ib-sriov", {"deviceID": VF})):
        config = {"cniVersion": "1.0.0", "name": "cni-plugin-host-device-test",
                  "type": plugin, **extra}
        assert call(daemon, plugin, config, CNI_COMMAND="CHECK") == (0, None), plugin
    config = {"cniVersion": "1.0.0", "name": "cni-plugin-host-device-test",
              "type": "host-device", "device": "dummy0"}
    rc, out = call(daemon, "host-device", config, CNI_COMMAND="CHECK")
    assert (rc, out["code"], out["msg"]) == (1, 999, "Required prevResult missing")


def test_status_with_a_pool_the_node_lacks_succeeds(daemon: CniDaemon) -> None:
    """skel.go calls funcs.Status only when the plugin has one; sriov-cni, ib-sriov-cni and
    host-device register none, so STATUS succeeds whatever the ipam section names (a pool
    missing on one node must not mark the node's networking not ready; that pod's ADD
    reports the pool instead)."""
    ipam = {"type": "nv-ipam", "poolName": "no-such-pool"}
    for plugin, extra in (("sriov", {"deviceID": VF}), ("ib-sriov", {"deviceID": VF}),
                          ("host-device", {"device": "dummy0"})):
        config = {"cniVersion": "1.1.0", "name": "net", "type": plugin, "ipam": ipam, **extra}
        assert call(daemon, plugin, config, CNI_COMMAND="STATUS") == (0, None), plugin


# ------------------------------------------------------------------ item 18: no stricter

@pytest.mark.parametrize(("text", "expected"), [
    # ib-sriov-cni pkg/utils/utils_test.go "Valid IPoIB hardware address" (20 bytes)
    ("00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01",
     "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01"),
    # the other spellings Go's net.ParseMAC, which the upstream plugins call, accepts
    ("6E-16-06-0E-B7-E9", "6e:16:06:0e:b7:e9"),
    ("6e16.060e.b7e9", "6e:16:06:0e:b7:e9"),
    ("02:00:5e:10:00:00:00:01", "02:00:5e:10:00:00:00:01"),
])
def test_mac_spellings_go_accepts(text: str, expected: str) -> None:
    assert normalize_mac(text) == expected


@pytest.mark.parametrize("text", [
    # ib-sriov-cni utils_test.go "Not valid IPoIB hardware address" (neither 6, 8 nor 20 bytes)
    "00:00:00:00:fe:80:00:00:00", "6e:16:06:0e:b7", "6e-16:06:0e:b7:e9", "zz:16:06:0e:b7:e9",
])
def test_mac_spellings_go_refuses(text: str) -> None:
    assert normalize_mac(text) is None


def test_a_20_byte_ipoib_hwaddr_is_a_host_device_selector(daemon: CniDaemon) -> None:
    """host-device.go getLink parses `hwaddr` with net.ParseMAC, so an IPoIB address (the
    ib-sriov-cni utils_test.go one) selects a device; no node link has it here, so the
    error is about finding the device, not about the address."""
    hwaddr = "00:00:00:00:FE:80:00:00:00:00:00:00:02:00:5E:10:00:00:00:01"
    config = {"cniVersion": "1.0.0", "name": "ib-hd", "type": "host-device", "hwaddr": hwaddr}
    rc, out = call(daemon, "host-device", config, CNI_NETNS="/proc/self/ns/net")
    assert (rc, out["code"]) == (1, 7)
    assert out["msg"] == f"hwaddr: no device with MAC {hwaddr.lower()} on the node"


def test_spoofchk_and_trust_other_than_on_are_accepted(daemon: CniDaemon) -> None:
    """sriov-cni pkg/sriov/sriov.go ApplyVFConfig: "on" turns spoof checking or trust on and
    any other string off, with no validation in LoadConf. The values reach the plugin (the
    error is the pod namespace), not a config error."""
    config = {"cniVersion": "1.0.0", "name": "net", "type": "sriov", "deviceID": VF,
              "spoofchk": "yes", "trust": "true", "mac": "6E-16-06-0E-B7-E9"}
    rc, out = call(daemon, "sriov", config)
    assert (rc, out["code"]) == (1, 4), out
    assert out["msg"].startswith("CNI_NETNS:")


# ------------------------------------------------------------------ items 14, 15: parsing

def test_ib_kubernetes_refuses_until_configured(daemon: CniDaemon) -> None:
    """ib-sriov-cni cmd/ib-sriov-cni/main.go getNetConfNetns, with the network-operator docs'
    ib-sriov-network ("ibKubernetesEnabled": true, "pkey": "0x6"): without
    args.cni["mellanox.infiniband.app"] == "configured" the ADD is refused, before any GUID
    check; with it and without a GUID, "GUID must be provided by ib-kubernetes"."""
    docs = {"type": "ib-sriov", "cniVersion": "0.3.1", "name": "ib-sriov-network",
            "pkey": "0x6", "link_state": "enable", "ibKubernetesEnabled": True,
            "ipam": {"type": "nv-ipam", "poolName": "pool1"}, "deviceID": VF}
    rc, out = call(daemon, "ib-sriov", docs)
    assert (rc, out["code"]) == (1, 11)
    assert out["msg"] == ('args.cni: InfiniBand status "mellanox.infiniband.app" is not '
                          '"configured" (ibKubernetesEnabled is true)')
    for marker in ("", "pending"):
        rc, out = call(daemon, "ib-sriov", {**docs, "args": {"cni": {
            "mellanox.infiniband.app": marker, "guid": "02:00:00:00:00:00:00:04"}}})
        assert (rc, out["code"]) == (1, 11), marker
    rc, out = call(daemon, "ib-sriov", {**docs, "args": {"cni": {
        "mellanox.infiniband.app": "configured"}}})
    assert (rc, out["code"]) == (1, 7)
    assert out["msg"].startswith("args.cni.guid: required when ibKubernetesEnabled is true")


def test_an_unknown_auxiliary_device_id_is_named(daemon: CniDaemon) -> None:
    """host-device.go handleDeviceID: a runtimeConfig.deviceID that is neither under
    /sys/bus/pci/devices nor /sys/bus/auxiliary/devices is "not found or unsupported"."""
    config = {"cniVersion": "1.0.0", "name": "cni-plugin-host-device-test",
              "type": "host-device", "runtimeConfig": {"deviceID": "mlx5_core.sf.4"}}
    rc, out = call(daemon, "host-device", config)
    assert (rc, out["code"]) == (1, 7)
    assert out["msg"].startswith("runtimeConfig.deviceID: runtime config DeviceID "
                                 "mlx5_core.sf.4 not found or unsupported")
