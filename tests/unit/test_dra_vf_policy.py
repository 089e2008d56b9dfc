"""Which VFs are advertised under the SR-IOV DRA driver's SriovResourcePolicies and with which
DeviceAttributes. Inputs are upstream's controller tests
(k8snetworkplumbingwg/dra-driver-sriov pkg/controller/resourcepolicycontroller_test.go):
matchesNodeSelector, deviceMatchesFilter, deviceMatchesFilters linkType, getPolicyDeviceMap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nicop.api import dra
from nicop.node.discovery import scan
from nicop.node.dra.devices import node_devices
from nicop.node.dra.vf_policy import Vf, vf_policy
from nicop_sim.hardware import SimulatedHost

# upstream's "devA": vendor 8086, device 154c, PF eth0 at 0000:01:00.0, ethernet
DEV_A = Vf("8086", "154c", "0000:00:00.1", "eth0", "0000:01:00.0", dra.LINK_ETHERNET)


def policy(name: str, *configs: dict[str, Any], node_selector: Any = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"configs": list(configs)}
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    return {"metadata": {"name": name}, "spec": spec}


def selects(f: dict[str, Any], vf: Vf = DEV_A) -> bool:
    chosen = vf_policy([policy("p", {"resourceFilters": [f]})], [], {})
    assert chosen is not None
    return chosen.attributes(vf) is not None


def test_a_filter_selects_when_every_list_it_gives_holds_the_vf() -> None:
    """deviceMatchesFilter: the empty filter, all fields at once, each field wrong alone, and
    two fields together."""
    assert selects({})
    assert selects({"vendors": ["8086"], "devices": ["154c"], "pciAddresses": ["0000:00:00.1"],
                    "pfNames": ["eth0"], "pfPciAddresses": ["0000:01:00.0"],
                    "linkType": "ethernet"})
    for wrong in ({"vendors": ["1234"]}, {"devices": ["9999"]},
                  {"pciAddresses": ["0000:00:00.2"]}, {"pfNames": ["eth9"]},
                  {"pfPciAddresses": ["0000:00:ff.f"]}, {"linkType": "infiniband"},
                  {"vendors": ["8086"], "linkType": "infiniband"},
                  {"vendors": ["1234"], "linkType": "ethernet"}):
        assert not selects(wrong), wrong
    assert selects({"vendors": ["8086"], "linkType": "ethernet"})


@pytest.mark.parametrize(("link", "vf_link", "expected"), [
    ("eth", dra.LINK_ETHERNET, True), ("ETH", dra.LINK_ETHERNET, True),
    ("Eth", dra.LINK_ETHERNET, True), ("ib", dra.LINK_INFINIBAND, True),
    ("IB", dra.LINK_INFINIBAND, True), ("ib", dra.LINK_ETHERNET, False),
    ("eth", dra.LINK_INFINIBAND, False)])
def test_link_types_are_matched_in_any_case_and_short_form(link: str, vf_link: str,
                                                           expected: bool) -> None:
    """deviceMatchesFilters linkType (the CRD's enum allows the lower-case forms; upstream's
    matching is case-insensitive, and so is nicop's)."""
    vf = Vf("8086", "154c", "0000:00:00.1", "eth0", "0000:01:00.0", vf_link)
    assert selects({"linkType": link}, vf) is expected


def test_node_selector_terms_are_ored_and_none_selects_every_node() -> None:
    """matchesNodeSelector: nil and empty terms match all; In on a label; terms ORed."""
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    other = {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}
    for selector, labels, expected in (
            (None, {}, True), ({"nodeSelectorTerms": []}, {}, True),
            ({"nodeSelectorTerms": [term]}, {"zone": "a"}, True),
            ({"nodeSelectorTerms": [term]}, {"zone": "b"}, False),
            ({"nodeSelectorTerms": [term, other]}, {"rack": "r1"}, True)):
        chosen = vf_policy([policy("p", {}, node_selector=selector)], [], labels)
        assert chosen is not None
        assert (chosen.attributes(DEV_A) is not None) is expected, (selector, labels)


def test_first_match_wins_and_attributes_come_from_selected_device_attributes() -> None:
    """getPolicyDeviceMap: no policy leaves nicop's default (every VF); a config without a
    DeviceAttributesSelector advertises with no attributes; one with a selector applies the
    matched DeviceAttributes (later name wins); the first policy by name takes a VF."""
    assert vf_policy([], [], {}) is None
    plain = vf_policy([policy("p1", {"resourceFilters": [{"vendors": ["8086"]}]})], [], {})
    assert plain is not None and plain.attributes(DEV_A) == {}
    attributes = [
        {"metadata": {"name": "da2", "labels": {"pool": "test"}},
         "spec": {"attributes": {"sriovnetwork.k8snetworkplumbingwg.io/resourceName": {
             "string": "later"}}}},
        {"metadata": {"name": "da1", "labels": {"pool": "test"}},
         "spec": {"attributes": {"sriovnetwork.k8snetworkplumbingwg.io/resourceName": {
             "string": "my-resource"}, "example.com/tier": {"int": 1}}}},
    ]
    chosen = vf_policy([
        policy("p2", {"resourceFilters": [{"vendors": ["8086"]}]}),
        policy("p1", {"deviceAttributesSelector": {"matchLabels": {"pool": "test"}},
                      "resourceFilters": [{"vendors": ["8086"]}]}),
    ], attributes, {})
    assert chosen is not None
    assert chosen.attributes(DEV_A) == {
        "sriovnetwork.k8snetworkplumbingwg.io/resourceName": {"string": "later"},
        "example.com/tier": {"int": 1}}
    assert chosen.attributes(Vf("15b3", "101e", "x", "y", "z", dra.LINK_ETHERNET)) is None


def test_a_node_publishes_only_the_vfs_a_policy_selects_with_its_attributes(
        tmp_path: Path) -> None:
    host = SimulatedHost.build(tmp_path, "cx6dx")
    host.set_numvfs("enp59s0f0np0", 4)
    chosen = vf_policy([policy("mlx", {
        "deviceAttributesSelector": {"matchLabels": {"pool": "eth0-resource"}},
        "resourceFilters": [{"vendors": ["15b3"], "pfNames": ["enp59s0f0np0"],
                             "pciAddresses": ["0000:3b:00.2", "0000:3b:00.3"]}]})],
        [{"metadata": {"name": "eth0-attrs", "labels": {"pool": "eth0-resource"}},
          "spec": {"attributes": {"k8s.cni.cncf.io/resourceName": {
              "string": "eth0_resource"}}}}], {})
    devices = {d.name: d for d in node_devices(scan(host), host, vfs=chosen)}
    assert sorted(n for n in devices if n.startswith("vf-")) == [
        "vf-0000-3b-00-2", "vf-0000-3b-00-3"]
    assert devices["vf-0000-3b-00-2"].attributes["k8s.cni.cncf.io/resourceName"] == {
        "string": "eth0_resource"}
    assert "pf-0000-3b-00-0" in devices  # PFs are not the policies' to choose
