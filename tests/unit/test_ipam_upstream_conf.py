"""nv-ipam's network configuration on upstream's own inputs: which pool, pool type, static
addresses and features a call resolves to, from the `ipam` section, `nv-ipam.conf` in the conf dir
(/etc/cni/net.d/nv-ipam.d) and nv-ipam's defaults, and which combinations are refused.

Every case names the upstream test it comes from in Mellanox/nvidia-k8s-ipam.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nicop.cni.ipam import Ipam, NvIpamPlugin, parse_nv_ipam
from nicop.cni.pools import FilePools
from nicop.cni.spec import CniError, Code, Request, parse_request, render_result
from nicop.cni.store import Store
from nicop.node.host import Host

CONF_DIR = "/etc/cni/net.d/nv-ipam.d"


def conf(tmp_path: Path, file: str | None, stdin: str, args: str = "K8S_POD_NAME=test;"
         "K8S_POD_NAMESPACE=test") -> Request:
    """A request as types_test.go builds it: nv-ipam.conf holding `file` (none when None) in the
    conf dir under the host root, the network configuration `stdin` (its %q is the conf dir)."""
    d = tmp_path / CONF_DIR.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    if file is not None:
        (d / "nv-ipam.conf").write_text(file)
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c", "CNI_NETNS": "/x", "CNI_IFNAME": "net0",
           "CNI_PATH": "/opt/cni/bin", "CNI_ARGS": args}
    return parse_request("nv-ipam", env, stdin.replace("%q", json.dumps(CONF_DIR)).encode())


def load(tmp_path: Path, file: str | None, stdin: str, **kw: Any) -> Any:
    return parse_nv_ipam(conf(tmp_path, file, stdin, **kw), Host(tmp_path))


# ------------------------------------------------------------------ LoadConf() Its

def test_defaults_when_nothing_overrides_them(tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/types/types_test.go, Describe "Types Tests", Context
    "LoadConf()", It "loads default configuration when no overwrites provided": the pool is the
    network's name, log file /var/log/nv-ipam-cni.log at level info; the other defaults of
    pkg/cni/types/types.go too (IPPool, daemon socket, 5 s timeout, forcePoolName false)."""
    got = load(tmp_path, "{}", '{"name": "my-net", "ipam": {"confDir": %q}}')
    assert (got.pools, got.pool_type, got.conf_dir) == (["my-net"], "ippool", CONF_DIR)
    assert (got.log_file, got.log_level) == ("/var/log/nv-ipam-cni.log", "info")
    assert (got.daemon_socket, got.daemon_call_timeout, got.force_pool_name) == (
        "unix:///var/lib/cni/nv-ipam/daemon.sock", 5, False)


def test_the_conf_file_fills_what_the_network_leaves_out(tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/types/types_test.go, Describe "Types Tests", Context
    "LoadConf()", It "overwrites configuration from file"."""
    got = load(tmp_path, '{"logLevel": "debug", "logFile": "some/path.log"}',
               '{"name": "my-net", "ipam": {"confDir": %q}}')
    assert (got.conf_dir, got.log_file, got.log_level) == (CONF_DIR, "some/path.log", "debug")


@pytest.mark.parametrize(("content", "says"), [
    ("{garbage", "cannot be read as JSON"),
    ('["poolName", "x"]', "must hold a JSON object"),
])
def test_a_conf_file_that_does_not_parse_fails_the_call(tmp_path: Path, content: str,
                                                        says: str) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/types/types.go LoadConf: "failed to read/parse config
    file(<path>)" fails the call (a missing file is no error: the defaults apply); the message
    names the file."""
    with pytest.raises(CniError) as e:
        load(tmp_path, content, '{"name": "my-net", "ipam": {"confDir": %q}}')
    path = tmp_path / CONF_DIR.lstrip("/") / "nv-ipam.conf"
    assert e.value.code == 7 and e.value.msg.startswith(f"ipam.confDir: {path} {says}")
    path.unlink()
    assert load(tmp_path, None, '{"name": "my-net", "ipam": {"confDir": %q}}').pools == ["my-net"]


def test_the_network_configuration_wins_over_the_conf_file(tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/types/types_test.go, Describe "Types Tests", Context
    "LoadConf()", It "overwrites configuration from json input"."""
    got = load(tmp_path, '{"logLevel": "debug"}',
               '{"name": "my-net", "ipam": {"confDir": %q, "poolName": "my-pool", '
               '"logLevel": "error"}}')
    assert (got.pools, got.conf_dir) == (["my-pool"], CONF_DIR)
    assert (got.log_file, got.log_level) == ("/var/log/nv-ipam-cni.log", "error")


def test_invalid_json_is_refused(tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/types/types_test.go, Describe "Types Tests", Context
    "LoadConf()", It "Fails if config is invalid json"."""
    with pytest.raises(CniError) as e:
        conf(tmp_path, "{}", "{garbage%^&*")
    assert e.value.code == Code.DECODING_FAILURE
    assert e.value.msg.startswith("decoding the network configuration")


def test_a_network_without_ipam_is_refused(tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/types/types_test.go, Describe "Types Tests", Context
    "LoadConf()", It "Fails if config does not contain ipam key"."""
    with pytest.raises(CniError) as e:
        load(tmp_path, "{}", '{"name": "my-net", "type": "sriov"}')
    assert (e.value.code, e.value.msg) == (7, "IPAM config missing 'ipam' key")
    assert "my-net" in e.value.details


@pytest.mark.parametrize(("case", "file", "stdin"), [
    ("Fails if CNI stdin data does not contain pool name and forcePoolName is set in config "
     "file", '{"forcePoolName": true}', '{"name": "my-net", "ipam": {"confDir": %q}}'),
    ("Fails if CNI stdin data does not contain pool name and forcePoolName is set", "{}",
     '{"name": "my-net", "ipam": {"confDir": %q, "forcePoolName": true}}'),
])
def test_force_pool_name_needs_a_pool_name(tmp_path: Path, case: str, file: str,
                                           stdin: str) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/types/types_test.go, Describe "Types Tests", Context
    "LoadConf()", the two Its of `case`: the network name is not taken as the pool's."""
    with pytest.raises(CniError) as e:
        load(tmp_path, file, stdin)
    assert e.value.code == 7, case
    assert e.value.msg.startswith("ipam.poolName: no pool provided: forcePoolName is set")


def test_force_pool_name_false_in_the_network_wins_over_the_file(tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/types/types.go overlayConf: the file fills only what the
    network configuration leaves unset, so an explicit `"forcePoolName": false` keeps the
    network name as pool name; an empty poolName or a 0 timeout count as unset."""
    got = load(tmp_path, '{"forcePoolName": true, "poolName": "fromFile", '
                         '"daemonCallTimeoutSeconds": 9}',
               '{"name": "my-net", "ipam": {"confDir": %q, "forcePoolName": false, '
               '"poolName": "", "daemonCallTimeoutSeconds": 0}}')
    assert (got.pools, got.force_pool_name, got.daemon_call_timeout) == (["fromFile"], False, 9)
    got = load(tmp_path, '{"forcePoolName": true}',
               '{"name": "my-net", "ipam": {"confDir": %q, "forcePoolName": false}}')
    assert got.pools == ["my-net"]


def test_missing_pod_metadata_names_the_argument(tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/types/types_test.go, Describe "Types Tests", Context
    "LoadConf()", It "Missing metadata arguments"."""
    stdin = '{"name": "my-net", "ipam": {"confDir": %q}}'
    file = '{"logLevel": "debug", "logFile": "some/path.log"}'
    for args, missing in (("K8S_POD_NAME=test", "K8S_POD_NAMESPACE"),
                          ("K8S_POD_NAMESPACE=test", "K8S_POD_NAME")):
        with pytest.raises(CniError) as e:
            load(tmp_path, file, stdin, args=args)
        assert (e.value.code, e.value.msg) == (
            Code.INVALID_ENV, f"CNI_ARGS: {missing} is not provided by container runtime")


def ips(*values: str) -> list[Any]:
    return [ipaddress.ip_address(v) for v in values]


@pytest.mark.parametrize(("case", "stdin", "args", "expected", "error"), [
    ("no IPs by default", '{"name": "my-net", "ipam": {"confDir": %q}}', "", [], None),
    ("env variable", '{"name": "my-net", "ipam": {"confDir": %q}}', "IP=192.168.1.1",
     ips("192.168.1.1"), None),
    ("STDIN CNI args", '{"name": "my-net", "args": {"cni": {"ips": ["1.1.1.1", "2.2.2.2/24"]}}, '
     '"ipam": {"confDir": %q}}', "", ips("1.1.1.1", "2.2.2.2"), None),
    ("STDIN RuntimeConfig", '{"name": "my-net", "runtimeConfig": {"ips": ["1.1.1.1", '
     '"2.2.2.2/24"]}, "ipam": {"confDir": %q}}', "", ips("1.1.1.1", "2.2.2.2"), None),
    ("ipv6", '{"name": "my-net", "runtimeConfig": {"ips": ["fd52:2eb5:44::1"]}, '
     '"ipam": {"confDir": %q}}', "", ips("fd52:2eb5:44::1"), None),
    ("invalid ip", '{"name": "my-net", "runtimeConfig": {"ips": ["adfdsaf"]}, '
     '"ipam": {"confDir": %q}}', "", None, "runtimeConfig.ips: 'adfdsaf' is not an IP address"),
    ("allocate default gateway and IP via env variable",
     '{"name": "my-net", "args": {"cni": {"allocateDefaultGateway": true}},'
     '"ipam": {"confDir": %q}}', "IP=192.168.1.1", None,
     "allocateDefaultGateway can't be used together with static IP request"),
    ("allocate default gateway and IP via STDIN CNI args",
     '{"name": "my-net", "args": {"cni": {"ips": ["1.1.1.1", "2.2.2.2/24"], '
     '"allocateDefaultGateway": true}}, "ipam": {"confDir": %q}}', "", None,
     "allocateDefaultGateway can't be used together with static IP request"),
    ("allocate default gateway and IP via STDIN RuntimeConfig",
     '{"name": "my-net", "runtimeConfig": {"ips": ["1.1.1.1", "2.2.2.2/24"]}, '
     '"args": {"cni": {"allocateDefaultGateway": true}}, "ipam": {"confDir": %q}}', "", None,
     "allocateDefaultGateway can't be used together with static IP request"),
    ("allocate default gateway and ipv6",
     '{"name": "my-net", "runtimeConfig": {"ips": ["fd52:2eb5:44::1"]}, '
     '"args": {"cni": {"allocateDefaultGateway": true}}, "ipam": {"confDir": %q}}', "", None,
     "allocateDefaultGateway can't be used together with static IP request"),
    ("allocate IP with index and IP via env variable",
     '{"name": "my-net", "args": {"cni": {"allocateIPWithIndex": 1}},"ipam": {"confDir": %q}}',
     "IP=192.168.1.1", None, "allocateIPWithIndex can't be used together with static IP request"),
    ("allocate IP with index and IP via STDIN CNI args",
     '{"name": "my-net", "args": {"cni": {"ips": ["1.1.1.1", "2.2.2.2/24"], '
     '"allocateIPWithIndex": 1}}, "ipam": {"confDir": %q}}', "", None,
     "allocateIPWithIndex can't be used together with static IP request"),
    ("allocate IP with index and IP via STDIN RuntimeConfig",
     '{"name": "my-net", "runtimeConfig": {"ips": ["1.1.1.1", "2.2.2.2/24"]}, '
     '"args": {"cni": {"allocateIPWithIndex": 1}}, "ipam": {"confDir": %q}}', "", None,
     "allocateIPWithIndex can't be used together with static IP request"),
    ("allocate IP with index and ipv6",
     '{"name": "my-net", "runtimeConfig": {"ips": ["fd52:2eb5:44::1"]}, '
     '"args": {"cni": {"allocateIPWithIndex": 1}}, "ipam": {"confDir": %q}}', "", None,
     "allocateIPWithIndex can't be used together with static IP request"),
])
def test_static_ips(tmp_path: Path, case: str, stdin: str, args: str, expected: list[Any] | None,
                    error: str | None) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/types/types_test.go, Describe "Types Tests", Context
    "LoadConf()", DescribeTable "Static IPs", the Entry named `case`."""
    cni_args = "K8S_POD_NAME=test;K8S_POD_NAMESPACE=test" + (";" + args if args else "")
    if error is None:
        assert load(tmp_path, "{}", stdin, args=cni_args).static_ips == expected, case
    else:
        with pytest.raises(CniError) as e:
            load(tmp_path, "{}", stdin, args=cni_args)
        assert e.value.code == 7 and error in e.value.msg, case


def test_an_invalid_ip_in_cni_args_is_refused(tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/types/types.go loadEnvCNIArgs: "CNI_ARGS: IP argument
    contains invalid IP address"; the runtimeConfig and args.cni addresses win over it."""
    stdin = '{"name": "my-net", "ipam": {"confDir": %q}}'
    with pytest.raises(CniError, match="IP argument contains invalid IP address"):
        load(tmp_path, "{}", stdin, args="K8S_POD_NAME=t;K8S_POD_NAMESPACE=t;IP=nonsense")
    stdin = '{"name": "my-net", "args": {"cni": {"ips": ["10.0.0.1"]}}, "ipam": {}}'
    assert load(tmp_path, "{}", stdin, args="K8S_POD_NAME=t;K8S_POD_NAMESPACE=t;IP=10.0.0.9"
                ).static_ips == ips("10.0.0.1")


@pytest.mark.parametrize(("case", "file", "stdin", "pools"), [
    ("use network name if not set", "{}", '{"name": "my-net", "ipam": {"confDir": %q}}',
     ["my-net"]),
    ("from conf file", '{"poolName": "fromFile"}', '{"name": "my-net", "ipam": {"confDir": %q}}',
     ["fromFile"]),
    ("from STDIN", '{"poolName": "fromFile"}',
     '{"name": "my-net", "ipam": {"confDir": %q, "poolName": "fromSTDIN"}}', ["fromSTDIN"]),
    ("from STDIN CNI args", '{"poolName": "fromFile"}',
     '{"name": "my-net", "args":{"cni": {"poolNames": ["fromArgs", "fromArgs2"]}}, '
     '"ipam": {"confDir": %q, "poolName": "fromSTDIN"}}', ["fromArgs", "fromArgs2"]),
    ("too many pools", "{}",
     '{"name": "my-net", "ipam": {"confDir": %q, "poolName": "pool1,pool2,pool3"}}', None),
])
def test_pool_name(tmp_path: Path, case: str, file: str, stdin: str,
                   pools: list[str] | None) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/types/types_test.go, Describe "Types Tests", Context
    "LoadConf()", DescribeTable "PoolName", the Entry named `case`."""
    if pools is None:
        with pytest.raises(CniError) as e:
            load(tmp_path, file, stdin)
        assert e.value.msg == "ipam.poolName: 3 pools given; at most two (one IPv4, one IPv6)"
    else:
        assert load(tmp_path, file, stdin).pools == pools, case


def test_an_empty_pool_name_in_a_list_is_refused(tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/types/types.go getPools: "pool field has invalid
    format" for an empty entry."""
    with pytest.raises(CniError, match=r"ipam\.poolName: 'pool1,' has an empty pool name"):
        load(tmp_path, "{}", '{"name": "my-net", "ipam": {"poolName": "pool1,"}}')


@pytest.mark.parametrize(("case", "file", "stdin", "pool_type"), [
    ("use IPPool by default", "{}", '{"name": "my-net", "ipam": {"confDir": %q}}', "ippool"),
    ("from conf file", '{"poolType": "CIDRPool"}', '{"name": "my-net", "ipam": {"confDir": %q}}',
     "cidrpool"),
    ("from STDIN", "{}", '{"name": "my-net", "ipam": {"confDir": %q, "poolType": "cidrPool"}}',
     "cidrpool"),
    ("from STDIN CNI Args", "{}",
     '{"name": "my-net", "args": {"cni": {"poolType":"cidrpool"}}, "ipam": {"confDir": %q}}',
     "cidrpool"),
    ("unknown type", "{}", '{"name": "my-net", "ipam": {"confDir": %q, "poolType": "foobar"}}',
     None),
])
def test_pool_type(tmp_path: Path, case: str, file: str, stdin: str,
                   pool_type: str | None) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/types/types_test.go, Describe "Types Tests", Context
    "LoadConf()", DescribeTable "PoolType", the Entry named `case`."""
    if pool_type is None:
        with pytest.raises(CniError) as e:
            load(tmp_path, file, stdin)
        assert e.value.msg == ("ipam.poolType: unsupported poolType 'foobar', supported values: "
                               "ippool, cidrpool")
    else:
        assert load(tmp_path, file, stdin).pool_type == pool_type, case


def test_a_negative_index_is_refused(tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/types/types_test.go, Describe "Types Tests", Context
    "LoadConf()", It "errors if allocateIPWithIndex is negative"."""
    with pytest.raises(CniError) as e:
        load(tmp_path, "{}", '{"name": "my-net", "ipam": {"confDir": %q}, '
                             '"args": {"cni": {"allocateIPWithIndex": -1}}}')
    assert e.value.msg == ("args.cni.allocateIPWithIndex: allocateIPWithIndex can't be negative "
                           "(-1)")


def test_gateway_and_index_together_are_refused(tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/types/types_test.go, Describe "Types Tests", Context
    "LoadConf()", It "errors if allocateDefaultGateway and allocateIPWithIndex are used
    together"."""
    with pytest.raises(CniError) as e:
        load(tmp_path, "{}", '{"name": "my-net", "ipam": {"confDir": %q}, "args": {"cni": '
                             '{"allocateIPWithIndex": 1, "allocateDefaultGateway": true}}}')
    assert "allocateDefaultGateway can't be used together allocateIPWithIndex" in e.value.msg


# ------------------------------------------------------------------ through the daemon

@pytest.fixture
def ipam(tmp_path: Path) -> Iterator[Ipam]:
    pools = {"pool2": {"subnet": "10.100.0.0/16", "startIP": "10.100.0.2",
                       "endIP": "10.100.0.254", "gateway": "10.100.0.1"},
             # the allocation plugin_test.go's daemon answers with
             "my-pool": {"subnet": "192.168.1.0/24", "startIP": "192.168.1.10",
                         "endIP": "192.168.1.20", "gateway": "192.168.1.1",
                         "routes": [{"dst": "5.5.0.0/16"}]}}
    (tmp_path / "pools.json").write_text(json.dumps(pools))
    ipam = Ipam(Store(Host(tmp_path)), FilePools(tmp_path / "pools.json"))
    yield ipam
    ipam.store.close()


def call(command: str, stdin: dict[str, Any]) -> Request:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "1234", "CNI_NETNS": "/proc/19783/ns",
           "CNI_IFNAME": "net1", "CNI_PATH": "/opt/cni/bin",
           "CNI_ARGS": "K8S_POD_NAME=test;K8S_POD_NAMESPACE=test"}
    return parse_request("nv-ipam", env, json.dumps(stdin).encode())


def test_the_conf_file_is_read_by_the_daemon(ipam: Ipam, tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/types/types_test.go, Describe "Types Tests", DescribeTable
    "PoolName", Entry "from conf file", through an ADD: the pool comes from nv-ipam.conf in the
    default conf dir of the node."""
    d = tmp_path / CONF_DIR.lstrip("/")
    d.mkdir(parents=True)
    (d / "nv-ipam.conf").write_text('{"poolName": "pool2"}')
    got = ipam.allocate(call("ADD", {"cniVersion": "1.0.0", "name": "n", "ipam": {
        "type": "nv-ipam"}}))
    assert got["ips"] == [{"address": "10.100.0.2/16", "gateway": "10.100.0.1"}]


def test_nv_ipams_daemon_settings_are_accepted_and_the_log_goes_to_the_daemon(
        ipam: Ipam, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The fields of Mellanox/nvidia-k8s-ipam cmd/ipam-node/app/app_test.go, It "deployShimCNI
    works as expected" (the nv-ipam.conf ipam-node writes: daemonSocket,
    daemonCallTimeoutSeconds, logFile, logLevel, forcePoolName) do not stop an ADD. nicop's
    nv-ipam talks to nicop's daemon wherever daemonSocket points and writes no logFile; with
    logLevel debug the daemon's log shows what each call resolved."""
    d = tmp_path / CONF_DIR.lstrip("/")
    d.mkdir(parents=True)
    log_file = tmp_path / "var/log/nv-ipam-cni.log"
    (d / "nv-ipam.conf").write_text(json.dumps({
        "daemonSocket": "unix:///nowhere/daemon.sock", "daemonCallTimeoutSeconds": 1,
        "logFile": "/var/log/nv-ipam-cni.log", "logLevel": "debug", "forcePoolName": True}))
    with caplog.at_level(logging.INFO, logger="nicop.cni.ipam"):
        got = ipam.allocate(call("ADD", {"cniVersion": "1.0.0", "name": "n", "ipam": {
            "type": "nv-ipam", "poolName": "pool2"}}))
    assert got["ips"][0]["address"] == "10.100.0.2/16"
    assert "nv-ipam ADD 1234/net1 of network n: pools ['pool2'] (ippool), static IPs []" in \
        caplog.text
    assert not log_file.exists()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="nicop.cni.ipam"):
        ipam.release(call("DEL", {"cniVersion": "1.0.0", "name": "n", "ipam": {
            "type": "nv-ipam", "poolName": "pool2", "logLevel": "info"}}))
    assert "nv-ipam DEL" not in caplog.text, "the network's own logLevel wins over the file's"


def test_plugin_add_check_and_del(ipam: Ipam) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/cni/plugin/plugin_test.go, Describe "plugin tests", Contexts
    "CmdAdd()" It "executes successfully", "CmdCheck()" and "CmdDel()" It "executes
    successfully": a 0.4.0 network on pool my-pool gets 192.168.1.10/24 with gateway
    192.168.1.1 and the route to 5.5.0.0/16 through it, printed in 0.4.0's shape."""
    plugin = NvIpamPlugin(ipam)
    net = {"cniVersion": "0.4.0", "name": "my-net", "ipam": {"type": "nv-ipam",
                                                            "poolName": "my-pool"}}
    result = render_result(plugin.add(call("ADD", net)), "0.4.0")
    assert result == {"cniVersion": "0.4.0",
                      "ips": [{"version": "4", "address": "192.168.1.10/24",
                               "gateway": "192.168.1.1"}],
                      "routes": [{"dst": "5.5.0.0/16", "gw": "192.168.1.1"}], "dns": {}}
    plugin.check(call("CHECK", net))
    plugin.delete(call("DEL", net))
    assert ipam.store.snapshot()["my-pool"] == []
    plugin.delete(call("DEL", net))  # idempotent, as the CNI spec asks
    with pytest.raises(CniError) as e:
        plugin.check(call("CHECK", net))
    assert e.value.msg == 'reservation for pool "my-pool", poolType "ippool" not found'
