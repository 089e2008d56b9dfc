"""How nicop's multus reads a pod's k8s.v1.cni.cncf.io/networks annotation, the delegate config
it makes of a NetworkAttachmentDefinition, and the network-status it writes.

The annotation values are Multus' own test inputs: pkg/k8sclient/k8sclient_test.go of
k8snetworkplumbingwg/multus-cni ("parsePodNetworkObjectName": the tables "fails to get
podnetwork given bad annotation values" and "gets pod network successfully from annotation
values"; "retrieves delegates from kubernetes using simple format annotation" and "... using
JSON format annotation"; "fails when the JSON format annotation is invalid"). The delegate's
`deviceID`/`pciBusID` and `args.cni` follow its pkg/types/conf.go (delegateAddDeviceID,
addDeviceIDInConfList, addCNIArgsInConfig); the status fields the NetworkStatus type of
network-attachment-definition-client.
"""

from __future__ import annotations

import json

import pytest

from nicop.api.networks_annotation import Selection, SelectionError, parse_selections
from nicop.cni.multus import delegate_config, network_status

BAD = {
    "can't have more than 2 items separated by \"/\"": "root@someIP/root@someOtherIP/root@thirdIP",
    "can't have more than 2 items separated by \"@\"": "root@someIP/root@someOtherIP@garbagevalue",
    "not matching comma-delimited format": "root@someIP/root@someOtherIP",
    "invalid network interface name space in netdev name": "default/net1@myIfc Name",
    "invalid network interface name too long": "default/net1@very_long_interface_name",
}
GOOD = {
    "network without namespace": ("net1", Selection("net1", "test")),
    "network with namespace": ("default/net1", Selection("net1", "default")),
    "network with interface name": ("net1@my_interface",
                                    Selection("net1", "test", interface="my_interface")),
    "network with interface name and namespace": (
        "default/net1@my_interface", Selection("net1", "default", interface="my_interface")),
}


@pytest.mark.parametrize("value", BAD.values(), ids=list(BAD))
def test_multus_refuses_what_multus_refuses(value: str) -> None:
    with pytest.raises(SelectionError):
        parse_selections(value, "test")


@pytest.mark.parametrize(("value", "expected"), GOOD.values(), ids=list(GOOD))
def test_multus_reads_what_multus_reads(value: str, expected: Selection) -> None:
    assert parse_selections(value, "test") == [expected]


def test_the_errors_say_what_is_wrong() -> None:
    with pytest.raises(SelectionError, match="more than one '/'"):
        parse_selections(BAD["can't have more than 2 items separated by \"/\""], "test")
    with pytest.raises(SelectionError, match="'root@someIP' is not a valid name"):
        parse_selections("root@someIP/root@someOtherIP", "test")
    with pytest.raises(SelectionError, match="at most 15 characters"):
        parse_selections("default/net1@very_long_interface_name", "test")


def test_comma_separated_names_keep_their_order_and_default_to_the_pods_namespace() -> None:
    assert parse_selections("net1,net2", "test") == [Selection("net1", "test"),
                                                     Selection("net2", "test")]
    assert parse_selections(" other/net1@eth5 , net2 ", "test") == [
        Selection("net1", "other", interface="eth5"), Selection("net2", "test")]


def test_the_json_form() -> None:
    """"retrieves delegates ... using JSON format annotation": `ipRequest`/`macRequest` are not
    fields of the element (its fields are `ips` and `mac`), so they are ignored."""
    value = """[
{"name":"net1"},
{
  "name":"net2",
  "ipRequest": "1.2.3.4",
  "macRequest": "aa:bb:cc:dd:ee:ff"
},
{
  "name":"net3",
  "namespace":"other-ns"
}
]"""
    assert parse_selections(value, "test") == [
        Selection("net1", "test"), Selection("net2", "test"), Selection("net3", "other-ns")]
    full = json.dumps([{"name": "sriov-net", "interface": "ib0", "mac": "02:00:00:00:00:07",
                        "ips": ["192.168.1.7/24", "fd00::7"], "cni-args": {"vlan": 5}}])
    assert parse_selections(full, "test") == [Selection(
        "sriov-net", "test", interface="ib0", mac="02:00:00:00:00:07",
        ips=["192.168.1.7/24", "fd00::7"], cni_args={"vlan": 5})]


@pytest.mark.parametrize(("value", "problem"), [
    ("[adsfasdfasdfasf]", "not valid JSON"),
    ('{"name": "net1"}', "a list of objects"),
    ('[{"namespace": "x"}]', 'needs a "name"'),
    ('[{"name": "n", "mac": "not-a-mac"}]', "mac 'not-a-mac' is not a valid address"),
    ('[{"name": "n", "ips": ["10.0.0.300"]}]', "'10.0.0.300' is not an IP address"),
    ('[{"name": "n", "interface": "a b"}]', "interface name 'a b' is invalid"),
])
def test_the_json_form_is_checked(value: str, problem: str) -> None:
    with pytest.raises(SelectionError, match=problem):
        parse_selections(value, "test")


def test_no_annotation_selects_nothing() -> None:
    assert parse_selections("", "test") == []
    assert parse_selections("  ", "test") == []


def nad(config: object, **annotations: str) -> dict[str, object]:
    return {"metadata": {"name": "net1", "namespace": "test", "annotations": annotations},
            "spec": {"config": config if isinstance(config, str) else json.dumps(config)}}


def test_the_delegate_gets_the_device_and_the_definitions_name() -> None:
    """"injects network name into minimal thick plugin CNI config"; a device goes in as
    deviceID and pciBusID, into every plugin of a list."""
    sel = Selection("net1", "test", cni_args={"foo": "bar"})
    assert delegate_config(nad({"type": "mynet"}), sel, "0000:03:00.2") == {
        "type": "mynet", "name": "net1", "deviceID": "0000:03:00.2",
        "pciBusID": "0000:03:00.2", "args": {"cni": {"foo": "bar"}}}
    listed = delegate_config(nad({"cniVersion": "1.0.0", "name": "sriov-net", "plugins": [
        {"type": "sriov", "args": {"cni": {"a": 1}}}, {"type": "tuning"}]}), sel, "0000:03:00.3")
    assert listed["name"] == "sriov-net"
    assert [(p["deviceID"], p["pciBusID"], p["args"]["cni"]) for p in listed["plugins"]] == [
        ("0000:03:00.3", "0000:03:00.3", {"a": 1, "foo": "bar"}),
        ("0000:03:00.3", "0000:03:00.3", {"foo": "bar"})]


@pytest.mark.parametrize(("config", "problem"), [
    ("", "has no spec.config"),
    ("asdfasdfasfdasfd", "not valid JSON"),
    ({"name": "x"}, "must be a CNI config"),
])
def test_a_definition_that_cannot_be_used(config: object, problem: str) -> None:
    from nicop.cni.spec import CniError

    with pytest.raises(CniError, match=problem) as e:
        delegate_config(nad(config), Selection("net1", "test"), "")
    assert "network test/net1" in e.value.msg


def test_network_status_entries() -> None:
    """The sandbox interface's name, MAC and addresses; `default` only for the default
    network; `dns` always; `device-info` when a device was handed out."""
    result = {"interfaces": [{"name": "cni0", "mac": "aa:aa:aa:aa:aa:aa"},
                             {"name": "eth0", "mac": "92:79:27:01:7c:ce", "sandbox": "/ns"}],
              "ips": [{"address": "10.244.1.2/24", "interface": 1, "gateway": "10.244.1.1"},
                      {"address": "10.244.0.1/24", "interface": 0}],
              "routes": [], "dns": {}}
    assert network_status("cbr0", "eth0", result, default=True) == {
        "name": "cbr0", "interface": "eth0", "ips": ["10.244.1.2"],
        "mac": "92:79:27:01:7c:ce", "default": True, "dns": {}}
    vf = {"interfaces": [{"name": "net1", "mac": "ea:0e:fa:63:95:f9", "sandbox": "/ns",
                          "mtu": 9000}],
          "ips": [{"address": "1.1.1.1/24", "interface": 0}], "routes": [],
          "dns": {"nameservers": ["1.1.1.53"]}}
    status = network_status("test/sriov-net", "net1", vf, device_id="0000:03:00.2")
    assert list(status) == ["name", "interface", "ips", "mac", "mtu", "dns", "device-info"]
    assert status["device-info"] == {"type": "pci", "version": "1.1.0",
                                     "pci": {"pci-address": "0000:03:00.2"}}
    assert network_status("n", "net2", {"interfaces": [], "ips": [], "dns": {}}) == {
        "name": "n", "interface": "net2", "dns": {}}
