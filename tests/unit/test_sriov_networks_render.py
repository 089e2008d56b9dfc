"""The NetworkAttachmentDefinitions of SriovNetwork and SriovIBNetwork: upstream's CNI JSON,
compared as parsed JSON, and its annotations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from nicop.operator.networks import NetworkError
from nicop.operator.sriov_networks import KINDS, render_nad

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_NS = "nvidia-network-operator"


def network(kind: str, spec: dict[str, Any], namespace: str = OPERATOR_NS) -> dict[str, Any]:
    return {"apiVersion": "sriovnetwork.openshift.io/v1", "kind": kind,
            "metadata": {"name": "test", "namespace": namespace, "uid": "u-1"}, "spec": spec}


def config(kind: str, spec: dict[str, Any]) -> Any:
    return json.loads(render_nad(KINDS[kind], network(kind, spec), OPERATOR_NS)["spec"]["config"])


def example(name: str) -> dict[str, Any]:
    cr: dict[str, Any] = yaml.safe_load((ROOT / "examples" / name).read_text())
    cr["metadata"]["uid"] = "u-1"
    return cr


def test_simplest_network_matches_upstreams_golden_file() -> None:
    # api/v1/testdata/TestRendering/simple.golden, plus the CRD's default logLevel
    assert config("SriovNetwork", {"resourceName": "vf"}) == {
        "cniVersion": "1.0.0", "name": "test", "type": "sriov", "vlan": 0, "vlanQoS": 0,
        "logLevel": "info", "ipam": {}}


def test_simplest_ib_network_matches_upstreams_golden_file() -> None:
    assert config("SriovIBNetwork", {"resourceName": "vf"}) == {
        "cniVersion": "1.0.0", "name": "test", "type": "ib-sriov", "ipam": {}}


def test_the_sriovnetwork_example() -> None:
    nad = render_nad(KINDS["SriovNetwork"], example("sriovnetwork.yaml"), OPERATOR_NS,
                     "nvidia.com")
    assert (nad["metadata"]["namespace"], nad["metadata"]["name"]) == ("default", "roce-vlan100")
    annotations = nad["metadata"]["annotations"]
    assert annotations["k8s.v1.cni.cncf.io/resourceName"] == "nvidia.com/cx6dx_vf"
    assert annotations["sriovnetwork.openshift.io/owner-ref"] == \
        "SriovNetwork.sriovnetwork.openshift.io/nvidia-network-operator/roce-vlan100"
    assert "ownerReferences" not in nad["metadata"]  # another namespace: no owner reference
    assert json.loads(nad["spec"]["config"]) == {
        "cniVersion": "1.0.0", "name": "roce-vlan100",
        "plugins": [
            {"type": "sriov", "vlan": 100, "spoofchk": "on", "trust": "off", "vlanQoS": 3,
             "capabilities": {"mac": True, "ips": True}, "link_state": "auto",
             "logLevel": "info", "ipam": {"type": "nv-ipam", "poolName": "rdma-pool"}},
            {"type": "tuning", "sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "1"}},
        ],
    }


def test_the_sriovibnetwork_example() -> None:
    nad = render_nad(KINDS["SriovIBNetwork"], example("sriovibnetwork.yaml"), OPERATOR_NS)
    assert nad["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"] == \
        "nvidia.com/cx7_ib_vf"
    assert json.loads(nad["spec"]["config"]) == {
        "cniVersion": "1.0.0", "name": "ib-sriov", "type": "ib-sriov", "link_state": "enable",
        "capabilities": {"infinibandGUID": True},
        "ipam": {"type": "nv-ipam", "poolName": "ib-pool"}}


def test_every_optional_field_in_upstreams_order() -> None:
    cfg = render_nad(KINDS["SriovNetwork"], network("SriovNetwork", {
        "resourceName": "vf", "vlan": 7, "vlanQoS": 1, "vlanProto": "802.1ad", "minTxRate": 0,
        "maxTxRate": 100, "spoofChk": "off", "trust": "on", "linkState": "disable",
        "logLevel": "debug", "logFile": "/var/log/sriov.log"}), OPERATOR_NS)["spec"]["config"]
    assert list(json.loads(cfg)) == [
        "cniVersion", "name", "type", "vlan", "spoofchk", "trust", "vlanQoS", "vlanProto",
        "min_tx_rate", "max_tx_rate", "link_state", "logLevel", "logFile", "ipam"]


def test_ipam_loses_all_whitespace_like_upstream() -> None:
    ipam = '{\n  "type": "whereabouts",\n  "range": "10.0.0.0/24",\n  "note": "a b"\n}'
    assert config("SriovNetwork", {"resourceName": "vf", "ipam": ipam})["ipam"] == {
        "type": "whereabouts", "range": "10.0.0.0/24", "note": "ab"}


def test_a_network_in_its_own_namespace_owns_its_nad() -> None:
    nad = render_nad(KINDS["SriovNetwork"], network("SriovNetwork", {"resourceName": "vf"},
                                                    namespace="team-a"), OPERATOR_NS)
    assert nad["metadata"]["namespace"] == "team-a"
    assert nad["metadata"]["ownerReferences"][0]["kind"] == "SriovNetwork"


def test_network_namespace_only_from_the_operator_namespace() -> None:
    cr = network("SriovNetwork", {"resourceName": "vf", "networkNamespace": "team-b"},
                 namespace="team-a")
    with pytest.raises(NetworkError, match=r"spec\.networkNamespace"):
        render_nad(KINDS["SriovNetwork"], cr, OPERATOR_NS)


def test_invalid_json_names_the_field() -> None:
    with pytest.raises(NetworkError, match=r"spec\.capabilities"):
        config("SriovNetwork", {"resourceName": "vf", "capabilities": "{mac: true}"})


# k8snetworkplumbingwg/sriov-network-operator api/v1/helper_test.go TestOVSRendering: the specs
# of its test table and the CNI config of api/v1/testdata/TestOVSRendering/<name>.golden.
OVS_GOLDEN = {
    "simpleovs": (
        {"networkNamespace": "testnamespace", "resourceName": "testresource"},
        '{ "cniVersion":"1.0.0", "name":"test","type":"ovs","ipam":{} }'),
    "chained": (
        {"networkNamespace": "testnamespace", "resourceName": "testresource", "mtu": 1500,
         "metaPlugins": '\n\t\t\t\t\t{\n\t\t\t\t\t\t"type": "vrf",\n\t\t\t\t\t\t"vrfname": "blue"'
                        '\n\t\t\t\t\t}\n\t\t\t\t\t'},
        '{ "cniVersion":"1.0.0", "name":"test","plugins": [ {"type":"ovs","mtu":1500,"ipam":{} },'
        ' {"type":"vrf","vrfname":"blue"} ] }'),
    "complexconf": (
        {"networkNamespace": "testnamespace", "resourceName": "testresource",
         "capabilities": '{"foo": "bar"}', "bridge": "test", "vlan": 100, "mtu": 1500,
         "trunk": [{"id": 120}, {"minID": 500, "maxID": 550}], "interfaceType": "netdev",
         "ipam": '{"type": "foo"}'},
        '{ "cniVersion":"1.0.0", "name":"test","type":"ovs","capabilities":{"foo": "bar"},'
        '"bridge":"test","vlan":100,"mtu":1500,"trunk":[{"id":120},{"minID":500,"maxID":550}],'
        '"interface_type":"netdev","ipam":{"type":"foo"} }'),
}


@pytest.mark.parametrize("case", sorted(OVS_GOLDEN))
def test_ovs_network_matches_upstreams_golden_file(case: str) -> None:
    """The NAD of each OVSNetwork of upstream's TestOVSRendering table: the same CNI JSON, keys
    in the same order, and upstream's annotations (its test runs without RESOURCE_PREFIX)."""
    spec, golden = OVS_GOLDEN[case]
    nad = render_nad(KINDS["OVSNetwork"], network("OVSNetwork", spec), OPERATOR_NS, prefix="")
    assert json.dumps(json.loads(nad["spec"]["config"])) == json.dumps(json.loads(golden))
    assert (nad["metadata"]["namespace"], nad["metadata"]["name"]) == ("testnamespace", "test")
    annotations = nad["metadata"]["annotations"]
    assert annotations["k8s.v1.cni.cncf.io/resourceName"] == "/testresource"
    assert annotations["sriovnetwork.openshift.io/owner-ref"] == \
        f"OVSNetwork.sriovnetwork.openshift.io/{OPERATOR_NS}/test"


def test_ovs_zero_vlan_and_mtu_and_a_trunk_id_0_like_upstream() -> None:
    """Zero vlan and mtu are left out as upstream's template does; a trunk ID of 0 is kept (a
    set pointer in upstream's TrunkConfig)."""
    cfg = config("OVSNetwork", {"resourceName": "vf", "vlan": 0, "mtu": 0,
                                "trunk": [{"minID": 0, "maxID": 10}]})
    assert cfg == {"cniVersion": "1.0.0", "name": "test", "type": "ovs",
                   "trunk": [{"minID": 0, "maxID": 10}], "ipam": {}}


def test_the_ovsnetwork_example() -> None:
    nad = render_nad(KINDS["OVSNetwork"], example("ovsnetwork.yaml"), OPERATOR_NS, "nvidia.com")
    assert (nad["metadata"]["namespace"], nad["metadata"]["name"]) == ("default", "ovs")
    assert nad["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"] == \
        "nvidia.com/switchdev"
    assert json.loads(nad["spec"]["config"]) == {
        "cniVersion": "1.0.0", "name": "ovs", "type": "ovs", "vlan": 200,
        "ipam": {"type": "nv-ipam", "poolName": "pool1"}}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_network_without_spec_names_the_missing_resource(kind: str) -> None:
    cr = network(kind, {})
    del cr["spec"]
    with pytest.raises(NetworkError, match=r"spec\.resourceName is missing"):
        render_nad(KINDS[kind], cr, OPERATOR_NS)
